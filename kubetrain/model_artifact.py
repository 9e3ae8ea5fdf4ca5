"""The collected-model folder: ``model.safetensors`` (the full state dict) and
``model.json`` (the model card: provenance, training metrics, sha256 of the model file).

The folder may be local, an fsspec URL (``s3://bucket/models/run``) or a KFP artifact folder
holding only a ``LOCATION`` pointer to one (see :func:`kubetrain.storage.dereference`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kubetrain import storage
from kubetrain.errors import IntegrityError

if TYPE_CHECKING:  # torch only for loading; reading a card or copying a model needs none
    import torch

MODEL_FORMAT = "kubetrain.model/v1"
MODEL_FILE = "model.safetensors"
MODEL_CARD = "model.json"


def read_model_card(model_dir: storage.Location) -> dict[str, Any]:
    """The card of a collected model, with the model file checked against its sha256."""
    folder = storage.dereference(model_dir)
    try:
        card = json.loads(storage.read_text(storage.join(folder, MODEL_CARD)))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise IntegrityError(f"model {folder}: no {MODEL_CARD}; collect the model first") from None
    if card.get("format") != MODEL_FORMAT:
        raise IntegrityError(
            f"model {folder}: format {card.get('format')!r} is not {MODEL_FORMAT}; collect the "
            "model with this kubetrain"
        )
    model_file = storage.join(folder, MODEL_FILE)
    try:
        actual = storage.sha256(model_file)
    except FileNotFoundError:
        raise IntegrityError(f"model {folder}: {MODEL_FILE} is missing; re-collect it") from None
    if actual != card["sha256"]:
        raise IntegrityError(
            f"model {folder}: {model_file} does not match its sha256; re-collect it"
        )
    return card


def load_model_weights(model_dir: storage.Location) -> dict[str, torch.Tensor]:
    """The state dict in ``model.safetensors`` (safetensors: no pickle, nothing executed)."""
    from safetensors import SafetensorError
    from safetensors.torch import load, load_file

    model_file = storage.join(storage.dereference(model_dir), MODEL_FILE)
    try:
        if storage.is_local(model_file):
            return load_file(str(model_file))
        return dict(sorted(load(storage.read_bytes(model_file)).items()))
    except SafetensorError as exc:
        raise IntegrityError(
            f"model file {model_file} is not a safetensors file ({exc}); refused unread, "
            "re-collect it"
        ) from exc


def load_model(
    model_dir: storage.Location, card: dict[str, Any] | None = None
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The collected model rebuilt from its card's spec, weights loaded, in eval mode; and the
    card (read, sha256 checked, unless the caller already has it)."""
    from kubetrain.models import build_model

    card = card if card is not None else read_model_card(model_dir)
    spec = card["model"]
    model = build_model(spec["spec"], spec["sample_shape"], spec["num_classes"])
    try:
        model.load_state_dict(load_model_weights(model_dir), strict=True)
    except RuntimeError as exc:
        # torch's message spans lines (missing and unexpected keys): keep the error one line.
        detail = " ".join(str(exc).split())
        message = f"model {model_dir} does not fit model {spec['spec']!r}: {detail}; re-collect it"
        raise IntegrityError(message) from exc
    return model.eval(), card
