"""DeepSpeed ZeRO checkpoints (stages 1-3), as ``engine.save_checkpoint`` of deepspeed 0.19.8
writes them (our trainer's under ``epoch-NNNNNN/zero/``, and users'): a folder holding a
``latest`` file that names a tag folder (``global_step5/``), or the tag folder itself, with
``mp_rank_00_model_states.pt`` (stages 1-2) or one ``zero_pp_rank_R_mp_rank_00_model_states.pt``
per rank (stage 3), and every rank's ``[bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt``.

The model published is the one DeepSpeed's own ``deepspeed/utils/zero_to_fp32.py`` (v0.19.8)
reconstructs, by its rules, read here, not copied:

* the fp32 master weights are in the optimizer files' flat groups (``parse_optim_states``):
  ``single_partition_of_fp32_groups`` under stages 1-2, where each group is the ranks'
  partitions end to end and the parameters of ``param_shapes`` lie in it one after another,
  each followed by its ``param_alignment_paddings`` (``_zero2_merge_trainable_params``: the
  offset consumed, rounded up to ``2 × world size``, must equal the elements there);
  ``fp32_flat_groups`` under stage 3, where every rank holds ``ceil(numel / world size)``
  elements of each parameter, the last rank's padded (``zero3_partitioned_param_info``,
  ``_zero3_merge_trainable_params``, ``GatheredTensor.contiguous``);
* buffers come from rank 0's model states (``module``, the names in ``buffer_names``), a
  floating one as float32 (``parse_model_states``);
* frozen parameters from ``frozen_param_fragments`` (``_zero2_merge_frozen_params``: rank 0's
  whole tensor; ``_zero3_merge_frozen_params``: every rank's fragment end to end, cut to the
  shape). Stage 1 saves none there, and zero_to_fp32 drops them; they are in rank 0's
  ``module`` whole, and are published from it (a model without them would not load);
* a shared parameter (``shared_params``: alias → source, rank 0's) is the source's tensor
  again under the alias' name.

Memory stays bounded: every file is ``torch.load``ed memory-mapped (``mmap=True``: unpickling
reads the pickled structure only, never a tensor's bytes), and the output is written tensor by
tensor from slices of the mapped flat groups, each mapping dropped once
:data:`BYTES_PER_MAPPING` bytes were read through it (a mapped page read stays resident
while mapped), so the peak is about that much beside torch, whatever the checkpoint's size.

Every pickle is loaded by ``torch.load(weights_only=True)`` with :data:`SAFE_GLOBALS` only:
the three DeepSpeed classes the files name, each read as inert data by a stand-in of ours
(torch's ``add_safe_globals`` takes a stand-in under the name a checkpoint uses), so no
DeepSpeed code runs and collect needs no DeepSpeed installed. Optimizer state (Adam's moments,
the loss scaler) is never published.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubetrain.artifacts.checkpoint_formats.api import (
    Candidate,
    ModelSource,
    make_candidate,
    no_state_key,
)
from kubetrain.artifacts.checkpoint_formats.files import UnreadableCheckpoint, held_to_rule, join
from kubetrain.artifacts.checkpoint_formats.writer import TORCH_DTYPES, Entry, tensor_bytes
from kubetrain.artifacts.manifest import shown
from kubetrain.artifacts.model_card import SOURCE_DEEPSPEED_ZERO
from kubetrain.errors import IntegrityError, refusal_reason

#: The file naming the newest tag folder (deepspeed runtime/engine.py ``save_checkpoint``).
LATEST = "latest"
#: Every rank's optimizer partition, stage 3's per-rank model states (``_get_zero_ckpt_name``,
#: ``_get_ckpt_name``; ``bf16_`` when trained in bf16).
_RANK_FILE = re.compile(
    r"(?P<bf16>bf16_)?zero_pp_rank_(?P<rank>\d+)_mp_rank_(?P<mp>\d+)_(?P<kind>optim|model)"
    r"_states\.pt"
)
#: Stages 1-2's one model states file.
_MODEL_FILE = re.compile(r"mp_rank_(?P<mp>\d+)_model_states\.pt")
#: Bytes read through one mapping of a file before it is dropped (and mapped again if needed).
BYTES_PER_MAPPING = 64 << 20
#: The groups of fp32 master weights in an optimizer file, by stage (zero_to_fp32.py
#: ``parse_optim_states``).
_FLAT_GROUPS = {1: "single_partition_of_fp32_groups", 2: "single_partition_of_fp32_groups",
                3: "fp32_flat_groups"}  # fmt: skip
#: Where torch's refusal names the global a pickle asked for (``GLOBAL posix.system``).
_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
_SAVE_AGAIN = "save the checkpoint again with DeepSpeed's engine.save_checkpoint"


def _zero_stage(value: int) -> int:
    """``ZeroStageEnum(2)`` as the number it holds."""
    return int(value)


class _Record:
    """A plain object DeepSpeed pickles beside the weights (the loss scaler's settings, a
    fragment's numel and start): its attributes are set as data, no code of its own runs, and
    nothing of it is used."""


#: What a ZeRO checkpoint's pickles name besides tensors and plain containers (found with
#: ``torch.serialization.get_unsafe_globals_in_checkpoint`` on the stage 1-3 checkpoints, fp32
#: and bf16, of deepspeed 0.19.8), each mapped to an inert stand-in:
#: ``ZeroStageEnum`` is the optimizer state's ``zero_stage`` (stages 1-3), ``LossScaler`` its
#: ``loss_scaler`` (stages 1-3), ``fragment_address`` the values of its
#: ``param_slice_mappings`` (stages 1-2).
SAFE_GLOBALS = [
    (_zero_stage, "deepspeed.runtime.zero.config.ZeroStageEnum"),
    (_Record, "deepspeed.runtime.fp16.loss_scaler.LossScaler"),
    (_Record, "deepspeed.utils.tensor_fragment.fragment_address"),
]


def _load(path: Path) -> Any:
    """``torch.load(weights_only=True, mmap=True)`` of a file held to the rule, with
    :data:`SAFE_GLOBALS` only; anything else is refused in one line naming the file and what it
    holds, unread."""
    import torch

    try:
        with warnings.catch_warnings(), torch.serialization.safe_globals(SAFE_GLOBALS):
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except MemoryError:
        raise
    except Exception as exc:  # whatever a refused or malformed pickle raises
        if isinstance(exc, OSError) and exc.errno not in (errno.EINVAL, None):
            raise  # the file system's own error: the error boundary's line
        text = str(exc)
        if "Weights only load" in text or "Unsupported global" in text:
            named = _GLOBAL.search(text)
            held = f"the class or function {named[1]}" if named else refusal_reason(exc)
            raise IntegrityError(
                f"checkpoint file {path} holds {held}, which no DeepSpeed ZeRO checkpoint "
                f"holds; refused unread (torch.load weights_only=True): {_SAVE_AGAIN}"
            ) from None
        raise UnreadableCheckpoint(
            f"checkpoint file {path} is truncated or corrupt ({text.split('. ')[0].strip()}); "
            f"{_SAVE_AGAIN}, or collect an earlier checkpoint"
        ) from None


# --- finding the files --------------------------------------------------------------------------


def is_zero_file(name: str) -> bool:
    return _RANK_FILE.fullmatch(name) is not None or _MODEL_FILE.fullmatch(name) is not None


def _tag_named_by_latest(root: Path, folder: str, names: list[str]) -> str | None:
    """The tag folder ``folder/latest`` names, when ``latest`` is a small regular file naming
    a folder beside it (else None: no DeepSpeed pointer, never followed out)."""
    if LATEST not in names:
        return None
    path = root / join(folder, LATEST)
    try:
        status = os.lstat(path)
        if not stat.S_ISREG(status.st_mode) or status.st_size > 4096:
            return None
        with open(path, "rb") as handle:
            tag = handle.read(4096).decode().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not tag or "/" in tag or tag.startswith("."):
        return None
    if tag not in names or not stat.S_ISDIR(os.lstat(root / join(folder, tag)).st_mode):
        _refuse_dangling_latest(root, folder, names, tag)
        return None
    return tag


def _refuse_dangling_latest(root: Path, folder: str, names: list[str], tag: str) -> None:
    """A DeepSpeed save folder (a tag folder of ZeRO files beside ``latest``) whose ``latest``
    names no tag folder here: DeepSpeed's own load_checkpoint would find nothing to load, and
    an older tag is not the checkpoint ``latest`` says was written. Refused, never guessed."""
    tags = [name for name in names if name != LATEST and _zero_files(root, join(folder, name))]
    if tags:
        raise IntegrityError(
            f"checkpoint folder {root / folder}: its {LATEST} names tag {shown(tag)}, which is "
            f"not a folder there (tag folders: {', '.join(sorted(tags)[:5])}); its save did not "
            f"finish or the folder was changed: point {LATEST} at a complete tag, or name "
            "that tag's folder with --checkpoint-dir"
        )


def _zero_files(root: Path, folder: str) -> list[str]:
    try:
        return sorted(name for name in os.listdir(root / folder) if is_zero_file(name))
    except OSError:
        return []


def _first_model_file(names: list[str]) -> str:
    """The file a card names as the source: rank 0's model states (zero_to_fp32.py
    ``get_model_state_file``), else the first file."""
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):
        if name in names:
            return name
    return names[0]


@dataclass(frozen=True)
class _Inventory:
    """A tag folder's files: optimizer and (stage 3) model states files by rank."""

    folder: str
    optim: dict[int, str]
    ranked_models: dict[int, str]
    model: str | None


