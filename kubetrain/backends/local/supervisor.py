"""The process that plays Kubeflow Trainer for one local job.

It starts the job's command once per node with the PET_* environment the Trainer injects
(master address 127.0.0.1, a free port; `$(VAR)` references in the command expanded as the
kubelet does), records each node's exit code, and as soon as one node fails stops the others
and either starts every node again (up to ``spec.max_restarts`` times) or fails the job, as
JobSet's failure policy does; it stops every node when it is itself terminated. It owns the
job's processes (``owned_processes``): a child subreaper, so what a node leaves behind, even
without the job's identity in its environment, stays below it, and is stopped when the job
ends, Complete included, as a pod's processes end with its container. An elastic job
(``--nodes MIN:MAX``) is followed by ``elastic`` instead, as a PyTorchJob's elasticPolicy runs,
and a ``--launcher ray`` job by ``ray_engine``, as KubeRay runs a RayJob.
Run as ``python -m kubetrain.backends.local.supervisor DIR``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from kubetrain.backends import mpirun_report, owned_processes
from kubetrain.backends.base import COMPLETE, FAILED, RUNNING, JobStatus, NodeStatus
from kubetrain.backends.local import mpirun
from kubetrain.backends.local.env_references import expand_all
from kubetrain.backends.local.files import node_log, read_record, read_status, write_status
from kubetrain.backends.local.processes import JOB_ID_ENV, stop_job_processes
from kubetrain.backends.torchrun_report import TAIL_BYTES, describe_code, first_failure
from kubetrain.jobspec import TrainJobSpec
from kubetrain.names import JOB_NAME_ENV
from kubetrain.train.options import MPI_TRAINER_COMMAND, RAY_TRAINER_COMMAND, TRAINER_COMMAND

POLL_SECONDS = 0.05
GRACE_SECONDS = 5.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def program_path() -> str:
    """The PATH a user's program runs with: the caller's, so `python` and `torchrun` are the
    ones the caller's shell would run (their activated venv's), then this interpreter's
    folder, for a program found nowhere else. kubetrain's own programs are found by path
    (``with_our_interpreter``), never by putting its folder ahead of the caller's."""
    parts = [part for part in os.environ.get("PATH", "").split(os.pathsep) if part]
    ours = os.path.dirname(sys.executable)
    return os.pathsep.join(parts if ours in parts else [*parts, ours])


def with_our_interpreter(program: list[str]) -> list[str]:
    """Our trainer (``TRAINER_COMMAND``) started by this interpreter's torchrun, by path, one
    rank of it under mpi (``MPI_TRAINER_COMMAND``) and its Ray driver under ray
    (``RAY_TRAINER_COMMAND``) by this interpreter: the caller's PATH
    may hold another torchrun or python (a venv without kubetrain) or none, and on a cluster
    the image's is kubetrain's. Any other program is left to PATH."""
    if tuple(program[: len(TRAINER_COMMAND)]) == TRAINER_COMMAND:
        return [sys.executable, "-m", "torch.distributed.run", *program[1:]]
    for ours in (MPI_TRAINER_COMMAND, RAY_TRAINER_COMMAND):
        if tuple(program[: len(ours)]) == ours:
            return [sys.executable, *program[1:]]
    return program


def core_share(spec: TrainJobSpec) -> str:
    """Threads per training process when the nodes share this machine's cores.

    On a cluster each node pod has CPUs of its own. Here every process's OpenMP pool would
    otherwise take all cores, and N emulated nodes oversubscribe them N-fold: torchrun sets
    OMP_NUM_THREADS=1 only for several processes per node, not for one per node (10 epochs
    of digits, 2 nodes on 2 cores: 4x slower training).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return str(max(1, (cores or 1) // (spec.num_nodes * spec.procs_per_node)))


def base_env(spec: TrainJobSpec) -> dict[str, str]:
    """What every process of the job gets: its core share (unless set), ours, the spec's, and
    the job's identity (``processes``)."""
    return {
        "OMP_NUM_THREADS": core_share(spec),
        **os.environ,
        "PATH": program_path(),
        "PYTHONUNBUFFERED": "1",
        JOB_NAME_ENV: spec.name,
        **spec.env,
        JOB_ID_ENV: os.environ[JOB_ID_ENV],
    }


