"""Collect step: take the newest complete checkpoint rank 0 published, verify it, and publish
the model as one ``model.safetensors`` (plus a ``model.json`` card) in an output folder.

A folder in kubetrain's own layout (``LATEST``, ``epoch-*/manifest.json``) is collected as
such. Any other local folder is searched for what training scripts write (``torch.save``d
state dicts, safetensors files, DCP folders, HF sharded checkpoints: see
:mod:`kubetrain.artifacts.checkpoint_formats`), the newest taken, or the one
``checkpoint_file`` names; of nested state, only the model (never optimizer state, and never a
guess between several candidates: ``state_key`` names one). A model holding NaN or Inf is
refused unless ``allow_nonfinite``.

DDP's ``model.safetensors`` (rank 0's full model) is streamed with bounded memory and its sha256
checked while copying; FSDP's sharded DCP checkpoints are gathered into one full state dict, so
what is published has the same keys and shapes whatever the strategy. Checkpoint and output may be
local folders or fsspec URLs (``s3://bucket/prefix``). The output appears only when complete:
locally a staging folder renamed into place; on object storage the model file first and the
card (``model.json``, which readers require) last.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubetrain import storage
from kubetrain.artifacts.checkpoint_formats.writer import NonfiniteScan
from kubetrain.artifacts.manifest import MANIFEST, check_model_code, shown
from kubetrain.artifacts.model_card import MODEL_CARD, MODEL_FILE, MODEL_FORMAT, SOURCE_KUBETRAIN
from kubetrain.artifacts.output_rule import MODEL, CheckedOutput, check_output
from kubetrain.artifacts.publish import publish_verified
from kubetrain.artifacts.safetensors_header import tensor_names
from kubetrain.components._shared.program import absolute_location
from kubetrain.errors import IntegrityError, InvalidInput
from kubetrain.storage.integrity import sha256_file
from kubetrain.storage.verified_copy import copy_verified


@dataclass(frozen=True)
class CollectedModel:
    path: str
    sha256: str
    card: dict[str, Any]


#: ``export`` values: none, or a program for serving (see kubetrain.artifacts.export).
EXPORT_KINDS = ("none", "torch-export", "torchscript")


def collect_checkpoint(
    checkpoint_dir: str,
    output_dir: str,
    export: str = "none",
    model_factory: str = "",
    checkpoint_file: str = "",
    state_key: str = "",
    allow_nonfinite: bool = False,
    data: str = "",
) -> CollectedModel:
    """Publish the newest complete checkpoint of ``checkpoint_dir`` as a model in ``output_dir``.

    ``model_factory`` (``package.module:callable``) builds the model an export traces when the
    checkpoint records custom code, which is never imported on the manifest's word alone; for
    a script's checkpoint it is recorded as the model's spec (evaluate still imports it only
    when named there too). ``checkpoint_file`` names the checkpoint to take (relative to
    ``checkpoint_dir``, or absolute inside it) instead of the newest. ``state_key`` names the
    state dict that is the model in a checkpoint of nested state (``app.model``).
    ``allow_nonfinite`` publishes a model holding NaN or Inf. With ``data`` (a prepared
    dataset: its sample shape and classes), a script's checkpoint is checked to load into
    ``model_factory``'s model before anything is published.
    """
    from kubetrain.artifacts import checkpoint_formats as foreign
    from kubetrain.artifacts.checkpoint_manifest import latest_checkpoint

    if not checkpoint_dir:
        raise InvalidInput("checkpoint_dir", "is empty", "pass the folder the training job wrote")
    if export not in EXPORT_KINDS:
        raise InvalidInput("export", f"{export!r} is not one of {EXPORT_KINDS}", "pick one")
    # what the card records, and what names a file inside it, whatever folder collect ran in
    checkpoint_dir, data = absolute_location(checkpoint_dir), absolute_location(data)
    if not storage.is_dir(checkpoint_dir, "checkpoint_dir"):
        raise IntegrityError(
            f"checkpoint_dir {checkpoint_dir} does not exist; check --checkpoint-dir, and that "
            "the training job ran and wrote a checkpoint there"
        )
    # before the work: an output the rule allows (never the checkpoint folder itself)
    output = check_output(output_dir, "output", MODEL, {"checkpoint_dir": checkpoint_dir})
    publishing = Publishing(output, export, model_factory, state_key, allow_nonfinite, data)
    local = storage.is_local(checkpoint_dir)
    root = storage.local_path(checkpoint_dir, "checkpoint_dir") if local else None
    if checkpoint_file:
        if root is None:
            raise InvalidInput(
                "checkpoint_file",
                f"names a file in {checkpoint_dir}, which is not a local folder",
                "copy the checkpoint to a local folder or volume and point --checkpoint-dir at it",
            )
        named = foreign.named_checkpoint(root, checkpoint_file)
        if isinstance(named, Path):  # one of kubetrain's own checkpoint folders
            return _collect_ours(named, output_dir, publishing)
        return _collect_foreign(root, named, output_dir, publishing)
    checkpoint = latest_checkpoint(checkpoint_dir)
    if checkpoint is not None:
        return _collect_ours(checkpoint, output_dir, publishing)
    if root is not None and (reported := foreign.rays_latest_of_ours(root)) is not None:
        return _collect_ours(reported, output_dir, publishing)
    if root is not None and foreign.holds_our_layout(root):
        raise IntegrityError(
            f"checkpoint_dir {checkpoint_dir} holds no complete checkpoint (no LATEST pointer and "
            "no epoch-* folder with a manifest); check the training job's logs"
        )
    if root is None:
        raise IntegrityError(
            f"checkpoint_dir: {checkpoint_dir} holds no kubetrain checkpoint (no LATEST pointer "
            "and no epoch-* folder with a manifest), and other formats are read from a local "
            "folder only; copy the checkpoint to a local folder or volume and point "
            "--checkpoint-dir at it"
        )
    writing: list[str] = []
    for candidate in foreign.newest_checkpoints(root, writing):
        try:
            return _collect_foreign(root, candidate, output_dir, publishing)
        except foreign.UnreadableCheckpoint:
            if not foreign.still_being_written(root, candidate):
                raise
            # caught mid-write: the next newest
            writing.append(f"{shown(candidate.relative)} (changing as it was read)")
    raise foreign.nothing_to_collect(checkpoint_dir, writing)


@dataclass(frozen=True)
class Publishing:
    """How the model is taken and published, whatever the checkpoint's format: ``output`` is
    where the output rule allowed it."""

    output: CheckedOutput
    export: str
    model_factory: str
    state_key: str
    allow_nonfinite: bool
    data: str

    def scanned(self, scan: NonfiniteScan) -> Callable[[int, Any], None] | None:
        """What watches the model's bytes as they are written: ``scan``, unless NaN/Inf is
        allowed."""
        return None if self.allow_nonfinite else scan.watcher()

    def expected_tensors(self) -> dict[str, tuple[int, ...]] | None:
        """The names and shapes of ``model_factory``'s model for ``data``'s samples, when both
        are given: what a script's checkpoint must load into."""
        if not (self.model_factory and self.data):
            return None
        from kubetrain.artifacts.datasets import read_manifest
        from kubetrain.artifacts.models import build_model

        manifest = read_manifest(self.data)
        model = build_model(
            self.model_factory,
            manifest["sample_shape"],
            manifest["num_classes"],
            option="model_factory",
        )
        return {name: tuple(value.shape) for name, value in model.state_dict().items()}