def _inventory(root: Path, folder: str, names: list[str]) -> _Inventory:
    where = f"checkpoint {root / folder}"
    optim: dict[int, str] = {}
    ranked: dict[int, str] = {}
    model = None
    for name in names:
        found = _RANK_FILE.fullmatch(name) or _MODEL_FILE.fullmatch(name)
        if found is None:
            continue
        if int(found["mp"]) != 0:
            raise IntegrityError(
                f"{where} holds {shown(name)}, a model-parallel (tensor or pipeline) shard, "
                "which zero_to_fp32 does not merge either; use DeepSpeed's ds_to_universal.py "
                "to convert it, or train without model parallelism"
            )
        if _MODEL_FILE.fullmatch(name):
            model = join(folder, name)
            continue
        into = optim if found["kind"] == "optim" else ranked
        rank = int(found["rank"])
        if rank in into:
            raise IntegrityError(
                f"{where} holds two {found['kind']} states files of rank {rank} "
                f"({shown(os.path.basename(into[rank]))} and {shown(name)}): two saves' files; "
                "save each checkpoint into a folder of its own"
            )
        into[rank] = join(folder, name)
    return _Inventory(folder, optim, ranked, model)


class DeepSpeedZero:
    FORMATS = (SOURCE_DEEPSPEED_ZERO,)

    def recognise_folder(self, root: Path, folder: str, names: list[str]) -> list[Candidate]:
        tag_folder, pointer = folder, []
        zero = [name for name in names if is_zero_file(name)]
        if not zero:
            tag = _tag_named_by_latest(root, folder, names)
            if tag is None:
                return []
            tag_folder, pointer = join(folder, tag), [join(folder, LATEST)]
            zero = _zero_files(root, tag_folder)
            if not zero:
                return []
        files = pointer + [join(tag_folder, name) for name in zero]
        relative = join(tag_folder, _first_model_file(zero))
        return [
            make_candidate(root, relative, SOURCE_DEEPSPEED_ZERO, files, tag_folder or root.name)
        ]

    def recognise_file(self, root: Path, relative: str) -> Candidate | None:
        return None

    def files(self, root: Path, candidate: Candidate) -> list[str]:
        """``latest`` (when the candidate was found through it) and every ZeRO file of the tag
        folder as it is now."""
        folder = os.path.dirname(candidate.relative)
        pointer = [name for name in candidate.files if os.path.basename(name) == LATEST]
        return pointer + [join(folder, name) for name in _zero_files(root, folder)]

    def read(self, root: Path, candidate: Candidate, state_key: str) -> ModelSource:
        folder = os.path.dirname(candidate.relative)
        no_state_key(state_key, f"DeepSpeed ZeRO checkpoint {root / folder}")
        names = [os.path.basename(name) for name in self.files(root, candidate)]
        plan = _Plan.of(root, _inventory(root, folder, names))
        entries = {name: tensor.entry(name) for name, tensor in plan.tensors.items()}

        def chunks(order: list[str]) -> Iterator[Any]:
            return _Mapped(root).chunks([plan.tensors[name] for name in order])

        return ModelSource(SOURCE_DEEPSPEED_ZERO, entries, chunks, numbers=plan.numbers)


