"""DDP training that saves the way Hugging Face's ``Trainer`` lays out its output folder
(huggingface/transformers ``src/transformers/trainer.py``, ``_save_checkpoint``): after each
epoch rank 0 writes ``checkpoint-<global step>/`` holding the model as a sharded
``save_pretrained`` folder (``model.safetensors.index.json`` + ``model-0000i-of-0000n
.safetensors``, written by huggingface_hub's ``save_torch_state_dict`` with a small
``max_shard_size``: the sharding transformers' ``save_pretrained`` uses, see
huggingface/huggingface_hub ``src/huggingface_hub/serialization/_torch.py``) beside the
Trainer's ``optimizer.pt`` and ``trainer_state.json``; at the end the final model is saved the
same way into the output folder itself (``Trainer.save_model``). Gloo on CPU; digits from
``$KUBETRAIN_DATA_DIR``.

    torchrun --nnodes 2 --nproc-per-node 1 hf_sharded.py [--epochs N]

At the end rank 0 scores the final model on the test split and writes ``script_accuracy.json``.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from huggingface_hub import save_torch_state_dict
from netdef import build
from safetensors.torch import load_file
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

#: Small enough that the 64x64 perceptron is saved in two shards.
MAX_SHARD_SIZE = "10KB"


def save_model(model, folder):
    os.makedirs(folder, exist_ok=True)
    save_torch_state_dict(model.state_dict(), folder, max_shard_size=MAX_SHARD_SIZE)


def save_checkpoint(model, optimizer, output_dir, epoch, global_step):
    folder = os.path.join(output_dir, f"checkpoint-{global_step}")
    save_model(model, folder)
    torch.save(optimizer.state_dict(), os.path.join(folder, "optimizer.pt"))
    with open(os.path.join(folder, "trainer_state.json"), "w") as file:
        json.dump({"epoch": float(epoch), "global_step": global_step}, file)


def read_split(split):
    tensors = load_file(os.path.join(os.environ["KUBETRAIN_DATA_DIR"], f"{split}.safetensors"))
    return tensors["x"], tensors["y"]


def main(args):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x, y = read_split("train")
    torch.manual_seed(0)
    model = DistributedDataParallel(build(list(x.shape[1:]), 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    global_step = 0
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), targets)
            loss.backward()
            optimizer.step()
            global_step += 1
        if rank == 0:
            print(f"{{'loss': {loss.item():.4f}, 'epoch': {epoch}}}", flush=True)
            save_checkpoint(model.module, optimizer, args.output_dir, epoch, global_step)
    if rank == 0:
        save_model(model.module, args.output_dir)
        test_x, test_y = read_split("test")
        with torch.no_grad():
            predicted = model.module(test_x).argmax(dim=1)
        accuracy = (predicted == test_y).double().mean().item()
        with open("script_accuracy.json", "w") as file:
            json.dump({"accuracy": accuracy}, file)
        print(f"test accuracy {accuracy:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="DDP with HF-style sharded checkpoints")
    parser.add_argument("--output-dir", default=".")
    parser.add_argument("--epochs", type=int, default=6)
    main(parser.parse_args())
