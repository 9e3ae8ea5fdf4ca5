"""Checkpoints that training scripts write themselves, found and turned into one
``model.safetensors``.

What a folder may hold, besides kubetrain's own layout (``kubetrain.artifacts.checkpoint``):

* ``torch-save``: a ``torch.save``d state dict (``.pt``, ``.pth``, ``.bin``);
  ``torch-save-dict``: a dict holding one under ``model_state_dict``, ``state_dict`` or
  ``model`` (its ``epoch`` and ``step`` recorded when they are whole numbers, everything else,
  such as ``optimizer_state_dict``, ignored);
* ``safetensors``: a bare ``.safetensors`` file;
* ``dcp``: a ``torch.distributed.checkpoint`` folder (``.metadata`` and ``*.distcp``): the
  model is the entries under a top-level ``model`` (or ``model_state_dict``, ``state_dict``)
  key when there is one, else every tensor entry;
* ``hf-sharded-safetensors`` (``hf-sharded-torch-save``): Hugging Face's
  ``model.safetensors.index.json`` (``pytorch_model.bin.index.json``) and the shards its
  ``weight_map`` names.

DDP's ``module.`` prefix is stripped when every name has it.

Safety: every file is held to the manifest rule (a regular file inside the folder, no link
out of it, no device or FIFO) before it is opened, records (an index, DCP's metadata) are read
bounded, pickles are loaded only by ``torch.load(weights_only=True)`` (and DCP's metadata by
kubetrain's restricted unpickler, its pickled-bytes entries never), and a value in a state
dict that is not a tensor is refused in one line.

Memory: the output is written tensor by tensor (:func:`_write_safetensors`): safetensors
sources and shards are copied byte range by byte range (no torch needed), ``torch.save`` files
are memory-mapped (``mmap=True``, so no second copy is made), and DCP checkpoints are read in
batches of at most :data:`DCP_BATCH_BYTES`.

Which one is collected when a folder holds several: :func:`find_checkpoint`.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import math
import os
import re
import struct
import time
import warnings
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from kubetrain.artifacts.manifest import (
    MAX_RECORD_BYTES,
    local_entry_problem,
    name_problem,
    shown,
)
from kubetrain.artifacts.model_card import (
    SOURCE_DCP,
    SOURCE_HF_SHARDED_SAFETENSORS,
    SOURCE_HF_SHARDED_TORCH_SAVE,
    SOURCE_SAFETENSORS,
    SOURCE_TORCH_SAVE,
    SOURCE_TORCH_SAVE_DICT,
)
from kubetrain.artifacts.safetensors_header import tensor_names
from kubetrain.errors import IntegrityError, InvalidInput, refusal_reason
from kubetrain.storage.integrity import CHUNK_BYTES, sha256_file

if TYPE_CHECKING:
    import torch

#: File name endings of the files a script saves a model in.
TORCH_SUFFIXES = (".pt", ".pth", ".bin")
SAFETENSORS_SUFFIX = ".safetensors"
MODEL_SUFFIXES = (SAFETENSORS_SUFFIX, *TORCH_SUFFIXES)
#: Hugging Face's index of sharded weights, by the format of its shards.
INDEX_SUFFIXES = {
    ".safetensors.index.json": SOURCE_HF_SHARDED_SAFETENSORS,
    ".bin.index.json": SOURCE_HF_SHARDED_TORCH_SAVE,
}
DCP_METADATA = ".metadata"
#: Where a saved dict keeps the model's state dict, in the order they are looked for.
STATE_DICT_KEYS = ("model_state_dict", "state_dict", "model")
#: DistributedDataParallel's prefix on every name of ``model.state_dict()`` (not
#: ``model.module.state_dict()``).
DDP_PREFIX = "module."
#: What a folder is searched for, in the line that says it holds none of it.
LOOKED_FOR = "our manifest/LATEST, *.safetensors, *.pt/*.pth/*.bin, a DCP .metadata, an HF index"
#: Files saved beside a model that are not one (Hugging Face's Trainer, common scripts).
_AUXILIARY = re.compile(
    r"(optimizer|optim|scheduler|lr_scheduler|rng_state|training_args|scaler|trainer_state)"
    r"([-_.\d].*)?",
    re.IGNORECASE,
)
#: Name parts of a file still being written (``model.pt.tmp``, ``model.partial.pt``).
_WRITING_PARTS = {"tmp", "temp", "partial", "part", "incomplete"}
#: kubetrain's own checkpoint folders, never taken for a script's.
_OUR_CHECKPOINT = re.compile(r"epoch-\d{6,}")
_NUMBER = re.compile(r"\d+")
_EPOCH_IN_NAME = re.compile(r"epoch[-_]?(\d+)", re.IGNORECASE)
_STEP_IN_NAME = re.compile(r"(?:step|checkpoint|ckpt|iter)[-_]?(\d+)", re.IGNORECASE)
#: A file modified this recently may still be being written: its size is checked twice,
#: :data:`SETTLE_SECONDS` apart, before it is taken.
RECENT_SECONDS = 30.0
SETTLE_SECONDS = 0.25
#: Most bytes of a DCP checkpoint's tensors held in memory at once (one larger tensor is read
#: on its own).
DCP_BATCH_BYTES = 64 << 20
#: Bytes per element of each safetensors dtype.
_DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8,
}  # fmt: skip
_TORCH_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
    "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "uint16": "U16", "uint32": "U32",
    "uint64": "U64",
}  # fmt: skip
_SAVE_STATE_DICT = "save the model's state_dict() (a dict of tensors)"


# --- finding the newest ----------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A checkpoint a script wrote: ``relative`` is its file (a ``.pt``/``.safetensors`` file,
    an HF index, a DCP ``.metadata``) relative to the checkpoint folder; ``files`` every file
    it consists of (checked for settling); ``numbers`` the numbers in its name and
    ``family`` its name with them blanked (``model_epoch_#.pt``)."""

    relative: str
    format: str
    files: tuple[str, ...]
    mtime_ns: int
    numbers: tuple[int, ...] = ()
    family: str = ""