# --- the merge, planned from the pickled structure alone -----------------------------------------


@dataclass(frozen=True)
class _Piece:
    """``length`` elements from ``start`` of the flat view of a tensor in a file (``keys``
    lead to it in what ``torch.load`` returns)."""

    file: str
    keys: tuple[Any, ...]
    start: int
    length: int


@dataclass(frozen=True)
class _Planned:
    """A published tensor: its dtype and shape, the pieces it is made of end to end, and the
    dtype each piece is cast to (floating buffers to float32), or None."""

    dtype: Any
    shape: tuple[int, ...]
    pieces: tuple[_Piece, ...]
    cast: Any = None

    def entry(self, name: str) -> Entry:
        dtype = str(self.dtype).removeprefix("torch.")
        return Entry(
            name, TORCH_DTYPES[dtype], self.shape, math.prod(self.shape) * self.dtype.itemsize
        )


def _tensor_at(loaded: Any, keys: tuple[Any, ...], path: Path) -> Any:
    import torch

    value = loaded
    for key in keys:
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            value = None
            break
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        raise IntegrityError(
            f"checkpoint file {path} holds a {type(value).__name__} at "
            f"{shown('.'.join(map(str, keys)))}, where DeepSpeed saves a tensor; {_SAVE_AGAIN}"
        )
    if str(value.dtype).removeprefix("torch.") not in TORCH_DTYPES:
        raise IntegrityError(
            f"checkpoint file {path}: {shown('.'.join(map(str, keys)))} is a {value.dtype} tensor, "
            "which safetensors cannot hold; train with a real dtype"
        )
    return value


