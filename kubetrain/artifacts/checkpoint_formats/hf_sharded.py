"""Hugging Face's sharded checkpoints (``save_pretrained``, ``save_torch_state_dict``):
``model.safetensors.index.json`` (``pytorch_model.bin.index.json``) whose ``weight_map``
names the shard file of every tensor, the shards beside it. Read as a whole folder."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kubetrain import bounded_json
from kubetrain.artifacts.checkpoint_formats.api import (
    HF_SHARD,
    Candidate,
    ModelSource,
    index_of_shard,
    make_candidate,
    no_state_key,
)
from kubetrain.artifacts.checkpoint_formats.files import (
    UnreadableCheckpoint,
    check_listed,
    held_to_rule,
    join,
    read_record,
)
from kubetrain.artifacts.checkpoint_formats.safetensors_file import stored_source
from kubetrain.artifacts.checkpoint_formats.torch_save import chosen_state, load, tensors_source
from kubetrain.artifacts.checkpoint_formats.writer import safetensors_tensors
from kubetrain.artifacts.manifest import shown
from kubetrain.artifacts.model_card import (
    SOURCE_HF_SHARDED_SAFETENSORS,
    SOURCE_HF_SHARDED_TORCH_SAVE,
)
from kubetrain.errors import IntegrityError

#: The index's name ending, by the format of its shards.
INDEX_SUFFIXES = {
    ".safetensors.index.json": SOURCE_HF_SHARDED_SAFETENSORS,
    ".bin.index.json": SOURCE_HF_SHARDED_TORCH_SAVE,
}


def is_index(name: str) -> bool:
    return name.endswith(tuple(INDEX_SUFFIXES))


def _weight_map(root: Path, relative: str) -> dict[str, str]:
    """An HF index's ``weight_map`` (tensor → shard file), every shard held to the rule."""
    path = held_to_rule(root, relative)
    what = f"checkpoint file {path}"
    try:
        index = bounded_json.loads(read_record(path))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise UnreadableCheckpoint(
            f"{what} is not a JSON index ({exc}); refused: save the model again with "
            "save_pretrained, or collect one shard-free file"
        ) from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise IntegrityError(
            f"{what} has no weight_map of tensor names to shard files; save the model with "
            "save_pretrained, or collect one shard-free file"
        )
    for name, shard in weight_map.items():
        check_listed(path.parent, shard, f"{what} maps {shown(name)} to")
    return weight_map


def _check_names_the_shards_present(root: Path, relative: str, named: set[str]) -> None:
    """The index is complete and names exactly the shards beside it: every shard it names is
    there (else the save is unfinished: read again later), it names all ``N`` of a
    ``-of-N`` set, and no shard of its name is there that it leaves out (another save's)."""
    index = root / relative
    present = {name for name in os.listdir(index.parent) if index_of_shard(name) == index.name}
    absent = sorted(shard for shard in named if not (index.parent / shard).exists())
    if absent:
        raise UnreadableCheckpoint(
            f"checkpoint file {index} names shard {shown(absent[0])}, which is not there "
            f"({len(absent)} of {len(named)} missing); wait for the save to finish, or save "
            "the model again"
        )
    totals = {int(match["total"]) for shard in named if (match := HF_SHARD.fullmatch(shard))}
    parts = {int(match["part"]) for shard in named if (match := HF_SHARD.fullmatch(shard))}
    if len(totals) == 1 and parts != set(range(1, max(totals) + 1)):
        lacking = min(set(range(1, max(totals) + 1)) - parts, default=max(parts))
        raise IntegrityError(
            f"checkpoint file {index} names {len(parts)} shards of a set of {max(totals)} "
            f"(not shard {lacking}); the index is incomplete: save the model again"
        )
    unnamed = sorted(present - named)
    if unnamed:
        raise IntegrityError(
            f"checkpoint folder {index.parent} holds shard {shown(unnamed[0])}, which "
            f"{index.name} does not name ({len(unnamed)} left out): a shard of another save; "
            "remove the stale shards or save the model again into an empty folder"
        )


def _check_shard(shard: Path, holds: set[str], mapped: list[str], relative: str) -> None:
    """A shard holds exactly what the index maps to it: a tensor missing is refused, and so is
    one the index leaves out (the model would be published without it)."""
    missing = sorted(set(mapped) - holds)
    if missing:
        raise _lacks(shard, missing[0], relative)
    unmapped = sorted(holds - set(mapped))
    if unmapped:
        raise IntegrityError(
            f"checkpoint file {shard} holds tensor {shown(unmapped[0])}, which "
            f"{os.path.basename(relative)} does not map to it ({len(unmapped)} left out); save "
            "the model again, so the index names every tensor"
        )


def _lacks(shard: Path, name: str, relative: str) -> IntegrityError:
    return IntegrityError(
        f"checkpoint file {shard} lacks tensor {shown(name)}, which "
        f"{os.path.basename(relative)} maps to it; save the model again"
    )


class HfSharded:
    FORMATS = tuple(INDEX_SUFFIXES.values())

    def recognise_folder(self, root: Path, folder: str, names: list[str]) -> list[Candidate]:
        found = []
        named = folder or root.name
        for name in names:
            for suffix, fmt in INDEX_SUFFIXES.items():
                if name.endswith(suffix) and not name.startswith("."):
                    shard_suffix = suffix.removesuffix(".index.json")
                    files = [name] + [n for n in names if n.endswith(shard_suffix)]
                    found.append(
                        make_candidate(
                            root, join(folder, name), fmt, [join(folder, n) for n in files], named
                        )
                    )
        return found

    def recognise_file(self, root: Path, relative: str) -> Candidate | None:
        return None

    def files(self, root: Path, candidate: Candidate) -> list[str]:
        folder = os.path.dirname(candidate.relative)
        named = set(_weight_map(root, candidate.relative).values())
        _check_names_the_shards_present(root, candidate.relative, named)
        return [candidate.relative, *sorted(join(folder, shard) for shard in named)]

    def read(self, root: Path, candidate: Candidate, state_key: str) -> ModelSource:
        relative = candidate.relative
        no_state_key(state_key, f"checkpoint {root / relative}")
        folder = os.path.dirname(relative)
        wanted: dict[str, list[str]] = {}
        for name, shard in _weight_map(root, relative).items():
            wanted.setdefault(join(folder, shard), []).append(name)
        if candidate.format == SOURCE_HF_SHARDED_SAFETENSORS:
            stored = {}
            for shard, names in sorted(wanted.items()):
                in_shard = safetensors_tensors(held_to_rule(root, shard))
                _check_shard(root / shard, set(in_shard), names, relative)
                stored.update({name: in_shard[name] for name in names})
            return stored_source(candidate.format, stored)
        state: dict[str, Any] = {}
        for shard, names in sorted(wanted.items()):
            path = held_to_rule(root, shard)
            _, loaded = chosen_state(load(path), "", f"checkpoint file {path}")
            _check_shard(path, set(loaded), names, relative)
            state.update({name: loaded[name] for name in names})
        return tensors_source(candidate.format, state)
