"""Finding the checkpoint to collect in a folder a script saved into: every candidate any
reader recognises, depth first below the folder (FSDP2's ``checkpoints/<api>/<time>/``,
Lightning's ``lightning_logs/version_N/checkpoints/``, a Ray Train run's recorded
``checkpoint_<time>/``: :mod:`.ray_train`), the newest taken that is not being written."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from kubetrain.artifacts.checkpoint_formats.api import Candidate, Reader, index_of_shard
from kubetrain.artifacts.checkpoint_formats.files import join
from kubetrain.artifacts.checkpoint_formats.ray_train import (
    RAY_CHECKPOINT_PREFIX,
    RAY_RECORD,
    recorded_checkpoints,
)
from kubetrain.artifacts.manifest import shown
from kubetrain.errors import IntegrityError
from kubetrain.storage.settled import unsettled, writers_of

#: What a folder is searched for, in the line that says it holds none of it.
LOOKED_FOR = (
    "our manifest/LATEST, *.safetensors, *.pt/*.pth/*.bin, Lightning *.ckpt, a DCP .metadata, "
    "an HF index, a Ray Train run's recorded checkpoint_*, in any folder below"
)
#: Most files and folders the search looks at: past that, the folder is not one a script saves
#: into (a home folder, a dataset), and a model found so far may not be the newest.
MAX_ENTRIES = 200_000
#: Name parts of a file still being written (``model.pt.tmp``, ``model.partial.pt``).
_WRITING_PARTS = {"tmp", "temp", "partial", "part", "incomplete"}
#: kubetrain's own checkpoint folders, never taken for a script's.
OUR_CHECKPOINT = re.compile(r"epoch-\d{6,}")
#: Folders that hold no checkpoint.
_PASSED_OVER = {"__pycache__", "tensorboard", "wandb", "mlruns", ".git"}
#: A kubetrain dataset or model folder beside the checkpoints (their manifests).
_OUR_RECORDS = {"manifest.json", "model.json"}
#: A checkpoint that failed to read and was modified this recently may have been caught by a
#: writer that pauses: it is watched for :data:`WATCH_SECONDS`, :data:`SETTLE_SECONDS` apart.
RECENT_SECONDS = 30.0
SETTLE_SECONDS = 0.25
WATCH_SECONDS = 3.0


def holds_our_layout(folder: Path) -> bool:
    """Whether ``folder`` is a kubetrain checkpoint folder (a LATEST pointer, or an
    ``epoch-NNNNNN`` folder): then it is collected as one, complete or not."""
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return "LATEST" in names or any(
        OUR_CHECKPOINT.fullmatch(name) and (folder / name).is_dir() for name in names
    )


def still_written_name(name: str) -> bool:
    """A hidden name, or one with a ``.tmp``/``.partial``/``.part`` part: being written."""
    return name.startswith(".") or bool(
        _WRITING_PARTS & {part.lower() for part in name.split(".")[1:]}
    )


def whole_folder(
    readers: Sequence[Reader], root: Path, folder: str, names: list[str]
) -> list[Candidate]:
    """The checkpoints ``folder`` is as a whole (a DCP folder, an HF index)."""
    visible = [name for name in names if not still_written_name(name) or name == ".metadata"]
    return [c for reader in readers for c in reader.recognise_folder(root, folder, visible)]


def one_file(readers: Sequence[Reader], root: Path, relative: str) -> Candidate | None:
    return next(
        (c for reader in readers if (c := reader.recognise_file(root, relative)) is not None),
        None,
    )


def candidates(readers: Sequence[Reader], root: Path, writing: list[str]) -> list[Candidate]:
    """Every checkpoint in ``root`` and the folders below it, at any depth (links are not
    followed), refused past :data:`MAX_ENTRIES` entries rather than taken from a part. HF
    shards whose index is not there yet (it is written after them) are no checkpoint: each is
    added to ``writing``, with why."""
    seen = [0]
    return _candidates(readers, root, "", seen, writing)


def _candidates(
    readers: Sequence[Reader], root: Path, folder: str, seen: list[int], writing: list[str]
) -> list[Candidate]:
    try:
        entries = sorted(os.scandir(root / folder if folder else root), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []
    names = [entry.name for entry in entries]
    seen[0] += len(names)
    if seen[0] > MAX_ENTRIES:
        raise IntegrityError(
            f"checkpoint_dir: {root} holds over {MAX_ENTRIES} files and folders, too many to "
            "tell the newest checkpoint; point --checkpoint-dir at the folder your script "
            "saves into, or name the file with --checkpoint-file"
        )
    if folder and _OUR_RECORDS & set(names):
        return []
    whole = whole_folder(readers, root, folder, names)
    if whole:
        return whole
    # A Ray Train run's folder: only the checkpoints its record names, ranked in its order.
    recorded = recorded_checkpoints(root, folder) if RAY_RECORD in names else None
    found = []
    for entry in entries:
        relative = join(folder, entry.name)
        if still_written_name(entry.name):
            continue
        if entry.is_dir(follow_symlinks=False):
            if recorded is not None and entry.name.startswith(RAY_CHECKPOINT_PREFIX):
                if entry.name not in recorded:
                    writing.append(
                        f"{shown(relative)} (not in Ray's record {RAY_RECORD} of the run: a "
                        "report that did not finish)"
                    )
                    continue
                order = (recorded.index(entry.name),)
                found += [
                    dataclasses.replace(candidate, numbers=order)
                    for candidate in _candidates(readers, root, relative, seen, writing)
                ]
            elif not (OUR_CHECKPOINT.fullmatch(entry.name) or entry.name in _PASSED_OVER):
                found += _candidates(readers, root, relative, seen, writing)
        elif (index := index_of_shard(entry.name)) is not None:
            writing.append(
                f"{shown(relative)} (an HF shard without its index {index}: wait for the save "
                "to write it)"
            )
        elif (candidate := one_file(readers, root, relative)) is not None:
            found.append(candidate)
    return found


def ranked(found: list[Candidate]) -> list[Candidate]:
    """Newest first: among files named alike (``model_epoch_9.pt``, ``model_epoch_10.pt``;
    ``checkpoint-50/``, ``checkpoint-200/``; ``version_1/.../epoch=3-step=40.ckpt``) the
    highest numbers; among differently named ones the most recently modified (a family counts
    by its newest file)."""
    family_mtime: dict[str, int] = {}
    for candidate in found:
        family_mtime[candidate.family] = max(
            family_mtime.get(candidate.family, 0), candidate.mtime_ns
        )
    return sorted(
        found,
        key=lambda c: (family_mtime[c.family], c.family, c.numbers, c.mtime_ns, c.relative),
        reverse=True,
    )


def _sizes(root: Path, files: Iterable[str]) -> dict[str, tuple[int, int]]:
    sizes = {}
    for name in files:
        try:
            status = os.stat(root / name)
        except OSError:
            status = None
        sizes[name] = (status.st_size, status.st_mtime_ns) if status else (-1, -1)
    return sizes


def still_writing(root: Path, candidate: Candidate) -> str | None:
    """Why ``candidate`` is still being written (one clause naming the file), or None: every
    format's files are held to the one rule of :func:`kubetrain.storage.settled.unsettled`
    (size and time still for a grace, no process holding one open for writing)."""
    return unsettled([root / name for name in candidate.files])


def settled_candidates(
    readers: Sequence[Reader], root: Path, writing: list[str]
) -> Iterator[Candidate]:
    """The checkpoints in ``root``, newest first (see :func:`ranked`), that are not being
    written: no hidden or ``.tmp``/``.partial``/``.part`` name, no HF shards without their
    index, files that held still for the grace and that no process holds open for writing
    (each passed over is added to ``writing``, with why). Opens nothing: the files are held to
    the rule when one is read."""
    for candidate in ranked(candidates(readers, root, writing)):
        reason = still_writing(root, candidate)
        if reason is None:
            yield candidate
        else:
            writing.append(f"{shown(candidate.relative)} ({reason})")


def still_being_written(root: Path, candidate: Candidate) -> bool:
    """Whether a checkpoint that failed to read was caught mid-write: modified recently and
    changing within :data:`WATCH_SECONDS` (a writer pausing between writes outlasts the
    settling check), or held open for writing by a process. An old file, or one that holds
    still with no writer, is corrupt, not being written."""
    if writers_of([root / name for name in candidate.files]):
        return True
    if time.time() - candidate.mtime_ns / 1e9 > RECENT_SECONDS:
        return False
    before = _sizes(root, candidate.files)
    deadline = time.monotonic() + WATCH_SECONDS
    while time.monotonic() < deadline:
        time.sleep(SETTLE_SECONDS)
        now = _sizes(root, candidate.files)
        if now != before or any(mtime > candidate.mtime_ns for _size, mtime in now.values()):
            return True
    return False


def nothing_to_collect(checkpoint_dir: object, writing: list[str]) -> IntegrityError:
    passed = f"; still being written: {', '.join(writing[:3])}" if writing else ""
    return IntegrityError(
        f"checkpoint_dir: {checkpoint_dir} holds no checkpoint (looked for {LOOKED_FOR}"
        f"{passed}); point --checkpoint-dir at the folder your script saves into, or name the "
        "file with --checkpoint-file"
    )
