"""A bare ``.safetensors`` file (``safetensors.torch.save_file``): copied byte range by byte
range, its header checked as safetensors checks it (no torch, never a pickle)."""

from __future__ import annotations

from pathlib import Path

from kubetrain.artifacts.checkpoint_formats.api import (
    Candidate,
    ModelSource,
    SingleFile,
    no_state_key,
)
from kubetrain.artifacts.checkpoint_formats.files import held_to_rule
from kubetrain.artifacts.checkpoint_formats.writer import Stored, copy_ranges, safetensors_tensors
from kubetrain.artifacts.model_card import SOURCE_SAFETENSORS


def stored_source(fmt: str, tensors: dict[str, Stored]) -> ModelSource:
    """A model whose tensors are byte ranges of safetensors files."""

    def chunks(order: list[str]) -> object:
        return copy_ranges([tensors[name] for name in order])

    entries = {name: stored.entry(name) for name, stored in tensors.items()}
    return ModelSource(fmt, entries, chunks)


class SafetensorsFile(SingleFile):
    FORMATS = (SOURCE_SAFETENSORS,)
    SUFFIXES = (".safetensors",)

    def read(self, root: Path, candidate: Candidate, state_key: str) -> ModelSource:
        path = held_to_rule(root, candidate.relative)
        no_state_key(state_key, f"checkpoint file {path}")
        return stored_source(SOURCE_SAFETENSORS, safetensors_tensors(path))
