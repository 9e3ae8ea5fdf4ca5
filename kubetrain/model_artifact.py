"""The collected-model folder: ``model.safetensors`` (full state dict, card in its header) and
``model.json`` (the model card: provenance, training metrics, sha256 of the model file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kubetrain.errors import IntegrityError
from kubetrain.integrity import sha256_file

MODEL_FORMAT = "kubetrain.model/v1"
MODEL_FILE = "model.safetensors"
MODEL_CARD = "model.json"


def read_model_card(model_dir: str) -> dict[str, Any]:
    """The card of a collected model, with the model file checked against its sha256."""
    card_path = Path(model_dir) / MODEL_CARD
    if not card_path.is_file():
        raise IntegrityError(f"model {model_dir}: no {MODEL_CARD}; collect the model first")
    card = json.loads(card_path.read_text())
    if card.get("format") != MODEL_FORMAT:
        raise IntegrityError(
            f"model {model_dir}: format {card.get('format')!r} is not {MODEL_FORMAT}"
        )
    model_file = Path(model_dir) / MODEL_FILE
    if not model_file.is_file():
        raise IntegrityError(f"model {model_dir}: {MODEL_FILE} is missing")
    if sha256_file(model_file) != card["sha256"]:
        raise IntegrityError(
            f"model {model_dir}: {model_file} does not match its sha256; re-collect it"
        )
    return card