def _collect_ours(
    checkpoint: storage.Location, output_dir: str, publishing: Publishing
) -> CollectedModel:
    """A checkpoint of kubetrain's own layout, as it always was collected."""
    from kubetrain.artifacts.checkpoint_manifest import (
        listed_files,
        read_manifest,
        verify_checkpoint,
    )

    # Every name the manifest lists is held to the manifest rule before any file is opened;
    # DDP's model file is verified while it is copied, FSDP's shards before they are gathered.
    manifest = read_manifest(checkpoint)
    listed_files(checkpoint, manifest)
    if publishing.state_key:
        raise InvalidInput(
            "state_key",
            f"{checkpoint} is a kubetrain checkpoint, whose model is its model.safetensors",
            "drop --state-key",
        )
    if publishing.export != "none":  # the export rebuilds the model: refused now, not later
        check_model_code(
            manifest["model"]["spec"], publishing.model_factory, f"checkpoint {checkpoint}"
        )
    if manifest["strategy"] == "fsdp":
        verify_checkpoint(checkpoint)
    elif manifest["strategy"] == "ddp" and MODEL_FILE not in manifest["files"]:
        raise IntegrityError(
            f"checkpoint {checkpoint}: its manifest lists no {MODEL_FILE}; collect an earlier "
            "checkpoint (--checkpoint-file epoch-NNNNNN), or train again"
        )
    staged = storage.staging_dir(output_dir)
    scan = NonfiniteScan()
    try:
        if manifest["strategy"] == "ddp":
            model_sha256 = _copy_rank0_model(
                checkpoint, manifest, staged / MODEL_FILE, publishing.scanned(scan)
            )
        elif manifest["strategy"] == "deepspeed":
            model_sha256 = _merge_zero(
                checkpoint, manifest, staged / MODEL_FILE, publishing.scanned(scan)
            )
        else:
            model_sha256 = _gather_shards(checkpoint, staged / MODEL_FILE)
        card = _model_card(checkpoint, manifest, model_sha256)
        _publish(staged, card, model_sha256, publishing, scan)
    finally:
        storage.discard_staging(staged)
    return CollectedModel(
        path=str(storage.join(output_dir, MODEL_FILE)), sha256=card["sha256"], card=card
    )