def node_env(spec: TrainJobSpec, rank: int, master_port: int) -> dict[str, str]:
    """The environment of one torchrun node: ``base_env`` and exactly the Trainer's PET_*."""
    return {
        **base_env(spec),
        "PET_NNODES": str(spec.num_nodes),
        "PET_NPROC_PER_NODE": str(spec.procs_per_node),
        "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(master_port),
    }


def launches(job_dir: Path, spec: TrainJobSpec) -> list[tuple[list[str], dict[str, str]]]:
    """(command, env) of each process the supervisor starts, one per node for torchrun (the
    job's command with the PET_* env, a fresh port each attempt, as new pods get); for mpi,
    one: the launcher's mpirun over this machine's hostfile (``mpirun``), whose output is
    every rank's, as the launcher pod's log is. The program's `$(VAR)`s are expanded."""
    program = with_our_interpreter([*spec.command, *spec.args])
    if spec.launcher == "mpi":
        hostfile = job_dir / mpirun.HOSTFILE
        hostfile.write_text(mpirun.hostfile_text(spec))
        # Pods have a network each, this machine one: a fresh rendezvous port per attempt for
        # ranks that read MASTER_ADDR/MASTER_PORT (ours; DeepSpeed's own MPI discovery
        # always takes 29500). The job's env wins.
        rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        env = {**rendezvous, **base_env(spec), **mpirun.launcher_env(hostfile, spec)}
        launcher = mpirun.mpirun_path()
        if launcher is None:  # launch checked it; removed since
            raise OSError(f"mpirun is not installed: {mpirun.MISSING_MPIRUN_FIX}")
        command = mpirun.launcher_command(launcher, hostfile, spec, expand_all(program, env))
        return [(command, env)]
    port = free_port()
    envs = [node_env(spec, rank, port) for rank in range(spec.num_nodes)]
    return [(expand_all(program, env), env) for env in envs]


def stop_nodes(processes: list[subprocess.Popen]) -> list[int]:
    """Stop every process of the job but this one, SIGKILL for those still running after a
    grace period: everything below this one (the nodes, the workers they started in sessions
    of their own, what they left behind with or without the job's identity), then any process
    of the job found elsewhere. Returns the PIDs stopped."""
    deadline = time.monotonic() + GRACE_SECONDS
    stopped = owned_processes.stop_descendants(
        GRACE_SECONDS, waited_by_caller=[proc.pid for proc in processes]
    )
    stopped += stop_job_processes(os.environ[JOB_ID_ENV], max(0.0, deadline - time.monotonic()))
    for proc in processes:
        proc.wait()
    return stopped


def supervise(job_dir: Path) -> JobStatus:
    record = read_record(job_dir / "job.json")
    spec = TrainJobSpec.from_dict(record["spec"])
    status = read_status(job_dir)
    stop_requested: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda sig, _frame: stop_requested.append(sig))
    owned_processes.become_owner()
    if spec.elastic:
        # Imported here: it builds on this module's helpers.
        from kubetrain.backends.local.elastic import supervise_elastic

        return supervise_elastic(job_dir, spec, record["cwd"], status, stop_requested)
    if spec.launcher == "ray":
        # Imported here: it builds on this module's helpers (and imports Ray when it runs).
        from kubetrain.backends.local.ray_engine import supervise_ray

        return supervise_ray(job_dir, spec, record["cwd"], status, stop_requested)

    while True:
        attempt_starts = [log_size(node_log(job_dir, rank)) for rank in range(log_count(spec))]
        processes = start_nodes(job_dir, spec, record["cwd"], status)
        if status.state == FAILED:
            return status
        state, reason, message = follow_nodes(status, processes, stop_requested)
        if state == COMPLETE:
            if left := stop_nodes(processes):  # the job ends whole, as its pods would
                print(f"stopped {len(left)} process(es) the job's programs left running")
            return finish(job_dir, status, COMPLETE, reason, message)
        stop_nodes(processes)
        record_exit_codes(status, processes)
        if reason == "NodeFailed":
            message = (
                name_failing_mpi_rank(job_dir, status, attempt_starts[0], spec.procs_per_node)
                if spec.launcher == "mpi"
                else name_failing_rank(job_dir, status, attempt_starts)
            ) or message
        if reason == "NodeFailed" and status.restarts < spec.max_restarts:
            # JobSet's failurePolicy: every node starts again (a torch job cannot go on with
            # one rank replaced); the trainer resumes from the newest checkpoint.
            status.restarts += 1
            for rank in range(log_count(spec)):
                with open(node_log(job_dir, rank), "a") as log:
                    log.write(
                        f"kubetrain: {message}; restart {status.restarts} of "
                        f"{spec.max_restarts}: starting every node again\n"
                    )
            continue
        return finish(job_dir, status, FAILED, reason, message)


