"""How `wait`, `logs` and `kubetrain run` show rank 0's log: its lines as they are, and its
progress records (``kubetrain.progress``) as a live bar on a terminal, or, off one, as a
plain line only when nothing was said for a while, so a redirected log stays concise. An
elastic job's membership notices are lines like any other, and the bar keeps the latest
count in view ("1 of 1..2 nodes").

``KUBETRAIN_PROGRESS`` overrides the choice: ``records`` passes the records on untouched (a
step whose output a parent process draws, as `kubetrain run` does for its wait step),
``plain`` or ``live`` force those. Colour and the bar follow rich's own terminal detection,
which honours ``NO_COLOR``.
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import TYPE_CHECKING, TextIO

from kubetrain.progress import Progress, format_seconds, parse_membership, parse_record

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress

LIVE, PLAIN, RECORDS = "live", "plain", "records"
MODES = (LIVE, PLAIN, RECORDS)
#: The environment variable that picks the mode (a parent sets it for its steps).
MODE_VARIABLE = "KUBETRAIN_PROGRESS"
#: Off a terminal, a progress record is shown as a plain line only after this long without
#: any line: a heartbeat through a long epoch, not a line every record.
PLAIN_PROGRESS_SECONDS = 30.0


def display_mode(stream: TextIO) -> str:
    """``KUBETRAIN_PROGRESS`` when it names a mode, else live on a terminal, plain off one."""
    chosen = os.environ.get(MODE_VARIABLE, "")
    if chosen in MODES:
        return chosen
    return LIVE if stream.isatty() else PLAIN


class ProgressDisplay:
    """A sink for rank 0's log lines; use it as a context manager so a live bar is taken
    off the terminal when the job ends (the epoch lines above it stay)."""

    def __init__(
        self, stream: TextIO | None = None, mode: str | None = None, indent: str = ""
    ) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.mode = mode or display_mode(self.stream)
        self.indent = indent
        self.last: Progress | None = None
        #: An elastic job's membership as its last notice stated it ("1 of 1..2 nodes").
        self.membership = ""
        self._last_output = time.monotonic()
        self._bar: RichProgress | None = None
        self._task: int | None = None

    def __enter__(self) -> ProgressDisplay:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def feed(self, line: str) -> None:
        """Show one log line: a progress record as the mode says, any other line as it is."""
        record = parse_record(line)
        if record is None or self.mode == RECORDS:
            if (membership := parse_membership(line)) is not None:
                self.membership = membership
                if self.last is not None and self._bar is not None:
                    self._draw(self.last)
            self.print(line)
            return
        self.last = record
        if self.mode == LIVE:
            self._draw(record)
        elif time.monotonic() - self._last_output >= PLAIN_PROGRESS_SECONDS:
            self.print(record.describe())

    def print(self, text: str) -> None:
        """A line above the bar (or just a line, with no bar)."""
        text = f"{self.indent}{text}"
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            self.stream.write(f"{text}\n")
            self.stream.flush()
        self._last_output = time.monotonic()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def _draw(self, record: Progress) -> None:
        if self._bar is None:
            self._bar, self._task = _start_bar(self.stream)
        assert self._task is not None
        eta = "" if record.eta_seconds is None else f"eta {format_seconds(record.eta_seconds)}"
        self._bar.update(
            self._task,
            completed=record.fraction(),
            description=f"{self.indent}epoch {record.epoch}/{record.epochs}",
            batch=f"batch {record.batch}/{record.batches}",
            loss=f"loss {record.loss:.4f}",
            rate=f"{record.samples_per_second:,.0f} samples/s",
            eta=eta,
            nodes=self.membership,
            refresh=True,  # drawn now: a print above the bar shows its last drawn state
        )


def _start_bar(stream: TextIO) -> tuple[RichProgress, int]:
    """The bar: epoch, bar over the whole run, batch, loss, samples/s, ETA (rank 0's own
    estimate, which knows the epochs still to come), and an elastic job's nodes."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[batch]}"),
        TextColumn("{task.fields[loss]}"),
        TextColumn("{task.fields[rate]}"),
        TextColumn("{task.fields[eta]}"),
        TextColumn("{task.fields[nodes]}"),
        console=Console(file=stream),
        transient=True,
        auto_refresh=False,  # nothing moves between records; each record draws the bar
    )
    task = bar.add_task("", total=1.0, batch="", loss="", rate="", eta="", nodes="")
    bar.start()
    return bar, task
