"""The local jobs under the local backend's root (``KUBETRAIN_LOCAL_ROOT``, default
``~/.kubetrain/local``), running and finished, for `kubetrain list`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from kubetrain.backends.base import JobRow
from kubetrain.backends.local.backend import LocalBackend
from kubetrain.errors import KubetrainError

#: A job folder whose status.json cannot be read (being replaced, or damaged).
UNKNOWN = "Unknown"


def list_local_jobs(root: str | os.PathLike[str] | None = None) -> list[JobRow]:
    """Every folder under the root holding a ``status.json``, by name. The state is what
    ``LocalBackend.status`` says, so a job whose supervisor died shows Failed, not Running."""
    backend = LocalBackend(root)
    if not backend.root.is_dir():
        return []
    now = time.time()
    rows = []
    for job_dir in sorted(backend.root.iterdir()):
        if not (job_dir / "status.json").is_file():
            continue
        try:
            status = backend.status(job_dir.name)
            state, created_at = status.state, status.created_at
        except (KubetrainError, OSError, ValueError, TypeError):  # a name or record not ours
            state, created_at = UNKNOWN, (job_dir / "status.json").stat().st_mtime
        rows.append(JobRow(job_dir.name, state, max(0.0, now - created_at), _nodes(job_dir)))
    return rows


def _nodes(job_dir: Path) -> int | None:
    """``spec.num_nodes`` of ``job.json``, as launch wrote it; None when unreadable."""
    try:
        nodes = json.loads((job_dir / "job.json").read_text())["spec"]["num_nodes"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return nodes if isinstance(nodes, int) and not isinstance(nodes, bool) else None
