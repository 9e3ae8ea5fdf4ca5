"""Where the local backend keeps a job on disk, and reading/writing its records.

``$KUBETRAIN_LOCAL_ROOT/<job>/`` (default root ``~/.kubetrain/local``) holds::

    job.json         the spec, the working directory it was launched from and the job's id
                     (in the environment of every process of the job: ``processes``)
    status.json      JobStatus, rewritten atomically by the supervisor on every change
    supervisor.json  the supervisor process that owns the nodes (its PID and the job's id)
    node-<i>.log     stdout+stderr of node i (``--launcher mpi``: node-0.log is mpirun's, with
                     every rank's output)
    hostfile         ``--launcher mpi``: the hostfile mpirun reads (``mpirun``)
    checkpoints/     the default checkpoint folder of the job
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from kubetrain import bounded_json
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


def read_record(path: Path) -> Any:
    """A JSON record of the job folder. Opened without blocking and read only when it is a
    regular file: a FIFO or a device put in its place would hang every reader
    (`kubetrain list` included); it is an OSError, as an unreadable record is."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path.name} is not a regular file")
        return bounded_json.loads(handle.read())


def read_status(job_dir: Path) -> JobStatus:
    """The job's status record; one that is not a JSON object is a ValueError, as malformed
    JSON is (a ``[]`` there broke all of `kubetrain list`)."""
    record = read_record(job_dir / "status.json")
    if not isinstance(record, dict):
        raise ValueError(f"status.json holds JSON {type(record).__name__}, not an object")
    return JobStatus.from_dict(record)


def recorded_nodes(job_dir: Path, field: str = "num_nodes") -> int | None:
    """``spec.num_nodes`` (or another count, ``min_nodes``) of ``job.json``, as launch wrote
    it; None when unreadable or absent."""
    try:
        nodes = read_record(job_dir / "job.json")["spec"].get(field)
    except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError):
        return None
    return nodes if isinstance(nodes, int) and not isinstance(nodes, bool) else None


def recorded_launcher(job_dir: Path) -> str:
    """``spec.launcher`` of ``job.json`` (torchrun when unreadable or absent)."""
    try:
        launcher = read_record(job_dir / "job.json")["spec"].get("launcher", "torchrun")
    except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError):
        return "torchrun"
    return launcher if isinstance(launcher, str) else "torchrun"


def write_status(job_dir: Path, status: JobStatus) -> None:
    atomic.write_json(job_dir / "status.json", status.to_dict())
