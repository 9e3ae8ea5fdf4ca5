"""Which processes belong to a local job, and stopping every one of them.

Each local job has an identity (a random id in ``job.json``) that its supervisor is started
with in ``JOB_ID_ENV``; the nodes and everything they start inherit it. torchrun starts its
workers in sessions of their own (``torch.distributed.elastic.multiprocessing``'s
``SubprocessHandler`` passes ``start_new_session=True``), so a signal to a node's process
group does not reach them: the environment marker does, wherever a process moved. A process
started with an empty environment carries no identity: the supervisor, a child subreaper
(``kubetrain.backends.owned_processes``), finds it among its descendants instead.

A process is taken for the job's only if its environment carries the job's id, and psutil
signals a ``Process`` only while its PID still names the process it found, so a reused PID is
never signalled.
"""

from __future__ import annotations

import os
import time

import psutil

from kubetrain.backends.owned_processes import JOB_ID_ENV, stop_rounds

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
    deadline = time.monotonic() + grace_seconds
    return stop_rounds(lambda: marked_processes(marker, value), deadline)


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
