"""Rank 0's structured progress records: one log line each, so they travel wherever rank 0's
log goes (a local node's log file, a pod log read through the Kubernetes API) and `wait`,
`logs` and `kubetrain run` can draw a live display from them, whatever rank 0's stdout is.

A record is ``kubetrain-progress {json}``: a fixed word a person reading ``kubectl logs`` can
skip, then a JSON object readers parse. Readers ignore unknown keys, so fields can be added.
The word may follow a prefix (torchrun's ``--tee``/``--local-ranks-filter`` put
``[default0]:`` before each line), so it is searched for, not anchored.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, fields

from kubetrain import bounded_json

PREFIX = "kubetrain-progress "
#: How a line from whatever runs the nodes (the local supervisor, wait on a cluster) starts.
NOTICE = "kubetrain: "
#: An elastic job's membership as a notice states it: "1 of 1..2 nodes" (live of MIN..MAX).
_MEMBERSHIP = re.compile(r"\b(\d+) of (\d+)\.\.(\d+) nodes\b")


@dataclass(frozen=True)
class Progress:
    """Where training is: ``batch`` of ``batches`` in ``epoch`` of ``epochs``; ``step`` counts
    optimizer steps since the run began; ``loss`` is rank 0's mean training loss so far this
    epoch; ``samples_per_second`` is the whole job's rate this epoch (rank 0's times the world
    size); ``eta_seconds`` is the estimate to the end of the last epoch (None: not yet known);
    ``heartbeat_seconds`` is the writer's promise that its next line comes within that many
    seconds (None: no promise, e.g. at an epoch's last batch, before validation and a
    checkpoint), from which `wait` derives how long a silence means a hung rank."""

    epoch: int
    epochs: int
    batch: int
    batches: int
    step: int
    loss: float
    samples_per_second: float
    eta_seconds: float | None = None
    heartbeat_seconds: float | None = None

    def fraction(self) -> float:
        """How much of the whole run is done, 0 to 1."""
        if self.epochs <= 0 or self.batches <= 0:
            return 0.0
        return min(1.0, ((self.epoch - 1) + self.batch / self.batches) / self.epochs)

    def describe(self) -> str:
        """The record as the plain line a log or a redirected `wait` shows."""
        eta = "" if self.eta_seconds is None else f" eta {format_seconds(self.eta_seconds)}"
        return (
            f"epoch {self.epoch}/{self.epochs} batch {self.batch}/{self.batches} "
            f"step {self.step} loss {self.loss:.4f} "
            f"samples/s {self.samples_per_second:.1f}{eta}"
        )


def format_seconds(seconds: float) -> str:
    """``1:02:03``, ``2:03`` or ``3s``: short, for a progress line."""
    whole = int(max(seconds, 0.0))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}" if minutes else f"{secs}s"


def format_record(progress: Progress) -> str:
    """The log line for ``progress`` (no newline); non-finite numbers become null (JSON has
    no NaN), so any reader parses every record."""
    values = {
        key: None if isinstance(value, float) and not math.isfinite(value) else value
        for key, value in asdict(progress).items()
    }
    return PREFIX + json.dumps(values, separators=(",", ":"))


def parse_record(line: str) -> Progress | None:
    """The record a log line holds, or None for any other line (a malformed record included,
    such as one with a number written as text: it is then shown as the plain line it is)."""
    start = line.find(PREFIX)
    if start < 0:
        return None
    try:
        values = bounded_json.loads(line[start + len(PREFIX) :])
        known = {f.name for f in fields(Progress)}
        values = {k: v for k, v in values.items() if k in known}
        for measured in ("loss", "samples_per_second"):  # a diverged run's NaN came as null
            if values.get(measured, 0) is None:
                values[measured] = math.nan
        progress = Progress(**values)
    except (ValueError, TypeError, AttributeError):
        return None
    whole = (progress.epoch, progress.epochs, progress.batch, progress.batches, progress.step)
    measured = (progress.loss, progress.samples_per_second)
    if not all(_is_whole(v) for v in whole) or not all(_is_number(v) for v in measured):
        return None
    if progress.eta_seconds is not None and not _is_number(progress.eta_seconds):
        return None
    heartbeat = progress.heartbeat_seconds
    if heartbeat is not None and not (_is_number(heartbeat) and 0 < heartbeat < math.inf):
        return None
    return progress


def _is_whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def node_range(min_nodes: int, max_nodes: int) -> str:
    """An elastic job's nodes as status, list and notices show them: "1..2"."""
    return f"{min_nodes}..{max_nodes}"


def membership(live_nodes: int, nodes: str) -> str:
    """An elastic job's membership: "1 of 1..2 nodes" (nodes training now, of ``nodes``, its
    ``node_range``)."""
    return f"{live_nodes} of {nodes} nodes"


def parse_membership(line: str) -> str | None:
    """The membership a notice about an elastic job's nodes states (``NOTICE`` then e.g.
    "node 1 lost (killed by SIGKILL); continuing with 1 of 1..2 nodes"), or None for any
    other line: the live display keeps the latest in view."""
    text = line.strip()
    if not text.startswith(NOTICE):
        return None
    found = _MEMBERSHIP.findall(text)
    if not found:
        return None
    live, low, high = found[-1]
    return membership(int(live), node_range(int(low), int(high)))
