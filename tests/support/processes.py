"""Process trees read from /proc, so fault tests can kill one torchrun worker and then check
that no process of a job is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def supervisor_pid(job_dir: Path) -> int:
    """The PID of a local job's supervisor (``local.SUPERVISOR_FILE``)."""
    return int(json.loads((job_dir / "supervisor.json").read_text())["pid"])


def parent_pids() -> dict[int, int]:
    """pid → parent pid of every process visible in /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended while we looked
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``, children first."""
    parents = parent_pids()
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found.extend(children)
        frontier = children
    return [p for p in found if process_alive(p)]


def wait_for_descendants(pid: int, count: int, timeout: float) -> list[int]:
    """The descendants of ``pid`` once there are at least ``count`` of them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(found := descendants(pid)) >= count:
            return found
        time.sleep(0.05)
    raise TimeoutError(f"process {pid} did not get {count} descendants in {timeout:g}s")


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if process_alive(pid)]


def kill(pid: int, signum: int = signal.SIGKILL) -> float:
    """Send ``signum`` to ``pid``; the monotonic time it was sent."""
    os.kill(pid, signum)
    return time.monotonic()


def run_kubetrain(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """``python -m kubetrain ARGS`` as a user runs it, output captured (``env`` on top of
    this process's)."""
    return subprocess.run(
        [sys.executable, "-m", "kubetrain", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def kubetrain_in_process(args: list[Any], capsys: Any) -> tuple[int, str, str]:
    """``kubetrain ARGS`` in this process, as the console script runs it: (exit code, stdout,
    stderr without warning lines)."""
    from kubetrain.cli import main

    try:
        code = main([str(a) for a in args])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    out, err = capsys.readouterr()
    err = "\n".join(line for line in err.splitlines() if "Warning" not in line)
    return code or 0, out, err
