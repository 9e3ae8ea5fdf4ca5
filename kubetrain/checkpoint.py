"""Training checkpoints: atomic, verifiable, and readable without a process group.

Layout (format ``kubetrain.checkpoint/v1``)::

    CKPT_DIR/LATEST                  one line: the newest complete folder, e.g. epoch-000003
    CKPT_DIR/epoch-000003/
        manifest.json                format, epoch, step, world_size, strategy (ddp|fsdp),
                                     model {spec, sample_shape, num_classes}, metrics (one dict
                                     per finished epoch), files {relpath: sha256}, created
        model.safetensors            ddp: the unwrapped module's full state dict
        optimizer.pt                 ddp: optimizer state keyed by parameter name (torch.save)
        dcp/...                      fsdp: a torch.distributed.checkpoint (DCP) checkpoint of
                                     {"model": ..., "optim": ...} written by all ranks

How a checkpoint is written, so that a crash never leaves a half-written one that looks done:

1. rank 0 empties the hidden staging folder ``CKPT_DIR/.tmp-epoch-000003`` (a fixed name, so
   that every FSDP rank writes into the same place), then all ranks meet at a barrier;
2. the payload goes into the staging folder (rank 0 alone for ddp, every rank for fsdp);
3. after a barrier, rank 0 writes manifest.json with the sha256 of every payload file, fsyncs
   the folder and renames it to ``epoch-000003`` (:func:`kubetrain.atomic.publish_dir`);
4. rank 0 atomically rewrites ``LATEST``.

Readers ignore dot-folders and folders without a readable manifest, and the manifest is the
last thing written before the rename, so a checkpoint folder either is complete or is not seen.

``CKPT_DIR`` may also be an fsspec URL (``s3://bucket/prefix``). Object stores cannot rename a
folder, so there the payload goes straight under ``CKPT_DIR/epoch-000003/`` (FSDP through
DCP's ``FsspecWriter``), after rank 0 has removed any earlier attempt, manifest first; the
manifest, listing the sha256 of every payload object read back from the store, is written
last, and ``LATEST`` after it. A folder whose manifest is missing is never taken as a
checkpoint, so a crash mid-write leaves nothing that looks done.
With more than one node, ``CKPT_DIR`` must be storage that all nodes share: every rank reads
it to resume, and every FSDP rank writes its shard into it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import warnings
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from kubetrain import atomic, storage
from kubetrain.checkpoint_manifest import (
    DCP_DIR,
    FORMAT,
    LATEST,
    MANIFEST,
    MODEL_FILE,
    OPTIMIZER_FILE,
    STRATEGIES,
    PathLike,
    checkpoint_name,
    latest_checkpoint,
    read_manifest,
    verify_checkpoint,
)
from kubetrain.errors import IntegrityError

# The checkpoint API in one place: the layout and readers live in checkpoint_manifest (no torch).
__all__ = [
    "DCP_DIR", "FORMAT", "LATEST", "MANIFEST", "MODEL_FILE", "OPTIMIZER_FILE", "STRATEGIES",
    "checkpoint_name", "latest_checkpoint", "load_full_state_dict", "load_model",
    "read_manifest", "restore_checkpoint", "save_checkpoint", "verify_checkpoint",
]  # fmt: skip

# DCP warns when used without a process group; loading that way is what we mean to do.
_SINGLE_PROCESS_WARNING = ".*in a single process.*"


def _dcp_reader(dcp_path: PathLike):
    """DCP's reader for a local folder, or its fsspec reader for object storage."""
    import torch.distributed.checkpoint as dcp

    if storage.is_local(dcp_path):
        return dcp.FileSystemReader(str(storage.local_path(dcp_path)))
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(os.fspath(dcp_path))


def _dcp_writer(dcp_path: PathLike):
    import torch.distributed.checkpoint as dcp

    if storage.is_local(dcp_path):
        return dcp.FileSystemWriter(str(storage.local_path(dcp_path)))
    # torch 2.13 exports FsspecWriter/Reader only from this module.
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    return FsspecWriter(os.fspath(dcp_path))