def log_count(spec: TrainJobSpec) -> int:
    """The processes the supervisor starts, each with its log: the nodes, or mpi's launcher."""
    return 1 if spec.launcher == "mpi" else spec.num_nodes


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def name_failing_rank(job_dir: Path, status: JobStatus, attempt_starts: list[int]) -> str:
    """The failure message naming the rank that failed first and its exception, e.g. "node 1
    exited with code 1: [rank 2] RuntimeError: boom", read from this attempt's node logs
    (``torchrun_report.first_failure``); "" when they name nothing but a peer's going away.
    The node that exited first is not always the one whose rank failed first, so the job's
    failed node becomes the one whose torchrun reported that rank's failure."""
    node_logs = {}
    for node, start in zip(status.nodes, attempt_starts, strict=True):
        path = node_log(job_dir, node.rank)
        try:
            with open(path, "rb") as log:
                log.seek(max(start, log_size(path) - TAIL_BYTES))
                node_logs[node.rank] = log.read().decode(errors="replace").splitlines()
        except OSError:
            continue  # best effort: the failure is reported all the same
    found = first_failure(node_logs)
    if found is None:
        return ""
    rank, failure = found
    if failure.consequence:
        return ""  # no rank's own failure found: the node that exited first stays the cause
    if failure.exit_code is not None:  # from its node's report: that node failed by itself
        status.failed_rank = rank
    node = status.failed_node
    code = node.exit_code if node is not None and node.exit_code is not None else 1
    if node is not None and failure.exit_code is not None and code == -signal.SIGTERM:
        # Its rank had failed by itself, but another node exited first and we stopped this
        # one: its code is the one torchrun exits with for a failed worker, not our SIGTERM.
        node.exit_code = code = 1
    where = ": " if rank == status.failed_rank else f"; on node {rank}: "
    return f"node {status.failed_rank} {describe_code(code)}{where}{failure.describe()}"


def name_failing_mpi_rank(
    job_dir: Path, status: JobStatus, attempt_start: int, procs_per_node: int
) -> str:
    """The failure message of an mpi job, naming the rank mpirun reports failed first in this
    attempt's launcher log (``mpirun_report``), e.g. "launcher exited with code 1: rank 2
    (node 1) exited with code 1"; "" when it names none (every rank ended by itself, or
    mpirun itself failed: its own message is in the log)."""
    path = node_log(job_dir, 0)
    try:
        with open(path, "rb") as log:
            log.seek(max(attempt_start, log_size(path) - TAIL_BYTES))
            lines = log.read().decode(errors="replace").splitlines()
    except OSError:
        return ""  # best effort: the failure is reported all the same
    found = mpirun_report.first_failure(lines, procs_per_node)
    launcher = status.nodes[0] if status.nodes else None
    if found is None or launcher is None or launcher.exit_code is None:
        return ""
    return f"launcher {describe_code(launcher.exit_code)}: {found.describe()}"


