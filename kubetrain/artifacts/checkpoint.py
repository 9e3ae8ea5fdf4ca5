"""Training checkpoints: atomic, verifiable, and readable without a process group.

Layout (format ``kubetrain.checkpoint/v1``)::

    CKPT_DIR/LATEST                  one line: the newest complete folder, e.g. epoch-000003
    CKPT_DIR/epoch-000003/
        manifest.json                format, epoch, step, world_size, strategy (ddp|fsdp),
                                     model {spec, sample_shape, num_classes}, metrics (one dict
                                     per finished epoch), files {relpath: sha256}, created;
                                     optional: history (one dict per optimizer step: step,
                                     epoch, loss, samples_per_second; at most 2000, evenly
                                     thinned), hyperparameters, run {job, started_at,
                                     updated_at, seconds}
        model.safetensors            ddp: the unwrapped module's full state dict
        optimizer.pt                 ddp: optimizer state keyed by parameter name (torch.save)
        dcp/...                      fsdp: a torch.distributed.checkpoint (DCP) checkpoint of
                                     {"model": ..., "optim": ...} written by all ranks
        zero/...                     deepspeed: what ``engine.save_checkpoint(step folder,
                                     tag="zero", save_latest=False)`` writes from all ranks
                                     (``mp_rank_00_model_states.pt``, or one
                                     ``zero_pp_rank_R_mp_rank_00_model_states.pt`` per rank
                                     under ZeRO-3, and each rank's ``[bf16_]zero_pp_rank_R_
                                     mp_rank_00_optim_states.pt``); the manifest adds
                                     zero_stage. DeepSpeed's zero_to_fp32.py and
                                     zero_to_torch.py, which it copies beside the tag folder,
                                     are listed like any file.

How a checkpoint is written, so that a crash never leaves a half-written one that looks done:

1. rank 0 picks a fresh hidden staging folder ``CKPT_DIR/.tmp-epoch-000003-<uuid>``, removes
   what earlier attempts at that epoch left and tells every rank its name (every FSDP rank
   writes into the same place; no pid, which two hosts can share);
2. the payload goes into the staging folder (rank 0 alone for ddp, every rank for fsdp and
   deepspeed);
3. after a barrier, rank 0 writes manifest.json with the sha256 of every payload file, fsyncs
   the folder and renames it to ``epoch-000003`` (:func:`kubetrain.storage.atomic.publish_dir`);
4. rank 0 atomically rewrites ``LATEST``.

A rank that dies before the barrier (a node lost mid-save in an elastic job) fails the
collective rank 0 waits in, and torchrun's agent stops rank 0: the attempt leaves only its
hidden staging folder, which the next save of that epoch removes
(tests/test_train_elastic.py kills rank 1 as it writes its FSDP shard).

A folder has one writer: the training job's rank 0 holds an ``flock`` on ``CKPT_DIR/.lock``
for the whole run (:func:`lock_checkpoint_dir`, the holder's identity written inside), so a
second job given the same folder stops at once instead of overwriting its epochs and flipping
``LATEST``; the lock dies with the process, so the same job restarted takes it again. The lock
is local or on a shared volume (flock; NFS v4 carries it): object storage has no lock, and
two jobs must be given different prefixes there.

Readers ignore dot-folders and folders without a readable manifest, and the manifest is the
last thing written before the rename, so a checkpoint folder either is complete or is not seen.

``CKPT_DIR`` may also be an fsspec URL (``s3://bucket/prefix``). Object stores cannot rename a
folder, so there the payload goes straight under ``CKPT_DIR/epoch-000003/`` (FSDP through
DCP's ``FsspecWriter``), after rank 0 has removed any earlier attempt, manifest first; the
manifest, listing the sha256 of every payload object read back from the store, is written
last, and ``LATEST`` after it. A folder whose manifest is missing is never taken as a
checkpoint, so a crash mid-write leaves nothing that looks done.
With more than one node, ``CKPT_DIR`` must be storage that all nodes share: every rank reads
it to resume, and every FSDP or DeepSpeed rank writes its shard into it. DeepSpeed writes and
reads local files only, so a deepspeed checkpoint folder is local or a shared volume, never
object storage.
"""

from __future__ import annotations