def _collect_foreign(
    root: Path, candidate: Any, output_dir: str, publishing: Publishing
) -> CollectedModel:
    """A checkpoint a training script wrote (``candidate``, found in ``root``), written tensor
    by tensor as ``model.safetensors``."""
    from kubetrain.artifacts import checkpoint_formats as foreign

    if publishing.export != "none":  # refused before anything is read
        raise InvalidInput(
            "export",
            f"{root / candidate.relative} is a script's checkpoint, which records no sample "
            "shape to trace the model with",
            "collect it with --export none (an export needs a kubetrain checkpoint)",
        )
    expected = publishing.expected_tensors()
    staged = storage.staging_dir(output_dir)
    try:
        scan = NonfiniteScan()
        converted = foreign.convert(
            root,
            candidate,
            staged / MODEL_FILE,
            publishing.state_key,
            expected,
            publishing.model_factory,
            observe=publishing.scanned(scan),
        )
        card = {
            "format": MODEL_FORMAT,
            "source_checkpoint": str(root),
            "source_file": converted.source,
            "source_sha256": converted.source_sha256,
            "source_format": converted.format,
            **converted.numbers,
            **({"state_key": converted.state_key} if converted.state_key else {}),
            "model": {"spec": publishing.model_factory} if publishing.model_factory else {},
            "metrics": [],
            "checkpoint_files": converted.files,
            "sha256": converted.sha256,
        }
        _publish(staged, card, converted.sha256, publishing, scan)
    finally:
        storage.discard_staging(staged)
    return CollectedModel(
        path=str(storage.join(output_dir, MODEL_FILE)), sha256=card["sha256"], card=card
    )


def _publish(
    staged: Path,
    card: dict[str, Any],
    model_sha256: str,
    publishing: Publishing,
    scan: NonfiniteScan,
) -> None:
    """Write the card beside the staged model (and the export, checked against the model before
    it is kept), then publish the folder where the output rule allowed. Every format passes
    here: a model holding NaN or Inf is refused here, whatever wrote it (``scan`` saw its bytes
    as they were written, or it is read once more). ``model_sha256`` is the model file's, as
    the copy verified it or the writer hashed it."""
    if not publishing.allow_nonfinite:
        scan.refuse(staged / MODEL_FILE, f"checkpoint {card['source_checkpoint']}")
    (staged / MODEL_CARD).write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
    verified = {MODEL_FILE: model_sha256}
    if publishing.export != "none":
        from kubetrain.artifacts.export import export_model, exported_files

        export_model(staged, publishing.export, model_factory=publishing.model_factory or None)
        verified.update(exported_files(staged))  # each hashed as it was written
    # the model file's sha256 was verified as it was staged: not hashed again to upload it
    publish_verified(staged, publishing.output, verified)


