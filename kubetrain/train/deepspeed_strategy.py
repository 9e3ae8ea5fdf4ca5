"""Strategy deepspeed: our model in a DeepSpeed ZeRO engine, and its micro-steps.

DeepSpeed is imported here only (the ``deepspeed`` extra): ddp and fsdp never need it. The
engine joins the process group ``distributed.init_runtime`` started (gloo on CPU, nccl on CUDA):
``deepspeed.initialize`` takes an initialized torch process group as it is (deepspeed v0.19.8
comm/comm.py ``init_distributed``).
"""

from __future__ import annotations

import copy
import logging
import os
import warnings
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from kubetrain.train.distributed import Runtime


def engine_config(config: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """``config`` (already filled with our options) plus the one setting that depends on the
    device: bf16 on a GPU that has it, unless the config chooses a precision itself; fp32 on
    CPU."""
    filled = copy.deepcopy(dict(config))
    chooses_precision = any(key in filled for key in ("bf16", "fp16", "torch_autocast"))
    if device.type == "cuda" and torch.cuda.is_bf16_supported() and not chooses_precision:
        filled["bf16"] = {"enabled": True}
    return filled


def initialize(module: nn.Module, config: Mapping[str, Any], runtime: Runtime) -> Any:
    """The DeepSpeed engine of ``module``, trained as ``config`` says on ``runtime.device``."""
    # DeepSpeed's documented choice of accelerator, so --device cpu on a GPU host stays on CPU.
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if runtime.device.type == "cuda" else "cpu")
    # The engine reads its device from LOCAL_RANK, which a launcher sets; one process has none.
    os.environ.setdefault("LOCAL_RANK", str(runtime.local_rank))
    import deepspeed

    # Its INFO lines (the whole config, each step's timings) would bury the epoch lines, and so
    # would torch's warning about the collectives ZeRO calls, repeated on every step.
    deepspeed.utils.logger.setLevel(logging.WARNING)
    warnings.filterwarnings(
        "ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning
    )
    engine, _optimizer, _loader, _scheduler = deepspeed.initialize(
        model=module.to(runtime.device),
        model_parameters=[param for param in module.parameters() if param.requires_grad],
        config=engine_config(config, runtime.device),
    )
    return engine


class DeepSpeedUpdates:
    """The engine's own accumulation, clipping and optimizer step, with the step boundary set by
    our loop (a short last group of an epoch ends a step too, as with ddp and fsdp): the
    engine's public ``set_gradient_accumulation_boundary`` before each micro-batch, ``step``
    once the group's last one is back-propagated. The loop divides each loss by its group's
    size, so the engine does not divide again (``scale_wrt_gas=False``)."""

    def __init__(self, engine: Any) -> None:
        self.model = engine

    def micro_batch(self, last_in_group: bool) -> AbstractContextManager[object]:
        self.model.set_gradient_accumulation_boundary(last_in_group)
        return nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        self.model.backward(loss, scale_wrt_gas=False)

    def step(self) -> None:
        self.model.step()
