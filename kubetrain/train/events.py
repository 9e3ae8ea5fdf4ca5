"""Rank 0's TensorBoard event files, when the ``tensorboard`` package is installed, so that
``tensorboard --logdir`` and the KFP UI's TensorBoard viewer show the run's curves.

Every scalar is logged against the optimizer step (per-epoch ones at the epoch's last step):
one axis for all curves, and a resumed run's ``purge_step`` hides what the interrupted
attempt logged after its checkpoint, which a per-epoch axis could not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


class EventFiles:
    """Scalars into ``SummaryWriter`` event files: per step ``train/loss`` and
    ``train/samples_per_second``; per epoch ``train/accuracy`` and the scored split's
    ``<split>/loss`` and ``<split>/accuracy`` (``validation``, or ``test`` for a dataset
    without a validation split)."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer

    def steps(self, history: Iterable[Mapping[str, Any]]) -> None:
        for entry in history:
            self._writer.add_scalar("train/loss", entry["loss"], entry["step"])
            rate = entry["samples_per_second"]
            self._writer.add_scalar("train/samples_per_second", rate, entry["step"])

    def epoch(self, record: Mapping[str, Any], split: str) -> None:
        step = record["step"]
        self._writer.add_scalar("train/accuracy", record["train_accuracy"], step)
        self._writer.add_scalar(f"{split}/loss", record[f"{split}_loss"], step)
        self._writer.add_scalar(f"{split}/accuracy", record[f"{split}_accuracy"], step)
        self._writer.flush()  # readable at each epoch, not only every flush_secs

    def close(self) -> None:
        self._writer.close()


def open_event_files(folder: str | None, resumed_step: int) -> EventFiles | None:
    """Event files in ``folder`` (None: none wanted), or None when the ``tensorboard``
    package is missing (``torch.utils.tensorboard`` raises ImportError then). Every run purges
    the events of steps after ``resumed_step`` (0 when nothing was resumed): an attempt that
    logged them did not reach its next checkpoint, or its first, and they are trained again."""
    if folder is None:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return EventFiles(SummaryWriter(log_dir=folder, purge_step=resumed_step + 1))