import errno
import fcntl
import io
import json
import os
import pickle
import shutil
import socket
import uuid
import warnings
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from kubetrain import bounded_json, storage
from kubetrain.artifacts.checkpoint_manifest import (
    DCP_DIR,
    EPOCH_NAME,
    FORMAT,
    LATEST,
    MANIFEST,
    MODEL_FILE,
    OPTIMIZER_FILE,
    STRATEGIES,
    ZERO_DIR,
    PathLike,
    checkpoint_name,
    is_complete,
    latest_checkpoint,
    latest_name,
    read_manifest,
    refuse_object_storage_for_deepspeed,
    verify_checkpoint,
)
from kubetrain.artifacts.manifest import check_entry
from kubetrain.errors import IntegrityError, InvalidInput, refusal_reason
from kubetrain.names import JOB_NAME_ENV
from kubetrain.storage import atomic

# The checkpoint API in one place: the layout and readers live in checkpoint_manifest (no torch).
__all__ = [
    "DCP_DIR", "FORMAT", "LATEST", "MANIFEST", "MODEL_FILE", "OPTIMIZER_FILE", "STRATEGIES",
    "ZERO_DIR", "deepspeed_safe_globals", "refuse_object_storage_for_deepspeed",
    "checkpoint_name", "latest_checkpoint", "latest_name", "load_full_state_dict", "load_model",
    "lock_checkpoint_dir", "prune_checkpoints", "read_manifest", "restore_checkpoint",
    "save_checkpoint", "verify_checkpoint",
]  # fmt: skip

# DCP warns when used without a process group; loading that way is what we mean to do.
_SINGLE_PROCESS_WARNING = ".*in a single process.*"


# What DCP's pickled ``.metadata`` is made of, besides the classes of
# torch.distributed.checkpoint.metadata and torch dtypes (see _MetadataUnpickler).
_DCP_METADATA_FILE = ".metadata"
_DCP_METADATA_GLOBALS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # returns torch.layout values only
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("collections", "OrderedDict"),
    *(("pathlib", name) for name in ("PosixPath", "PurePosixPath", "WindowsPath", "PurePath")),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata`` allowing only the plain classes it is made of. DCP itself
    reads it with ``pickle.load``, which calls whatever the file names: a planted file would run
    code even when its manifest sha256 matches (whoever can write the file can write that)."""

    def find_class(self, module: str, name: str) -> Any:
        if "." not in name:
            if (module, name) in _DCP_METADATA_GLOBALS:
                return super().find_class(module, name)
            if module == "torch.distributed.checkpoint.metadata":
                found = super().find_class(module, name)
                if isinstance(found, type) and found.__module__ == module:
                    return found  # its dataclasses and enums: building them runs no code
            if module == "torch" and isinstance(vars(torch).get(name), torch.dtype):
                return vars(torch)[name]
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a DCP checkpoint's metadata")


def _read_dcp_metadata(dcp_path: PathLike) -> Any:
    """DCP's metadata of ``dcp_path``, unpickled by :class:`_MetadataUnpickler` (no code runs)."""
    from torch.distributed.checkpoint.metadata import Metadata

    path = storage.join(dcp_path, _DCP_METADATA_FILE)
    try:
        metadata = _MetadataUnpickler(io.BytesIO(storage.read_bytes(path))).load()
    except FileNotFoundError:
        raise IntegrityError(
            f"checkpoint file {path} is missing; use an earlier checkpoint"
        ) from None
    except Exception as exc:  # whatever a malformed pickle raises
        raise IntegrityError(
            f"checkpoint file {path} is not DCP metadata, refused unread ({exc}); "
            "use a checkpoint written by kubetrain.train"
        ) from exc
    if not isinstance(metadata, Metadata):
        raise IntegrityError(
            f"checkpoint file {path} holds a {type(metadata).__name__}, not DCP metadata; "
            "use a checkpoint written by kubetrain.train"
        )
    # the shard files DCP opens are named here, not in manifest.json: the same rule for them
    for stored in (metadata.storage_data or {}).values():
        relative = getattr(stored, "relative_path", None)
        check_entry(dcp_path, relative, f"checkpoint {dcp_path}", f"{_DCP_METADATA_FILE} names")
    return metadata


