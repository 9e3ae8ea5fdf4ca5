"""The root cause in torchrun's failure report, so a failed job names the rank and its exception.

When a worker dies, torchrun itself exits 1 and prints a ``ChildFailedError`` report whose
"Root Cause (first observed failure)" block names the global rank, the worker's exit code
(negative for a signal) and, when the worker wrote torch's error file (``@record``, or our
trainer's ``record_for_torchrun``), its traceback; otherwise the block says "To enable
traceback see: ...", and the exception is in the node's log, each line prefixed ``[rankN]: ``
by the hook ``init_process_group`` installs (torch 2.13: ``torch/distributed/elastic/
multiprocessing/errors/__init__.py`` ``_FAILURE_FORMAT_TEMPLATE``/``_MSG_FORMAT_TEMPLATE``,
``torch/distributed/distributed_c10d.py`` ``_distributed_excepthook``). torchrun without
``--redirects``/``--tee``, as we run it, passes the workers' output through unchanged; with
``--tee`` every worker line starts with ``[default<local rank>]:`` (``torch/distributed/
elastic/multiprocessing/tail_log.py`` ``TailLog.start``, the role's name, ``default`` unless
``--role``), which is set aside before the lines are read.
The node's exit code alone (1) hides which rank failed, and how.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

ROOT_CAUSE_HEADER = "Root Cause (first observed failure):"
_FIELD = re.compile(r"^\s*(time|rank|exitcode|traceback)\s*:\s?(.*)$")
_RANK = re.compile(r"^(-?\d+)(?:\s*\(local_rank:\s*(\d+)\))?")
_BORDER = re.compile(r"^(=+|-+)$")
_RANK_PREFIX = re.compile(r"^\[rank(\d+)\]: ?(.*)$")
#: torchrun ``--tee``'s tag of a worker's line: its local rank, under the default role.
_TEE_PREFIX = re.compile(r"^\[default(\d+)\]:(.*)$")
TRACEBACK_HEADER = "Traceback (most recent call last):"
#: Python's lines between the tracebacks of a chained exception.
_CHAIN_LINES = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
#: What the report's traceback says when the worker wrote no error file, or was signalled.
_NO_TRACEBACK = ("To enable traceback see:", "Signal ")
#: torchrun's own traceback ends with this exception line; it is never a worker's.
TORCHRUN_EXCEPTION = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
#: A rank that failed because another one went away says so (gloo: "Connection closed by
#: peer ... typically caused by a remote worker crashing"): a consequence, not the cause.
_PEER_GONE = ("closed by peer", "reset by peer", "remote worker crashing", "Broken pipe")
#: Bytes read from the end of each node's log to find its report and the rank's traceback.
TAIL_BYTES = 256 * 1024


def describe_code(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


@dataclass(frozen=True)
class RankFailure:
    """The root cause of one torchrun report: which rank failed, how, and with what."""

    rank: int | None
    local_rank: int | None
    #: None for a rank known only by the exception it printed (no report of its node).
    exit_code: int | None
    #: torchrun's "YYYY-MM-DD_HH:MM:SS" (ordered as text); "" when missing.
    time: str = ""
    #: The worker's exception line ("RuntimeError: boom"); "" when none was found.
    exception: str = ""

    @property
    def consequence(self) -> bool:
        """Failed because a peer went away (or was stopped by SIGTERM), not by itself."""
        return self.exit_code == -signal.SIGTERM.value or any(
            marker in self.exception for marker in _PEER_GONE
        )

    def describe(self) -> str:
        """E.g. "[rank 2] RuntimeError: boom", "[rank 1] was killed by signal SIGKILL"."""
        where = "[a worker]" if self.rank is None else f"[rank {self.rank}]"
        how = describe_code(self.exit_code) if self.exit_code is not None else "failed"
        return f"{where} {self.exception or how}"


def rank_tags(line: str) -> tuple[int | None, int | None, str]:
    """(the local rank torchrun ``--tee``'s tag names, the global rank torch's excepthook tag
    names, the text after them) of a node's log line; None for a tag the line does not carry
    (a line with neither is torchrun's own, or a worker's untagged output)."""
    local = None
    if tee := _TEE_PREFIX.match(line):
        local, line = int(tee.group(1)), tee.group(2)
    if hook := _RANK_PREFIX.match(line):
        return local, int(hook.group(1)), hook.group(2)
    return local, None, line


def _untee(lines: Iterable[str]) -> list[str]:
    """The lines without torchrun ``--tee``'s tag, as torchrun prints them without it."""
    return [_TEE_PREFIX.sub(r"\2", line, count=1) for line in lines]


