"""Peak memory of a command, measured the way `ru_maxrss` can be trusted: the command runs as
the child of a small launcher process whose ``getrusage(RUSAGE_CHILDREN)`` is read after the
command exits. Measured from a big parent (pytest, with torch and moto loaded) directly, Linux
folds the forking parent's own peak into the child's figure."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_LAUNCHER = (
    "import json, resource, subprocess, sys; "
    "done = subprocess.run(json.loads(sys.argv[1]), capture_output=True, text=True); "
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss; "
    "print(json.dumps([done.returncode, done.stdout, done.stderr, peak]))"
)


@dataclass(frozen=True)
class MeasuredRun:
    returncode: int
    stdout: str
    stderr: str
    peak_mib: float


def run_measuring_peak_memory(
    argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 600
) -> MeasuredRun:
    """Run ``argv`` (no shell) and return its output and peak resident memory in MiB."""
    launcher = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, json.dumps(list(argv))],
        capture_output=True,
        text=True,
        env=dict(env) if env is not None else None,
        timeout=timeout,
        check=True,
    )
    returncode, stdout, stderr, peak_kib = json.loads(launcher.stdout)
    return MeasuredRun(returncode, stdout, stderr, peak_kib / 1024)  # ru_maxrss: KiB on Linux
