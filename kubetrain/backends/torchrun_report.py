"""The root cause in torchrun's failure report, so a failed job names the rank and signal.

When a worker dies, torchrun itself exits 1 and prints a ``ChildFailedError`` report whose
"Root Cause (first observed failure)" block names the global rank and the worker's exit code
(negative for a signal). The node's exit code alone (1) hides that a rank was SIGKILLed.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable

ROOT_CAUSE_HEADER = "Root Cause (first observed failure):"
_FIELD = re.compile(r"^\s*(rank|exitcode)\s*:\s*(-?\d+)(?:\s*\(local_rank:\s*(\d+)\))?")


def describe_code(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def root_cause(lines: Iterable[str]) -> str | None:
    """E.g. "rank 1 (local rank 0) was killed by signal SIGKILL", from the last report in
    ``lines``; None when there is no torchrun report."""
    fields: dict[str, tuple[int, str | None]] | None = None
    for line in lines:
        if ROOT_CAUSE_HEADER in line:
            fields = {}
        elif fields is not None and (match := _FIELD.match(line)):
            fields.setdefault(match.group(1), (int(match.group(2)), match.group(3)))
    if not fields or "exitcode" not in fields:
        return None
    where = "a worker"
    if "rank" in fields:
        rank, local_rank = fields["rank"]
        where = f"rank {rank}" + (f" (local rank {local_rank})" if local_rank is not None else "")
    return f"{where} {describe_code(fields['exitcode'][0])}"