@dataclass
class Search:
    """What :func:`find_checkpoint` found: the newest settled candidate, or None, and the ones
    it passed over as still being written."""

    found: Candidate | None
    writing: list[str] = field(default_factory=list)


def holds_our_layout(folder: Path) -> bool:
    """Whether ``folder`` is a kubetrain checkpoint folder (a LATEST pointer, or an
    ``epoch-NNNNNN`` folder): then it is collected as one, complete or not."""
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return "LATEST" in names or any(
        _OUR_CHECKPOINT.fullmatch(name) and (folder / name).is_dir() for name in names
    )


def _still_written_name(name: str) -> bool:
    """A hidden name, or one with a ``.tmp``/``.partial``/``.part`` part: being written."""
    return name.startswith(".") or bool(
        _WRITING_PARTS & {part.lower() for part in name.split(".")[1:]}
    )


def _is_auxiliary(name: str) -> bool:
    return _AUXILIARY.fullmatch(name.split(".")[0]) is not None


def _mtime_ns(path: Path) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def _numbered(relative: str) -> tuple[tuple[int, ...], str]:
    return tuple(int(n) for n in _NUMBER.findall(relative)), _NUMBER.sub("#", relative)


def _candidate(root: Path, relative: str, fmt: str, files: Iterable[str], named: str) -> Candidate:
    files = tuple(files)
    numbers, family = _numbered(named)
    mtime = max((_mtime_ns(root / name) for name in files), default=0)
    return Candidate(relative, fmt, files, mtime, numbers, family)


def _folder_checkpoint(root: Path, relative_dir: str, names: list[str]) -> list[Candidate]:
    """A folder that is one checkpoint: a DCP folder, or an HF folder with an index."""
    join = (lambda name: f"{relative_dir}/{name}") if relative_dir else (lambda name: name)
    named = relative_dir or root.name
    if DCP_METADATA in names:
        files = [DCP_METADATA] + [n for n in names if n.endswith(".distcp")]
        return [_candidate(root, join(DCP_METADATA), SOURCE_DCP, map(join, files), named)]
    found = []
    for name in names:
        for suffix, fmt in INDEX_SUFFIXES.items():
            if name.endswith(suffix) and not _still_written_name(name):
                shard_suffix = suffix.removesuffix(".index.json")
                files = [name] + [n for n in names if n.endswith(shard_suffix)]
                found.append(_candidate(root, join(name), fmt, map(join, files), named))
    return found


def _candidates(root: Path, relative_dir: str = "") -> list[Candidate]:
    """Every checkpoint in ``root/relative_dir`` and, from the top, in its subfolders."""
    folder = root / relative_dir if relative_dir else root
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []
    names = [entry.name for entry in entries]
    if relative_dir and ({"manifest.json", "model.json"} & set(names)):
        return []  # a kubetrain dataset or model folder beside the checkpoints: no checkpoint
    whole = _folder_checkpoint(root, relative_dir, names)
    if whole:
        return whole
    found = []
    for entry in entries:
        name = entry.name
        relative = f"{relative_dir}/{name}" if relative_dir else name
        if _still_written_name(name):
            continue
        if entry.is_dir(follow_symlinks=False):
            if not relative_dir and not _OUR_CHECKPOINT.fullmatch(name) and name != "__pycache__":
                found += _candidates(root, relative)
        elif name.endswith(MODEL_SUFFIXES) and not _is_auxiliary(name):
            fmt = SOURCE_SAFETENSORS if name.endswith(SAFETENSORS_SUFFIX) else SOURCE_TORCH_SAVE
            found.append(_candidate(root, relative, fmt, [relative], relative))
    return found


