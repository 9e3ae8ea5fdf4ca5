"""The local jobs under the local backend's root (``KUBETRAIN_LOCAL_ROOT``, default
``~/.kubetrain/local``), running and finished, for `kubetrain list`."""

from __future__ import annotations

import math
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from kubetrain.backends.base import RUNNING, JobRow, JobStatus
from kubetrain.backends.local.backend import LocalBackend
from kubetrain.backends.local.files import read_status, recorded_nodes
from kubetrain.errors import KubetrainError
from kubetrain.progress import node_range

#: A job folder whose status.json cannot be read (being replaced, or damaged).
UNKNOWN = "Unknown"


def list_local_jobs(
    root: str | os.PathLike[str] | None = None,
    on_unreadable: Callable[[str, str], None] | None = None,
) -> list[JobRow]:
    """Every folder under the root holding a regular ``status.json``, by name. The state is
    what ``LocalBackend.status`` says, so a job whose supervisor died shows Failed, not
    Running. A job whose records cannot be read (damaged, a field of the wrong type, a FIFO in
    place of a file) is listed Unknown and told to ``on_unreadable(name, why)``: one bad
    folder never hides the others."""
    backend = LocalBackend(root)
    if not backend.root.is_dir():
        return []
    now = time.time()
    rows = []
    for job_dir in sorted(backend.root.iterdir()):
        try:
            status_file = (job_dir / "status.json").stat()
        except OSError:
            continue
        if not stat.S_ISREG(status_file.st_mode):
            continue
        status = None
        try:
            _check_created_at(read_status(job_dir).created_at)
            status = backend.status(job_dir.name)
            state, created_at = status.state, status.created_at
        except (KubetrainError, OSError, ValueError, TypeError, RecursionError) as error:
            state, created_at = UNKNOWN, status_file.st_mtime
            if on_unreadable is not None:
                on_unreadable(job_dir.name, str(error) or type(error).__name__)
        rows.append(
            JobRow(job_dir.name, state, max(0.0, now - created_at), _nodes(job_dir, status))
        )
    return rows


def _nodes(job_dir: Path, status: JobStatus | None) -> int | str | None:
    """The NODES cell: the job's node count; for an elastic job its range ("1..2"), and
    while it runs the nodes training in it ("1 of 1..2")."""
    max_nodes, min_nodes = recorded_nodes(job_dir), recorded_nodes(job_dir, "min_nodes")
    if max_nodes is None or min_nodes is None:
        return max_nodes
    nodes = node_range(min_nodes, max_nodes)
    if status is not None and status.state == RUNNING and status.live_nodes is not None:
        return f"{status.live_nodes} of {nodes}"
    return nodes


def _check_created_at(created_at: object) -> None:
    """The job's age is computed from it: a text or an infinity would break the whole list."""
    if (
        isinstance(created_at, bool)
        or not isinstance(created_at, (int, float))
        or not math.isfinite(created_at)
    ):
        raise ValueError(f"status.json created_at is {created_at!r}, not a time in seconds")
