"""A user's DeepSpeed program written the way the seed document's DeepSpeed example is
(``004_…``, "DeepSpeed" section: ``deepspeed.initialize(model=..., model_parameters=...,
config="ds_config.json")``, ``model_engine.backward(loss)``, ``model_engine.step()``,
``model_engine.save_checkpoint(dir, tag=f"step_{step}")``), small: a tiny model on a fixed
synthetic dataset, a few steps, ZeRO stage 2. It never reads a launcher's variables itself, so
the same file runs under torchrun (DeepSpeed reads RANK/WORLD_SIZE/MASTER_* that torchrun
sets) and under mpirun (DeepSpeed's ``init_distributed`` finds no RANK and discovers the world
through mpi4py: deepspeed v0.19.8 ``deepspeed/comm/comm.py`` ``mpi_discovery``, which takes
rank 0's address and port 29500)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

STEPS = 4
#: The port DeepSpeed's MPI discovery gives every rank (deepspeed v0.19.8 deepspeed/constants.py
#: TORCH_DISTRIBUTED_DEFAULT_PORT): one such run at a time on this machine.
MPI_DISCOVERY_PORT = 29500


@contextlib.contextmanager
def mpi_discovery_port() -> Iterator[None]:
    """Hold this machine's lock on ``MPI_DISCOVERY_PORT`` (a file lock, across test workers):
    on a cluster each launcher has its own network; here two such runs would share one port."""
    path = Path(tempfile.gettempdir()) / f"kubetrain-deepspeed-port-{MPI_DISCOVERY_PORT}.lock"
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ds_config(world_size: int, zero_stage: int = 2) -> dict:
    """The JSON config beside the program (the seed's keys; batch = micro x accumulation x
    world size, as DeepSpeed checks)."""
    micro, accumulation = 4, 1
    return {
        "train_batch_size": micro * accumulation * world_size,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accumulation,
        # torch_adam: torch's AdamW, not DeepSpeed's FusedAdam, whose C++ op would be compiled
        # on the first run (minutes on 2 busy cores; deepspeed runtime/engine.py
        # _configure_basic_optimizer reads the key).
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 0.01, "weight_decay": 0.01, "torch_adam": True},
        },
        "zero_optimization": {"stage": zero_stage},
        "steps_per_print": 1000,
    }


TRAIN = """
import deepspeed
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))

model_engine, optimizer, _, _ = deepspeed.initialize(
    model=model,
    model_parameters=model.parameters(),
    config="ds_config.json",
)

rank = deepspeed.comm.get_rank()
generator = torch.Generator().manual_seed(rank)
for step in range(1, {steps} + 1):
    x = torch.randn(4, 8, generator=generator)
    y = (x.sum(dim=1) > 0).long()
    loss = nn.functional.cross_entropy(model_engine(x), y)
    model_engine.backward(loss)
    model_engine.step()
    if rank == 0:
        print(f"step {{step}} loss {{loss.item():.4f}}", flush=True)

model_engine.save_checkpoint("checkpoint", tag=f"step_{{step}}")
print(f"rank {{rank}} of {{deepspeed.comm.get_world_size()}} saved step_{{step}}", flush=True)
"""


def write_program(folder: Path, world_size: int, zero_stage: int = 2) -> Path:
    """``train.py`` and its ``ds_config.json`` in ``folder`` (the job's working directory)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ds_config.json").write_text(json.dumps(ds_config(world_size, zero_stage)))
    program = folder / "train.py"
    program.write_text(TRAIN.format(steps=STEPS))
    return program
