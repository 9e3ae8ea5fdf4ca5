"""Reading a file a user names (a token, a script, a compiled package): a regular file of at
most a stated size, so ``--token-file /dev/zero`` or a FIFO is one line, not a hang or a
process that reads until memory runs out."""

from __future__ import annotations

import os
import stat

from kubetrain.errors import InvalidInput

MIB = 1024 * 1024
#: What a file that is not a regular one is, for the error line.
_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """What a file of ``os.stat`` mode ``mode`` that is not a regular file is, in words."""
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def check_regular_file(path: str | os.PathLike[str], field: str, limit: int, fix: str) -> int:
    """The size of ``path``, refusing what is not a regular file of at most ``limit`` bytes;
    for a file a library reads itself (a kubeconfig). ``stat`` never blocks, even on a FIFO."""
    try:
        status = os.stat(path)
    except OSError as exc:
        raise InvalidInput(field, f"cannot read {os.fspath(path)}: {exc.strerror}", fix) from None
    return _checked_size(path, status, field, limit, fix)


def read_user_file(path: str | os.PathLike[str], field: str, limit: int, fix: str) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes. Opened without
    blocking (a FIFO with no writer would hold ``open`` forever), checked on the open file (no
    swap between check and read), and read no further than ``limit + 1`` bytes (a file that
    grew)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise InvalidInput(field, f"cannot read {os.fspath(path)}: {exc.strerror}", fix) from None
    try:
        _checked_size(
            path, os.fstat(fd), field, limit, fix
        )  # before fdopen, which refuses a folder
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise InvalidInput(field, f"{os.fspath(path)} is more than {limit} bytes", fix)
    return data


def _checked_size(
    path: str | os.PathLike[str], status: os.stat_result, field: str, limit: int, fix: str
) -> int:
    if not stat.S_ISREG(status.st_mode):
        problem = f"{os.fspath(path)} is {file_kind(status.st_mode)}, not a regular file"
        raise InvalidInput(field, problem, fix)
    if status.st_size > limit:
        problem = f"{os.fspath(path)} is {status.st_size} bytes, more than {limit}"
        raise InvalidInput(field, problem, fix)
    return status.st_size
