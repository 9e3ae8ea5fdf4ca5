"""Atomic publishing: write to a temporary path, fsync, rename, so readers never see half a file.

What is published gets its mode from the umask, as a plain ``open``/``mkdir`` would (mkstemp
and mkdtemp create 0600/0700, which another uid on a shared volume, e.g. a serving pod, could
not read), and a folder replaced in place is swapped with ``renameat2(RENAME_EXCHANGE)`` so
that the target never goes missing for a reader.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename or a new entry in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process umask, read without changing it where the kernel tells it (Linux 4.7+:
    ``Umask:`` in /proc/self/status), so no other thread creates a file under a zero umask."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode ``open(path, "w")`` would give a new file."""
    return 0o666 & ~current_umask()


def folder_mode() -> int:
    """The mode ``mkdir`` would give a new folder."""
    return 0o777 & ~current_umask()


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (same-directory temp file, fsync, rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, file_mode())  # mkstemp's 0600 would hide it from other users
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    write_bytes(path, text.encode())


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def open_to_umask(root: str | os.PathLike[str]) -> None:
    """Give every folder and file under ``root`` (itself included) the mode the umask gives a
    new one: some writers create theirs 0600 (safetensors' ``save_file``, mkstemp, mkdtemp),
    which another uid on a shared volume could not read once published."""
    folders, files = folder_mode(), file_mode()
    os.chmod(root, folders)
    for folder, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            path = os.path.join(folder, name)
            if not os.path.islink(path):  # a link's mode is its target's: left alone
                os.chmod(path, folders if name in dirs else files)


def fsync_tree(root: str | os.PathLike[str]) -> None:
    """fsync every file and folder under ``root`` (bottom-up), before it is published."""
    for folder, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(folder)


def staging_dir(final: str | os.PathLike[str]) -> Path:
    """A fresh hidden folder beside ``final`` to build it in; readers ignore dot-folders."""
    target = Path(final)
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent)
    os.chmod(staged, folder_mode())  # mkdtemp's 0700 would hide the published folder
    return Path(staged)


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _load_renameat2() -> Any:
    """glibc's ``renameat2`` (2.28+), or None where there is none (macOS, musl, old glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        function = libc.renameat2
    except (OSError, AttributeError):
        return None
    path, fd = ctypes.c_char_p, ctypes.c_int
    function.argtypes = [fd, path, fd, path, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_renameat2 = _load_renameat2()


def exchange(first: str | os.PathLike[str], second: str | os.PathLike[str]) -> bool:
    """Swap two existing paths in one step (``renameat2(RENAME_EXCHANGE)``); False where the
    kernel, the filesystem or the C library cannot, so the caller falls back to renames."""
    if _renameat2 is None:
        return False
    result = _renameat2(
        _AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE
    )
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), os.fspath(first), None, os.fspath(second))


def publish_dir(staged: str | os.PathLike[str], final: str | os.PathLike[str]) -> Path:
    """fsync a fully written staging folder and rename it to ``final``. An old ``final`` is
    swapped out in one step where the kernel can (readers see the old or the new folder, never
    none), else renamed aside first; then it is removed."""
    staged, target = Path(staged), Path(final)
    open_to_umask(staged)
    fsync_tree(staged)
    if target.is_dir() and not target.is_symlink() and exchange(staged, target):
        shutil.rmtree(staged, ignore_errors=True)  # now holds the retired folder
    elif target.exists():
        retired = target.with_name(f".old-{target.name}-{uuid.uuid4().hex}")
        os.replace(target, retired)
        os.replace(staged, target)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(staged, target)
    fsync_dir(target.parent)
    return target


def publish_new_dir(staged: str | os.PathLike[str], final: str | os.PathLike[str]) -> bool:
    """fsync a fully written staging folder and rename it to ``final`` only where no folder
    with entries is (a plain rename never replaces one): False, and ``staged`` left to its
    caller, when one is there already, even one that appeared a moment ago."""
    staged, target = Path(staged), Path(final)
    fsync_tree(staged)
    try:
        os.rename(staged, target)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        raise
    fsync_dir(target.parent)
    return True