def _load_safetensors(path: PathLike) -> dict[str, torch.Tensor]:
    from safetensors.torch import load, load_file

    if storage.is_local(path):
        return load_file(str(storage.local_path(path)))
    # In one order on every rank: FSDP's load distributes the tensors with collectives in
    # dict order, and safetensors' load(bytes) returns them in a per-process hash order.
    return dict(sorted(load(storage.read_bytes(path)).items()))


def _dcp_model_tensors(dcp_path: PathLike) -> dict[str, torch.Tensor]:
    """Read the "model" entries of a DCP checkpoint into plain tensors, in this process alone."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = _dcp_reader(dcp_path).read_metadata()
    model: dict[str, torch.Tensor] = {}
    for key, entry in metadata.state_dict_metadata.items():
        path = metadata.planner_data.get(key, ()) if metadata.planner_data else ()
        if len(path) == 2 and path[0] == "model" and isinstance(entry, TensorStorageMetadata):
            model[path[1]] = torch.empty(entry.size, dtype=entry.properties.dtype)
    if not model:
        raise IntegrityError(f"checkpoint {dcp_path}: its DCP checkpoint has no model")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SINGLE_PROCESS_WARNING)
        dcp.load({"model": model}, storage_reader=_dcp_reader(dcp_path), no_dist=True)
    return model


def load_full_state_dict(ckpt_path: PathLike, verify: bool = True) -> dict[str, torch.Tensor]:
    """The model's full, unsharded state dict (plain module names), without a process group."""
    manifest = verify_checkpoint(ckpt_path) if verify else read_manifest(ckpt_path)
    if manifest["strategy"] == "fsdp":
        return _dcp_model_tensors(storage.join(ckpt_path, DCP_DIR))
    return _load_safetensors(storage.join(ckpt_path, MODEL_FILE))


def load_model(ckpt_path: PathLike, verify: bool = True) -> nn.Module:
    """Rebuild the checkpoint's model from its manifest and load its weights, for evaluation."""
    from kubetrain.models import build_model

    manifest = verify_checkpoint(ckpt_path) if verify else read_manifest(ckpt_path)
    info = manifest["model"]
    model = build_model(info["spec"], info["sample_shape"], info["num_classes"])
    model.load_state_dict(load_full_state_dict(ckpt_path, verify=False))
    return model


