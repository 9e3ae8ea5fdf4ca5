"""Checkpoints that training scripts write themselves, found and turned into one
``model.safetensors``.

One reader per writer, each a module behind :class:`~.api.Reader` and listed in
:data:`READERS` (a new format is one new file and one line here):

* ``torch_save``: ``torch.save``d state dicts and dicts holding one (``.pt``/``.pth``/``.bin``);
* ``lightning``: Lightning's ``.ckpt``;
* ``safetensors_file``: a bare ``.safetensors`` file;
* ``dcp``: a ``torch.distributed.checkpoint`` folder;
* ``hf_sharded``: Hugging Face's sharded folders (an index and its shards);
* ``deepspeed_zero``: DeepSpeed ZeRO (stages 1-3) folders, merged as ``zero_to_fp32`` merges
  them (its ``*_model_states.pt``/``*_optim_states.pt`` are never taken as models one by one).

Shared by all: the search (:mod:`.search`, depth first, newest first, never a file being
written; in a Ray Train run's folder only the checkpoints Ray's record names, in its order:
:mod:`.ray_train`), the rule for the files read (:mod:`.files`), which part of nested state is
the model (:mod:`.state_select`: optimizer state is never published; ambiguity is refused, never
guessed), the published names (:mod:`.naming`: wrapper prefixes off, checked against a model
factory when one is known) and the one bounded writer (:mod:`.writer`).

Safety: every file is held to the manifest rule before it is opened, records are read bounded,
pickles are loaded only by ``torch.load(weights_only=True)`` (DCP's metadata by kubetrain's
restricted unpickler, its pickled-bytes entries never).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubetrain.artifacts.checkpoint_formats.api import Candidate, Reader, index_of_shard
from kubetrain.artifacts.checkpoint_formats.dcp import METADATA, Dcp
from kubetrain.artifacts.checkpoint_formats.deepspeed_zero import DeepSpeedZero
from kubetrain.artifacts.checkpoint_formats.files import (
    UnreadableCheckpoint,
    held_to_rule,
    join,
    snapshot,
)
from kubetrain.artifacts.checkpoint_formats.hf_sharded import HfSharded, is_index
from kubetrain.artifacts.checkpoint_formats.lightning import Lightning
from kubetrain.artifacts.checkpoint_formats.naming import published_names
from kubetrain.artifacts.checkpoint_formats.ray_train import RAY_RECORD, recorded_checkpoints
from kubetrain.artifacts.checkpoint_formats.safetensors_file import SafetensorsFile
from kubetrain.artifacts.checkpoint_formats.search import (
    holds_our_layout,
    nothing_to_collect,
    one_file,
    settled_candidates,
    still_being_written,
    still_writing,
    whole_folder,
)
from kubetrain.artifacts.checkpoint_formats.torch_save import TorchSave
from kubetrain.artifacts.checkpoint_formats.writer import write_safetensors
from kubetrain.artifacts.manifest import local_entry_problem, name_problem, shown
from kubetrain.errors import IntegrityError, InvalidInput
from kubetrain.storage.integrity import sha256_file

__all__ = [
    "READERS", "Candidate", "Converted", "convert", "holds_our_layout", "named_checkpoint",
    "newest_checkpoints", "nothing_to_collect", "rays_latest_of_ours", "still_being_written",
    "UnreadableCheckpoint", "zero_tag_folder",
]  # fmt: skip

#: Every format collect reads besides kubetrain's own, in the order a file is offered to them.
READERS: tuple[Reader, ...] = (
    Dcp(), HfSharded(), DeepSpeedZero(), TorchSave(), Lightning(), SafetensorsFile()
)  # fmt: skip
_BY_FORMAT = {fmt: reader for reader in READERS for fmt in reader.FORMATS}
_EPOCH_IN_NAME = re.compile(r"epoch[-_=]?(\d+)", re.IGNORECASE)
_STEP_IN_NAME = re.compile(r"(?:step|checkpoint|ckpt|iter)[-_=]?(\d+)", re.IGNORECASE)


def newest_checkpoints(root: Path, writing: list[str]) -> Iterator[Candidate]:
    """The checkpoints below ``root``, newest first, not being written (:mod:`.search`)."""
    return settled_candidates(READERS, root, writing)


def rays_latest_of_ours(root: Path) -> Path | None:
    """The checkpoint Ray's record in ``root`` names latest, when it is one of kubetrain's own
    (``python -m kubetrain.train.ray`` reports its ``epoch-N`` folders to Ray as
    ``checkpoint_epoch-N_<time>``: a manifest inside), so it is collected by its manifest as
    under ``CHECKPOINT_DIR``; None for any other folder."""
    if not (root / RAY_RECORD).is_file():
        return None
    recorded = recorded_checkpoints(root, "")
    latest = root / recorded[-1] if recorded else None
    return latest if latest is not None and (latest / "manifest.json").is_file() else None


# --- a file the user names -------------------------------------------------------------------

_NAMED_FIX = (
    "name a .pt/.pth/.bin/.ckpt/.safetensors file, an HF index, a DCP folder or a DeepSpeed "
    "ZeRO folder inside --checkpoint-dir"
)


def named_checkpoint(root: Path, given: str) -> Candidate | Path:
    """What ``--checkpoint-file`` names (relative to ``root``, or absolute inside it): a
    candidate, or the Path of a kubetrain checkpoint folder (``epoch-000003``). Refused in one
    line when it is outside ``root``, missing, of no known format, or still being written."""
    relative = given
    if os.path.isabs(given):
        inside = [
            os.path.relpath(given, base)
            for base in (os.path.abspath(root), os.path.realpath(root))
            if os.path.commonpath([os.path.abspath(given), base]) == base
        ]
        if not inside:
            raise InvalidInput(
                "checkpoint_file", f"{given} is outside checkpoint_dir {root}", _NAMED_FIX
            )
        relative = inside[0]
    relative = relative.removeprefix("./").rstrip("/") or "."
    problem = None if relative == "." else name_problem(relative)
    if problem is None:
        problem = local_entry_problem(root, relative, allow_dir=True)
    if problem is not None:
        raise InvalidInput("checkpoint_file", f"{shown(given)} {problem}", _NAMED_FIX)
    path = root / relative if relative != "." else root
    if not path.exists():
        raise InvalidInput("checkpoint_file", f"{path} does not exist", _NAMED_FIX)
    if path.is_dir():
        names = sorted(os.listdir(path))
        if "manifest.json" in names and METADATA not in names:
            return path
        found = whole_folder(READERS, root, "" if relative == "." else relative, names)
        if len(found) != 1:
            raise InvalidInput(
                "checkpoint_file",
                f"{path} is a folder holding no DCP .metadata, one HF index or a DeepSpeed ZeRO "
                "checkpoint",
                "name the model file itself with --checkpoint-file",
            )
        candidate = found[0]
    else:
        name, folder = os.path.basename(relative), os.path.dirname(relative)
        siblings = sorted(os.listdir(path.parent))
        if "manifest.json" in siblings and METADATA not in siblings:
            # a file of one of kubetrain's own checkpoint folders: the folder is taken whole,
            # every file verified against its manifest, as without --checkpoint-file
            return path.parent
        found = whole_folder(READERS, root, folder, siblings)
        whole = next((c for c in found if c.relative == relative), None)
        if whole is not None:  # what a card names as the source (a DCP .metadata, an HF index)
            candidate = whole
        elif name == METADATA or is_index(name):
            raise InvalidInput(
                "checkpoint_file", f"{path} is being written (a hidden or .tmp name)",
                "name a complete checkpoint",
            )  # fmt: skip
        elif any(relative in c.files for c in found):
            raise InvalidInput(
                "checkpoint_file",
                f"{path} is one shard of the checkpoint {root / found[0].relative}",
                "name its folder (or its HF index) instead, which collect reads whole",
            )
        elif (index := index_of_shard(name)) is not None:
            raise IntegrityError(
                f"checkpoint file {path} is one shard of an HF sharded checkpoint whose index "
                f"{index} is not there yet (the save writes it after every shard); wait for "
                f"the save to finish, then name {join(folder, index)} with --checkpoint-file"
            )
        else:
            candidate = one_file(READERS, root, relative)
            if candidate is None:
                raise InvalidInput(
                    "checkpoint_file", f"{path} is of no format collect reads", _NAMED_FIX
                )
    reason = still_writing(root, candidate)
    if reason is not None:
        raise IntegrityError(
            f"checkpoint file {root / candidate.relative} is still being written ({reason}); "
            "collect it once the training job has finished"
        )
    return candidate


# --- converting ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Converted:
    """What :func:`convert` wrote: the source's format and sha256, the sha256 of every file it
    read (relative to the checkpoint folder), the epoch and step it recorded, the node of the
    checkpoint the model was under, the tensors."""

    source: str
    format: str
    source_sha256: str
    files: dict[str, str]
    numbers: dict[str, int]
    state_key: str
    tensors: int
    sha256: str


def _numbers_in_name(relative: str) -> dict[str, int]:
    numbers = {}
    for name, pattern in (("epoch", _EPOCH_IN_NAME), ("step", _STEP_IN_NAME)):
        found = pattern.findall(relative)
        if found:
            numbers[name] = int(found[-1])
    return numbers


def _check_listed(root: Path, digests: dict[str, str], listed: Mapping[str, str]) -> None:
    for name, digest in digests.items():
        if name not in listed:
            raise IntegrityError(
                f"checkpoint {root}: file {name} is not listed in its manifest; refused unread: "
                "collect a checkpoint kubetrain.train wrote whole"
            )
        if listed[name] != digest:
            raise IntegrityError(
                f"checkpoint {root}: file {root / name} is corrupt (sha256 {digest[:12]}…, "
                f"manifest says {listed[name][:12]}…); re-create it rather than use it"
            )


def zero_tag_folder(root: Path, folder: str) -> Candidate:
    """The DeepSpeed ZeRO checkpoint ``engine.save_checkpoint`` wrote in ``root/folder`` (a
    kubetrain deepspeed checkpoint's tag folder), taken as it is: our layout publishes a
    checkpoint whole, so no settling is waited for."""
    names = sorted(os.listdir(root / folder)) if (root / folder).is_dir() else []
    found = DeepSpeedZero().recognise_folder(root, folder, names)
    if not found:
        raise IntegrityError(
            f"checkpoint {root} holds no DeepSpeed ZeRO files in {folder}/; it is incomplete: "
            "collect an earlier checkpoint (--checkpoint-file epoch-NNNNNN), or train again"
        )
    return found[0]


def convert(
    root: Path,
    candidate: Candidate,
    target: Path,
    state_key: str = "",
    expected: Mapping[str, tuple[int, ...]] | None = None,
    factory: str = "",
    observe: Callable[[int, Any], None] | None = None,
    listed: Mapping[str, str] | None = None,
) -> Converted:
    """Write the model in ``candidate`` (a checkpoint in ``root``) as the safetensors file
    ``target``: the state dict ``state_key`` names, else the one the rule finds; with
    ``expected`` (``factory``'s tensor names and shapes) only when it loads into that model.

    Every file it reads is held to the manifest rule before it is opened and hashed; a file
    that changes while it is read (size, time or inode) fails the step: collect again once
    the job has finished writing. The files are hashed on a thread while the model is read.
    ``observe(offset, bytes)`` sees the output as it is written."""
    reader = _BY_FORMAT[candidate.format]
    relative = candidate.relative
    files = reader.files(root, candidate)
    for name in files:
        held_to_rule(root, name)
    before = snapshot(root, files)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256") as hashing:
        # hashed beside the reading (hashlib and file reads release the GIL); a file changed
        # meanwhile fails the step below, as one changed while read does
        hashed = hashing.submit(lambda: {name: sha256_file(root / name) for name in files})
        if listed is not None:  # a kubetrain checkpoint: verified before anything is unpickled
            _check_listed(root, hashed.result(), listed)
        source = reader.read(root, candidate, state_key)
        if not source.entries:
            raise IntegrityError(
                f"checkpoint {root / relative} holds no tensors; save the model's state_dict() "
                "(a dict of tensors)"
            )
        shapes = {name: entry.shape for name, entry in source.entries.items()}
        names = published_names(
            shapes, source.owner_prefix, expected, f"checkpoint {root / relative}", factory
        )
        order = sorted(source.entries, key=lambda name: names[name])
        entries = [dataclasses.replace(source.entries[name], name=names[name]) for name in order]
        written = write_safetensors(target, entries, source.chunks(order), observe)
        digests = hashed.result()
    if snapshot(root, files) != before:
        raise UnreadableCheckpoint(
            f"checkpoint {root / relative} changed while it was collected; collect again once "
            "the training job has finished writing it"
        )
    return Converted(
        source=relative,
        format=source.format,
        source_sha256=digests[relative],
        files=digests,
        numbers={**_numbers_in_name(relative), **source.numbers},
        state_key=source.state_key,
        tensors=written.tensors,
        sha256=written.sha256,
    )