def exception_line(traceback_lines: Sequence[str]) -> str:
    """The exception line of the last Python traceback in ``traceback_lines``: the first
    unindented line after its last "Traceback (most recent call last):" (frames are
    indented; a chained exception has a header of its own)."""
    starts = [i for i, line in enumerate(traceback_lines) if line.startswith(TRACEBACK_HEADER)]
    end = _exception_index(traceback_lines, starts[-1]) if starts else None
    return "" if end is None else traceback_lines[end].strip()


def torchrun_failure(lines: Iterable[str]) -> RankFailure | None:
    """The root cause of the last torchrun report in ``lines`` (a node's log), with the
    worker's exception from the report's traceback or else from the rank's ``[rankN]:``
    lines; None when there is no report."""
    lines = _untee(lines)
    header = max((i for i, line in enumerate(lines) if ROOT_CAUSE_HEADER in line), default=None)
    if header is None:
        return None
    fields: dict[str, str] = {}
    traceback: list[str] = []
    for line in lines[header + 1 :]:
        if _BORDER.match(line.strip()):
            break
        if "traceback" in fields:
            traceback.append(line[2:])  # torch indents the traceback's lines by two more
        elif match := _FIELD.match(line):
            fields[match.group(1)] = match.group(2).strip()
            if match.group(1) == "traceback":
                traceback.append(match.group(2))
    rank_match = _RANK.match(fields.get("rank", ""))
    code_match = _RANK.match(fields.get("exitcode", ""))
    if code_match is None:
        return None
    rank = int(rank_match.group(1)) if rank_match else None
    local_rank = int(rank_match.group(2)) if rank_match and rank_match.group(2) else None
    exception = _reported_exception(traceback) or (
        rank_exception(lines[:header], rank) if rank is not None else ""
    )
    return RankFailure(
        rank, local_rank, int(code_match.group(1)), fields.get("time", ""), exception
    )


def _reported_exception(traceback: list[str]) -> str:
    """The exception in a report's traceback field: a traceback's exception line, or the one
    line a worker recorded; "" when torch says there is none."""
    if not traceback or traceback[0].startswith(_NO_TRACEBACK):
        return ""
    if traceback[0].startswith(TRACEBACK_HEADER):
        return exception_line(traceback)
    return traceback[0].strip()


def rank_exception(lines: Sequence[str], rank: int) -> str:
    """The exception global ``rank`` printed (its ``[rankN]:`` lines), else that of the last
    unprefixed traceback (a worker that failed before joining the process group), never
    torchrun's own."""
    if found := _prefixed_exception(lines, rank):
        return found
    plain = [line for line in lines if not _RANK_PREFIX.match(line)]
    starts = [i for i, line in enumerate(plain) if line.startswith(TRACEBACK_HEADER)]
    for start, end in reversed(list(pairwise([*starts, len(plain)]))):
        found = exception_line(plain[start:end])
        if found and not found.startswith(TORCHRUN_EXCEPTION):
            return found
    return ""


def _prefixed_exception(lines: Sequence[str], rank: int) -> str:
    own = [
        m.group(2) for line in lines if (m := _RANK_PREFIX.match(line)) and m.group(1) == str(rank)
    ]
    return exception_line(own)


def _failure_without_report(
    node_logs: Mapping[int, Sequence[str]],
) -> tuple[int, RankFailure] | None:
    """The first rank, by node then rank, whose ``[rankN]:`` exception is its own (not a
    peer going away): a node whose rank failed first can be stopped, because another node
    exited first, before its torchrun printed a report."""
    for node, lines in sorted(node_logs.items()):
        ranks = {int(m.group(1)) for line in lines if (m := _RANK_PREFIX.match(line))}
        for rank in sorted(ranks):
            failure = RankFailure(rank, None, None, exception=_prefixed_exception(lines, rank))
            if failure.exception and not failure.consequence:
                return node, failure
    return None


