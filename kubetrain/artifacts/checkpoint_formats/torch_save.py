"""``torch.save`` files (``.pt``, ``.pth``, ``.bin``): a state dict, or a dict holding one
(``{"model_state_dict": ..., "optimizer_state_dict": ..., "epoch": 7}``, the DDP tutorial's
``{"MODEL_STATE": ..., "EPOCHS_RUN": 5}``), the model chosen by
:mod:`~kubetrain.artifacts.checkpoint_formats.state_select`. Loaded only by
``torch.load(weights_only=True)``, memory-mapped."""

from __future__ import annotations

import errno
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubetrain.artifacts.checkpoint_formats.api import (
    Candidate,
    ModelSource,
    SingleFile,
)
from kubetrain.artifacts.checkpoint_formats.files import UnreadableCheckpoint, held_to_rule
from kubetrain.artifacts.checkpoint_formats.state_select import (
    SAVE_STATE_DICT,
    Choice,
    choose_state,
    leaves_of,
)
from kubetrain.artifacts.checkpoint_formats.writer import tensor_bytes, tensor_entry, unsupported
from kubetrain.artifacts.manifest import shown
from kubetrain.artifacts.model_card import SOURCE_TORCH_SAVE, SOURCE_TORCH_SAVE_DICT
from kubetrain.errors import IntegrityError, refusal_reason

SUFFIXES = (".pt", ".pth", ".bin")
#: Where a saved dict records how far training got, by the name a card gives it.
NUMBER_KEYS = {"epoch": ("epoch", "epochs_run", "current_epoch"), "step": ("step", "global_step")}


def load(path: Path, safe_globals: Sequence[Any] = ()) -> Any:
    """``torch.load(weights_only=True)`` of ``path``, memory-mapped when it is a zip file (what
    ``torch.save`` writes): tensors and plain containers only (and ``safe_globals``, torch's
    allowlist), never code the file names."""
    import torch

    try:
        mmap = zipfile.is_zipfile(path)
        with warnings.catch_warnings(), torch.serialization.safe_globals(list(safe_globals)):
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except MemoryError:
        raise
    except Exception as exc:  # whatever a refused or malformed pickle raises
        if isinstance(exc, OSError) and exc.errno not in (errno.EINVAL, None):
            raise  # the file system's own error (EIO, EACCES...): the error boundary's line
        # torch's zip reader says EINVAL of a truncated or corrupt archive
        reason = "truncated or corrupt" if isinstance(exc, OSError) else refusal_reason(exc)
        refused = any(words in str(exc) for words in ("Weights only load", "Unsupported global"))
        raise (IntegrityError if refused else UnreadableCheckpoint)(
            f"checkpoint file {path} is not a plain state dict, refused unread by "
            f"torch.load(weights_only=True) ({reason}); {SAVE_STATE_DICT} with torch.save"
        ) from None


def _whole(value: object) -> int | None:
    import torch

    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = int(value.item())
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def numbers_beside(saved: Mapping[Any, Any]) -> dict[str, int]:
    """The ``epoch``/``step`` a dict records beside the model (whole numbers only)."""
    numbers = {}
    lowered = {str(key).lower(): value for key, value in saved.items()}
    for name, aliases in NUMBER_KEYS.items():
        found = [_whole(lowered.get(alias)) for alias in aliases]
        found = [number for number in found if number is not None]
        if found:
            numbers[name] = found[0]
    return numbers


def chosen_state(saved: Any, state_key: str, what: str) -> tuple[Choice, dict[str, Any]]:
    """The model's tensors (name → tensor) in what ``torch.load`` returned."""
    import torch

    if not isinstance(saved, Mapping):
        raise IntegrityError(
            f"{what} holds a {type(saved).__name__}, not a state dict; {SAVE_STATE_DICT}"
        )
    leaves = leaves_of(saved, lambda value: isinstance(value, torch.Tensor))
    choice = choose_state(leaves, state_key, what)
    state = {}
    for name, path in choice.names.items():
        value: Any = saved
        for part in path:
            value = value[part]
        kind = unsupported(value)
        if kind is not None:
            where = f"{what}: {choice.state_key}" if choice.state_key else what
            raise IntegrityError(
                f"{where}: state dict entry {shown(name)} is a {kind} tensor, which safetensors "
                "cannot hold; save dense tensors of a real dtype"
            )
        state[name] = value
    return choice, state


def tensors_source(fmt: str, state: dict[str, Any], **found: Any) -> ModelSource:
    """A model held as tensors in memory (memory-mapped from the file)."""

    def chunks(order: list[str]) -> Any:
        return (tensor_bytes(state[name]) for name in order)

    entries = {name: tensor_entry(name, tensor) for name, tensor in state.items()}
    return ModelSource(fmt, entries, chunks, **found)


def read_saved(
    root: Path,
    candidate: Candidate,
    state_key: str,
    safe_globals: Sequence[Any] = (),
    check: Callable[[Any, str], None] | None = None,
) -> tuple[Any, Choice, dict[str, Any]]:
    path = held_to_rule(root, candidate.relative)
    what = f"checkpoint file {path}"
    saved = load(path, safe_globals)
    if check is not None:
        check(saved, what)
    choice, state = chosen_state(saved, state_key, what)
    return saved, choice, state


class TorchSave(SingleFile):
    FORMATS = (SOURCE_TORCH_SAVE, SOURCE_TORCH_SAVE_DICT)
    SUFFIXES = SUFFIXES

    def read(self, root: Path, candidate: Candidate, state_key: str) -> ModelSource:
        saved, choice, state = read_saved(root, candidate, state_key)
        if not choice.node:
            return tensors_source(SOURCE_TORCH_SAVE, state)
        return tensors_source(
            SOURCE_TORCH_SAVE_DICT,
            state,
            numbers=numbers_beside(saved),
            state_key=choice.state_key,
        )
