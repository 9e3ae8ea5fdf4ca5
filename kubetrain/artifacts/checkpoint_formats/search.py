"""Finding the checkpoint to collect in a folder a script saved into: every candidate any
reader recognises, depth first below the folder (FSDP2's ``checkpoints/<api>/<time>/``,
Lightning's ``lightning_logs/version_N/checkpoints/``), the newest taken that is not being
written."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from kubetrain.artifacts.checkpoint_formats.api import Candidate, Reader
from kubetrain.artifacts.checkpoint_formats.files import join
from kubetrain.artifacts.manifest import shown
from kubetrain.errors import IntegrityError

#: What a folder is searched for, in the line that says it holds none of it.
LOOKED_FOR = (
    "our manifest/LATEST, *.safetensors, *.pt/*.pth/*.bin, Lightning *.ckpt, a DCP .metadata, "
    "an HF index, in any folder below"
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
#: A file modified this recently may still be being written: its size is checked twice,
#: :data:`SETTLE_SECONDS` apart, before it is taken.
RECENT_SECONDS = 30.0
SETTLE_SECONDS = 0.25
#: How long a recent checkpoint that failed to read is watched for a writer still at it.
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


def candidates(readers: Sequence[Reader], root: Path) -> list[Candidate]:
    """Every checkpoint in ``root`` and the folders below it, at any depth (links are not
    followed), refused past :data:`MAX_ENTRIES` entries rather than taken from a part."""
    seen = [0]
    return _candidates(readers, root, "", seen)


def _candidates(
    readers: Sequence[Reader], root: Path, folder: str, seen: list[int]
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
    found = []
    for entry in entries:
        relative = join(folder, entry.name)
        if still_written_name(entry.name):
            continue
        if entry.is_dir(follow_symlinks=False):
            if not (OUR_CHECKPOINT.fullmatch(entry.name) or entry.name in _PASSED_OVER):
                found += _candidates(readers, root, relative, seen)
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


def is_settled(root: Path, candidate: Candidate) -> bool:
    """Not being written: unchanged in size and time across :data:`SETTLE_SECONDS` when it
    was modified in the last :data:`RECENT_SECONDS` (an older file is taken as it is)."""
    if time.time() - candidate.mtime_ns / 1e9 > RECENT_SECONDS:
        return True
    before = _sizes(root, candidate.files)
    time.sleep(SETTLE_SECONDS)
    return _sizes(root, candidate.files) == before


def settled_candidates(
    readers: Sequence[Reader], root: Path, writing: list[str]
) -> Iterator[Candidate]:
    """The checkpoints in ``root``, newest first (see :func:`ranked`), that are not being
    written: no hidden or ``.tmp``/``.partial``/``.part`` name, and a size that holds still
    (each passed over is added to ``writing``). Opens nothing: the files are held to the rule
    when one is read."""
    for candidate in ranked(candidates(readers, root)):
        if is_settled(root, candidate):
            yield candidate
        else:
            writing.append(candidate.relative)


def still_being_written(root: Path, candidate: Candidate) -> bool:
    """Whether a checkpoint that failed to read was caught mid-write: modified recently and
    changing within :data:`WATCH_SECONDS` (a writer pausing between writes outlasts the
    settling check). An old file, or one that holds still, is corrupt, not being written."""
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
    passed = (
        f"; {', '.join(shown(name) for name in writing[:3])} still being written" if writing else ""
    )
    return IntegrityError(
        f"checkpoint_dir: {checkpoint_dir} holds no checkpoint (looked for {LOOKED_FOR}"
        f"{passed}); point --checkpoint-dir at the folder your script saves into, or name the "
        "file with --checkpoint-file"
    )
