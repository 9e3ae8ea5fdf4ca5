"""The one writer of ``model.safetensors`` for every format: tensor by tensor, one chunk in
memory at a time, hashed as it is written; and the check that a published model holds finite
numbers only."""

from __future__ import annotations

import hashlib
import importlib
import itertools
import json
import math
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from kubetrain import bounded_json
from kubetrain.artifacts.checkpoint_formats.files import UnreadableCheckpoint
from kubetrain.artifacts.manifest import shown
from kubetrain.artifacts.safetensors_header import tensor_names
from kubetrain.errors import IntegrityError
from kubetrain.storage.integrity import CHUNK_BYTES

if TYPE_CHECKING:
    import torch

#: Bytes per element of each safetensors dtype.
DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8,
}  # fmt: skip
#: torch's dtype names → safetensors'.
TORCH_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
    "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "uint16": "U16", "uint32": "U32",
    "uint64": "U64",
}  # fmt: skip
#: How a non-finite element of each floating dtype is told, on its bits: (numpy dtype, mask)
#: for the exponent-all-ones formats, or the numpy float dtype itself (None).
_NONFINITE_BITS = {
    "F64": ("<f8", None), "F32": ("<f4", None), "F16": ("<f2", None),
    "BF16": ("<u2", 0x7F80), "F8_E5M2": ("u1", 0x7C), "F8_E4M3": ("u1", 0x7F),
}  # fmt: skip
#: The option that publishes a model with NaN/Inf anyway, named by the refusal.
ALLOW_NONFINITE = "--allow-nonfinite"
#: What to do about a safetensors file that cannot be read back (a corrupt or cut shard).
SAVE_AGAIN = "save the model again (save_file or save_pretrained), or collect an earlier checkpoint"