def _dcp_reader(dcp_path: PathLike):
    """DCP's reader for a local folder, or its fsspec reader for object storage, that returns
    the metadata :func:`_read_dcp_metadata` read up front instead of ``pickle.load``-ing it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import StorageMeta

    if storage.is_local(dcp_path):
        base, location = dcp.FileSystemReader, str(storage.local_path(dcp_path))
    else:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        base, location = FsspecReader, os.fspath(dcp_path)
    metadata = _read_dcp_metadata(dcp_path)

    class VettedReader(base):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            if metadata.storage_meta is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return VettedReader(location)


def _dcp_load(request: dict[str, Any], dcp_path: PathLike, **options: Any) -> None:
    """``dcp.load`` of tensors only: an entry the metadata marks as bytes (which DCP would
    ``torch.load(weights_only=False)``) is refused, with the refusal raised as it is."""
    import torch.distributed.checkpoint as dcp

    class TensorsOnly(dcp.DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            raise IntegrityError(
                f"checkpoint {dcp_path}: entry {read_item.dest_index.fqn} is stored as pickled "
                "bytes, not a tensor; refused unread, use a checkpoint written by kubetrain.train"
            )

    reader = _dcp_reader(dcp_path)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_SINGLE_PROCESS_WARNING)
            dcp.load(request, storage_reader=reader, planner=TensorsOnly(), **options)
    except dcp.CheckpointException as exc:  # a BaseException wrapping each rank's error
        errors = (error for error, _trace in exc.failures.values())
        refusal = next((error for error in errors if isinstance(error, IntegrityError)), None)
        if refusal is None:
            raise
        raise refusal from None


def _dcp_writer(dcp_path: PathLike):
    import torch.distributed.checkpoint as dcp

    if storage.is_local(dcp_path):
        return dcp.FileSystemWriter(str(storage.local_path(dcp_path)))
    # torch 2.13 exports FsspecWriter/Reader only from this module.
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    return FsspecWriter(os.fspath(dcp_path))


def _load_safetensors(path: PathLike) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load, load_file

    try:
        if storage.is_local(path):
            return load_file(str(storage.local_path(path)))
        # In one order on every rank: FSDP's load distributes the tensors with collectives in
        # dict order, and safetensors' load(bytes) returns them in a per-process hash order.
        return dict(sorted(load(storage.read_bytes(path)).items()))
    except SafetensorError as exc:
        raise IntegrityError(
            f"checkpoint file {path} is not a safetensors file ({exc}); refused unread: use "
            "an earlier checkpoint, or train again"
        ) from exc


def _dcp_model_tensors(dcp_path: PathLike) -> dict[str, torch.Tensor]:
    """Read the "model" entries of a DCP checkpoint into plain tensors, in this process alone."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = _dcp_reader(dcp_path).read_metadata()
    model: dict[str, torch.Tensor] = {}
    for key, entry in metadata.state_dict_metadata.items():
        path = metadata.planner_data.get(key, ()) if metadata.planner_data else ()
        if len(path) != 2 or path[0] != "model":
            continue
        if not isinstance(entry, TensorStorageMetadata):  # skipping it would drop a weight
            raise IntegrityError(
                f"checkpoint {dcp_path}: model entry {path[1]} is stored as "
                f"{type(entry).__name__}, not a tensor; refused unread, use a checkpoint "
                "written by kubetrain.train"
            )
        model[path[1]] = torch.empty(entry.size, dtype=entry.properties.dtype)
    if not model:
        raise IntegrityError(
            f"checkpoint {dcp_path}: its DCP checkpoint has no model; use an earlier "
            "checkpoint, or one written by kubetrain.train"
        )
    _dcp_load({"model": model}, dcp_path, no_dist=True)
    return model


def load_full_state_dict(ckpt_path: PathLike, verify: bool = True) -> dict[str, torch.Tensor]:
    """The model's full, unsharded state dict (plain module names), without a process group."""
    manifest = verify_checkpoint(ckpt_path) if verify else read_manifest(ckpt_path)
    if manifest["strategy"] == "deepspeed":
        raise InvalidInput(
            "checkpoint",
            f"{ckpt_path} is a DeepSpeed ZeRO checkpoint, whose model is in partitions",
            "collect it first (kubetrain collect), which merges them into one model.safetensors",
        )
    if manifest["strategy"] == "fsdp":
        return _dcp_model_tensors(storage.join(ckpt_path, DCP_DIR))
    return _load_safetensors(storage.join(ckpt_path, MODEL_FILE))


