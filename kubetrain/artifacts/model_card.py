"""The collected-model folder: ``model.safetensors`` (the full state dict) and
``model.json`` (the model card: provenance, training metrics, sha256 of the model file).

Provenance: ``source_checkpoint`` (the folder collected from: a kubetrain checkpoint's epoch
folder, or the folder a script saved into), ``source_file`` (the file taken, relative to it:
a kubetrain checkpoint's ``manifest.json``, a script's ``model_epoch_10.pt``, a DCP
``.metadata``, an HF index), ``source_sha256`` (that file's), ``source_format`` (one of
:data:`SOURCE_FORMATS`) and ``epoch`` when known. A kubetrain checkpoint's card also carries
what its manifest recorded of the training: ``metrics`` (per epoch) and, from checkpoints
written since issue 18, ``history`` (per optimizer step), ``hyperparameters`` and ``run``;
all are optional. A card of kubetrain's own checkpoint (or one
written before ``source_format`` existed) records the model fully (``model``: spec, sample
shape, classes); one of a script's checkpoint records only what is known (``model`` may be
empty, or hold the spec ``kubetrain collect --model-factory`` named): evaluate takes the sample
shape and classes from the dataset and the model code from ``--model-factory``.

The folder may be local, an fsspec URL (``s3://bucket/models/run``) or a KFP artifact folder
holding only a ``LOCATION`` pointer to one (see :func:`kubetrain.storage.dereference`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kubetrain import storage
from kubetrain.artifacts.manifest import (
    MODEL_FIELDS,
    OBJECT,
    RECORDS,
    REWRITE,
    SHA256,
    TEXT,
    WHOLE,
    Rule,
    check_entry,
    check_fields,
    name_problem,
    read_format_manifest,
    shown,
)
from kubetrain.errors import IntegrityError, InvalidInput

if TYPE_CHECKING:  # torch only for loading; reading a card or copying a model needs none
    import torch

MODEL_FORMAT = "kubetrain.model/v1"
MODEL_FILE = "model.safetensors"
MODEL_CARD = "model.json"
#: The record of a model's exported programs (kubetrain.artifacts.export), beside its card.
EXPORT_CARD = "export.json"
#: A model registry's pointer to its current version (``kubetrain promote``): a folder beside
#: it is a published version, which nothing but promote writes.
REGISTRY_POINTER = "PROMOTED"
REGISTRY_POINTER_FORMAT = "kubetrain.promoted/v1"
#: What a model was collected from (the card's ``source_format``).
SOURCE_KUBETRAIN = "kubetrain"
SOURCE_TORCH_SAVE = "torch-save"
SOURCE_TORCH_SAVE_DICT = "torch-save-dict"
SOURCE_SAFETENSORS = "safetensors"
SOURCE_DCP = "dcp"
SOURCE_HF_SHARDED_SAFETENSORS = "hf-sharded-safetensors"
SOURCE_HF_SHARDED_TORCH_SAVE = "hf-sharded-torch-save"
SOURCE_LIGHTNING = "lightning"
SOURCE_DEEPSPEED_ZERO = "deepspeed-zero"
SOURCE_FORMATS = (
    SOURCE_KUBETRAIN, SOURCE_TORCH_SAVE, SOURCE_TORCH_SAVE_DICT, SOURCE_SAFETENSORS, SOURCE_DCP,
    SOURCE_HF_SHARDED_SAFETENSORS, SOURCE_HF_SHARDED_TORCH_SAVE, SOURCE_LIGHTNING,
    SOURCE_DEEPSPEED_ZERO,
)  # fmt: skip


_CARD_FIELDS = {"sha256": SHA256, "model": OBJECT}
_SOURCE_FIELDS = {
    "source_format": Rule(lambda value: value in SOURCE_FORMATS, f"one of {SOURCE_FORMATS}"),
    "source_file": TEXT,
    "source_sha256": SHA256,
    "epoch": WHOLE,
    "step": WHOLE,
}


def is_full_record(card: dict[str, Any]) -> bool:
    """Whether the card records the model fully (spec, sample shape, classes): a kubetrain
    checkpoint's card, as every card was before ``source_format``."""
    return card.get("source_format", SOURCE_KUBETRAIN) == SOURCE_KUBETRAIN