def start_nodes(
    job_dir: Path, spec: TrainJobSpec, cwd: str, status: JobStatus
) -> list[subprocess.Popen]:
    """Start every process of the job (``launches``); on a start error the job is recorded
    Failed and the processes already started are stopped."""
    processes: list[subprocess.Popen] = []
    # The nodes run in the job's folder; launch gave the program file it names in the launch
    # folder (`torchrun train.py`) by its path, and its arguments as they were typed.
    run_in = spec.working_dir or cwd
    try:
        planned = launches(job_dir, spec)
    except OSError as exc:
        return start_failed(job_dir, spec, status, processes, exc)
    for rank, (command, env) in enumerate(planned):
        try:
            processes.append(start_node(job_dir, spec, run_in, rank, command, env))
        except OSError as exc:
            return start_failed(job_dir, spec, status, processes, exc)
    status.state, status.failed_rank = RUNNING, None
    status.started_at = status.started_at or time.time()
    status.nodes = [
        NodeStatus(rank=r, pid=p.pid, log=node_log(job_dir, r).name)
        for r, p in enumerate(processes)
    ]
    write_status(job_dir, status)
    return processes


def start_node(
    job_dir: Path,
    spec: TrainJobSpec,
    run_in: str,
    rank: int,
    command: list[str],
    env: dict[str, str],
) -> subprocess.Popen:
    """Start node ``rank``'s process (the job's own, in ``owned_processes``' sense), its
    output appended to its log."""
    if spec.working_dir:
        Path(spec.working_dir).mkdir(parents=True, exist_ok=True)
    with open(node_log(job_dir, rank), "ab") as log:
        return owned_processes.start(
            command,
            env=env,
            cwd=run_in,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def start_failed(
    job_dir: Path,
    spec: TrainJobSpec,
    status: JobStatus,
    processes: list[subprocess.Popen],
    error: OSError,
) -> list[subprocess.Popen]:
    """Record the job Failed (StartError) for the process that could not start, said in its
    log too, and stop the ones already started."""
    rank = len(processes)
    stop_nodes(processes)
    status.failed_rank = rank
    finish(job_dir, status, FAILED, "StartError", start_error(job_dir, spec, rank, error))
    return processes


def start_error(job_dir: Path, spec: TrainJobSpec, rank: int, error: OSError) -> str:
    """Why node ``rank`` did not start, written to its log; returns the job's message."""
    with open(node_log(job_dir, rank), "ab") as log:
        log.write(f"cannot start {spec.command[0]}: {error}\n".encode())
    return f"node {rank} could not start {spec.command[0]}: {error}"


def follow_nodes(
    status: JobStatus, processes: list[subprocess.Popen], stop_requested: list[int]
) -> tuple[str, str, str]:
    """Poll the nodes until all exit 0, one fails, or we are told to stop: (state, reason,
    message)."""
    while True:
        if stop_requested:
            return FAILED, "Stopped", f"stopped by {signal.Signals(stop_requested[0]).name}"
        for node, proc in zip(status.nodes, processes, strict=True):
            code = proc.poll()
            if code is not None and node.exit_code is None:
                node.exit_code = code
                if code != 0:
                    status.failed_rank = node.rank
                    return FAILED, "NodeFailed", f"node {node.rank} {describe_code(code)}"
        if all(node.exit_code == 0 for node in status.nodes):
            return COMPLETE, "Completed", "all nodes exited with code 0"
        time.sleep(POLL_SECONDS)


def record_exit_codes(status: JobStatus, processes: list[subprocess.Popen]) -> None:
    for node, proc in zip(status.nodes, processes, strict=True):
        if node.exit_code is None:
            node.exit_code = proc.wait()


def finish(job_dir: Path, status: JobStatus, state: str, reason: str, message: str) -> JobStatus:
    status.state, status.reason, status.message = state, reason, message
    status.finished_at = time.time()
    write_status(job_dir, status)
    return status


def main(argv: list[str]) -> int:
    status = supervise(Path(argv[0]))
    return 0 if status.state == COMPLETE else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