def load_model(
    ckpt_path: PathLike, verify: bool = True, model_factory: str | None = None
) -> nn.Module:
    """Rebuild the checkpoint's model from its manifest and load its weights, for evaluation.

    A model of custom code (``package.module:callable``) is built only by ``model_factory``,
    the caller's explicit choice: the manifest's spec is never imported (see
    :func:`kubetrain.artifacts.models.rebuild_model`).
    """
    from kubetrain.artifacts.models import rebuild_model

    manifest = verify_checkpoint(ckpt_path) if verify else read_manifest(ckpt_path)
    model = rebuild_model(manifest["model"], model_factory, f"checkpoint {ckpt_path}")
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
    optimizer: torch.optim.Optimizer | None,
    *,
    epoch: int,
    step: int,
    strategy: str,
    model_info: Mapping[str, Any],
    metrics: Sequence[Mapping[str, Any]],
    history: Sequence[Mapping[str, Any]] | None = None,
    hyperparameters: Mapping[str, Any] | None = None,
    run: Mapping[str, Any] | None = None,
) -> Path | str:
    """Write the checkpoint of ``epoch`` (collective: every rank calls it) and return its path.

    ``model`` may be wrapped in DDP or be FSDP2-sharded, or be a DeepSpeed engine (strategy
    deepspeed: it saves its own optimizer, ``optimizer`` is None); ``model_info`` holds the spec,
    sample_shape and num_classes that rebuild it. ``history`` (one entry per optimizer step),
    ``hyperparameters`` and ``run`` (job, started_at, updated_at, seconds) go into the
    manifest when given, for the report; readers take them as optional.
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict

    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, not {strategy!r}")
    if strategy == "deepspeed":
        refuse_object_storage_for_deepspeed(checkpoint_dir, "--checkpoint-dir")
    local = storage.is_local(checkpoint_dir)
    final = storage.join(checkpoint_dir, checkpoint_name(epoch))
    rank = _rank()
    # Locally a fresh hidden folder renamed into place; on object storage the final prefix.
    target = _agreed_staging(checkpoint_dir, epoch) if local else final
    if rank == 0:
        _clear(target)
    _barrier()

    strategy_fields: dict[str, Any] = {}
    if strategy == "deepspeed":
        # every rank writes its partition; the engine's own "latest" file is not written: LATEST
        # (below) is the one pointer, and it names a folder only once it is complete
        model.save_checkpoint(str(target), tag=ZERO_DIR, save_latest=False)
        strategy_fields["zero_stage"] = model.zero_optimization_stage()
    elif strategy == "fsdp":
        import torch.distributed.checkpoint as dcp

        model_state, optim_state = get_state_dict(model, optimizer)

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_SINGLE_PROCESS_WARNING)
            dcp.save(
                {"model": model_state, "optim": optim_state},
                storage_writer=_dcp_writer(storage.join(target, DCP_DIR)),
            )
    else:
        model_state, optim_state = get_state_dict(model, optimizer)
        if rank == 0:
            _write_ddp_payload(target, _plain_tensors(model_state), optim_state)
    _barrier()

    if rank == 0:
        manifest = {
            "format": FORMAT,
            "epoch": epoch,
            "step": step,
            "world_size": _world_size(),
            "strategy": strategy,
            **strategy_fields,
            "model": dict(model_info),
            "metrics": [dict(entry) for entry in metrics],
            **({} if history is None else {"history": [dict(entry) for entry in history]}),
            **({} if hyperparameters is None else {"hyperparameters": dict(hyperparameters)}),
            **({} if run is None else {"run": dict(run)}),
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


def _agreed_staging(checkpoint_dir: PathLike, epoch: int) -> Path:
    """A staging folder name unique to this attempt, chosen by rank 0 and told to every rank."""
    choice: list[Any] = [f".tmp-{checkpoint_name(epoch)}-{uuid.uuid4().hex}"]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(choice, src=0)
    return Path(storage.join(checkpoint_dir, choice[0]))


def _clear(target: PathLike) -> None:
    """Start ``target`` afresh: locally, remove what earlier attempts at the same epoch left
    (the lock makes this job the folder's only writer) and create it; on object storage remove
    an earlier attempt, its manifest first so no reader trusts it."""
    if storage.is_local(target):
        staging = Path(target)
        attempt_prefix = staging.name.rsplit("-", 1)[0] + "-"
        for earlier in staging.parent.glob(f"{attempt_prefix}*"):
            shutil.rmtree(earlier, ignore_errors=True)
        staging.mkdir(parents=True)
        return
    storage.retract(target, MANIFEST)


def prune_checkpoints(
    checkpoint_dir: PathLike, keep: int, latest_before: str | None
) -> list[Path | str]:
    """Delete the complete epoch checkpoints beyond the newest ``keep`` (0 keeps all), by rank 0
    once the newest is published; return what was deleted.

    Only folders older than ``latest_before`` (what ``LATEST`` named before this epoch's
    checkpoint) go: a reader that resolved ``LATEST`` earlier still finds its folder, so with
    ``keep`` 1 two checkpoints stay until the next epoch. What ``LATEST`` names now stays, and
    so do staging dot-folders and folders without a readable manifest (half-written or not
    ours). Each goes manifest first, so a folder half-deleted by a crash is never taken as a
    checkpoint.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise InvalidInput(
            "--keep-checkpoints", f"{keep!r} is not a whole number >= 0", "pass 0 to keep all, or N"
        )
    before = EPOCH_NAME.fullmatch(latest_before or "")
    if keep == 0 or before is None or not storage.is_dir(checkpoint_dir):
        return []
    epochs = sorted(
        (int(match.group(1)), name)
        for name in storage.list_dirs(checkpoint_dir)
        if (match := EPOCH_NAME.fullmatch(name)) and is_complete(storage.join(checkpoint_dir, name))
    )
    protected = {latest_name(checkpoint_dir), latest_before}
    removed: list[Path | str] = []
    for epoch, name in epochs[:-keep]:
        if epoch < int(before.group(1)) and name not in protected:
            folder = storage.join(checkpoint_dir, name)
            storage.retract(folder, MANIFEST)
            removed.append(folder)
    return removed


# --- one writer per checkpoint folder ---------------------------------------------------------

LOCK_FILE = ".lock"


class CheckpointLock:
    """An ``flock`` on ``CKPT_DIR/.lock`` held by this process until :meth:`release` (or its
    death: the kernel drops it, so a restarted process of the same job takes it again)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd = path, fd

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing drops the flock
            self._fd = -1


def job_identity() -> dict[str, Any]:
    """Who holds a checkpoint folder, for the line another job gets: the job's name where the
    backend sets ``KUBETRAIN_JOB_NAME``, torchrun's run id, the host (a pod's name on a
    cluster) and the process."""
    return {
        "job": os.environ.get(JOB_NAME_ENV) or None,
        "run_id": os.environ.get("TORCHELASTIC_RUN_ID") or None,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _describe_holder(raw: bytes) -> str:
    try:
        holder = bounded_json.loads(raw)
        parts = [f"{key} {holder[key]}" for key in ("job", "run_id", "host", "pid", "since")]
        return ", ".join(part for part in parts if not part.endswith(" None"))
    except (ValueError, TypeError, KeyError):
        return "a process that has not yet said who it is"


def lock_checkpoint_dir(checkpoint_dir: PathLike) -> CheckpointLock | None:
    """Make this process the only writer of a local ``checkpoint_dir`` (created if missing),
    or refuse in one line naming the folder and the job that holds it. Object storage and
    filesystems without ``flock`` have no lock: None (each job needs a folder of its own)."""
    if not storage.is_local(checkpoint_dir):
        return None
    folder = storage.local_path(checkpoint_dir, "--checkpoint-dir")
    path = folder / LOCK_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except (FileExistsError, NotADirectoryError):
        raise InvalidInput(
            "--checkpoint-dir", f"{folder} is not a folder", "pass a folder path"
        ) from None
    except OSError as exc:
        raise InvalidInput(
            "--checkpoint-dir",
            f"cannot write {path} ({exc.strerror})",
            "pass a folder this job can write",
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _describe_holder(os.pread(fd, 64 * 1024, 0))
        os.close(fd)
        raise InvalidInput(
            "--checkpoint-dir",
            f"{folder} is being written by another job ({holder}), whose epochs and LATEST "
            "this job would overwrite",
            "give each job its own --checkpoint-dir, or wait until that job ends",
        ) from None
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            return None  # a filesystem without locks (some FUSE mounts): as on object storage
        raise
    except BaseException:
        os.close(fd)
        raise
    record = (json.dumps(job_identity(), sort_keys=True) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, record, 0)
    return CheckpointLock(path, fd)


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


def deepspeed_safe_globals() -> list[Any]:
    """The classes a DeepSpeed ZeRO checkpoint's pickles hold besides tensors and plain
    containers (found with ``torch.serialization.get_unsafe_globals_in_checkpoint`` on stage
    1-3 checkpoints of deepspeed 0.19.8): the stage enum, the loss scaler's plain record and
    the optimizer's fragment addresses (stages 1-2). Building them runs no code of the file."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, LossScaler, fragment_address]