def _shape(value: Any, what: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(size) for size in value)
    except (TypeError, ValueError):
        shape = ()
        value = None
    if value is None or any(size < 0 for size in shape):
        raise IntegrityError(f"{what} is {shown(value)}, not a tensor shape; {_SAVE_AGAIN}")
    return shape


def _ranks_of(optim: dict[int, str], world: int, where: str) -> None:
    """Every rank's optimizer file is there, no other (zero_to_fp32.py ``parse_optim_states``
    counts them against ``partition_count``)."""
    missing = sorted(set(range(world)) - set(optim))
    if missing:
        raise UnreadableCheckpoint(
            f"{where} lacks the optimizer states of rank {missing[0]} ({len(optim)} of "
            f"{world} ranks' files there; *zero_pp_rank_{missing[0]}_mp_rank_00_optim_states.pt"
            "): the save is unfinished or a rank failed to write; wait for the save, or "
            "collect an earlier checkpoint"
        )
    extra = sorted(set(optim) - set(range(world)))
    if extra:
        raise IntegrityError(
            f"{where} holds the optimizer states of rank {extra[0]}, but its world size is "
            f"{world}: another save's files; save each checkpoint into a folder of its own"
        )


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, list) and value:
        value = max(value)  # ZeRO-2 keeps one per param group (zero_to_fp32: the largest)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise IntegrityError(f"{what} is {shown(value)}, not a positive count; {_SAVE_AGAIN}")
    return value


