"""Process group, device and model wrapping for DDP and FSDP2.

Under torchrun the topology comes from its environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/PORT, which torchrun derives from PET_*). Without it we start a one-process group
on an in-memory store, so that one code path (collectives, DCP, FSDP) serves every world size.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from kubetrain.errors import InvalidInput


@dataclass(frozen=True)
class Runtime:
    """Where this process sits in the job."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise InvalidInput(name, f"{value!r} is not an integer", "launch with torchrun") from exc


def pick_device(option: str, local_rank: int) -> torch.device:
    """cuda:LOCAL_RANK when CUDA is wanted and present, else cpu."""
    use_cuda = option == "cuda" or (option == "auto" and torch.cuda.is_available())
    if not use_cuda:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise InvalidInput(
            "--device", "cuda was asked for but CUDA is unavailable", "use cpu or auto"
        )
    if local_rank >= torch.cuda.device_count():
        raise InvalidInput(
            "--device",
            f"local rank {local_rank} has no GPU ({torch.cuda.device_count()} visible)",
            "start at most one process per GPU (--nproc-per-node)",
        )
    torch.cuda.set_device(local_rank)
    # Shapes are fixed within a run: let cuDNN time its convolution kernels once, keep the best.
    torch.backends.cudnn.benchmark = True
    return torch.device("cuda", local_rank)


def init_runtime(device_option: str) -> Runtime:
    """Join (or create) the process group: nccl on CUDA, gloo on CPU."""
    rank = _env_int("RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    device = pick_device(device_option, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    device_id = device if device.type == "cuda" else None
    if "RANK" in os.environ and "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, device_id=device_id)
    elif world_size > 1:
        raise InvalidInput(
            "WORLD_SIZE",
            f"is {world_size} but MASTER_ADDR/RANK are not set",
            "start several processes with torchrun (python -m torch.distributed.run)",
        )
    else:
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, device_id=device_id
        )
        rank, world_size, local_rank = 0, 1, 0
    return Runtime(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _shard_units(module: nn.Module) -> Iterator[nn.Module]:
    """Children that own parameters, looking inside ModuleList/ModuleDict (they have no forward)."""
    for child in module.children():
        if isinstance(child, nn.ModuleList | nn.ModuleDict):
            yield from _shard_units(child)
        elif any(True for _ in child.parameters()):
            yield child


def wrap_model(model: nn.Module, strategy: str, runtime: Runtime) -> nn.Module:
    """Move ``model`` to the device and wrap it: DDP, or FSDP2 on each unit and then the root."""
    model = model.to(runtime.device)
    if strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(runtime.device.type, (runtime.world_size,))
        for unit in list(_shard_units(model)):
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [runtime.device.index] if runtime.device.type == "cuda" else None
    # Gradients live in the all-reduce buckets: no copy in and out of them on every step.
    return DistributedDataParallel(model, device_ids=device_ids, gradient_as_bucket_view=True)


@contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce/reduce-scatter on accumulation micro-steps that are not last."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if enabled:
        yield
    elif isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
    elif isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


def all_reduce_sum(values: Sequence[float], device: torch.device) -> list[float]:
    """Sum per-rank totals (loss sums, counts) over all ranks, in float64 to keep counts exact."""
    tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor)
    return tensor.tolist()
