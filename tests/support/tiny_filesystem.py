"""A full disk on demand: a small tmpfs mounted in a private user+mount namespace (no root
needed, and the mount disappears with the namespace), for "no space left" tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# Mounts the tmpfs, then runs the Python program given after it (argv is passed through
# as data: "$@", never pasted into this line).
_MOUNT_THEN_RUN = 'mount -t tmpfs -o size="$0" tmpfs "$1" && shift && exec "$@"'


def tiny_filesystem_available(mount_point: Path) -> bool:
    """Whether an unprivileged user+mount namespace may mount a tmpfs here (most Linux hosts)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-Urm", "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
        capture_output=True,
    )
    return probe.returncode == 0


def run_python_on_tiny_filesystem(
    mount_point: Path, size: str, args: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` with a ``size`` tmpfs (e.g. "1m") mounted at ``mount_point``."""
    return subprocess.run(
        ["unshare", "-Urm", "sh", "-c", _MOUNT_THEN_RUN, size, str(mount_point),
         sys.executable, *args],
        capture_output=True,
        text=True,
        env=env if env is not None else dict(os.environ),
        timeout=300,
    )  # fmt: skip
