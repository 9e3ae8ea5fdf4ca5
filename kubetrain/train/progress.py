"""What rank 0 tells the user: a rich bar on a terminal, plain lines and progress records in
pod logs.

Log collectors read plain lines, and a bar redrawn in a pod log is noise, so the bar is
only used when stdout is a TTY of this process's own: not under mpirun, which gives each
rank a pseudo-terminal and forwards it to the launcher's log. Off a terminal rank 0 writes
structured progress records (:mod:`kubetrain.progress`), from which `wait`, `logs` and
`kubetrain run` draw their own live display. Other ranks say nothing.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kubetrain.errors import terminal_text
from kubetrain.progress import Progress, format_record


@dataclass(frozen=True)
class SoFar:
    """Where the loop is within an epoch, read only when a record is due: the loss is on the
    device, and reading it waits for the device to catch up."""

    step: int  # optimizer steps since the run began
    loss: float  # rank 0's mean training loss so far this epoch
    samples: int  # rank 0's samples so far this epoch


class Reporter(Protocol):
    def start_epoch(self, epoch: int, epochs: int, batches: int) -> None: ...
    def advance(self, so_far: Callable[[], SoFar]) -> None: ...
    def line(self, text: str) -> None: ...
    def close(self) -> None: ...


class SilentReporter:
    """For ranks other than 0."""

    def start_epoch(self, epoch: int, epochs: int, batches: int) -> None:
        pass

    def advance(self, so_far: Callable[[], SoFar]) -> None:
        pass

    def line(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class PlainReporter:
    """One flushed line per event, for logs, and within an epoch a progress record every
    ``RECORD_SECONDS`` and at its last batch. The records are also the heartbeat: `wait`'s
    stall check takes a log silent for its stall timeout for a hung rank, so however
    ``RECORD_SECONDS`` is set, a line comes at least every ``HEARTBEAT_SECONDS``, and each
    record but an epoch's last says within how long the next one comes
    (``heartbeat_seconds``): a record is written at the end of the first batch after its
    interval, so that is the interval plus the slowest batch yet, and at least
    ``HEARTBEAT_SECONDS``. `wait` derives its default stall timeout from it."""

    #: Often enough for a live display, rare enough to keep a long run's log short.
    RECORD_SECONDS = 2.0
    #: Far below `wait`'s default stall timeout (1800 s), and the least a record promises.
    HEARTBEAT_SECONDS = 60.0

    def __init__(self, world_size: int = 1) -> None:
        self._world_size = world_size
        self._epoch = self._epochs = self._batches = self._done = 0
        self._epoch_started = self._last_line = self._batch_started = time.monotonic()
        self._slowest_batch = 0.0
        #: When and at which epoch this process began training (a resumed run starts late).
        self._first_epoch: int | None = None
        self._first_epoch_started = 0.0

    def start_epoch(self, epoch: int, epochs: int, batches: int) -> None:
        now = time.monotonic()
        if self._first_epoch is None:
            self._first_epoch, self._first_epoch_started = epoch, now
        self._epoch, self._epochs, self._batches, self._done = epoch, epochs, batches, 0
        self._epoch_started = self._batch_started = now

    def _interval(self) -> float:
        return min(self.RECORD_SECONDS, self.HEARTBEAT_SECONDS)

    def advance(self, so_far: Callable[[], SoFar]) -> None:
        self._done += 1
        now = time.monotonic()
        self._slowest_batch = max(self._slowest_batch, now - self._batch_started)
        if self._done >= self._batches or now - self._last_line >= self._interval():
            self.line(format_record(self._progress(so_far())))
        self._batch_started = time.monotonic()

    def _progress(self, so_far: SoFar) -> Progress:
        """The record: rates from rank 0's time since the epoch began (read after ``so_far``,
        which waited for the device), the ETA from the rest of this epoch at its time per
        batch plus the epochs to come at the wall time a whole epoch took here (validation and
        checkpoints included, which a per-batch estimate leaves out), or at this epoch's time
        per batch while none has ended yet."""
        now = time.monotonic()
        elapsed = max(now - self._epoch_started, 1e-9)
        per_batch = elapsed / self._done
        epochs_ended = self._epoch - (self._first_epoch or self._epoch)
        per_epoch = (
            (self._epoch_started - self._first_epoch_started) / epochs_ended
            if epochs_ended > 0
            else per_batch * self._batches
        )
        eta = per_batch * (self._batches - self._done) + per_epoch * (self._epochs - self._epoch)
        return Progress(
            epoch=self._epoch,
            epochs=self._epochs,
            batch=self._done,
            batches=self._batches,
            step=so_far.step,
            loss=round(so_far.loss, 6),  # short lines: a display shows 4 digits
            samples_per_second=round(so_far.samples / elapsed * self._world_size, 1),
            eta_seconds=round(eta, 1),
            heartbeat_seconds=(
                None
                if self._done >= self._batches
                else round(max(self.HEARTBEAT_SECONDS, self._interval() + self._slowest_batch), 1)
            ),
        )

    def line(self, text: str) -> None:
        self.write(text)
        self._last_line = time.monotonic()

    def write(self, text: str) -> None:
        """Where a line goes: this process's stdout, escaped (a checkpoint path may hold any
        character); a Ray Train worker sends it to the driver, which escapes it there."""
        print(terminal_text(text), flush=True)

    def close(self) -> None:
        pass


class RichReporter:
    """A per-epoch progress bar, with the epoch lines printed above it."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._console = Console()
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self._console,
            transient=True,
            refresh_per_second=4,
        )
        self._task: int | None = None
        self._progress.start()

    def start_epoch(self, epoch: int, epochs: int, batches: int) -> None:
        if self._task is not None:
            self._progress.remove_task(self._task)
        self._task = self._progress.add_task(f"epoch {epoch}/{epochs}", total=batches)

    def advance(self, so_far: Callable[[], SoFar]) -> None:
        if self._task is not None:
            self._progress.advance(self._task)

    def line(self, text: str) -> None:
        self._console.print(terminal_text(text), highlight=False, markup=False, soft_wrap=True)

    def close(self) -> None:
        self._progress.stop()


def make_reporter(is_main: bool, world_size: int = 1) -> Reporter:
    if not is_main:
        return SilentReporter()
    # OpenMPI sets OMPI_COMM_WORLD_RANK in every process mpirun starts.
    under_mpirun = "OMPI_COMM_WORLD_RANK" in os.environ
    if sys.stdout.isatty() and not under_mpirun:
        return RichReporter()
    return PlainReporter(world_size)