def read_model_card(model_dir: storage.Location) -> dict[str, Any]:
    """The card of a collected model, with the model file checked against its sha256. Every
    malformed card is one IntegrityError; the model file is held to the manifest rule (a
    regular file inside the folder) before it is read."""
    folder = storage.dereference(model_dir)
    what = f"model {folder}"
    card = read_format_manifest(
        folder,
        MODEL_FORMAT,
        what=what,
        if_missing="; collect the model first",
        if_foreign="collect the model with this kubetrain",
        name=MODEL_CARD,
    )
    check_fields(card, _CARD_FIELDS, what, MODEL_CARD)
    present = {key: _SOURCE_FIELDS[key] for key in _SOURCE_FIELDS if card.get(key) is not None}
    check_fields(card, present, what, MODEL_CARD)
    # a script's checkpoint says nothing of the model: what the card holds must still be right
    recorded = MODEL_FIELDS if is_full_record(card) else {
        key: rule for key, rule in MODEL_FIELDS.items() if key in card["model"]
    }  # fmt: skip
    check_fields(card["model"], recorded, what, MODEL_CARD, within="model.")
    optional = {
        "metrics": RECORDS,
        "checkpoint_files": OBJECT,
        "history": RECORDS,
        "hyperparameters": OBJECT,
        "run": OBJECT,
    }
    check_fields(card, {key: optional[key] for key in optional if key in card}, what, MODEL_CARD)
    source_file = card.get("source_file")
    if source_file is not None and (problem := name_problem(source_file)) is not None:
        raise IntegrityError(
            f"{what}: {MODEL_CARD} names the source file {shown(card['source_file'])}, which "
            f"{problem}; {REWRITE}"
        )
    # names in the source checkpoint, shown in reports: held to the rule by name alone
    for name in card.get("checkpoint_files", {}):
        if (problem := name_problem(name)) is not None:
            raise IntegrityError(
                f"{what}: {MODEL_CARD} lists the checkpoint file {shown(name)}, which "
                f"{problem}; {REWRITE}"
            )
    model_file = storage.join(folder, check_entry(folder, MODEL_FILE, what, f"{MODEL_CARD} names"))
    try:
        actual = storage.sha256(model_file)
    except FileNotFoundError:
        raise IntegrityError(f"{what}: {MODEL_FILE} is missing; re-collect it") from None
    if actual != card["sha256"]:
        raise IntegrityError(f"{what}: {model_file} does not match its sha256; re-collect it")
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
    model_dir: storage.Location,
    card: dict[str, Any] | None = None,
    model_factory: str | None = None,
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The collected model rebuilt from its card, weights loaded, in eval mode; and the card
    (read, sha256 checked, unless the caller already has it). A card naming custom code is
    rebuilt only with ``model_factory``, the caller's explicit choice
    (:func:`kubetrain.artifacts.models.rebuild_model`). A model collected from a script's
    checkpoint records no code: it is rebuilt by ``model_factory``, for the sample shape and
    classes the caller puts in ``card["model"]`` (evaluate: the dataset's)."""
    from kubetrain.artifacts.models import rebuild_model

    card = card if card is not None else read_model_card(model_dir)
    recorded = card["model"]
    source = f"a {card.get('source_format')} checkpoint ({card.get('source_file')})"
    if "spec" not in recorded and not model_factory:
        raise InvalidInput(
            "model_factory",
            f"model {model_dir} was collected from {source} and records no model code",
            "pass --model-factory package.module:callable that builds it (model_factory in a "
            "pipeline step)",
        )
    if "sample_shape" not in recorded or "num_classes" not in recorded:
        raise IntegrityError(
            f"model {model_dir} was collected from {source} and records no sample shape or "
            "class count to build the model for; evaluate it with --data, which gives them"
        )
    recorded = {"spec": model_factory, **recorded}
    model = rebuild_model(recorded, model_factory, f"model {model_dir}")
    try:
        model.load_state_dict(load_model_weights(model_dir), strict=True)
    except RuntimeError as exc:
        # torch's message spans lines (missing and unexpected keys): keep the error one line.
        detail = " ".join(str(exc).split())
        built = model_factory or recorded["spec"]
        message = f"model {model_dir} does not fit model {built!r}: {detail}; re-collect it"
        raise IntegrityError(message) from exc
    return model.eval(), card
