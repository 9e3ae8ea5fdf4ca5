"""Distributed checkpointing of an FSDP model, written in the style of the PyTorch recipe
"Getting Started with Distributed Checkpoint (DCP)" (pytorch/tutorials
``recipes_source/distributed_checkpoint_recipe.rst``): an ``AppState`` that is ``Stateful`` and
returns ``{"model": ..., "optim": ...}`` from ``get_state_dict(model, optimizer)``, saved with
``dcp.save({"app": AppState(model, optimizer)}, checkpoint_id="checkpoint")`` (so its planner
keys are ``app.model.*`` and ``app.optim.*``) and loaded back with ``dcp.load`` when the folder
exists. The recipe's ToyModel (``net1``, ``relu``, ``net2``) is sharded with FSDP2's
``fully_shard``. Gloo on CPU; digits from ``$KUBETRAIN_DATA_DIR``.

    torchrun --nnodes 2 --nproc-per-node 1 dcp_recipe.py [--epochs N]

At the end every rank scores the sharded model on the test split; rank 0 writes
``script_accuracy.json``.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from netdef import build_toy
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

CHECKPOINT_DIR = "checkpoint"


class AppState(Stateful):
    """The application state DCP saves and loads: ``state_dict``/``load_state_dict`` are
    called by ``dcp.save``/``dcp.load``, and ``get_state_dict`` handles FSDP's names."""

    def __init__(self, model, optimizer=None):
        self.model = model
        self.optimizer = optimizer

    def state_dict(self):
        model_state_dict, optimizer_state_dict = get_state_dict(self.model, self.optimizer)
        return {"model": model_state_dict, "optim": optimizer_state_dict}

    def load_state_dict(self, state_dict):
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )


def read_split(split):
    tensors = load_file(os.path.join(os.environ["KUBETRAIN_DATA_DIR"], f"{split}.safetensors"))
    return tensors["x"], tensors["y"]


def main(epochs):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x, y = read_split("train")
    torch.manual_seed(0)
    model = fully_shard(build_toy(list(x.shape[1:]), 10))
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    if os.path.exists(os.path.join(CHECKPOINT_DIR, ".metadata")):
        dcp.load({"app": AppState(model, optimizer)}, checkpoint_id=CHECKPOINT_DIR)
        print("resumed from", CHECKPOINT_DIR, flush=True)

    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)

    state_dict = {"app": AppState(model, optimizer)}
    dcp.save(state_dict, checkpoint_id=CHECKPOINT_DIR)

    test_x, test_y = read_split("test")
    with torch.no_grad():
        predicted = model(test_x).argmax(dim=1)
    if rank == 0:
        accuracy = (predicted == test_y).double().mean().item()
        with open("script_accuracy.json", "w") as file:
            json.dump({"accuracy": accuracy}, file)
        print(f"test accuracy {accuracy:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="DCP recipe with FSDP2")
    parser.add_argument("--epochs", type=int, default=6)
    main(parser.parse_args().epochs)