@dataclass(frozen=True)
class Entry:
    """One tensor of the output: its published name, safetensors dtype, shape and size."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


class Written(NamedTuple):
    """What a safetensors file was written with: how many tensors, and its sha256."""

    tensors: int
    sha256: str


def write_safetensors(
    target: Path,
    entries: list[Entry],
    chunks: Iterable[Any],
    observe: Callable[[int, Any], None] | None = None,
) -> Written:
    """Write ``entries`` as a safetensors file whose data is ``chunks`` (buffers, in the
    entries' order); returns its sha256. Holds one chunk at a time; ``observe(offset, bytes)``
    sees every byte written, in order."""
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
    position = 0
    with open(target, "wb") as out:
        head = (struct.pack("<Q", len(text)), text)
        for piece in itertools.chain(head, (memoryview(c).cast("B") for c in chunks)):
            out.write(piece)
            digest.update(piece)
            if observe is not None:
                observe(position, piece)
            position += len(piece)
        written = position - 8 - len(text)
    if written != offset:  # a source that changed under us
        raise UnreadableCheckpoint(
            f"the tensors read were {written} bytes, their shapes say {offset}; collect again "
            "once the training job has finished writing"
        )
    return Written(len(entries), digest.hexdigest())


def tensor_entry(name: str, tensor: torch.Tensor) -> Entry:
    dtype = TORCH_DTYPES[str(tensor.dtype).removeprefix("torch.")]
    return Entry(name, dtype, tuple(tensor.shape), tensor.numel() * tensor.element_size())


def tensor_bytes(tensor: torch.Tensor) -> Any:
    """The tensor's bytes as a buffer, without a copy when it is contiguous on the CPU."""
    import torch

    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy() if flat.numel() else b""  # numpy has no bf16, fp8


def unsupported(tensor: torch.Tensor) -> str | None:
    """What makes ``tensor`` one safetensors cannot hold (sparse, complex...), or None."""
    import torch

    dtype = str(tensor.dtype).removeprefix("torch.")
    if tensor.layout != torch.strided:
        return str(tensor.layout).removeprefix("torch.")
    return None if dtype in TORCH_DTYPES else dtype


# --- reading a safetensors file back (no torch) ------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """A tensor in a safetensors file: where its bytes are."""

    path: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    def entry(self, name: str) -> Entry:
        return Entry(name, self.dtype, self.shape, self.end - self.begin)


def safetensors_tensors(path: Path) -> dict[str, Stored]:
    """Every tensor of a safetensors file and where its bytes are, the header checked as
    safetensors checks it and each size against its dtype and shape (never a pickle)."""
    try:
        tensor_names(path)
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = bounded_json.loads(handle.read(length), max_bytes=length)
    except (ValueError, struct.error) as exc:
        raise UnreadableCheckpoint(
            f"checkpoint file {path} is not a safetensors file ({exc}); refused unread: "
            f"{SAVE_AGAIN}"
        ) from None
    start = 8 + length
    found = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, shape = entry["dtype"], tuple(entry["shape"])
        begin, end = entry["data_offsets"]
        if dtype not in DTYPE_BYTES or end - begin != math.prod(shape) * DTYPE_BYTES[dtype]:
            raise IntegrityError(
                f"checkpoint file {path}: tensor {shown(name)} of dtype {shown(dtype)} and shape "
                f"{list(shape)} does not fit its {end - begin} bytes; refused unread: {SAVE_AGAIN}"
            )
        found[name] = Stored(path, dtype, shape, start + begin, start + end)
    return found


def copy_ranges(stored: list[Stored]) -> Iterator[bytes]:
    """The bytes of ``stored`` in order, read CHUNK_BYTES at a time (a whole number of
    elements per chunk: CHUNK_BYTES is a multiple of every element size)."""
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
                    raise UnreadableCheckpoint(
                        f"checkpoint file {tensor.path} ended early; collect again"
                    )
                left -= len(chunk)
                yield chunk
    finally:
        for handle in handles.values():
            handle.close()


# --- finite numbers only -----------------------------------------------------------------------


def first_nonfinite(dtype: str, chunk: Any) -> int | None:
    """Index in ``chunk`` (a buffer of whole ``dtype`` elements) of the first NaN or Inf, or
    None; integer and bool dtypes have none."""
    import numpy as np

    if dtype not in _NONFINITE_BITS:
        return None
    numpy_dtype, mask = _NONFINITE_BITS[dtype]
    values = np.frombuffer(chunk, dtype=numpy_dtype)
    if mask is None:
        if np.isfinite(values).all():  # the common case, without an index array
            return None
        bad = np.flatnonzero(~np.isfinite(values))
        return int(bad[0]) if bad.size else None
    bad = (values & mask) == mask
    return int(np.flatnonzero(bad)[0]) if bad.any() else None


def _refusal(what: str, name: str, element: int, shape: tuple[int, ...]) -> IntegrityError:
    return IntegrityError(
        f"{what}: tensor {shown(name)} holds NaN or Inf (element {element} of shape "
        f"{list(shape)}), a model whose training diverged; collect an earlier checkpoint with "
        f"--checkpoint-file, or publish it anyway with {ALLOW_NONFINITE}"
    )


class NonfiniteScan:
    """Finds the first NaN or Inf of a safetensors file from its bytes as they stream past
    (``feed(offset, bytes)``, in order, from any producer: the writer, the verified copy's
    read-back), so a published model costs no second read. Bytes out of order, or a file not
    seen to its end, leave it :attr:`incomplete`: then :func:`refuse_nonfinite` reads the file."""

    def __init__(self) -> None:
        self._restart()

    def watcher(self) -> Callable[[int, Any], None]:
        """:meth:`feed`, numpy imported meanwhile beside the caller's work: its ~0.2 s would
        otherwise fall in the first feed, on the verified copy's hashing thread."""
        threading.Thread(target=importlib.import_module, args=("numpy",), daemon=True).start()
        return self.feed

    def _restart(self) -> None:
        self.position = 0
        self.out_of_order = False
        self.found: tuple[str, int, tuple[int, ...]] | None = None
        self._head = bytearray()
        self._tensors: list[tuple[int, int, str, str, tuple[int, ...]]] | None = None
        self._carry = b""
        self._next = 0

    def feed(self, offset: int, data: Any) -> None:
        if offset == 0:  # a copy started again from zero
            self._restart()
        if offset != self.position or self.out_of_order:
            self.out_of_order = True
            return
        view = memoryview(data).cast("B")
        self.position += len(view)
        if self._tensors is None:
            view, offset = self._read_header(view, offset)
            if self._tensors is None:
                return
        if self.found is None:
            self._scan(view, offset)

    def _read_header(self, view: memoryview, offset: int) -> tuple[memoryview, int]:
        for whole_header in (False, True):  # the length (8 bytes), then the header it measures
            need = 8 + (struct.unpack("<Q", self._head[:8])[0] if whole_header else 0)
            take = max(0, min(len(view), need - len(self._head)))
            self._head += view[:take]
            view, offset = view[take:], offset + take
            if len(self._head) < need:
                return view, offset
        try:
            header = bounded_json.loads(bytes(self._head[8:]), max_bytes=len(self._head))
        except ValueError:
            self.out_of_order = True  # not a safetensors file: refuse_nonfinite says so
            return view, offset
        start = len(self._head)
        self._tensors = sorted(
            (start + entry["data_offsets"][0], start + entry["data_offsets"][1], name,
             entry["dtype"], tuple(entry["shape"]))
            for name, entry in header.items()
            if name != "__metadata__" and entry.get("dtype") in _NONFINITE_BITS
        )  # fmt: skip
        return view, offset

    def _scan(self, view: memoryview, offset: int) -> None:
        end = offset + len(view)
        tensors = self._tensors or []
        while self._next < len(tensors) and offset < end:
            begin, stop, name, dtype, shape = tensors[self._next]
            if stop <= offset:
                self._next += 1
                self._carry = b""
                continue
            if begin >= end:
                return
            lo, hi = max(begin, offset), min(stop, end)
            width = DTYPE_BYTES[dtype]
            piece = view[lo - offset : hi - offset]  # no copy: most chunks are all whole elements
            first = 0  # the element ``piece`` starts at, counted from the tensor's start
            if self._carry:  # an element split across two chunks: made whole first
                need = width - len(self._carry)
                joined, piece = self._carry + bytes(piece[:need]), piece[need:]
                first = (lo - begin - len(self._carry)) // width
                if len(joined) == width and first_nonfinite(dtype, joined) is not None:
                    self.found = (name, first, shape)
                    return
                self._carry = joined if len(joined) < width else b""
                first += 1
            else:
                first = (lo - begin) // width
            whole = len(piece) - len(piece) % width
            index = first_nonfinite(dtype, piece[:whole])
            if index is not None:
                self.found = (name, first + index, shape)
                return
            self._carry += bytes(piece[whole:])
            if hi < stop:
                return
            self._next += 1
            self._carry = b""

    def incomplete(self, size: int) -> bool:
        return self.out_of_order or self.position != size

    def refuse(self, path: Path, what: str) -> None:
        """Refuse ``path`` if what streamed past held a NaN or Inf; read it when the stream
        did not show all of it."""
        if self.incomplete(path.stat().st_size):
            refuse_nonfinite(path, what)
        elif self.found is not None:
            raise _refusal(what, *self.found)


def refuse_nonfinite(path: Path, what: str) -> None:
    """Refuse the safetensors file ``path`` (the model about to be published) in one line
    naming its first tensor holding a NaN or Inf: a model whose training diverged."""
    tensors = safetensors_tensors(path)
    for name in sorted(tensors, key=lambda n: tensors[n].begin):
        stored = tensors[name]
        if stored.dtype not in _NONFINITE_BITS:
            continue
        width, seen = DTYPE_BYTES[stored.dtype], 0
        for chunk in copy_ranges([stored]):
            index = first_nonfinite(stored.dtype, chunk)
            if index is not None:
                raise _refusal(what, name, seen + index, stored.shape)
            seen += len(chunk) // width
