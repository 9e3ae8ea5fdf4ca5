"""Where checkpoints are and whether they are complete: the layout, manifest and ``LATEST``
pointer of ``kubetrain.artifacts.checkpoint``, readable without torch (collect streams a DDP
model file without importing it: torch alone is ~220 MiB of a process's memory)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kubetrain import storage
from kubetrain.artifacts.manifest import (
    MANIFEST,
    MODEL_FIELDS,
    OBJECT,
    POSITIVE,
    RECORDS,
    WHOLE,
    Rule,
    check_digests,
    check_entry,
    check_fields,
    read_format_manifest,
    verify_digests,
)
from kubetrain.errors import IntegrityError, InvalidInput
from kubetrain.rules import STRATEGIES, ZERO_STAGES

FORMAT = "kubetrain.checkpoint/v1"
LATEST = "LATEST"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
DCP_DIR = "dcp"
#: deepspeed: the tag folder ``engine.save_checkpoint(step folder, tag=ZERO_DIR)`` writes.
ZERO_DIR = "zero"
EPOCH_NAME = re.compile(r"epoch-(\d{6,})")
_FIELDS = {
    "epoch": WHOLE,
    "step": WHOLE,
    "world_size": POSITIVE,
    "strategy": Rule(lambda value: value in STRATEGIES, f"one of {', '.join(STRATEGIES)}"),
    "model": OBJECT,
    "metrics": RECORDS,
    "files": OBJECT,
}
#: Written by the trainer since issue 18, absent from older checkpoints: checked when present.
_OPTIONAL_FIELDS = {"history": RECORDS, "hyperparameters": OBJECT, "run": OBJECT}
#: deepspeed's manifest says which ZeRO stage wrote it: the stage decides its files' names.
_DEEPSPEED_FIELDS = {
    "zero_stage": Rule(
        lambda value: not isinstance(value, bool) and value in ZERO_STAGES,
        f"one of {', '.join(map(str, ZERO_STAGES))}",
    )
}
_PAYLOAD = {"ddp": (MODEL_FILE, OPTIMIZER_FILE), "fsdp": (f"{DCP_DIR}/.metadata",)}

PathLike = storage.Location


def checkpoint_name(epoch: int) -> str:
    """Folder name of the checkpoint taken after ``epoch``; zero-padded so names sort by epoch."""
    return f"epoch-{epoch:06d}"


def refuse_object_storage_for_deepspeed(checkpoint_dir: PathLike, field: str) -> None:
    """DeepSpeed saves and loads through local files (``torch.save`` to a path): its checkpoints
    go to a local folder or a shared volume."""
    if not storage.is_local(checkpoint_dir):
        raise InvalidInput(
            field,
            f"{checkpoint_dir} is object storage, where DeepSpeed cannot save its checkpoints",
            "give a local folder, or one on a volume all nodes share",
        )


# --- reading ---------------------------------------------------------------------------------


def read_manifest(ckpt_path: PathLike) -> dict[str, Any]:
    """The manifest of one checkpoint folder; IntegrityError if it is missing or malformed
    (the names it lists are held to the manifest rule by :func:`listed_files`)."""
    what = f"checkpoint {ckpt_path}"
    manifest = read_format_manifest(
        ckpt_path,
        FORMAT,
        what=what,
        if_missing=", so it is not a complete checkpoint; use the folder that CKPT_DIR/LATEST "
        "names",
        if_foreign="it was not written by kubetrain.train: use a checkpoint folder it wrote (the "
        "folder that CKPT_DIR/LATEST names)",
    )
    check_fields(manifest, _FIELDS, what, MANIFEST)
    check_fields(manifest["model"], MODEL_FIELDS, what, MANIFEST, within="model.")
    present = {key: rule for key, rule in _OPTIONAL_FIELDS.items() if key in manifest}
    check_fields(manifest, present, what, MANIFEST)
    if manifest["strategy"] == "deepspeed":
        check_fields(manifest, _DEEPSPEED_FIELDS, what, MANIFEST)
    return manifest


def deepspeed_payload(zero_stage: int, world_size: int) -> list[tuple[str, ...]]:
    """The files a deepspeed checkpoint cannot be without, each as the names one of which must
    be listed: the model states (one file, or one per rank under ZeRO-3, which shards them) and
    every rank's optimizer partition (``bf16_`` prefixed when trained in bf16), as
    deepspeed v0.19.8 runtime/engine.py ``_get_ckpt_name`` and ``_get_rank_zero_ckpt_name``
    name them."""
    ranks = range(world_size)
    if zero_stage == 3:
        models = [(f"{ZERO_DIR}/zero_pp_rank_{rank}_mp_rank_00_model_states.pt",) for rank in ranks]
    else:
        models = [(f"{ZERO_DIR}/mp_rank_00_model_states.pt",)]
    optim = [
        tuple(f"{ZERO_DIR}/{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
              for prefix in ("", "bf16_"))
        for rank in ranks
    ]  # fmt: skip
    return [*models, *optim]


def _required_payload(manifest: dict[str, Any], listed: int) -> list[tuple[str, ...]]:
    if manifest["strategy"] != "deepspeed":
        return [(name,) for name in _PAYLOAD[manifest["strategy"]]]
    # each rank wrote a file: a world size beyond the files listed is incomplete, unenumerated
    world_size = min(manifest["world_size"], listed + 1)
    return deepspeed_payload(manifest["zero_stage"], world_size)


def listed_files(ckpt_path: PathLike, manifest: dict[str, Any]) -> dict[str, str]:
    """The manifest's ``files`` once every name passed the manifest rule (a relative path to
    a regular file inside the folder) and every digest is a sha256; read nothing before."""
    return check_digests(ckpt_path, manifest["files"], f"checkpoint {ckpt_path}")


def is_complete(folder: PathLike) -> bool:
    try:
        read_manifest(folder)
    except IntegrityError:
        return False
    return True


def _epoch_of(name: str) -> int:
    match = EPOCH_NAME.fullmatch(name)
    return int(match.group(1)) if match else -1


def latest_name(checkpoint_dir: PathLike) -> str | None:
    """The epoch folder name ``LATEST`` holds now, whether or not that folder is complete (None
    when there is none); a FIFO or a link to /dev/zero as ``LATEST`` is no pointer: not read."""
    try:
        check_entry(checkpoint_dir, LATEST, f"checkpoint folder {checkpoint_dir}", "it holds")
        named = storage.read_text(storage.join(checkpoint_dir, LATEST)).strip()
    except (OSError, UnicodeDecodeError, IntegrityError):
        return None
    return named if EPOCH_NAME.fullmatch(named) else None


def latest_checkpoint(checkpoint_dir: PathLike) -> Path | str | None:
    """The folder LATEST names if complete, else the newest complete ``epoch-*`` folder, or None
    (a Path for a local CKPT_DIR, a URL for object storage)."""
    if not storage.is_dir(checkpoint_dir):
        return None
    named = latest_name(checkpoint_dir)
    if named and is_complete(storage.join(checkpoint_dir, named)):
        return storage.join(checkpoint_dir, named)
    names = [name for name in storage.list_dirs(checkpoint_dir) if EPOCH_NAME.fullmatch(name)]
    for name in sorted(names, key=_epoch_of, reverse=True):
        if is_complete(storage.join(checkpoint_dir, name)):
            return storage.join(checkpoint_dir, name)
    return None


def verify_checkpoint(ckpt_path: PathLike) -> dict[str, Any]:
    """Check every file against its manifest sha256 (naming the bad one); return the manifest."""
    manifest = read_manifest(ckpt_path)
    files = listed_files(ckpt_path, manifest)
    for names in _required_payload(manifest, len(files)):
        if not any(name in files for name in names):
            raise IntegrityError(
                f"checkpoint {ckpt_path}: {MANIFEST} does not list {names[0]}; "
                "it is incomplete, use an earlier checkpoint"
            )
    verify_digests(ckpt_path, files, f"checkpoint {ckpt_path}")
    return manifest
