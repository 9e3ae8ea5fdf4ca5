"""Process group, device and model wrapping for DDP and FSDP2 (DeepSpeed: deepspeed_strategy).

Under torchrun the topology comes from its environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/PORT, which torchrun derives from PET_*); under mpirun from OpenMPI's
(:func:`discover_mpi_topology`); under Ray Train the group exists before our code runs.
Without any of them we start a one-process group on an in-memory store, so that one code path
(collectives, DCP, FSDP, DeepSpeed) serves every world size.
"""

from __future__ import annotations

import os
import socket
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


def _env_int(name: str, default: int, fix: str = "launch with torchrun") -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise InvalidInput(name, f"{value!r} is not an integer", fix) from exc


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


#: The rendezvous port of DeepSpeed's MPI discovery (deepspeed v0.19.8 constants.py
#: TORCH_DISTRIBUTED_DEFAULT_PORT), used when the environment gives no MASTER_PORT.
MPI_DEFAULT_PORT = 29500


def _host_address() -> str:
    """This host's address for the other ranks: what its name resolves to (a pod's own IP,
    from the /etc/hosts entry the kubelet writes). DeepSpeed's MPI discovery runs
    ``hostname -I`` instead; a process of ours starts no program for it (the process guard),
    and the name is what the other pods reach it by. Unresolvable: the name itself, so the
    rendezvous names it in its error."""
    name = socket.gethostname()
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name


def discover_mpi_topology() -> bool:
    """Started by mpirun (OpenMPI's ``OMPI_COMM_WORLD_*`` set, torchrun's ``RANK`` not), set the
    torch topology as deepspeed v0.19.8 comm/comm.py ``mpi_discovery`` sets it: RANK,
    WORLD_SIZE and LOCAL_RANK (OpenMPI's own counts, which equal the ranks and per-host
    positions it computes with mpi4py), MASTER_ADDR rank 0's address broadcast over MPI (one
    the environment gives wins) and MASTER_PORT (the environment's, else 29500); and, as
    torchrun does, LOCAL_WORLD_SIZE. Return whether it did."""
    if "RANK" in os.environ or "OMPI_COMM_WORLD_RANK" not in os.environ:
        return False
    fix = "start it with OpenMPI's mpirun, which sets OMPI_COMM_WORLD_*"
    rank = _env_int("OMPI_COMM_WORLD_RANK", 0, fix)
    topology = {
        "RANK": str(rank),
        "WORLD_SIZE": str(_env_int("OMPI_COMM_WORLD_SIZE", 1, fix)),
        "LOCAL_RANK": str(_env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, fix)),
        "LOCAL_WORLD_SIZE": str(_env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1, fix)),
        "MASTER_PORT": os.environ.get("MASTER_PORT") or str(MPI_DEFAULT_PORT),
    }
    address = os.environ.get("MASTER_ADDR")
    if not address:
        try:
            from mpi4py import MPI
        except ImportError:
            raise InvalidInput(
                "MASTER_ADDR",
                "is not set under mpirun, and mpi4py, which would find rank 0's address, is "
                "not installed",
                "install mpi4py (pip install 'kubetrain[deepspeed]'), or set MASTER_ADDR",
            ) from None
        address = MPI.COMM_WORLD.bcast(_host_address() if rank == 0 else None, root=0)
    os.environ.update(topology, MASTER_ADDR=address)
    return True


def init_runtime(device_option: str, gpu_index: int | None = None) -> Runtime:
    """Join (or create) the process group: nccl on CUDA, gloo on CPU. A group the launcher
    started already (Ray Train's TorchTrainer does, before our code runs) is taken as it is;
    ``gpu_index`` is the GPU the launcher gave this process, when not its local rank."""
    discover_mpi_topology()
    rank = _env_int("RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    device = pick_device(device_option, local_rank if gpu_index is None else gpu_index)
    if dist.is_initialized():
        return Runtime(
            rank=dist.get_rank(),
            local_rank=local_rank,
            world_size=dist.get_world_size(),
            device=device,
        )
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


#: What gloo's TCP transport says, in the plain RuntimeError a collective raises, when the
#: process at the other end of a connection died (gloo/transport/tcp/pair.cc, as torch 2.13
#: vendors it: "Connection closed by peer [ADDR]:PORT", "Read error [ADDR]:PORT: Connection
#: reset by peer"). torch gives no exception type of its own for it.
GLOO_PEER_GONE = ("Connection closed by peer", "Connection reset by peer")


def lost_peer(exc: BaseException) -> str | None:
    """Why a collective failed when it failed because another process of the job died (a rank
    that crashed, a node lost from an elastic job), in a few words; None for any other error.
    Besides gloo's transport errors, torch's DistNetworkError: the rendezvous store's
    connection lost with the node that served it."""
    if isinstance(exc, dist.DistNetworkError):
        return " ".join(str(exc).split())[:200] or type(exc).__name__
    text = str(exc)
    if isinstance(exc, RuntimeError) and "gloo" in text:
        return next((f"gloo: {sign}" for sign in GLOO_PEER_GONE if sign in text), None)
    return None


def all_reduce_sum(values: Sequence[float], device: torch.device) -> list[float]:
    """Sum per-rank totals (loss sums, counts) over all ranks, in float64 to keep counts exact."""
    tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor)
    return tensor.tolist()
