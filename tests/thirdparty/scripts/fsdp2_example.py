"""FSDP2 training with full-state-dict checkpoints, written in the style of pytorch/examples
``distributed/FSDP2/example.py`` and its ``checkpoint.py``: the model is built on the meta
device, each of ``model.layers`` and then the root is wrapped with ``fully_shard``, and a
``Checkpointer`` gathers the full model and optimizer state dicts (``--dcp-api``: with
``get_model_state_dict``/``get_optimizer_state_dict(full_state_dict=True, cpu_offload=True)``;
otherwise each DTensor's ``full_tensor()``) and rank 0 ``torch.save``s them as
``checkpoints/<dcp_api|dtensor_api>/<milliseconds since the epoch>/model_state_dict.pt`` and
``optim_state_dict.pt``. A run resumes from the newest such folder. Here a checkpoint is saved
after every epoch (the example saves once, after its steps). Gloo on CPU; digits from
``$KUBETRAIN_DATA_DIR``.

    torchrun --nnodes 2 --nproc-per-node 1 fsdp2_example.py [--dcp-api] [--epochs N]

At the end every rank scores the sharded model on the test split; rank 0 writes
``script_accuracy.json``.
"""

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from netdef import build_layered
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

MODEL_CHECKPOINT = "model_state_dict.pt"
OPTIM_CHECKPOINT = "optim_state_dict.pt"
FULL_ON_CPU = StateDictOptions(full_state_dict=True, cpu_offload=True)


def newest_checkpoint_folder(path):
    """The highest numeric folder name under ``path`` (a save's time), or None."""
    numbers = [int(name) for name in os.listdir(path) if name.isdigit()]
    return max(numbers) if numbers else None


class Checkpointer:
    def __init__(self, folder, dcp_api):
        self.folder = os.path.join(folder, "dcp_api" if dcp_api else "dtensor_api")
        self.dcp_api = dcp_api
        os.makedirs(self.folder, exist_ok=True)
        self.last_training_time = newest_checkpoint_folder(self.folder)

    def _last(self, name):
        return os.path.join(self.folder, str(self.last_training_time), name)

    def load_model(self, model):
        full_sd = torch.load(self._last(MODEL_CHECKPOINT), mmap=True, weights_only=True)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, full_sd, options=options)

    def load_optim(self, model, optim):
        full_sd = torch.load(self._last(OPTIM_CHECKPOINT), mmap=True, weights_only=True)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_optimizer_state_dict(model, optim, full_sd, options=options)

    def _full_model_state_dict(self, model):
        if self.dcp_api:
            return get_model_state_dict(model, options=FULL_ON_CPU)
        full = {}
        for name, sharded in model.state_dict().items():
            tensor = sharded.full_tensor()  # every rank takes part in the all-gather
            if torch.distributed.get_rank() == 0:
                full[name] = tensor.cpu()
        return full

    def _full_optimizer_state_dict(self, model, optim):
        if self.dcp_api:
            return get_optimizer_state_dict(model, optim, options=FULL_ON_CPU)
        sharded = optim.state_dict()
        state = {}
        for param_id, param_state in sharded["state"].items():
            state[param_id] = {
                key: value.full_tensor() if isinstance(value, DTensor) else value
                for key, value in param_state.items()
            }
        return {"param_groups": sharded["param_groups"], "state": state}

    def save(self, model, optim):
        model_state_dict = self._full_model_state_dict(model)
        optim_state_dict = self._full_optimizer_state_dict(model, optim)
        if torch.distributed.get_rank() == 0:
            folder = os.path.join(self.folder, str(int(time.time() * 1000)))
            os.makedirs(folder, exist_ok=True)
            torch.save(model_state_dict, os.path.join(folder, MODEL_CHECKPOINT))
            torch.save(optim_state_dict, os.path.join(folder, OPTIM_CHECKPOINT))
            print(f"saved {folder}", flush=True)


def read_split(split):
    tensors = load_file(os.path.join(os.environ["KUBETRAIN_DATA_DIR"], f"{split}.safetensors"))
    return tensors["x"], tensors["y"]


def main(args):
    torch.distributed.init_process_group(backend="gloo")
    rank = torch.distributed.get_rank()
    x, y = read_split("train")
    torch.manual_seed(0)
    with torch.device("meta"):
        model = build_layered(list(x.shape[1:]), 10)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)

    checkpointer = Checkpointer("checkpoints", dcp_api=args.dcp_api)
    if checkpointer.last_training_time is None:
        model.to_empty(device="cpu")
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.reset_parameters()
    else:
        checkpointer.load_model(model)
    optim = torch.optim.Adam(model.parameters(), lr=3e-3)
    if checkpointer.last_training_time is not None:
        checkpointer.load_optim(model, optim)

    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            loss = F.cross_entropy(model(inputs), targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optim.step()
            optim.zero_grad()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
        checkpointer.save(model, optim)

    test_x, test_y = read_split("test")
    with torch.no_grad():
        predicted = model(test_x).argmax(dim=1)
    if rank == 0:
        accuracy = (predicted == test_y).double().mean().item()
        with open("script_accuracy.json", "w") as file:
            json.dump({"accuracy": accuracy}, file)
        print(f"test accuracy {accuracy:.4f}", flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="PyTorch FSDP2 example")
    parser.add_argument("--dcp-api", action="store_true", default=False)
    parser.add_argument("--epochs", type=int, default=6)
    main(parser.parse_args())