@dataclass
class _Plan:
    tensors: dict[str, _Planned]
    numbers: dict[str, int]

    @classmethod
    def of(cls, root: Path, files: _Inventory) -> _Plan:
        where = f"DeepSpeed ZeRO checkpoint {root / files.folder}"
        if not files.optim:
            raise IntegrityError(
                f"{where} holds no *_optim_states.pt, where ZeRO keeps the fp32 weights (a "
                "checkpoint without ZeRO, stage 0, is not read); collect a ZeRO stage 1-3 "
                "checkpoint, or save the model's state_dict() with torch.save"
            )
        header = _OptimizerHeader.of(root, files.optim[min(files.optim)])
        stage, world = header.stage, header.world
        _ranks_of(files.optim, world, where)
        model = files.model if stage < 3 else files.ranked_models.get(0)
        if model is None:
            expected = "zero_pp_rank_0_mp_rank_00" if stage == 3 else "mp_rank_00"
            raise IntegrityError(
                f"{where} holds optimizer states only, no model states ({expected}"
                "_model_states.pt, where the names, buffers and frozen parameters are); "
                "collect the whole tag folder DeepSpeed saved"
            )
        groups = [_flat_groups(root, files.optim[rank], stage) for rank in range(world)]
        model_path = held_to_rule(root, model)
        states = _load(model_path)
        shapes = states.get("param_shapes") if isinstance(states, dict) else None
        if not isinstance(shapes, list) or not all(isinstance(g, dict) for g in shapes):
            raise IntegrityError(
                f"checkpoint file {model_path} is not a ZeRO optimizer's model states (no "
                f"param_shapes, one dict per parameter group); {_SAVE_AGAIN}"
            )
        module = states.get("module") if isinstance(states.get("module"), dict) else {}
        tensors: dict[str, _Planned] = {}
        for name in states.get("buffer_names") or ():
            if name in module:
                tensors[name] = _whole(model_path, model, ("module", name), states, cast=True)
        frozen = states.get("frozen_param_shapes") or {}
        if frozen:
            tensors.update(_frozen(root, files, stage, world, frozen, where))
        if stage < 3:
            tensors.update(_zero2_trainable(where, shapes, groups, header.paddings, files.optim))
        else:
            tensors.update(_zero3_trainable(where, shapes, groups, files.optim))
        shared = states.get("shared_params") or {}
        if stage == 1:
            # stage 1 keeps frozen parameters in module only (zero_to_fp32 drops them)
            for name in module:
                if name not in tensors and name not in shared:
                    tensors[name] = _whole(model_path, model, ("module", name), states)
        for alias, source in shared.items():
            if source in tensors:
                tensors[alias] = tensors[source]
        steps = states.get("global_steps")
        numbers = {"step": steps} if isinstance(steps, int) and steps >= 0 else {}
        return cls(tensors, numbers)


@dataclass(frozen=True)
class _OptimizerHeader:
    """What rank 0's optimizer file says of the whole: the stage, the world size
    (``partition_count``) and, under stages 1-2, each parameter's alignment padding."""

    stage: int
    world: int
    paddings: list[Any] | None

    @classmethod
    def of(cls, root: Path, relative: str) -> _OptimizerHeader:
        path = held_to_rule(root, relative)
        saved = _load(path)
        state = saved.get("optimizer_state_dict") if isinstance(saved, dict) else None
        stage = state.get("zero_stage") if isinstance(state, dict) else None
        if stage not in _FLAT_GROUPS:
            raise IntegrityError(
                f"checkpoint file {path} is not a ZeRO stage 1-3 optimizer's states "
                f"(zero_stage {shown(stage)}); {_SAVE_AGAIN}"
            )
        world = _as_int(state.get("partition_count"), f"checkpoint file {path}: partition_count")
        paddings = state.get("param_alignment_paddings")
        return cls(stage, world, paddings if isinstance(paddings, list) else None)


def _flat_groups(root: Path, relative: str, stage: int) -> list[tuple[int, Any]]:
    """(numel, dtype) of each flat group of one rank's optimizer file (nothing of them read)."""
    path = held_to_rule(root, relative)
    saved = _load(path)
    state = saved.get("optimizer_state_dict") if isinstance(saved, dict) else None
    if not isinstance(state, dict) or state.get("zero_stage") != stage:
        raise IntegrityError(
            f"checkpoint file {path} is not the states of a ZeRO stage {stage} optimizer, as "
            f"rank 0's are: two saves' files; {_SAVE_AGAIN}"
        )
    key = _FLAT_GROUPS[stage]
    found = []
    for index in range(len(state.get(key) or ())):
        tensor = _tensor_at(saved, ("optimizer_state_dict", key, index), path)
        found.append((tensor.numel(), tensor.dtype))
    if not found:
        raise IntegrityError(f"checkpoint file {path} holds no {key}; {_SAVE_AGAIN}")
    return found


def _whole(
    path: Path, relative: str, keys: tuple[Any, ...], saved: Any, cast: bool = False
) -> _Planned:
    """A tensor taken whole from a model states file (a floating buffer as float32, with
    ``cast``, as zero_to_fp32.py ``parse_model_states`` restores it)."""
    import torch

    tensor = _tensor_at(saved, keys, path)
    upcast = torch.float32 if cast and tensor.is_floating_point() else None
    piece = _Piece(relative, keys, 0, tensor.numel())
    return _Planned(upcast or tensor.dtype, tuple(tensor.shape), (piece,), upcast)