def ranked(candidates: list[Candidate]) -> list[Candidate]:
    """Newest first: among files named alike (``model_epoch_9.pt``, ``model_epoch_10.pt``;
    ``checkpoint-50/``, ``checkpoint-200/``) the highest number; among differently named ones
    the most recently modified (a family counts by its newest file)."""
    family_mtime: dict[str, int] = {}
    for candidate in candidates:
        family_mtime[candidate.family] = max(
            family_mtime.get(candidate.family, 0), candidate.mtime_ns
        )
    return sorted(
        candidates,
        key=lambda c: (family_mtime[c.family], c.family, c.numbers, c.mtime_ns, c.relative),
        reverse=True,
    )


def _sizes(root: Path, files: Iterable[str]) -> dict[str, tuple[int, int]]:
    sizes = {}
    for name in files:
        try:
            status = os.stat(root / name)
        except OSError:
            status = None
        sizes[name] = (status.st_size, status.st_mtime_ns) if status else (-1, -1)
    return sizes


def is_settled(root: Path, candidate: Candidate) -> bool:
    """Not being written: unchanged in size and time across :data:`SETTLE_SECONDS` when it
    was modified in the last :data:`RECENT_SECONDS` (an older file is taken as it is)."""
    if time.time() - candidate.mtime_ns / 1e9 > RECENT_SECONDS:
        return True
    before = _sizes(root, candidate.files)
    time.sleep(SETTLE_SECONDS)
    return _sizes(root, candidate.files) == before


def find_checkpoint(root: Path) -> Search:
    """The newest checkpoint in ``root`` (see :func:`ranked`) that is not being written: no
    hidden or ``.tmp``/``.partial``/``.part`` name, and a size that holds still. Opens
    nothing: the files are held to the rule when the chosen one is read."""
    search = Search(None)
    for candidate in ranked(_candidates(root)):
        if is_settled(root, candidate):
            search.found = candidate
            return search
        search.writing.append(candidate.relative)
    return search


def nothing_to_collect(checkpoint_dir: object, writing: list[str]) -> IntegrityError:
    passed = (
        f"; {', '.join(shown(name) for name in writing[:3])} still being written" if writing else ""
    )
    return IntegrityError(
        f"checkpoint_dir: {checkpoint_dir} holds no checkpoint (looked for {LOOKED_FOR}"
        f"{passed}); point --checkpoint-dir at the folder your script saves into, or name the "
        "file with --checkpoint-file"
    )


# --- a file the user names -------------------------------------------------------------------

_NAMED_FIX = (
    "name a .pt/.pth/.bin/.safetensors file, an HF index or a DCP folder inside --checkpoint-dir"
)


def named_checkpoint(root: Path, given: str) -> Candidate | Path:
    """What ``--checkpoint-file`` names (relative to ``root``, or absolute inside it): a
    candidate, or the Path of a kubetrain checkpoint folder (``epoch-000003``). Refused in one
    line when it is outside ``root``, missing, of no known format, or still being written."""
    relative = given
    if os.path.isabs(given):
        inside = [
            os.path.relpath(given, base)
            for base in (os.path.abspath(root), os.path.realpath(root))
            if os.path.commonpath([os.path.abspath(given), base]) == base
        ]
        if not inside:
            raise InvalidInput(
                "checkpoint_file", f"{given} is outside checkpoint_dir {root}", _NAMED_FIX
            )
        relative = inside[0]
    relative = relative.removeprefix("./").rstrip("/") or "."
    problem = None if relative == "." else name_problem(relative)
    if problem is None:
        problem = local_entry_problem(root, relative, allow_dir=True)
    if problem is not None:
        raise InvalidInput("checkpoint_file", f"{shown(given)} {problem}", _NAMED_FIX)
    path = root / relative if relative != "." else root
    if not path.exists():
        raise InvalidInput("checkpoint_file", f"{path} does not exist", _NAMED_FIX)
    if path.is_dir():
        names = sorted(os.listdir(path))
        if "manifest.json" in names and not ({DCP_METADATA} & set(names)):
            return path
        found = _folder_checkpoint(root, "" if relative == "." else relative, names)
        if len(found) != 1:
            raise InvalidInput(
                "checkpoint_file",
                f"{path} is a folder holding no DCP .metadata or one HF index",
                "name the model file itself with --checkpoint-file",
            )
        candidate = found[0]
    else:
        name, folder = os.path.basename(relative), os.path.dirname(relative)
        beside = sorted(os.listdir(path.parent))
        found = _folder_checkpoint(root, folder, beside)
        if name == DCP_METADATA or name.endswith(tuple(INDEX_SUFFIXES)):
            candidate = next((c for c in found if c.relative == relative), None)
            if candidate is None:
                raise InvalidInput(
                    "checkpoint_file", f"{path} is being written (a hidden or .tmp name)",
                    "name a complete checkpoint",
                )  # fmt: skip
        elif any(relative in candidate.files for candidate in found):
            raise InvalidInput(
                "checkpoint_file",
                f"{path} is one shard of the checkpoint {root / found[0].relative}",
                "name its index or DCP folder instead, which collect reads whole",
            )
        elif name.endswith(MODEL_SUFFIXES):
            fmt = SOURCE_SAFETENSORS if name.endswith(SAFETENSORS_SUFFIX) else SOURCE_TORCH_SAVE
            candidate = _candidate(root, relative, fmt, [relative], relative)
        else:
            raise InvalidInput(
                "checkpoint_file", f"{path} is of no format collect reads", _NAMED_FIX
            )
    if not is_settled(root, candidate):
        raise IntegrityError(
            f"checkpoint file {root / candidate.relative} is still being written (its size "
            "changed as it was looked at); collect it once the training job has finished"
        )
    return candidate


