"""Collect step: take the newest complete checkpoint rank 0 published, verify it, and publish
the model as one ``model.safetensors`` (plus a ``model.json`` card) in an output folder.

DDP's ``model.safetensors`` (rank 0's full model) is streamed with bounded memory and its sha256
checked while copying; FSDP's sharded DCP checkpoints are gathered into one full state dict, so
what is published has the same keys and shapes whatever the strategy. Checkpoint and output may be
local folders or fsspec URLs (``s3://bucket/prefix``). The output appears only when complete:
locally a staging folder renamed into place; on object storage the model file first and the
card (``model.json``, which readers require) last.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubetrain import storage
from kubetrain.artifacts.manifest import check_model_code
from kubetrain.artifacts.model_card import MODEL_CARD, MODEL_FILE, MODEL_FORMAT
from kubetrain.artifacts.output_rule import MODEL, check_output
from kubetrain.artifacts.safetensors_header import tensor_names
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
    checkpoint_dir: str, output_dir: str, export: str = "none", model_factory: str = ""
) -> CollectedModel:
    """Publish the newest complete checkpoint of ``checkpoint_dir`` as a model in ``output_dir``.

    ``model_factory`` (``package.module:callable``) builds the model an export traces when the
    checkpoint records custom code, which is never imported on the manifest's word alone.
    """
    from kubetrain.artifacts.checkpoint_manifest import (
        latest_checkpoint,
        listed_files,
        read_manifest,
        verify_checkpoint,
    )

    if not checkpoint_dir:
        raise InvalidInput("checkpoint_dir", "is empty", "pass the folder the training job wrote")
    if export not in EXPORT_KINDS:
        raise InvalidInput("export", f"{export!r} is not one of {EXPORT_KINDS}", "pick one")
    if not storage.is_dir(checkpoint_dir, "checkpoint_dir"):
        raise IntegrityError(
            f"checkpoint_dir {checkpoint_dir} does not exist; check --checkpoint-dir, and that "
            "the training job ran and wrote a checkpoint there"
        )
    # before the work: an output the rule allows (never the checkpoint folder itself)
    check_output(output_dir, "output", MODEL, {"checkpoint_dir": checkpoint_dir})
    checkpoint = latest_checkpoint(checkpoint_dir)
    if checkpoint is None:
        raise IntegrityError(
            f"checkpoint_dir {checkpoint_dir} holds no complete checkpoint (no LATEST pointer and "
            "no epoch-* folder with a manifest); check the training job's logs"
        )
    # Every name the manifest lists is held to the manifest rule before any file is opened;
    # DDP's model file is verified while it is copied, FSDP's shards before they are gathered.
    manifest = read_manifest(checkpoint)
    listed_files(checkpoint, manifest)
    if export != "none":  # the export rebuilds the model: refused now, not after the copy
        check_model_code(manifest["model"]["spec"], model_factory, f"checkpoint {checkpoint}")
    if manifest["strategy"] == "fsdp":
        verify_checkpoint(checkpoint)
    elif MODEL_FILE not in manifest["files"]:
        raise IntegrityError(f"checkpoint {checkpoint}: its manifest lists no {MODEL_FILE}")
    staged = storage.staging_dir(output_dir)
    try:
        if manifest["strategy"] == "ddp":
            model_sha256 = _copy_rank0_model(checkpoint, manifest, staged / MODEL_FILE)
        else:
            model_sha256 = _gather_shards(checkpoint, staged / MODEL_FILE)
        card = _model_card(checkpoint, manifest, model_sha256)
        card_text = json.dumps(card, indent=2, sort_keys=True) + "\n"
        (staged / MODEL_CARD).write_text(card_text)
        if export != "none":
            from kubetrain.artifacts.export import export_model

            # checked against the model before it is kept
            export_model(staged, export, model_factory=model_factory or None)
        # the model file's sha256 was verified as it was staged: not hashed again to upload it
        storage.publish_dir(staged, output_dir, MODEL_CARD, {MODEL_FILE: model_sha256})
    finally:
        storage.discard_staging(staged)
    return CollectedModel(
        path=str(storage.join(output_dir, MODEL_FILE)), sha256=card["sha256"], card=card
    )


def _copy_rank0_model(checkpoint: storage.Location, manifest: dict[str, Any], target: Path) -> str:
    """DDP: rank 0's ``model.safetensors`` already is the full model; stream it (bounded memory,
    sha256 checked against the manifest while copying, so not hashed again) and check it holds
    tensors. Returns its sha256."""
    source = storage.join(checkpoint, MODEL_FILE)
    copied = copy_verified(str(source), str(target), expected_sha256=manifest["files"][MODEL_FILE])
    try:
        tensors = tensor_names(target)
    except ValueError as exc:
        raise IntegrityError(
            f"checkpoint file {source} is not a safetensors file ({exc}); refused unread"
        ) from exc
    if not tensors:
        raise IntegrityError(f"checkpoint {checkpoint} has no model tensors")
    return copied.sha256


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
        raise IntegrityError(f"checkpoint {checkpoint} has no model tensors")
    save_file(state, str(target))
    return sha256_file(target)


def _model_card(
    checkpoint: storage.Location, manifest: dict[str, Any], sha256: str
) -> dict[str, Any]:
    return {
        "format": MODEL_FORMAT,
        "source_checkpoint": str(checkpoint),
        "epoch": manifest["epoch"],
        "step": manifest["step"],
        "world_size": manifest["world_size"],
        "strategy": manifest["strategy"],
        "model": manifest["model"],
        "metrics": manifest.get("metrics", []),
        "checkpoint_files": manifest["files"],
        "sha256": sha256,
    }
