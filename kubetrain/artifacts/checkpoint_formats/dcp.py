"""``torch.distributed.checkpoint`` folders (``.metadata`` and ``*.distcp``), as
``dcp.save`` writes them: the state dict is flattened, and the metadata's ``planner_data``
keeps each entry's path (``app.model.fc.weight`` → ``("app", "model", "fc.weight")``;
``torch/distributed/checkpoint/_nested_dict.py``), so the model is chosen by the same rule
as a saved dict's (the DCP recipe's ``{"app": AppState}`` holds ``app.model`` and
``app.optim``). The metadata is unpickled by kubetrain's restricted unpickler (no code runs);
entries stored as pickled bytes are never loaded; tensors are read at most
:data:`DCP_BATCH_BYTES` at a time."""

from __future__ import annotations

import io
import math
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubetrain.artifacts.checkpoint_formats.api import Candidate, ModelSource, make_candidate
from kubetrain.artifacts.checkpoint_formats.files import (
    UnreadableCheckpoint,
    check_listed,
    held_to_rule,
    join,
    read_record,
)
from kubetrain.artifacts.checkpoint_formats.state_select import Leaf, choose_state
from kubetrain.artifacts.checkpoint_formats.writer import TORCH_DTYPES, Entry, tensor_bytes
from kubetrain.artifacts.manifest import shown
from kubetrain.artifacts.model_card import SOURCE_DCP
from kubetrain.errors import IntegrityError

METADATA = ".metadata"
#: Most bytes of a DCP checkpoint's tensors held in memory at once (one larger tensor is read
#: on its own).
DCP_BATCH_BYTES = 64 << 20
_SAVE_DCP = "save the checkpoint with torch.distributed.checkpoint.save"


def metadata_of(root: Path, relative: str) -> Any:
    """DCP's ``.metadata``, held to the rule, read bounded and unpickled by kubetrain's
    restricted unpickler (no code runs); every shard file it names held to the rule."""
    from torch.distributed.checkpoint.metadata import Metadata

    from kubetrain.artifacts.checkpoint import _MetadataUnpickler

    path = held_to_rule(root, relative)
    try:
        metadata = _MetadataUnpickler(io.BytesIO(read_record(path))).load()
    except IntegrityError:
        raise
    except Exception as exc:  # whatever a malformed or planted pickle raises
        raise UnreadableCheckpoint(
            f"checkpoint file {path} is not DCP metadata, refused unread ({exc}); {_SAVE_DCP}"
        ) from None
    if not isinstance(metadata, Metadata):
        raise IntegrityError(
            f"checkpoint file {path} holds a {type(metadata).__name__}, not DCP metadata; "
            f"{_SAVE_DCP}"
        )
    for stored in (metadata.storage_data or {}).values():
        check_listed(path.parent, getattr(stored, "relative_path", None), f"{path} names")
    return metadata


def _batches(folder: Path, metadata: Any, model: list[tuple[str, Any]], what: str) -> Iterator[Any]:
    """The bytes of ``model``'s entries (DCP key, tensor metadata), in order, read at most
    DCP_BATCH_BYTES at a time; an entry stored as pickled bytes is refused, never loaded."""
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
                "tensor; refused unread: save the model's state_dict() (its tensors) with "
                "torch.distributed.checkpoint.save"
            )

    def load(batch: list[tuple[str, Any]]) -> list[torch.Tensor]:
        request = {
            fqn: torch.empty(tuple(entry.size), dtype=entry.properties.dtype)
            for fqn, entry in batch
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
                raise UnreadableCheckpoint(
                    f"{what} could not be read ({exc}); refused: check that every file the "
                    f"checkpoint wrote is there, or {_SAVE_DCP} again"
                ) from None
            raise refusal from None
        return [request[fqn] for fqn, _entry in batch]

    batch: list[tuple[str, Any]] = []
    size = 0
    for item in model:
        nbytes = math.prod(item[1].size) * item[1].properties.dtype.itemsize
        if batch and size + nbytes > DCP_BATCH_BYTES:
            for tensor in load(batch):
                yield tensor_bytes(tensor)
            batch, size = [], 0
        batch.append(item)
        size += nbytes
    if batch:
        for tensor in load(batch):
            yield tensor_bytes(tensor)


class Dcp:
    FORMATS = (SOURCE_DCP,)

    def recognise_folder(self, root: Path, folder: str, names: list[str]) -> list[Candidate]:
        if METADATA not in names:
            return []
        files = [METADATA] + [n for n in names if n.endswith(".distcp")]
        named = folder or root.name
        return [
            make_candidate(
                root, join(folder, METADATA), SOURCE_DCP, [join(folder, n) for n in files], named
            )
        ]

    def recognise_file(self, root: Path, relative: str) -> Candidate | None:
        return None

    def files(self, root: Path, candidate: Candidate) -> list[str]:
        metadata = metadata_of(root, candidate.relative)
        folder = os.path.dirname(candidate.relative)
        names = {stored.relative_path for stored in (metadata.storage_data or {}).values()}
        return sorted(join(folder, name) for name in names | {METADATA})

    def read(self, root: Path, candidate: Candidate, state_key: str) -> ModelSource:
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        metadata = metadata_of(root, candidate.relative)
        folder = (root / candidate.relative).parent
        what = f"checkpoint {folder}"
        planner = metadata.planner_data or {}
        by_path = {}
        leaves = []
        for fqn, entry in metadata.state_dict_metadata.items():
            path = tuple(planner.get(fqn, (fqn,)))
            is_tensor = isinstance(entry, TensorStorageMetadata)
            leaves.append(Leaf(path, is_tensor, "Tensor" if is_tensor else "bytes"))
            by_path[path] = (fqn, entry)
        choice = choose_state(leaves, state_key, what)
        entries, fqns = {}, {}
        for name, path in choice.names.items():
            fqn, entry = by_path[path]
            dtype = str(entry.properties.dtype).removeprefix("torch.")
            if dtype not in TORCH_DTYPES:
                raise IntegrityError(
                    f"{what}: entry {shown(fqn)} is a {entry.properties.dtype} tensor, which "
                    "safetensors cannot hold; cast the model to a dtype it holds (e.g. "
                    "model.float()) before saving the checkpoint"
                )
            size = tuple(entry.size)
            entries[name] = Entry(
                name, TORCH_DTYPES[dtype], size, math.prod(size) * entry.properties.dtype.itemsize
            )
            fqns[name] = (fqn, entry)

        def chunks(order: list[str]) -> Iterator[Any]:
            return _batches(folder, metadata, [fqns[name] for name in order], what)

        return ModelSource(SOURCE_DCP, entries, chunks, state_key=choice.state_key)
