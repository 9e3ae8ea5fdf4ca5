"""The rule for every file a checkpoint reader opens: a regular file inside the checkpoint
folder (the manifest rule), records read bounded, and files that must not change while read."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from kubetrain.artifacts.manifest import MAX_RECORD_BYTES, local_entry_problem, name_problem, shown
from kubetrain.errors import IntegrityError


class UnreadableCheckpoint(IntegrityError):
    """A checkpoint file that cannot be read as its format: corrupt, or caught mid-write by a
    writer pausing longer than the settling check (collect then watches it for changes)."""


def held_to_rule(root: Path, relative: str) -> Path:
    """``root/relative`` once it is a regular file inside ``root`` (refused unread, in one
    line naming it, when it is a link out, a device, a FIFO or a folder)."""
    problem = name_problem(relative) or local_entry_problem(root, relative)
    path = root / relative
    if problem is not None:
        raise IntegrityError(
            f"checkpoint file {path} {problem}; refused unread: collect only regular files "
            "inside --checkpoint-dir"
        )
    if not path.exists():
        raise UnreadableCheckpoint(
            f"checkpoint file {path} is missing; check the training job's logs"
        )
    return path


def check_listed(folder: Path, entry: object, listed: str) -> None:
    """A file an index or DCP's metadata names: a relative name of a regular file inside the
    index's own folder (the manifest rule), else refused before anything is opened."""
    problem = name_problem(entry)
    if problem is None:
        problem = local_entry_problem(folder, str(entry))
    if problem is not None:
        raise IntegrityError(
            f"{listed} {shown(entry)}, which {problem}; refused unread (an index names only "
            "regular files inside its own folder): save the checkpoint again with every file "
            "beside its index"
        )


def read_record(path: Path) -> bytes:
    """A record (an index, DCP's metadata) read bounded by MAX_RECORD_BYTES."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise IntegrityError(
            f"checkpoint file {path} is over {MAX_RECORD_BYTES >> 20} MiB, more than any index "
            "or metadata of a checkpoint; refused unread: save the checkpoint again, or "
            "collect another with --checkpoint-file"
        )
    return data


def snapshot(root: Path, files: Iterable[str]) -> dict[str, tuple[int, int, int]]:
    """Size, time and inode of each file: compared after reading, a change fails the step."""
    found = {}
    for name in files:
        status = os.stat(root / name)
        found[name] = (status.st_size, status.st_mtime_ns, status.st_ino)
    return found


def join(folder: str, name: str) -> str:
    """``name`` inside ``folder`` (relative to the checkpoint folder; ``""`` is its top)."""
    return f"{folder}/{name}" if folder else name
