"""What rank 0 tells the user: a rich bar on a terminal, plain lines in pod logs.

Log collectors read plain lines, and a bar redrawn in a pod log is noise, so the bar is
only used when stdout is a TTY. Other ranks say nothing.
"""

from __future__ import annotations

import sys
import time
from typing import Protocol


class Reporter(Protocol):
    def start_epoch(self, epoch: int, epochs: int, batches: int) -> None: ...
    def advance(self) -> None: ...
    def line(self, text: str) -> None: ...
    def close(self) -> None: ...


class SilentReporter:
    """For ranks other than 0."""

    def start_epoch(self, epoch: int, epochs: int, batches: int) -> None:
        pass

    def advance(self) -> None:
        pass

    def line(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class PlainReporter:
    """One flushed line per event, for logs, and within a long epoch a line every
    ``HEARTBEAT_SECONDS``: `wait`'s stall check takes a silent log for a hung rank."""

    #: Far below `wait`'s default stall timeout (1800 s), far above a line per step.
    HEARTBEAT_SECONDS = 60.0

    def __init__(self) -> None:
        self._epoch = self._epochs = self._batches = self._done = 0
        self._last_line = time.monotonic()

    def start_epoch(self, epoch: int, epochs: int, batches: int) -> None:
        self._epoch, self._epochs, self._batches, self._done = epoch, epochs, batches, 0

    def advance(self) -> None:
        self._done += 1
        if time.monotonic() - self._last_line >= self.HEARTBEAT_SECONDS:
            self.line(
                f"epoch {self._epoch}/{self._epochs} in progress: batch {self._done}/"
                f"{self._batches}"
            )

    def line(self, text: str) -> None:
        print(text, flush=True)
        self._last_line = time.monotonic()

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

    def advance(self) -> None:
        if self._task is not None:
            self._progress.advance(self._task)

    def line(self, text: str) -> None:
        self._console.print(text, highlight=False, markup=False, soft_wrap=True)

    def close(self) -> None:
        self._progress.stop()


def make_reporter(is_main: bool) -> Reporter:
    if not is_main:
        return SilentReporter()
    return RichReporter() if sys.stdout.isatty() else PlainReporter()