#: torch's switch that makes every ``torch.load`` of the process ``weights_only=True``, even one
#: that asks for less (torch 2.13 serialization.py ``load``).
_FORCE_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"


def _restore_deepspeed(ckpt_path: PathLike, engine: Any) -> None:
    """``engine.load_checkpoint`` of the step folder's ``zero`` tag, every pickle loaded
    ``weights_only`` with :func:`deepspeed_safe_globals` only. DeepSpeed's own loader asks for
    ``weights_only=False`` (deepspeed v0.19.8 runtime/checkpoint_engine/
    torch_checkpoint_engine.py ``load``) and has no public hook to ask otherwise; torch's
    documented switch, set for the load alone, overrides it."""
    before = os.environ.get(_FORCE_WEIGHTS_ONLY)
    os.environ[_FORCE_WEIGHTS_ONLY] = "1"
    try:
        with torch.serialization.safe_globals(deepspeed_safe_globals()):
            loaded, _ = engine.load_checkpoint(str(ckpt_path), tag=ZERO_DIR)
    except pickle.UnpicklingError as exc:
        raise IntegrityError(
            f"checkpoint {ckpt_path}: a file of {ZERO_DIR}/ is not plain DeepSpeed state, refused "
            f"unread ({refusal_reason(exc)}); use a checkpoint written by kubetrain.train"
        ) from exc
    finally:
        if before is None:
            os.environ.pop(_FORCE_WEIGHTS_ONLY, None)
        else:
            os.environ[_FORCE_WEIGHTS_ONLY] = before
    if loaded is None:
        raise IntegrityError(
            f"checkpoint {ckpt_path}: DeepSpeed found no checkpoint in {ZERO_DIR}/; "
            "use an earlier checkpoint"
        )


