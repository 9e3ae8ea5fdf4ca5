"""The GPU mode of B3: a larger model (a CIFAR-style ResNet-18) and synthetic image data.

Both are importable by the training processes: ``--model bench.gpu_workload:resnet18``.
The data are class-conditional patterns plus noise, so the model has something to learn and
the accuracy line stays meaningful, without a download.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn


class _BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and an identity (or 1x1) shortcut."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(outputs),
            nn.ReLU(inplace=True),
            nn.Conv2d(outputs, outputs, 3, padding=1, bias=False),
            nn.BatchNorm2d(outputs),
        )
        self.shortcut = (
            nn.Identity()
            if stride == 1 and inputs == outputs
            else nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False), nn.BatchNorm2d(outputs)
            )
        )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


def _resnet(sample_shape: Sequence[int], num_classes: int, widths: Sequence[int]) -> nn.Module:
    channels = int(sample_shape[0])
    layers: list[nn.Module] = [
        nn.Conv2d(channels, widths[0], 3, padding=1, bias=False),
        nn.BatchNorm2d(widths[0]),
        nn.ReLU(inplace=True),
    ]
    inputs = widths[0]
    for index, width in enumerate(widths):
        stride = 1 if index == 0 else 2
        layers += [_BasicBlock(inputs, width, stride), _BasicBlock(width, width, 1)]
        inputs = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inputs, num_classes)]
    return nn.Sequential(*layers)


def resnet18(sample_shape: Sequence[int], num_classes: int) -> nn.Module:
    """ResNet-18 for 32x32 images (about 11 M parameters, 0.56 GFLOP per forward)."""
    return _resnet(sample_shape, num_classes, (64, 128, 256, 512))


def resnet_tiny(sample_shape: Sequence[int], num_classes: int) -> nn.Module:
    """The same shape at 1/8 of the width: the CPU smoke run of the GPU mode."""
    return _resnet(sample_shape, num_classes, (8, 16, 32, 64))


def write_synthetic_images(
    path: Path, *, samples: int, classes: int = 10, side: int = 32, seed: int = 0
) -> Path:
    """``data.npz`` of uint8 RGB images (x: [N, 3, side, side], y: [N]) for ``kubetrain prep``."""
    rng = np.random.default_rng(seed)
    patterns = rng.normal(128.0, 40.0, size=(classes, 3, side, side))
    y = rng.integers(0, classes, size=samples)
    x = np.empty((samples, 3, side, side), dtype=np.uint8)
    chunk = 4096  # bounded memory: 4096 float64 images at a time
    for start in range(0, samples, chunk):
        labels = y[start : start + chunk]
        noisy = patterns[labels] + rng.normal(0.0, 60.0, size=(len(labels), 3, side, side))
        x[start : start + chunk] = np.clip(noisy, 0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=x, y=y)
    return path
