"""Whether files are still being written: the one rule collect applies to every checkpoint a
script wrote, whatever its format, before reading it.

A file is taken only when

- its size, modification time and inode held still for :data:`GRACE_SECONDS` (a file last
  modified longer ago held still that long already; a younger one is watched until it is that
  old), and
- no process holds it open for writing, nor maps it writable: a file preallocated to its full
  size (``fallocate``, ``truncate``) and then written in place keeps its size, and a writer
  pausing between tensors keeps its time, but its writer still holds it open.

The writers are found where Linux shows them (``/proc/<pid>/fd`` and ``fdinfo`` for the open
mode, as ``psutil.Process.open_files()`` reads them; ``/proc/<pid>/maps`` for shared writable
mappings), for every process whose entries this one may read: its own user's, or all as root.
A writer in another container or on another node of a shared volume is not visible; there the
grace is what holds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

#: How long a file's size and modification time must hold still before it is taken.
GRACE_SECONDS = 2.0
#: The access mode bits of ``fdinfo``'s ``flags`` (octal): O_WRONLY 1, O_RDWR 2.
_ACCESS_MODE = 0o3


def unsettled(paths: Sequence[Path], grace: float | None = None) -> str | None:
    """Why ``paths`` are not to be taken yet (one clause naming the file), or None once none
    changed for ``grace`` seconds (:data:`GRACE_SECONDS` if None) and none is open for
    writing. Waits at most ``grace`` seconds, only for a file modified within it."""
    grace = GRACE_SECONDS if grace is None else grace
    before = _looks(paths)
    youngest = max((mtime for _size, mtime, _ino in before.values()), default=0)
    wait = grace - (time.time() - youngest / 1e9)
    if wait > 0:
        time.sleep(min(wait, grace))
    after = _looks(paths)
    for path in paths:
        if after[path] != before[path]:
            return f"{path.name} changed (size or modification time) within {grace:g} s"
    writers = writers_of(paths)
    for path in paths:
        if path in writers:
            return f"{path.name} is open for writing by process {writers[path]}"
    return None


def _looks(paths: Sequence[Path]) -> dict[Path, tuple[int, int, int]]:
    looks = {}
    for path in paths:
        try:
            status = os.stat(path)
        except OSError:
            looks[path] = (-1, -1, -1)
        else:
            looks[path] = (status.st_size, status.st_mtime_ns, status.st_ino)
    return looks


def writers_of(paths: Sequence[Path]) -> dict[Path, int]:
    """Each of ``paths`` some readable process holds open for writing (or maps shared and
    writable), with that process's id; files are matched by device and inode, so a link or
    another mount's name for the same file counts."""
    wanted: dict[tuple[int, int], Path] = {}
    for path in paths:
        try:
            status = os.stat(path)
        except OSError:
            continue
        wanted[(status.st_dev, status.st_ino)] = path
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return {}  # no procfs (macOS): only the grace holds
    found: dict[Path, int] = {}
    for pid in pids:
        for key in _written_by(pid, wanted):
            found.setdefault(wanted[key], int(pid))
    return found


def _written_by(pid: str, wanted: dict[tuple[int, int], Path]) -> set[tuple[int, int]]:
    """The (device, inode) keys of ``wanted`` that process ``pid`` holds open for writing or
    maps shared and writable; none when its entries cannot be read (another user's, gone)."""
    written = set()
    fd_folder = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_folder)
    except OSError:
        return written
    for fd in fds:
        try:
            status = os.stat(f"{fd_folder}/{fd}")
        except OSError:
            continue
        key = (status.st_dev, status.st_ino)
        if key in wanted and key not in written and _open_for_writing(pid, fd):
            written.add(key)
    try:
        with open(f"/proc/{pid}/maps", encoding="ascii", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) < 5 or fields[1][1] != "w" or fields[1][3] != "s":
                    continue
                major, _, minor = fields[3].partition(":")
                key = (os.makedev(int(major, 16), int(minor, 16)), int(fields[4]))
                if key in wanted:
                    written.add(key)
    except (OSError, ValueError, IndexError):
        pass
    return written


def _open_for_writing(pid: str, fd: str) -> bool:
    """Whether descriptor ``fd`` of ``pid`` was opened write-only or read-write."""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}", encoding="ascii") as info:
            for line in info:
                if line.startswith("flags:"):
                    return bool(int(line.split()[1], 8) & _ACCESS_MODE)
    except (OSError, ValueError, IndexError):
        pass
    return False
