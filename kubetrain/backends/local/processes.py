"""Which processes belong to a local job, and stopping every one of them.

Each local job has an identity (a random id in ``job.json``) that its supervisor is started
with in ``JOB_ID_ENV``; the nodes and everything they start inherit it. torchrun starts its
workers in sessions of their own (``torch.distributed.elastic.multiprocessing``'s
``SubprocessHandler`` passes ``start_new_session=True``), so a signal to a node's process
group does not reach them: the environment marker does, wherever a process moved.

A process is taken for the job's only if its environment carries the job's id, and psutil
signals a ``Process`` only while its PID still names the process it found, so a reused PID is
never signalled.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil

#: The job's identity, in the environment of every process of a local job.
JOB_ID_ENV = "KUBETRAIN_LOCAL_JOB_ID"
#: After SIGKILL, how long to wait for the kernel to take the processes away.
KILL_WAIT_SECONDS = 5.0
#: Rounds of stopping: a process may start another while being stopped, but not for ever.
MAX_STOP_ROUNDS = 10
POLL_SECONDS = 0.05
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess)


def marked_processes(marker: str, value: str) -> list[psutil.Process]:
    """The live processes whose environment has ``marker=value`` (this process excluded)."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(marker) == value and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (*_GONE, psutil.AccessDenied):
            continue  # ended while we looked, or another user's: not ours
    return found


def stop_job_processes(job_id: str, grace_seconds: float) -> list[int]:
    """Stop every process of the local job ``job_id`` (``stop_marked_processes``)."""
    return stop_marked_processes(JOB_ID_ENV, job_id, grace_seconds)


def stop_marked_processes(marker: str, value: str, grace_seconds: float) -> list[int]:
    """SIGTERM every process marked ``marker=value``, SIGKILL those still running after
    ``grace_seconds``; repeated while new ones appear (a process may start another while being
    stopped). Returns the PIDs that were stopped. Children of the caller are not reaped
    (``Popen.wait`` still gets their exit codes)."""
    stopped: list[int] = []
    deadline = time.monotonic() + grace_seconds
    for _ in range(MAX_STOP_ROUNDS):
        processes = marked_processes(marker, value)
        if not processes:
            break
        stopped.extend(proc.pid for proc in processes)
        for proc in processes:
            _send(proc, psutil.Process.terminate)
        running = still_running(processes, deadline - time.monotonic())
        for proc in running:
            _send(proc, psutil.Process.kill)
        still_running(running, KILL_WAIT_SECONDS)
    return stopped


def _send(proc: psutil.Process, action: Callable[[psutil.Process], None]) -> None:
    try:
        action(proc)
    except _GONE:
        pass


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except _GONE:
        return False


def still_running(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of ``processes`` still running once all have ended or ``timeout`` passed
    (polled, not ``psutil.wait_procs``, which would reap the caller's own children)."""
    deadline = time.monotonic() + timeout
    while (running := [p for p in processes if _running(p)]) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    return running


def marked_process(pid: object, marker: str, value: str) -> psutil.Process | None:
    """The process ``pid`` if it runs with ``marker=value`` in its environment, else None (gone,
    a zombie, someone else's, or a PID the kernel has since given to another process).

    The environment, not the create time, proves a PID is still ours: psutil derives create
    times from the boot time, which moves when the clock is stepped (NTP, a resumed VM)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(marker) == value:
            return proc
    except (*_GONE, psutil.AccessDenied):
        pass
    return None
