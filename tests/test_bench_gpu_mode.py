"""The GPU mode of the benchmarks (B3g) on CPU: the same code path end to end, real processes.

No timing is asserted: the test checks that the mode produces sane figures (positive rates,
an MFU between 0 and 100 %, FLOP counts that match the model), so that a session with a GPU
finds it working. Without a GPU, ``make bench`` reports B3g as skipped, with the reason.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from bench.core import REPO, FigureSkipped, Settings
from bench.figures import throughput_gpu
from bench.gpu_workload import resnet18, resnet_tiny


def test_smoke_run_on_cpu_gives_rates_and_mfu_for_fsdp():
    """FSDP only (the DDP run is the same loop with the other strategy; each costs ~12 s of
    torchrun start-ups here)."""
    workload = throughput_gpu.Workload(
        device="cpu",
        processes=2,
        model="bench.gpu_workload:resnet_tiny",
        samples=384,
        epochs=2,
        batch_size=64,
        repeats=1,
        strategies=("fsdp",),
    )
    rows = throughput_gpu.measure_workload(workload)

    assert [row.figure for row in rows] == [
        "B3g FSDP (cpu, float32) throughput",
        "B3g FSDP (cpu, float32) MFU",
    ]
    for rate, mfu in zip(rows[::2], rows[1::2], strict=True):
        assert rate.ours.median > 0 and rate.baseline.median > 0
        assert rate.ratio == pytest.approx(rate.ours.median / rate.baseline.median)
        assert 0 < mfu.ours.median < 100 and 0 < mfu.baseline.median < 100
        expected = (
            100
            * rate.ours.median
            * rate.extra["training_flops_per_sample"]
            / (rate.extra["peak_flops_per_device"] * workload.processes)
        )
        assert mfu.ours.median == pytest.approx(expected)


def test_probe_counts_forward_and_backward_flops_of_the_model():
    done = subprocess.run(
        [sys.executable, str(throughput_gpu.PROBE), "--device", "cpu", "--matmul-size", "256",
         "--model", "bench.gpu_workload:resnet_tiny"],
        capture_output=True, text=True, check=True, cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    report = json.loads(done.stdout.splitlines()[-1])
    model = resnet_tiny([3, 32, 32], 10)
    with FlopCounterMode(display=False) as forward_only:
        model(torch.randn(1, 3, 32, 32))
    # Backward costs about twice the forward: the training count is about three forwards.
    ratio = report["flops_per_sample"] / forward_only.get_total_flops()
    assert 2.5 < ratio < 3.5
    assert report["peak_flops"] > 1e8  # any CPU does 0.1 GFLOP/s of float32 matmul


def test_resnet18_has_the_published_size():
    model = resnet18([3, 32, 32], 10)
    parameters = sum(p.numel() for p in model.parameters())
    assert 11.1e6 < parameters < 11.2e6  # CIFAR ResNet-18: 11.17 M
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(torch.randn(1, 3, 32, 32)), torch.tensor([0])).backward()
    assert 1.6e9 < counter.get_total_flops() < 3.6e9  # ~0.56 GMAC forward: ~1.1 GFLOP, ×3


def test_without_cuda_the_figure_is_skipped_with_the_reason():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: B3g runs for real in make bench")
    with pytest.raises(FigureSkipped, match="no CUDA device"):
        throughput_gpu.measure(Settings(quick=True))
