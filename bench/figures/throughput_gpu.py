"""B3g, the GPU mode of B3: ``python -m kubetrain.train`` against the seed-style loop on every
visible GPU, DDP and FSDP2 with bf16 autocast, a CIFAR-sized ResNet-18 on synthetic images.

Reports samples/s (target ≥ 3× the baseline) and model FLOP utilisation: training FLOPs per
sample (counted by FlopCounterMode) × samples/s ÷ (the GPU's measured bf16 matmul rate × GPUs).
Skipped, with the reason in the results, when no CUDA device is visible. ``measure_workload``
also runs on CPU with a tiny model: the test suite's smoke run of this code path.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.core import (
    BASELINES,
    KUBETRAIN,
    PYTHON,
    REPO,
    TORCHRUN,
    FigureSkipped,
    Row,
    Settings,
    Stats,
    bench_env,
    interleaved,
    log,
)
from bench.core import run as run_command
from bench.figures.throughput import steady_rate
from bench.gpu_workload import write_synthetic_images

TARGET_RATIO = 3.0
PROBE = str(REPO / "bench" / "probes" / "mfu_probe.py")
STRATEGIES = ("ddp", "fsdp")


@dataclass(frozen=True)
class Workload:
    """What one B3g measurement trains, where, and how often."""

    device: str  # "cuda", or "cpu" for the smoke run
    processes: int
    model: str
    samples: int
    epochs: int
    batch_size: int
    repeats: int
    strategies: tuple[str, ...] = STRATEGIES

    @property
    def matmul_size(self) -> int:
        return 8192 if self.device == "cuda" else 1024


def probe(device: str, model: str | None = None, matmul_size: int = 8192) -> dict[str, Any]:
    """Run bench/probes/mfu_probe.py in its own process and return its JSON report."""
    argv = [PYTHON, PROBE, "--device", device, "--matmul-size", str(matmul_size)]
    if model:
        argv += ["--model", model]
    done = run_command(argv, env=bench_env(PYTHONPATH=str(REPO)))[1]
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(settings: Settings) -> list[Row]:
    found = probe("auto")
    if not found["cuda_devices"]:
        raise FigureSkipped("no CUDA device visible (torch.cuda.is_available() is False)")
    workload = Workload(
        device="cuda",
        processes=int(found["cuda_devices"]),
        model="bench.gpu_workload:resnet18",
        samples=4096 if settings.quick else 50_000,
        epochs=2 if settings.quick else 4,
        batch_size=256,
        repeats=settings.repeats(3),
    )
    return measure_workload(workload)


def measure_workload(workload: Workload) -> list[Row]:
    """Prepare the synthetic images, then alternate ours and the baseline for each strategy."""
    hardware = probe(workload.device, workload.model, workload.matmul_size)
    peak = float(hardware["peak_flops"]) * workload.processes
    per_sample = float(hardware["flops_per_sample"])
    env = bench_env(PYTHONPATH=str(REPO))  # both sides import bench.gpu_workload
    torchrun = [TORCHRUN, "--nproc-per-node", str(workload.processes)]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as t:
        tmp = Path(t)
        write_synthetic_images(tmp / "source" / "data.npz", samples=workload.samples)
        data = tmp / "data"
        run_command(
            [KUBETRAIN, "prep", "--source", str(tmp / "source"), "--output", str(data)], env=env
        )
        common = [
            "--data", str(data), "--model", workload.model, "--epochs", str(workload.epochs),
            "--batch-size", str(workload.batch_size),
        ]  # fmt: skip
        for strategy in workload.strategies:

            def ours(strategy: str = strategy) -> float:
                with tempfile.TemporaryDirectory(dir=tmp) as ckpt:
                    out = run_command(
                        [*torchrun, "-m", "kubetrain.train", *common, "--strategy", strategy,
                         "--checkpoint-dir", ckpt, "--checkpoint-every", str(workload.epochs),
                         "--resume", "never", "--device", workload.device],
                        env=env, cwd=REPO,
                    )[1].stdout  # fmt: skip
                return steady_rate(out)

            def baseline(strategy: str = strategy) -> float:
                script = str(BASELINES / "seed_style_train.py")
                argv = [*torchrun, script, *common, "--strategy", strategy]
                out = run_command([*argv, "--device", workload.device], env=env)[1].stdout
                return steady_rate(out)

            log(f"B3g: {strategy} on {workload.processes} x {workload.device} x{workload.repeats}")
            ours_stats, base_stats = interleaved(workload.repeats, ours, baseline)
            rows += _rows(workload, strategy, ours_stats, base_stats, hardware, peak, per_sample)
    return rows


def _mfu(rates: Stats, per_sample: float, peak: float) -> Stats:
    return Stats.of([100 * rate * per_sample / peak for rate in rates.values])


def _rows(
    workload: Workload,
    strategy: str,
    ours: Stats,
    base: Stats,
    hardware: dict[str, Any],
    peak: float,
    per_sample: float,
) -> list[Row]:
    ratio = ours.median / base.median
    met = ratio >= TARGET_RATIO
    where = f"{workload.processes} × {hardware['device_name']}"
    dtype = "bf16" if workload.device == "cuda" else "float32"
    precision = "bf16 autocast" if workload.device == "cuda" else "float32, CPU smoke run"
    name = f"B3g {strategy.upper()} ({workload.device}, {dtype})"
    model = workload.model.rsplit(":", 1)[-1]
    sizes = (
        f"{model} on {workload.samples} synthetic 3×32×32 images, batch {workload.batch_size} "
        f"per process, {workload.epochs} epochs per run, figure over epochs 2..N"
    )
    extra = {
        "device": where,
        "peak_flops_per_device": hardware["peak_flops"],
        "peak_dtype": hardware["peak_dtype"],
        "training_flops_per_sample": per_sample,
    }
    return [
        Row(
            figure=f"{name} throughput",
            unit="samples/s",
            ours=ours,
            ours_label=f"`torchrun -m kubetrain.train --strategy {strategy}` ({precision})",
            baseline=base,
            baseline_label=f"`seed_style_train.py --strategy {strategy}` (per-sample Dataset, "
            f"default DataLoader, batch copied to the device; {precision})",
            target=f"≥ {TARGET_RATIO}×",
            how=f"{where}; {sizes}; {ours.n} runs each, alternated",
            ratio=ratio,
            met=met,
            verdict="met" if met else f"missed: {ratio:.2f}× (target {TARGET_RATIO}×)",
            extra=extra,
        ),
        Row(
            figure=f"{name} MFU",
            unit="%",
            ours=_mfu(ours, per_sample, peak),
            ours_label="model FLOP utilisation of the runs above",
            baseline=_mfu(base, per_sample, peak),
            baseline_label="the same for the baseline's runs",
            target="reported",
            how=f"{per_sample / 1e9:.3f} GFLOP per trained sample (FlopCounterMode, forward + "
            f"backward) × samples/s ÷ ({hardware['peak_flops'] / 1e12:.1f} TFLOP/s measured "
            f"{hardware['peak_dtype']} matmul × {workload.processes})",
            ratio=ratio,
            extra=extra,
        ),
    ]