def restore_checkpoint(
    ckpt_path: PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    verify: bool = True,
) -> dict[str, Any]:
    """Load model and optimizer state (collective); return the manifest with epoch, step, metrics.

    Works across strategies and world sizes (a ddp checkpoint into an FSDP model and back;
    DCP reshards an fsdp checkpoint to this run's ranks as it loads it).
    Optimizer hyperparameters stay those of ``optimizer``, so a resumed run follows its
    command line (e.g. a new --lr). A deepspeed checkpoint goes back into the DeepSpeed engine
    ``model`` (``optimizer`` None) that wrote it, with the same ZeRO stage and world size.
    ``verify`` False: the caller has just checked every file against the manifest.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_state_dict,
    )

    manifest = verify_checkpoint(ckpt_path) if verify else read_manifest(ckpt_path)
    if manifest["strategy"] == "deepspeed" or optimizer is None:
        if manifest["strategy"] != "deepspeed" or optimizer is not None:
            raise InvalidInput(
                "--strategy",
                f"checkpoint {ckpt_path} was written by strategy {manifest['strategy']}, "
                "which this run cannot continue",
                f"resume it with --strategy {manifest['strategy']}, or pass --resume never with "
                "another --checkpoint-dir",
            )
        _restore_deepspeed(ckpt_path, model)
        return manifest
    hyperparameters = [
        {key: value for key, value in group.items() if key != "params"}
        for group in optimizer.param_groups
    ]
    if manifest["strategy"] == "fsdp":
        model_state, optim_state = get_state_dict(model, optimizer)
        request = {"model": _tensor_leaves(model_state), "optim": _tensor_leaves(optim_state)}
        _dcp_load(request, storage.join(ckpt_path, DCP_DIR))
        set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)
    else:
        model_state = _load_safetensors(storage.join(ckpt_path, MODEL_FILE))
        optim_path = storage.join(ckpt_path, OPTIMIZER_FILE)
        with storage.open_file(optim_path) as handle:
            data = io.BytesIO(handle.read())
        try:  # weights_only: tensors and plain containers, never code the file names
            optim_state = torch.load(data, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError) as exc:
            raise IntegrityError(
                f"checkpoint file {optim_path} is not plain optimizer state, refused unread "
                f"({refusal_reason(exc)}); use a checkpoint written by kubetrain.train"
            ) from exc
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