def _frozen(
    root: Path, files: _Inventory, stage: int, world: int, shapes: dict, where: str
) -> dict[str, _Planned]:
    """Frozen parameters: rank 0's whole fragment (stage 2), or every rank's fragment end to
    end, cut to the shape (stage 3)."""
    if stage < 3:
        sources = [files.model]
    else:
        missing = sorted(set(range(world)) - set(files.ranked_models))
        if missing:
            raise UnreadableCheckpoint(
                f"{where} lacks the model states of rank {missing[0]} (zero_pp_rank_"
                f"{missing[0]}_mp_rank_00_model_states.pt, which holds its part of the frozen "
                "parameters); wait for the save, or collect an earlier checkpoint"
            )
        sources = [files.ranked_models[rank] for rank in range(world)]
    fragments = []  # per source: name -> (numel, dtype)
    for relative in sources:
        path = held_to_rule(root, relative)
        saved = _load(path)
        found = {}
        for name in shapes:
            tensor = _tensor_at(saved, ("frozen_param_fragments", name), path)
            found[name] = (tensor.numel(), tensor.dtype)
        fragments.append((relative, found))
    planned = {}
    for name, value in shapes.items():
        shape = _shape(value, f"{where}: frozen_param_shapes[{shown(name)}]")
        pieces, left = [], math.prod(shape)
        for relative, found in fragments:
            take = min(left, found[name][0])
            if take:
                pieces.append(_Piece(relative, ("frozen_param_fragments", name), 0, take))
            left -= take
        if left:
            raise IntegrityError(
                f"{where}: the fragments of frozen parameter {shown(name)} lack {left} of its "
                f"{math.prod(shape)} elements; {_SAVE_AGAIN}"
            )
        planned[name] = _Planned(fragments[0][1][name][1], shape, tuple(pieces))
    return planned


def _pieces_of(
    rank_groups: list[tuple[int, Any]], rank_file: str, key: str, begin: int, length: int
) -> list[_Piece]:
    """``length`` elements from ``begin`` of one rank's flat groups taken end to end."""
    pieces, offset = [], 0
    for index, (numel, _dtype) in enumerate(rank_groups):
        lo, hi = max(begin, offset), min(begin + length, offset + numel)
        if lo < hi:
            pieces.append(
                _Piece(rank_file, ("optimizer_state_dict", key, index), lo - offset, hi - lo)
            )
        offset += numel
    return pieces


def _master_dtype(groups: list[list[tuple[int, Any]]], where: str) -> Any:
    dtypes = {dtype for rank in groups for _numel, dtype in rank}
    if len(dtypes) != 1:
        raise IntegrityError(
            f"{where}: its flat groups hold {len(dtypes)} dtypes ({sorted(map(str, dtypes))}), "
            f"where DeepSpeed keeps one; {_SAVE_AGAIN}"
        )
    return dtypes.pop()