# --- the rule for the files read -------------------------------------------------------------


def _held_to_rule(root: Path, relative: str) -> Path:
    """``root/relative`` once it is a regular file inside ``root`` (refused unread, in one
    line naming it, when it is a link out, a device, a FIFO or a folder)."""
    problem = name_problem(relative) or local_entry_problem(root, relative)
    path = root / relative
    if problem is not None:
        raise IntegrityError(
            f"checkpoint file {path} {problem}; refused unread: collect only regular files "
            "inside --checkpoint-dir"
        )
    if not path.exists():
        raise IntegrityError(f"checkpoint file {path} is missing; check the training job's logs")
    return path


def _check_listed(folder: Path, entry: object, listed: str) -> None:
    """A file an index or DCP's metadata names: a relative name of a regular file inside the
    index's own folder (the manifest rule), else refused before anything is opened."""
    problem = name_problem(entry)
    if problem is None:
        problem = local_entry_problem(folder, str(entry))
    if problem is not None:
        raise IntegrityError(
            f"{listed} {shown(entry)}, which {problem}; refused unread: an index names only "
            "regular files inside its own folder"
        )


def _read_record(path: Path) -> bytes:
    """A record (an index, DCP's metadata) read bounded by MAX_RECORD_BYTES."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise IntegrityError(
            f"checkpoint file {path} is over {MAX_RECORD_BYTES >> 20} MiB, more than any index "
            "or metadata of a checkpoint; refused unread"
        )
    return data


def _snapshot(root: Path, files: Iterable[str]) -> dict[str, tuple[int, int, int]]:
    snapshot = {}
    for name in files:
        status = os.stat(root / name)
        snapshot[name] = (status.st_size, status.st_mtime_ns, status.st_ino)
    return snapshot


# --- writing safetensors tensor by tensor -----------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One tensor of the output: its published name, safetensors dtype, shape and size."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def _write_safetensors(target: Path, entries: list[Entry], chunks: Iterable[Any]) -> str:
    """Write ``entries`` as a safetensors file whose data is ``chunks`` (buffers, in the
    entries' order); returns its sha256. Holds one chunk at a time."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for entry in entries:
        header[entry.name] = {
            "dtype": entry.dtype,
            "shape": list(entry.shape),
            "data_offsets": [offset, offset + entry.nbytes],
        }
        offset += entry.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data 8-byte aligned, as safetensors writes it
    digest = hashlib.sha256()
    written = 0
    with open(target, "wb") as out:
        for piece in (struct.pack("<Q", len(text)), text):
            out.write(piece)
            digest.update(piece)
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            out.write(view)
            digest.update(view)
            written += len(view)
    if written != offset:  # a source that changed under us
        raise IntegrityError(
            f"the tensors read were {written} bytes, their shapes say {offset}; collect again "
            "once the training job has finished writing"
        )
    return digest.hexdigest()


class Written(NamedTuple):
    """What a safetensors file was written with: how many tensors, and its sha256."""

    tensors: int
    sha256: str


def _strip_ddp_prefix(names: list[str]) -> Callable[[str], str]:
    """``module.x`` → ``x`` when every name has DDP's prefix (and none is left empty)."""
    if names and all(n.startswith(DDP_PREFIX) and len(n) > len(DDP_PREFIX) for n in names):
        return lambda name: name.removeprefix(DDP_PREFIX)
    return lambda name: name


def _check_names(names: Iterable[object], what: str) -> None:
    for name in names:
        if not isinstance(name, str) or not name:
            raise IntegrityError(
                f"{what}: state dict key {shown(name)} is not a tensor name; {_SAVE_STATE_DICT}"
            )


# --- safetensors files and HF shards (no torch) -----------------------------------------------


@dataclass(frozen=True)
class _Stored:
    """A tensor in a safetensors file: where its bytes are."""

    path: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def _safetensors_tensors(path: Path) -> dict[str, _Stored]:
    """Every tensor of a safetensors file and where its bytes are, the header checked as
    safetensors checks it and each size against its dtype and shape (never a pickle)."""
    try:
        tensor_names(path)
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
    except (ValueError, struct.error) as exc:
        raise IntegrityError(
            f"checkpoint file {path} is not a safetensors file ({exc}); refused unread"
        ) from None
    start = 8 + length
    found = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, shape = entry["dtype"], tuple(entry["shape"])
        begin, end = entry["data_offsets"]
        if dtype not in _DTYPE_BYTES or end - begin != math.prod(shape) * _DTYPE_BYTES[dtype]:
            raise IntegrityError(
                f"checkpoint file {path}: tensor {shown(name)} of dtype {shown(dtype)} and shape "
                f"{list(shape)} does not fit its {end - begin} bytes; refused unread"
            )
        found[name] = _Stored(path, dtype, shape, start + begin, start + end)
    return found


def _copy_ranges(stored: list[_Stored]) -> Iterator[bytes]:
    handles: dict[Path, Any] = {}
    try:
        for tensor in stored:
            if tensor.path not in handles:
                handles[tensor.path] = open(tensor.path, "rb")  # noqa: SIM115 (closed below)
            handle = handles[tensor.path]
            handle.seek(tensor.begin)
            left = tensor.end - tensor.begin
            while left:
                chunk = handle.read(min(left, CHUNK_BYTES))
                if not chunk:
                    raise IntegrityError(
                        f"checkpoint file {tensor.path} ended early; collect again"
                    )
                left -= len(chunk)
                yield chunk
    finally:
        for handle in handles.values():
            handle.close()


def _write_stored(target: Path, tensors: Mapping[str, _Stored], what: str) -> Written:
    """Write ``tensors`` (by name) as ``target``."""
    if not tensors:
        raise IntegrityError(f"{what} holds no tensors; {_SAVE_STATE_DICT}")
    rename = _strip_ddp_prefix(list(tensors))
    order = sorted(tensors, key=rename)
    entries = [
        Entry(rename(n), tensors[n].dtype, tensors[n].shape, tensors[n].end - tensors[n].begin)
        for n in order
    ]
    return Written(
        len(entries), _write_safetensors(target, entries, _copy_ranges([tensors[n] for n in order]))
    )


def _index_weight_map(root: Path, relative: str) -> dict[str, str]:
    """An HF index's ``weight_map`` (tensor → shard file), every shard held to the rule."""
    path = _held_to_rule(root, relative)
    what = f"checkpoint file {path}"
    try:
        index = json.loads(_read_record(path))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise IntegrityError(f"{what} is not a JSON index ({exc}); refused") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise IntegrityError(
            f"{what} has no weight_map of tensor names to shard files; save the model with "
            "save_pretrained, or collect one shard-free file"
        )
    for name, shard in weight_map.items():
        _check_listed(path.parent, shard, f"{what} maps {shown(name)} to")
    return weight_map


def _shards(root: Path, relative: str) -> tuple[dict[str, str], list[str]]:
    """The weight map and its shard files (relative to ``root``), in order."""
    weight_map = _index_weight_map(root, relative)
    folder = os.path.dirname(relative)
    shard_files = sorted(
        {f"{folder}/{shard}" if folder else shard for shard in weight_map.values()}
    )
    return weight_map, shard_files


def _convert_hf_safetensors(root: Path, relative: str, target: Path) -> Written:
    weight_map, _ = _shards(root, relative)
    folder = os.path.dirname(relative)
    by_file: dict[str, dict[str, _Stored]] = {}
    tensors = {}
    for name, shard in weight_map.items():
        shard_relative = f"{folder}/{shard}" if folder else shard
        if shard_relative not in by_file:
            by_file[shard_relative] = _safetensors_tensors(_held_to_rule(root, shard_relative))
        if name not in by_file[shard_relative]:
            raise IntegrityError(
                f"checkpoint file {root / shard_relative} lacks tensor {shown(name)}, which "
                f"{os.path.basename(relative)} maps to it; save the model again"
            )
        tensors[name] = by_file[shard_relative][name]
    return _write_stored(target, tensors, f"checkpoint file {root / relative}")


# --- torch.save files -------------------------------------------------------------------------


def _torch_load(path: Path) -> Any:
    """``torch.load(weights_only=True)`` of ``path``, memory-mapped when it is a zip file (what
    ``torch.save`` writes): tensors and plain containers only, never code the file names."""
    import torch

    try:
        mmap = zipfile.is_zipfile(path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except MemoryError:
        raise
    except Exception as exc:  # whatever a refused or malformed pickle raises
        if isinstance(exc, OSError) and exc.errno not in (errno.EINVAL, None):
            raise  # the file system's own error (EIO, EACCES...): the error boundary's line
        # torch's zip reader says EINVAL of a truncated or corrupt archive
        reason = "truncated or corrupt" if isinstance(exc, OSError) else refusal_reason(exc)
        raise IntegrityError(
            f"checkpoint file {path} is not a plain state dict, refused unread by "
            f"torch.load(weights_only=True) ({reason}); {_SAVE_STATE_DICT} with torch.save"
        ) from None


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def state_dict_of(saved: Any, what: str) -> tuple[dict[str, torch.Tensor], str, dict[str, int]]:
    """The state dict in what ``torch.load`` returned: the dict itself when it holds tensors
    only, else the one under ``model_state_dict``, ``state_dict`` or ``model``. Returns it, the
    source format and the ``epoch``/``step`` recorded beside it. A value that is not a tensor
    is refused in one line naming it."""
    import torch

    if not isinstance(saved, Mapping):
        raise IntegrityError(
            f"{what} holds a {type(saved).__name__}, not a state dict; {_SAVE_STATE_DICT}"
        )
    fmt, numbers = SOURCE_TORCH_SAVE, {}
    state: Mapping[Any, Any] = saved
    if not all(isinstance(value, torch.Tensor) for value in saved.values()):
        key = next((k for k in STATE_DICT_KEYS if isinstance(saved.get(k), Mapping)), None)
        if key is not None:
            fmt, state, what = SOURCE_TORCH_SAVE_DICT, saved[key], f"{what}: {key}"
            for name, aliases in (("epoch", ("epoch",)), ("step", ("step", "global_step"))):
                found = [_whole(saved.get(alias)) for alias in aliases]
                found = [number for number in found if number is not None]
                if found:
                    numbers[name] = found[0]
        elif any(isinstance(value, Mapping) for value in saved.values()):
            raise IntegrityError(
                f"{what} holds a dict of {', '.join(shown(k) for k in list(saved)[:6])} with no "
                f"state dict under {', '.join(STATE_DICT_KEYS)}; save it under model_state_dict"
            )
    _check_names(state, what)
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise IntegrityError(
                f"{what}: state dict entry {shown(name)} is of type {type(value).__name__}, "
                f"not a tensor; {_SAVE_STATE_DICT}"
            )
        kind = _unsupported(value)
        if kind is not None:
            raise IntegrityError(
                f"{what}: state dict entry {shown(name)} is a {kind} tensor, which safetensors "
                "cannot hold; save dense tensors of a real dtype"
            )
    if not state:
        raise IntegrityError(f"{what} holds an empty state dict; {_SAVE_STATE_DICT}")
    return dict(state), fmt, numbers


def _unsupported(tensor: torch.Tensor) -> str | None:
    """What makes ``tensor`` one safetensors cannot hold (sparse, complex...), or None."""
    import torch

    dtype = str(tensor.dtype).removeprefix("torch.")
    if tensor.layout != torch.strided:
        return str(tensor.layout).removeprefix("torch.")
    return None if dtype in _TORCH_DTYPES else dtype


def _tensor_entry(name: str, tensor: torch.Tensor) -> Entry:
    dtype = _TORCH_DTYPES[str(tensor.dtype).removeprefix("torch.")]
    return Entry(name, dtype, tuple(tensor.shape), tensor.numel() * tensor.element_size())


def _tensor_bytes(tensor: torch.Tensor) -> Any:
    """The tensor's bytes as a buffer, without a copy when it is contiguous on the CPU."""
    import torch

    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy() if flat.numel() else b""  # numpy has no bf16, fp8


def _write_tensors(target: Path, state: Mapping[str, torch.Tensor]) -> Written:
    rename = _strip_ddp_prefix(list(state))
    order = sorted(state, key=rename)
    entries = [_tensor_entry(rename(name), state[name]) for name in order]
    chunks = (_tensor_bytes(state[name]) for name in order)
    return Written(len(entries), _write_safetensors(target, entries, chunks))


def _convert_torch_save(
    root: Path, relative: str, target: Path
) -> tuple[str, dict[str, int], Written]:
    path = _held_to_rule(root, relative)
    state, fmt, numbers = state_dict_of(_torch_load(path), f"checkpoint file {path}")
    return fmt, numbers, _write_tensors(target, state)


def _convert_hf_torch_save(root: Path, relative: str, target: Path) -> Written:
    weight_map, _ = _shards(root, relative)
    folder = os.path.dirname(relative)
    wanted: dict[str, set[str]] = {}
    for name, shard in weight_map.items():
        wanted.setdefault(f"{folder}/{shard}" if folder else shard, set()).add(name)
    state = {}
    for shard, names in sorted(wanted.items()):
        path = _held_to_rule(root, shard)
        loaded, _, _ = state_dict_of(_torch_load(path), f"checkpoint file {path}")
        missing = sorted(names - set(loaded))
        if missing:
            raise IntegrityError(
                f"checkpoint file {path} lacks tensor {shown(missing[0])}, which "
                f"{os.path.basename(relative)} maps to it; save the model again"
            )
        state.update({name: loaded[name] for name in names})
    return _write_tensors(target, state)


# --- DCP ---------------------------------------------------------------------------------------


def _dcp_metadata(root: Path, relative: str) -> Any:
    """DCP's ``.metadata``, held to the rule, read bounded and unpickled by kubetrain's
    restricted unpickler (no code runs); every shard file it names held to the rule."""
    from torch.distributed.checkpoint.metadata import Metadata

    from kubetrain.artifacts.checkpoint import _MetadataUnpickler

    path = _held_to_rule(root, relative)
    try:
        metadata = _MetadataUnpickler(io.BytesIO(_read_record(path))).load()
    except IntegrityError:
        raise
    except Exception as exc:  # whatever a malformed or planted pickle raises
        raise IntegrityError(
            f"checkpoint file {path} is not DCP metadata, refused unread ({exc}); save the "
            "checkpoint with torch.distributed.checkpoint.save"
        ) from None
    if not isinstance(metadata, Metadata):
        raise IntegrityError(
            f"checkpoint file {path} holds a {type(metadata).__name__}, not DCP metadata; save "
            "the checkpoint with torch.distributed.checkpoint.save"
        )
    for stored in (metadata.storage_data or {}).values():
        _check_listed(path.parent, getattr(stored, "relative_path", None), f"{path} names")
    return metadata


def _dcp_model(metadata: Any, what: str) -> list[tuple[str, str, Any]]:
    """(published name, DCP key, tensor metadata) of the model: the entries under a top-level
    model key when there is one (each must be a tensor), else every tensor entry."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    paths = {
        key: tuple(str(part) for part in (metadata.planner_data or {}).get(key, (key,)))
        for key in metadata.state_dict_metadata
    }
    tops = {path[0] for path in paths.values() if len(path) > 1}
    key = next((k for k in STATE_DICT_KEYS if k in tops), None)
    model = []
    for fqn, entry in metadata.state_dict_metadata.items():
        path = paths[fqn]
        if key is not None:
            if path[0] != key or len(path) < 2:
                continue
            if not isinstance(entry, TensorStorageMetadata):
                raise IntegrityError(
                    f"{what}: model entry {shown('.'.join(path[1:]))} is stored as "
                    f"{type(entry).__name__}, not a tensor; refused unread, "
                    f"{_SAVE_STATE_DICT} under {key!r}"
                )
            model.append((".".join(path[1:]), fqn, entry))
        elif isinstance(entry, TensorStorageMetadata):
            model.append((fqn, fqn, entry))
    for _name, fqn, entry in model:
        if str(entry.properties.dtype).removeprefix("torch.") not in _TORCH_DTYPES:
            raise IntegrityError(
                f"{what}: entry {shown(fqn)} is a {entry.properties.dtype} tensor, which "
                "safetensors cannot hold"
            )
    if not model:
        raise IntegrityError(f"{what} holds no model tensors; {_SAVE_STATE_DICT}")
    return model


def _dcp_batches(
    folder: Path, metadata: Any, model: list[tuple[str, str, Any]], what: str
) -> Iterator[Any]:
    """The model's tensors' bytes, in ``model``'s order, read at most DCP_BATCH_BYTES at a
    time; an entry stored as pickled bytes is refused, never loaded."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import StorageMeta

    class VettedReader(dcp.FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            if metadata.storage_meta is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class TensorsOnly(dcp.DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            raise IntegrityError(
                f"{what}: entry {read_item.dest_index.fqn} is stored as pickled bytes, not a "
                "tensor; refused unread"
            )

    def load(batch: list[tuple[str, str, Any]]) -> list[torch.Tensor]:
        request = {
            fqn: torch.empty(tuple(entry.size), dtype=entry.properties.dtype)
            for _name, fqn, entry in batch
        }
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dcp.load(
                    request, storage_reader=VettedReader(str(folder)), planner=TensorsOnly(),
                    no_dist=True,
                )  # fmt: skip
        except dcp.CheckpointException as exc:
            errors = (error for error, _trace in exc.failures.values())
            refusal = next((e for e in errors if isinstance(e, IntegrityError)), None)
            if refusal is None:
                raise IntegrityError(f"{what} could not be read ({exc}); refused") from None
            raise refusal from None
        return [request[fqn] for _name, fqn, _entry in batch]

    batch: list[tuple[str, str, Any]] = []
    size = 0
    for item in model:
        nbytes = math.prod(item[2].size) * item[2].properties.dtype.itemsize
        if batch and size + nbytes > DCP_BATCH_BYTES:
            for tensor in load(batch):
                yield _tensor_bytes(tensor)
            batch, size = [], 0
        batch.append(item)
        size += nbytes
    if batch:
        for tensor in load(batch):
            yield _tensor_bytes(tensor)


def _convert_dcp(root: Path, relative: str, target: Path) -> Written:
    metadata = _dcp_metadata(root, relative)
    folder = (root / relative).parent
    what = f"checkpoint {folder}"
    model = _dcp_model(metadata, what)
    rename = _strip_ddp_prefix([name for name, _fqn, _entry in model])
    model = sorted(((rename(n), fqn, e) for n, fqn, e in model), key=lambda item: item[0])
    entries = [
        Entry(
            name,
            _TORCH_DTYPES[str(entry.properties.dtype).removeprefix("torch.")],
            tuple(entry.size),
            math.prod(entry.size) * entry.properties.dtype.itemsize,
        )
        for name, _fqn, entry in model
    ]
    chunks = _dcp_batches(folder, metadata, model, what)
    return Written(len(entries), _write_safetensors(target, entries, chunks))


def _dcp_files(root: Path, relative: str) -> list[str]:
    metadata = _dcp_metadata(root, relative)
    folder = os.path.dirname(relative)
    names = {stored.relative_path for stored in (metadata.storage_data or {}).values()} | {
        DCP_METADATA
    }
    return sorted(f"{folder}/{name}" if folder else name for name in names)


# --- converting ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Converted:
    """What :func:`convert` wrote: the source's format and sha256, the sha256 of every file it
    read (relative to the checkpoint folder), the epoch and step it recorded, the tensors."""

    source: str
    format: str
    source_sha256: str
    files: dict[str, str]
    numbers: dict[str, int]
    tensors: int
    sha256: str


def _numbers_in_name(relative: str) -> dict[str, int]:
    numbers = {}
    for name, pattern in (("epoch", _EPOCH_IN_NAME), ("step", _STEP_IN_NAME)):
        found = pattern.findall(relative)
        if found:
            numbers[name] = int(found[-1])
    return numbers


def convert(root: Path, candidate: Candidate, target: Path) -> Converted:
    """Write ``candidate`` (a checkpoint in ``root``) as the safetensors file ``target``.

    Every file it reads is held to the manifest rule before it is opened and hashed; a file
    that changes while it is read (size, time or inode) fails the step: collect again once
    the job has finished writing."""
    relative, fmt = candidate.relative, candidate.format
    if fmt == SOURCE_DCP:
        files = _dcp_files(root, relative)
    elif fmt in INDEX_SUFFIXES.values():
        files = [relative, *_shards(root, relative)[1]]
    else:
        files = [relative]
    for name in files:
        _held_to_rule(root, name)
    before = _snapshot(root, files)
    digests = {name: sha256_file(root / name) for name in files}
    numbers = _numbers_in_name(relative)
    if fmt == SOURCE_DCP:
        written = _convert_dcp(root, relative, target)
    elif fmt == SOURCE_HF_SHARDED_SAFETENSORS:
        written = _convert_hf_safetensors(root, relative, target)
    elif fmt == SOURCE_HF_SHARDED_TORCH_SAVE:
        written = _convert_hf_torch_save(root, relative, target)
    elif fmt == SOURCE_SAFETENSORS:
        path = _held_to_rule(root, relative)
        written = _write_stored(target, _safetensors_tensors(path), f"checkpoint file {path}")
    else:
        fmt, saved_numbers, written = _convert_torch_save(root, relative, target)
        numbers.update(saved_numbers)
    if _snapshot(root, files) != before:
        raise IntegrityError(
            f"checkpoint {root / relative} changed while it was collected; collect again once "
            "the training job has finished writing it"
        )
    return Converted(
        source=relative,
        format=fmt,
        source_sha256=digests[relative],
        files=digests,
        numbers=numbers,
        tensors=written.tensors,
        sha256=written.sha256,
    )