def first_failure(node_logs: Mapping[int, Sequence[str]]) -> tuple[int, RankFailure] | None:
    """(node, root cause) of the rank that failed first across the nodes' logs: a rank's own
    failure before one caused by a peer going away, then the earliest report (torchrun's time
    has one-second steps), then the lower node; a rank's own exception in a log without a
    report before a report of a consequence. Every node's torchrun reports its own first
    failure; the node that exits first is not always the one whose rank failed first (a rank
    blocked in a collective fails as soon as its peer's connection closes)."""
    node_logs = {node: _untee(lines) for node, lines in node_logs.items()}
    reports = [
        (node, failure)
        for node, lines in node_logs.items()
        if (failure := torchrun_failure(lines)) is not None
    ]
    best = min(
        reports, key=lambda item: (item[1].consequence, item[1].time or "~", item[0]), default=None
    )
    if best is None or best[1].consequence:
        return _failure_without_report(node_logs) or best
    return best


def root_cause(lines: Iterable[str]) -> str | None:
    """E.g. "rank 1 (local rank 0) was killed by signal SIGKILL", from the last report in
    ``lines``; None when there is no torchrun report."""
    failure = torchrun_failure(lines)
    if failure is None:
        return None
    where = "a worker"
    if failure.rank is not None:
        where = f"rank {failure.rank}"
        if failure.local_rank is not None:
            where += f" (local rank {failure.local_rank})"
    return f"{where} {describe_code(failure.exit_code)}"


def rank_traceback(lines: Sequence[str]) -> list[str]:
    """The failing rank's traceback in a node's log, its lines as written (tags included):
    that of the rank torchrun's last report names, from its ``[rankN]:`` lines (under
    ``--tee``, among its local rank's), else the last untagged traceback that is not
    torchrun's own (a worker that failed before ``init_process_group``, a program run
    without torchrun). A chained exception comes whole; [] when there is none."""
    failure = torchrun_failure(lines)
    tagged = [(i, *rank_tags(line)) for i, line in enumerate(lines)]
    if failure is not None and failure.local_rank is not None:
        if any(local is not None for _, local, _, _ in tagged):
            tagged = [tag for tag in tagged if tag[1] == failure.local_rank]
    if failure is not None and failure.rank is not None:
        own = [(i, text) for i, _, rank, text in tagged if rank == failure.rank]
        if found := _last_traceback([text for _, text in own]):
            return [lines[i] for i, _ in own[found[0] :]]  # the hook tags only tracebacks
    plain = [(i, text) for i, _, rank, text in tagged if rank is None]
    if found := _last_traceback([text for _, text in plain]):
        start, end = found
        return [lines[i] for i, _ in plain[start:end]]
    return []


def _exception_index(texts: Sequence[str], header: int) -> int | None:
    """Where the exception line of the traceback at ``header`` is: its first unindented
    line (frames are indented); None when the traceback was cut short."""
    return next(
        (
            n
            for n in range(header + 1, len(texts))
            if texts[n].strip() and not texts[n][0].isspace()
        ),
        None,
    )


def _last_traceback(texts: Sequence[str]) -> tuple[int, int] | None:
    """(start, end) of the last traceback in ``texts`` that is not torchrun's own, from the
    first traceback of its chain (Python joins them with "During handling of the above
    exception...") to its exception line; None when there is none."""
    headers = [n for n, text in enumerate(texts) if text.startswith(TRACEBACK_HEADER)]
    for later, header in reversed(list(enumerate(headers))):
        end = _exception_index(texts, header)
        if end is not None and texts[end].startswith(TORCHRUN_EXCEPTION):
            continue
        start = header
        for earlier in reversed(headers[:later]):
            between = [text.strip() for text in texts[earlier:start] if text.strip()]
            if not (between and between[-1] in _CHAIN_LINES):
                break
            start = earlier
        return start, len(texts) if end is None else end + 1
    return None