# --- writing ---------------------------------------------------------------------------------


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _write_model_file(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write the model payload; a seam of its own so tests can interrupt it mid-write."""
    from safetensors.torch import save_file

    save_file(tensors, str(path))


def _plain_tensors(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """CPU, contiguous, unshared copies: what safetensors accepts (tied weights share storage)."""
    return {
        key: value.detach().to("cpu").contiguous().clone()
        for key, value in state.items()
        if isinstance(value, torch.Tensor)
    }


def save_checkpoint(
    checkpoint_dir: PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    epoch: int,
    step: int,
    strategy: str,
    model_info: Mapping[str, Any],
    metrics: Sequence[Mapping[str, Any]],
) -> Path | str:
    """Write the checkpoint of ``epoch`` (collective: every rank calls it) and return its path.

    ``model`` may be wrapped in DDP or be FSDP2-sharded; ``model_info`` holds the spec,
    sample_shape and num_classes that rebuild it.
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict

    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, not {strategy!r}")
    local = storage.is_local(checkpoint_dir)
    final = storage.join(checkpoint_dir, checkpoint_name(epoch))
    # Locally a hidden folder renamed into place; on object storage the final prefix itself.
    target = storage.join(checkpoint_dir, f".tmp-{checkpoint_name(epoch)}") if local else final
    rank = _rank()
    if rank == 0:
        _clear(target)
    _barrier()

    model_state, optim_state = get_state_dict(model, optimizer)
    if strategy == "fsdp":
        import torch.distributed.checkpoint as dcp

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_SINGLE_PROCESS_WARNING)
            dcp.save(
                {"model": model_state, "optim": optim_state},
                storage_writer=_dcp_writer(storage.join(target, DCP_DIR)),
            )
    elif rank == 0:
        _write_ddp_payload(target, _plain_tensors(model_state), optim_state)
    _barrier()

    if rank == 0:
        manifest = {
            "format": FORMAT,
            "epoch": epoch,
            "step": step,
            "world_size": _world_size(),
            "strategy": strategy,
            "model": dict(model_info),
            "metrics": [dict(entry) for entry in metrics],
            "files": {},
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        manifest["files"] = storage.folder_digests(target, exclude=(MANIFEST,))
        if local:
            (target / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            atomic.publish_dir(target, final)
            atomic.write_text(storage.join(checkpoint_dir, LATEST), checkpoint_name(epoch) + "\n")
        else:
            storage.write_text(
                storage.join(target, MANIFEST), json.dumps(manifest, indent=2, sort_keys=True)
            )
            storage.write_text(storage.join(checkpoint_dir, LATEST), checkpoint_name(epoch) + "\n")
    _barrier()
    return final


def _clear(target: PathLike) -> None:
    """Remove an earlier attempt at ``target``, its manifest first so no reader trusts it."""
    if storage.is_local(target):
        shutil.rmtree(target, ignore_errors=True)
        Path(target).mkdir(parents=True)
        return
    storage.retract(target, MANIFEST)


def _write_ddp_payload(
    target: PathLike, tensors: dict[str, torch.Tensor], optim_state: dict[str, Any]
) -> None:
    if storage.is_local(target):
        _write_model_file(Path(target) / MODEL_FILE, tensors)
        torch.save(optim_state, Path(target) / OPTIMIZER_FILE)
        return
    from safetensors.torch import save

    storage.write_bytes(storage.join(target, MODEL_FILE), save(tensors))
    buffer = io.BytesIO()
    torch.save(optim_state, buffer)
    storage.write_bytes(storage.join(target, OPTIMIZER_FILE), buffer.getvalue())


# --- resuming --------------------------------------------------------------------------------


def _tensor_leaves(tree: Any) -> Any:
    """The same nested dicts keeping only tensors, so DCP never unpickles a non-tensor entry."""
    if isinstance(tree, Mapping):
        kept = {key: _tensor_leaves(value) for key, value in tree.items()}
        return {
            key: value
            for key, value in kept.items()
            if value is not None and not (isinstance(value, dict) and not value)
        }
    return tree if isinstance(tree, torch.Tensor) else None


def restore_checkpoint(
    ckpt_path: PathLike, model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """Load model and optimizer state (collective); return the manifest with epoch, step, metrics.

    Works across strategies and world sizes (a ddp checkpoint into an FSDP model and back).
    Optimizer hyperparameters stay those of ``optimizer``, so a resumed run follows its
    command line (e.g. a new --lr).
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_state_dict,
    )

    manifest = verify_checkpoint(ckpt_path)
    hyperparameters = [
        {key: value for key, value in group.items() if key != "params"}
        for group in optimizer.param_groups
    ]
    if manifest["strategy"] == "fsdp":
        import torch.distributed.checkpoint as dcp

        model_state, optim_state = get_state_dict(model, optimizer)
        request = {"model": _tensor_leaves(model_state), "optim": _tensor_leaves(optim_state)}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_SINGLE_PROCESS_WARNING)
            dcp.load(request, storage_reader=_dcp_reader(storage.join(ckpt_path, DCP_DIR)))
        set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)
    else:
        model_state = _load_safetensors(storage.join(ckpt_path, MODEL_FILE))
        with storage.open_file(storage.join(ckpt_path, OPTIMIZER_FILE)) as handle:
            optim_state = torch.load(
                io.BytesIO(handle.read()), map_location="cpu", weights_only=True
            )
        set_state_dict(
            model,
            optimizer,
            model_state_dict=model_state,
            optim_state_dict=optim_state,
            options=StateDictOptions(full_state_dict=True),
        )
    for group, saved in zip(optimizer.param_groups, hyperparameters, strict=True):
        group.update(saved)
    return manifest
