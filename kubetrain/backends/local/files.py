"""Where the local backend keeps a job on disk, and reading/writing its records.

``$KUBETRAIN_LOCAL_ROOT/<job>/`` (default root ``~/.kubetrain/local``) holds::

    job.json         the spec, the working directory it was launched from and the job's id
                     (in the environment of every process of the job: ``processes``)
    status.json      JobStatus, rewritten atomically by the supervisor on every change
    supervisor.json  the supervisor process that owns the nodes (its PID and the job's id)
    node-<i>.log     stdout+stderr of node i
    checkpoints/     the default checkpoint folder of the job
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kubetrain.backends.base import JobStatus
from kubetrain.storage import atomic

ROOT_ENV = "KUBETRAIN_LOCAL_ROOT"
#: Set (to anything but empty) while `kubetrain run` runs its steps: deleting a job then stops
#: its processes and keeps its folder, so a failed run's exit handler leaves the node logs the
#: run points to; the run removes the folder itself once the model is collected.
KEEP_FILES_ENV = "KUBETRAIN_LOCAL_KEEP_FILES"


def local_root() -> Path:
    return Path(os.environ.get(ROOT_ENV) or Path.home() / ".kubetrain" / "local")


def node_log(job_dir: Path, rank: int) -> Path:
    return job_dir / f"node-{rank}.log"


def read_status(job_dir: Path) -> JobStatus:
    return JobStatus.from_dict(json.loads((job_dir / "status.json").read_text()))


def write_status(job_dir: Path, status: JobStatus) -> None:
    atomic.write_json(job_dir / "status.json", status.to_dict())
