"""Atomic publishing: write to a temporary path, fsync, rename, so readers never see half a file."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename or a new entry in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (same-directory temp file, fsync, rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
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
    return Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))


def publish_dir(staged: str | os.PathLike[str], final: str | os.PathLike[str]) -> Path:
    """fsync a fully written staging folder and rename it to ``final`` (replacing an old one)."""
    staged, target = Path(staged), Path(final)
    fsync_tree(staged)
    if target.exists():
        retired = target.with_name(f".old-{target.name}-{os.getpid()}")
        os.replace(target, retired)
        os.replace(staged, target)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(staged, target)
    fsync_dir(target.parent)
    return target
