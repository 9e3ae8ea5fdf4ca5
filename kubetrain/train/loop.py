"""One training epoch (with gradient accumulation and clipping) and one evaluation pass."""

from __future__ import annotations

import time
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from kubetrain.train.data import eval_batches
from kubetrain.train.distributed import Runtime, all_reduce_sum, gradient_sync
from kubetrain.train.progress import Reporter, SoFar


class Updates(Protocol):
    """How micro-batches' gradients become optimizer steps: torch's optimizer on a DDP or FSDP
    model (:class:`TorchUpdates`), or a DeepSpeed engine (``deepspeed_strategy``)."""

    model: nn.Module

    def micro_batch(self, last_in_group: bool) -> AbstractContextManager[object]:
        """Around one micro-batch's forward and backward; ``last_in_group`` ends a step."""
        ...

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate ``loss``, already divided by the micro-batches of its step."""
        ...

    def step(self) -> None:
        """The optimizer step at the end of a group, gradients then cleared."""
        ...


class TorchUpdates:
    """A torch optimizer on a DDP or FSDP2 model: the gradient all-reduce skipped on micro-steps
    that are not last, the global gradient norm clipped before each step (0: not clipped)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, clip_grad_norm: float):
        self.model, self.optimizer, self.clip_grad_norm = model, optimizer, clip_grad_norm
        optimizer.zero_grad(set_to_none=True)

    def micro_batch(self, last_in_group: bool) -> AbstractContextManager[object]:
        return gradient_sync(self.model, enabled=last_in_group)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        if self.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


@dataclass(frozen=True)
class StepStats:
    """One optimizer step as this rank saw it: the mean loss over its micro-batches, their
    samples and the seconds since the step before (on a GPU, the host's clock: it runs ahead
    of the device until the device's queue fills, so single steps are approximate)."""

    loss: float
    samples: int
    seconds: float


@dataclass(frozen=True)
class EpochStats:
    """Totals over all ranks, and this rank's steps."""

    loss: float
    accuracy: float
    samples: int
    seconds: float
    steps: int
    per_step: list[StepStats]


def _autocast(device: torch.device) -> torch.autocast:
    """bf16 on GPU only: CPU autocast is slow and our CPU runs are tests and tiny models."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def train_epoch(
    updates: Updates,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    num_batches: int,
    runtime: Runtime,
    grad_accum_steps: int,
    reporter: Reporter,
    first_step: int = 0,
) -> EpochStats:
    """Run one epoch; every ``grad_accum_steps`` micro-batches (and the last) make one step.

    Each micro-batch's loss stays on the device (no wait on it per batch); they are read
    together at the end of the epoch, and mid-epoch only when the reporter asks for a record.
    ``first_step`` counts the steps before this epoch, for the records.
    """
    device = runtime.device
    model = updates.model
    model.train()
    batch_losses = torch.zeros(max(num_batches, 1), dtype=torch.float64, device=device)
    batch_sizes: list[int] = []
    correct = torch.zeros((), dtype=torch.int64, device=device)
    seen = 0
    steps = 0
    started = time.perf_counter()
    step_ends: list[float] = []

    def so_far() -> SoFar:
        done = len(batch_sizes)
        loss = batch_losses[:done].sum().item() / max(seen, 1)
        return SoFar(step=first_step + steps, loss=loss, samples=seen)

    for index, (x_batch, y_batch) in enumerate(batches):
        x = x_batch.to(device, non_blocking=True)  # a no-op for batches already there
        y = y_batch.to(device, non_blocking=True)
        group_start = index - index % grad_accum_steps
        group_size = min(grad_accum_steps, num_batches - group_start)
        last_in_group = index - group_start == group_size - 1
        with updates.micro_batch(last_in_group):
            with _autocast(device):
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y)
            updates.backward(loss / group_size)
        if last_in_group:
            updates.step()
            steps += 1
            step_ends.append(time.perf_counter())
        batch_losses[index] = loss.detach().double() * len(y)
        correct += (logits.detach().argmax(dim=1) == y).sum()
        seen += len(y)
        batch_sizes.append(len(y))
        reporter.advance(so_far)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    loss_sums = batch_losses[: len(batch_sizes)].tolist()
    total_loss, total_correct, total_seen = all_reduce_sum(
        [sum(loss_sums), float(correct.item()), float(seen)], device
    )
    return EpochStats(
        loss=total_loss / max(total_seen, 1),
        accuracy=total_correct / max(total_seen, 1),
        samples=int(total_seen),
        seconds=seconds,
        steps=steps,
        per_step=_per_step(loss_sums, batch_sizes, grad_accum_steps, started, step_ends),
    )


def _per_step(
    loss_sums: list[float],
    batch_sizes: list[int],
    grad_accum_steps: int,
    started: float,
    step_ends: list[float],
) -> list[StepStats]:
    """Group the micro-batches' summed losses into their optimizer steps."""
    per_step = []
    previous = started
    for number, ended in enumerate(step_ends):
        group = slice(number * grad_accum_steps, (number + 1) * grad_accum_steps)
        samples = sum(batch_sizes[group])
        per_step.append(
            StepStats(sum(loss_sums[group]) / max(samples, 1), samples, ended - previous)
        )
        previous = ended
    return per_step


@torch.no_grad()
def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int, runtime: Runtime
) -> tuple[float, float]:
    """Mean loss and accuracy on the whole of (x, y), each rank scoring its own slice."""
    device = runtime.device
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.float64, device=device)
    count = torch.zeros((), dtype=torch.float64, device=device)
    for xb, yb, weight in eval_batches(
        x, y, batch_size=batch_size, rank=runtime.rank, world_size=runtime.world_size
    ):
        xb, yb, weight = xb.to(device), yb.to(device), weight.to(device, torch.float64)
        with _autocast(device):
            logits = model(xb)
        losses = F.cross_entropy(logits.float(), yb, reduction="none")
        loss_sum += (losses.double() * weight).sum()
        correct += ((logits.argmax(dim=1) == yb).double() * weight).sum()
        count += weight.sum()
    model.train()
    total_loss, total_correct, total = all_reduce_sum(
        [loss_sum.item(), correct.item(), count.item()], device
    )
    return total_loss / max(total, 1.0), total_correct / max(total, 1.0)
