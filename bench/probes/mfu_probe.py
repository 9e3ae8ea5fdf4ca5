"""What model FLOP utilisation needs, printed as one JSON line.

* ``peak_flops``: the device's measured matmul rate, FLOP/s (bf16 on CUDA, float32 on CPU):
  the best of several timed square matmuls, so MFU is against what this device really does,
  not a datasheet figure.
* ``flops_per_sample``: the model's training FLOPs per sample (forward + backward), counted by
  ``torch.utils.flop_counter.FlopCounterMode`` over one batch.

Run in its own process so that the bench driver never imports torch or touches the GPU.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from kubetrain.artifacts.models import build_model


def matmul_rate(device: torch.device, size: int, repeats: int) -> float:
    """FLOP/s of ``size`` x ``size`` matmuls: bf16 on CUDA, float32 on CPU; best of ``repeats``."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + 1):  # the first is a warm-up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        for _ in range(10):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, (time.perf_counter() - started) / 10)
    return 2 * size**3 / best


def training_flops_per_sample(
    model_spec: str, sample_shape: list[int], num_classes: int, batch: int
) -> float:
    """Forward + backward FLOPs of one batch (counted on CPU: the count is device-independent)."""
    model = build_model(model_spec, sample_shape, num_classes)
    x = torch.randn(batch, *sample_shape)
    y = torch.randint(0, num_classes, (batch,))
    counter = FlopCounterMode(display=False)
    with counter:
        F.cross_entropy(model(x), y).backward()
    return counter.get_total_flops() / batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cuda", "cpu"),
        help="cuda or cpu: measure there; auto: only report how many GPUs are visible",
    )
    parser.add_argument("--model", help="a model spec, as for kubetrain.train --model")
    parser.add_argument("--sample-shape", type=int, nargs="+", default=[3, 32, 32])
    parser.add_argument("--num-classes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--matmul-size", type=int, default=8192)
    args = parser.parse_args()

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    report: dict[str, object] = {"cuda_devices": visible}
    if args.device == "auto":  # only the question whether there is a GPU to measure on
        print(json.dumps(report))
        return
    cuda = args.device == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    report["device_name"] = torch.cuda.get_device_name(device) if cuda else "cpu"
    report["peak_dtype"] = "bfloat16" if cuda else "float32"
    report["peak_flops"] = matmul_rate(device, args.matmul_size, repeats=5)
    if args.model:
        report["flops_per_sample"] = training_flops_per_sample(
            args.model, args.sample_shape, args.num_classes, args.batch
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
