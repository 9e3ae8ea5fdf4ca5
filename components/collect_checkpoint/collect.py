"""Collect step: take the newest complete checkpoint rank 0 published, verify it, and publish
the model as one ``model.safetensors`` (plus a ``model.json`` card) in an output folder.

FSDP's sharded DCP checkpoints are gathered into one full state dict first, so what is
published has the same keys and shapes whatever the strategy. Checkpoint and output may be
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
from kubetrain.errors import IntegrityError, InvalidInput
from kubetrain.integrity import sha256_file
from kubetrain.model_artifact import MODEL_CARD, MODEL_FILE, MODEL_FORMAT


@dataclass(frozen=True)
class CollectedModel:
    path: str
    sha256: str
    card: dict[str, Any]


def collect_checkpoint(checkpoint_dir: str, output_dir: str) -> CollectedModel:
    import torch
    from safetensors.torch import save_file

    from kubetrain.checkpoint import latest_checkpoint, load_full_state_dict, verify_checkpoint

    if not checkpoint_dir:
        raise InvalidInput("checkpoint_dir", "is empty", "pass the folder the training job wrote")
    if not storage.is_dir(checkpoint_dir, "checkpoint_dir"):
        raise IntegrityError(
            f"checkpoint_dir {checkpoint_dir} does not exist; did the training job run and "
            "write a checkpoint there?"
        )
    storage.resolve(output_dir, "output")  # refuse an unusable output before the work
    checkpoint = latest_checkpoint(checkpoint_dir)
    if checkpoint is None:
        raise IntegrityError(
            f"checkpoint_dir {checkpoint_dir} holds no complete checkpoint (no LATEST pointer and "
            "no epoch-* folder with a manifest); check the training job's logs"
        )
    manifest = verify_checkpoint(checkpoint)
    state = {
        key: tensor.detach().to("cpu").contiguous()
        for key, tensor in load_full_state_dict(checkpoint).items()
    }
    if not state or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise IntegrityError(f"checkpoint {checkpoint} has no model tensors")

    card = {
        "format": MODEL_FORMAT,
        "source_checkpoint": str(checkpoint),
        "epoch": manifest["epoch"],
        "step": manifest["step"],
        "world_size": manifest["world_size"],
        "strategy": manifest["strategy"],
        "model": manifest["model"],
        "metrics": manifest.get("metrics", []),
        "checkpoint_files": manifest["files"],
    }
    header = {key: json.dumps(value) for key, value in card.items()}
    staged = storage.staging_dir(output_dir)
    try:
        save_file(state, str(staged / MODEL_FILE), metadata=header)
        card["sha256"] = sha256_file(staged / MODEL_FILE)
        card_text = json.dumps(card, indent=2, sort_keys=True) + "\n"
        if storage.is_local(output_dir):
            (staged / MODEL_CARD).write_text(card_text)
            storage.publish_dir(staged, output_dir, MODEL_CARD)
        else:
            storage.retract(output_dir, MODEL_CARD)
            _copy_model_file(staged / MODEL_FILE, str(storage.join(output_dir, MODEL_FILE)))
            storage.write_text(storage.join(output_dir, MODEL_CARD), card_text)
    finally:
        storage.discard_staging(staged)
    return CollectedModel(
        path=str(storage.join(output_dir, MODEL_FILE)), sha256=card["sha256"], card=card
    )


def _copy_model_file(source: Path, target: str) -> None:
    """Upload the model file in bounded chunks and check what landed against its sha256."""
    from kubetrain.integrity import CHUNK_BYTES

    with open(source, "rb") as reader, storage.open_file(target, "wb") as writer:
        while chunk := reader.read(CHUNK_BYTES):
            writer.write(chunk)
    if storage.sha256(target) != sha256_file(source):
        raise IntegrityError(f"model {target}: the uploaded copy differs from {source}; retry")