def _copy_rank0_model(
    checkpoint: storage.Location,
    manifest: dict[str, Any],
    target: Path,
    observe: Callable[[int, Any], None] | None,
) -> str:
    """DDP: rank 0's ``model.safetensors`` already is the full model; stream it (bounded memory,
    sha256 checked against the manifest while copying, so not hashed again) and check it holds
    tensors. Returns its sha256."""
    source = storage.join(checkpoint, MODEL_FILE)
    copied = copy_verified(
        str(source), str(target), expected_sha256=manifest["files"][MODEL_FILE], observe=observe
    )
    try:
        tensors = tensor_names(target)
    except ValueError as exc:
        raise IntegrityError(
            f"checkpoint file {source} is not a safetensors file ({exc}); refused unread: "
            "collect an earlier checkpoint (--checkpoint-file epoch-NNNNNN), or train again"
        ) from exc
    if not tensors:
        raise IntegrityError(
            f"checkpoint {checkpoint} has no model tensors; collect an earlier checkpoint "
            "(--checkpoint-file epoch-NNNNNN), or train again"
        )
    return copied.sha256


def _merge_zero(
    checkpoint: storage.Location,
    manifest: dict[str, Any],
    target: Path,
    observe: Callable[[int, Any], None] | None,
) -> str:
    """DeepSpeed: the ZeRO files ``engine.save_checkpoint`` wrote under ``zero/`` merged tensor
    by tensor, as zero_to_fp32 merges them (:mod:`~kubetrain.artifacts.checkpoint_formats.
    deepspeed_zero`), every file read checked against its manifest sha256 first. Returns the
    written file's sha256."""
    from kubetrain.artifacts import checkpoint_formats as foreign
    from kubetrain.artifacts.checkpoint_manifest import ZERO_DIR

    if not storage.is_local(checkpoint):
        raise IntegrityError(
            f"checkpoint {checkpoint} is a DeepSpeed checkpoint on object storage, where "
            "DeepSpeed never saves; copy it to a local folder or volume and collect it there"
        )
    root = storage.local_path(checkpoint, "checkpoint_dir")
    candidate = foreign.zero_tag_folder(root, ZERO_DIR)
    return foreign.convert(
        root, candidate, target, observe=observe, listed=manifest["files"]
    ).sha256


def _gather_shards(checkpoint: storage.Location, target: Path) -> str:
    """FSDP: gather the DCP shards into one full state dict (this holds the model in memory);
    returns the written file's sha256."""
    import torch
    from safetensors.torch import save_file

    from kubetrain.artifacts.checkpoint import load_full_state_dict

    state = {
        key: tensor.detach().to("cpu").contiguous()
        for key, tensor in load_full_state_dict(checkpoint, verify=False).items()
    }
    if not state or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise IntegrityError(
            f"checkpoint {checkpoint} has no model tensors; collect an earlier checkpoint "
            "(--checkpoint-file epoch-NNNNNN), or train again"
        )
    save_file(state, str(target))
    return sha256_file(target)


def _model_card(
    checkpoint: storage.Location, manifest: dict[str, Any], sha256: str
) -> dict[str, Any]:
    manifest_file = storage.join(checkpoint, MANIFEST)
    return {
        "format": MODEL_FORMAT,
        "source_checkpoint": str(checkpoint),
        "source_file": MANIFEST,  # relative to source_checkpoint, as for any format
        "source_sha256": storage.sha256(manifest_file),
        "source_format": SOURCE_KUBETRAIN,
        "epoch": manifest["epoch"],
        "step": manifest["step"],
        "world_size": manifest["world_size"],
        "strategy": manifest["strategy"],
        "model": manifest["model"],
        "metrics": manifest.get("metrics", []),
        # what the trainer records for the report, in checkpoints written since issue 18
        **{key: manifest[key] for key in ("history", "hyperparameters", "run") if key in manifest},
        "checkpoint_files": manifest["files"],
        "sha256": sha256,
    }