def _zero2_trainable(
    where: str,
    shapes: list[dict],
    groups: list[list[tuple[int, Any]]],
    paddings: list[Any] | None,
    optim: dict[int, str],
) -> dict[str, _Planned]:
    """Stages 1-2 (zero_to_fp32.py ``_zero2_merge_trainable_params``): group ``g`` is every
    rank's partition end to end; its parameters lie there in ``param_shapes[g]``'s order, each
    followed by its alignment padding; what they consume, rounded up to ``2 × world``, must be
    what the group holds so rounded."""
    dtype = _master_dtype(groups, where)
    key = _FLAT_GROUPS[1]
    if any(len(rank) != len(shapes) for rank in groups):
        raise IntegrityError(
            f"{where}: its optimizer files hold {len(groups[0])} flat groups, its model states "
            f"name the parameters of {len(shapes)}; two saves' files: {_SAVE_AGAIN}"
        )
    world = len(groups)
    align = 2 * world
    planned = {}
    for index, group in enumerate(shapes):
        group_paddings = paddings[index] if paddings is not None else None
        if group_paddings is not None and len(group_paddings) != len(group):
            raise IntegrityError(
                f"{where}: group {index} has {len(group_paddings)} alignment paddings for "
                f"{len(group)} parameters; {_SAVE_AGAIN}"
            )
        sizes = [rank[index][0] for rank in groups]
        offset = 0
        for position, (name, value) in enumerate(group.items()):
            shape = _shape(value, f"{where}: param_shapes[{shown(name)}]")
            numel = math.prod(shape)
            pieces, at, begin = [], 0, offset
            for rank, size in enumerate(sizes):
                lo, hi = max(begin, at), min(begin + numel, at + size)
                if lo < hi:
                    pieces.append(
                        _Piece(optim[rank], ("optimizer_state_dict", key, index), lo - at, hi - lo)
                    )
                at += size
            planned[name] = _Planned(dtype, shape, tuple(pieces))
            offset += numel + (int(group_paddings[position]) if group_paddings else 0)
        consumed, held = (align * math.ceil(n / align) for n in (offset, sum(sizes)))
        if consumed != held:
            raise IntegrityError(
                f"{where}: the parameters of group {index} take {consumed} elements, its flat "
                f"group holds {held} (zero_to_fp32's check); {_SAVE_AGAIN}"
            )
    return planned


def _zero3_trainable(
    where: str, shapes: list[dict], groups: list[list[tuple[int, Any]]], optim: dict[int, str]
) -> dict[str, _Planned]:
    """Stage 3 (zero_to_fp32.py ``_zero3_merge_trainable_params``, ``GatheredTensor``): every
    rank holds ``ceil(numel / world)`` elements of each parameter, in ``param_shapes``' order
    across groups, its flat groups taken end to end; the parameter is the ranks' parts end to
    end, cut to its shape. What they take must be what each rank holds."""
    dtype = _master_dtype(groups, where)
    key = _FLAT_GROUPS[3]
    world = len(groups)
    held = {sum(numel for numel, _dtype in rank) for rank in groups}
    planned, offset = {}, 0
    for group in shapes:
        for name, value in group.items():
            shape = _shape(value, f"{where}: param_shapes[{shown(name)}]")
            numel = math.prod(shape)
            part = math.ceil(numel / world)
            pieces, left = [], numel
            for rank in range(world):
                take = min(part, left)
                if take:
                    pieces += _pieces_of(groups[rank], optim[rank], key, offset, take)
                left -= take
            planned[name] = _Planned(dtype, shape, tuple(pieces))
            offset += part
    if held != {offset}:
        raise IntegrityError(
            f"{where}: its parameters take {offset} elements of each rank's flat groups, which "
            f"hold {sorted(held)} (zero_to_fp32's check); {_SAVE_AGAIN}"
        )
    return planned


# --- reading, bounded -----------------------------------------------------------------------------


class _Mapped:
    """The files, memory-mapped on demand; every mapping dropped once
    :data:`BYTES_PER_MAPPING` bytes were read through them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.loaded: dict[str, Any] = {}
        self.read = 0

    def _flat(self, piece: _Piece) -> Any:
        if piece.file not in self.loaded:
            self.loaded[piece.file] = _load(held_to_rule(self.root, piece.file))
        path = self.root / piece.file
        tensor = _tensor_at(self.loaded[piece.file], piece.keys, path)
        if piece.start + piece.length > tensor.numel():
            raise UnreadableCheckpoint(
                f"checkpoint file {path} changed while it was collected; collect again once the "
                "training job has finished writing it"
            )
        return tensor.reshape(-1) if tensor.is_contiguous() else tensor.contiguous().reshape(-1)

    def chunks(self, tensors: list[_Planned]) -> Iterator[Any]:
        for planned in tensors:
            step = max(1, BYTES_PER_MAPPING // planned.dtype.itemsize)
            for piece in planned.pieces:
                for start in range(piece.start, piece.start + piece.length, step):
                    end = min(start + step, piece.start + piece.length)
                    part = self._flat(piece)[start:end]
                    if planned.cast is not None:
                        part = part.to(planned.cast)
                    self.read += (end - start) * planned.dtype.itemsize
                    yield tensor_bytes(part)
                    del part
                    if self.read >= BYTES_PER_MAPPING:
                        self.loaded.clear()
                        self.read = 0
