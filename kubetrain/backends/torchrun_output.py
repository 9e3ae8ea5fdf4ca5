"""How a node's log is shown (`wait`'s stream, `kubetrain logs`, a failed job's context): the
lines of global rank 0, where a line says whose it is, and torchrun's failure boilerplate
folded to one line. Both backends' lines go through ``NodeLogView``.

Whose a line is (``torchrun_report.rank_tags``): torch's excepthook tags a worker's uncaught
traceback ``[rankN]:`` (global) once ``init_process_group`` ran, and torchrun ``--tee`` tags
every worker line ``[default<local rank>]:``. Anything else (torchrun's own lines, a worker's
untagged output: torchrun without ``--tee`` passes it through as written) cannot be told
apart and is shown. We do not turn ``--tee`` on (``PET_TEE``): it writes each worker's stdout
and stderr to files torchrun tails separately, so a rank's prints and its warnings lose
their order.

What is folded is what torchrun 2.13 prints when a worker fails (``torch/distributed/elastic/
multiprocessing/errors/__init__.py``): its ``main`` is wrapped in ``@record``, which re-raises
the ``ChildFailedError`` ``launch_agent`` (``torch/distributed/launcher/api.py``) raises, so
Python prints it uncaught: "Traceback (most recent call last):", the launcher's frames
(``bin/torchrun``, the ``record`` wrapper, ``run.py`` ``main``/``run``, ``launcher/api.py``),
then ``torch.distributed.elastic.multiprocessing.errors.ChildFailedError:`` and its message,
``ChildFailedError.format_msg`` (``_MSG_FORMAT_TEMPLATE``): a ``=`` border, "<entrypoint>
FAILED", "Failures:" with one ``_FAILURE_FORMAT_TEMPLATE`` block per other failed rank,
"Root Cause (first observed failure):" with the first one's, and a closing ``=`` border.
When a worker used ``@record``, each block's traceback field repeats that worker's traceback
(``error_handler.py`` ``ErrorHandler.record_exception`` wrote it to the error file torchrun
reads): the rank's traceback is already in the log, tagged ``[rankN]:``. All of it becomes
one line naming the root cause; `kubetrain logs --raw` prints it as written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from kubetrain.backends.torchrun_report import (
    TORCHRUN_EXCEPTION,
    TRACEBACK_HEADER,
    rank_tags,
    root_cause,
)

#: Where torchrun's report is, for whoever reads the folded line.
RAW_HINT = "`kubetrain logs --raw` prints it"
_BORDER = re.compile(r"^=+$")
#: A traceback held back this long without its exception line is passed on as it is.
MAX_HELD_LINES = 2000
#: A report longer than this (one traceback per failed rank) is passed on as it is.
MAX_REPORT_LINES = 20000


def shown_as_rank_zero(line: str, node: int) -> bool:
    """Whether ``line`` of node ``node``'s log may be global rank 0's: it carries no rank tag,
    or its tags name rank 0 (``[rank0]:``; ``[default0]:`` on node 0, whose local rank 0 is
    global rank 0)."""
    local, rank, _ = rank_tags(line)
    if local is not None and (node != 0 or local != 0):
        return False
    return rank in (None, 0)


class TorchrunFolding:
    """Fed a node's lines in order, passes them on with torchrun's own traceback and failure
    report replaced by one line. An untagged traceback is held back until its exception line
    says whose it is (a worker's is passed on whole); ``flush`` passes on what is held when
    the log ends."""

    def __init__(self) -> None:
        self.held: list[str] = []
        self.in_report = False
        self.borders = 0

    def feed(self, line: str) -> list[str]:
        local, rank, text = rank_tags(line)
        if local is not None or rank is not None:
            return [line]  # a worker's: never part of torchrun's own output
        if self.in_report:
            return self._report_line(line)
        if text.startswith(TORCHRUN_EXCEPTION):  # after its frames, or alone in a log tail
            self.held.append(line)
            self.in_report = True
            return []
        if text.startswith(TRACEBACK_HEADER):
            released, self.held = self.held, [line]
            return released
        if not self.held:
            return [line]
        if not text.strip() or text[0].isspace():  # a frame
            self.held.append(line)
            return self.flush() if len(self.held) > MAX_HELD_LINES else []
        return [*self.flush(), line]  # a worker's exception line, or its output in between

    def _report_line(self, line: str) -> list[str]:
        self.held.append(line)
        if _BORDER.match(line.strip()):
            self.borders += 1
            if self.borders == 2:
                summary = folded_report(self.held)
                self.held, self.in_report, self.borders = [], False, 0
                return [summary]
        return self.flush() if len(self.held) > MAX_REPORT_LINES else []

    def flush(self) -> list[str]:
        """What is held back, as written (a log that ends within a traceback or a report)."""
        released, self.held = self.held, []
        self.in_report, self.borders = False, 0
        return released


def folded_report(lines: list[str]) -> str:
    """The line torchrun's traceback and report become, e.g. "torchrun: crash.py FAILED;
    root cause: rank 1 (local rank 1) exited with code 1 (ChildFailedError report folded;
    `kubetrain logs --raw` prints it)"."""
    borders = [i for i, line in enumerate(lines) if _BORDER.match(line.strip())]
    title = lines[borders[0] + 1].strip() if borders and borders[0] + 1 < len(lines) else ""
    summary = f"torchrun: {title or 'a worker FAILED'}"
    if cause := root_cause(lines):
        summary += f"; root cause: {cause}"
    return f"{summary} (ChildFailedError report folded; {RAW_HINT})"


class NodeLogView:
    """One node's log as shown: global rank 0's lines (every rank's with ``all_ranks``),
    torchrun's boilerplate folded. ``feed`` a line, get the lines to show; ``flush`` at the
    end of the log."""

    def __init__(self, node: int, all_ranks: bool = False) -> None:
        self.node = node
        self.all_ranks = all_ranks
        self.folding = TorchrunFolding()

    def feed(self, line: str) -> list[str]:
        if not self.all_ranks and not shown_as_rank_zero(line, self.node):
            return []
        return self.folding.feed(line)

    def flush(self) -> list[str]:
        return self.folding.flush()

    def shows(self, lines: Iterable[str]) -> bool:
        """Whether every one of ``lines`` passes this view's rank filter."""
        return self.all_ranks or all(shown_as_rank_zero(line, self.node) for line in lines)


def folded(lines: Iterable[str]) -> list[str]:
    """Every rank's lines, torchrun's boilerplate folded: a log tail read at once."""
    view = NodeLogView(0, all_ranks=True)
    shown = [out for line in lines for out in view.feed(line)]
    return [*shown, *view.flush()]
