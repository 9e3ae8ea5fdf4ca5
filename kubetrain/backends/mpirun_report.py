"""The failed rank in mpirun's output, so an mpi job's failure names the rank that failed.

mpirun (Open MPI 5's prterun) exits with the first failed rank's exit code and, when it stops
the other ranks because of it, prints which rank that was: "Process name:
[prterun-<host>-<pid>@1,<rank>]" then "Exit code: <n>", or, for a rank killed by a signal,
"process rank <rank> with PID <pid> on node <host> exited on signal <n>". When every rank has
ended by itself it prints no such report: the job then names no rank. On a cluster the launcher
pod's log is this output; locally the launcher's log is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from kubetrain.backends.torchrun_report import describe_code

#: The two reports, matched in the output's lines joined by spaces (prterun wraps its text
#: wherever the host's name and the PID put the line's end).
_EXITED = re.compile(r"Process name:\s*\[[^\]]*,(\d+)\]\s+Exit code:\s*(-?\d+)")
_SIGNALLED = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on\s+signal (\d+)")


@dataclass(frozen=True)
class MpirunFailure:
    """The first rank mpirun reports failed: its MPI rank, the node it stands for, and how."""

    rank: int
    node: int
    #: An exit code, or minus the signal that killed it (as ``Popen.returncode``).
    code: int

    def describe(self) -> str:
        return f"rank {self.rank} (node {self.node}) {describe_code(self.code)}"


def first_failure(lines: Iterable[str], procs_per_node: int) -> MpirunFailure | None:
    """The failed rank named by mpirun's report in ``lines`` (its output), or None."""
    text = " ".join(line.strip() for line in lines)
    found = [
        (match.start(), int(match.group(1)), sign * int(match.group(2)))
        for pattern, sign in ((_EXITED, 1), (_SIGNALLED, -1))
        for match in pattern.finditer(text)
    ]
    if not found:
        return None
    _, rank, code = min(found)
    return MpirunFailure(rank, rank // procs_per_node, code)
