"""A training script written the way the seed documents' DDP examples are (gloo,
``init_process_group``, ``DistributedSampler``, DDP, rank 0 saves with ``torch.save`` into its
working directory), and the model factory beside it: the user's own code the tests run."""

from __future__ import annotations

import textwrap
from pathlib import Path

#: ``build(sample_shape, num_classes)``: the factory `--model netdef:build` names.
NETDEF = """
from torch import nn


def build(sample_shape, num_classes):
    features = 1
    for size in sample_shape:
        features *= size
    return nn.Sequential(
        nn.Flatten(), nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, num_classes)
    )
"""

#: {netdef}: the factory's module; {save}: what rank 0 saves after each epoch; {after}: what
#: every rank does after the last epoch.
TRAIN = """
import os

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from {netdef} import build

EPOCHS = 8


def main():
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    tensors = load_file(os.path.join(os.environ["KUBETRAIN_DATA_DIR"], "train.safetensors"))
    dataset = TensorDataset(tensors["x"], tensors["y"])
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    model = DDP(build(list(tensors["x"].shape[1:]), 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(1, EPOCHS + 1):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {{epoch}} loss {{loss.item():.4f}}", flush=True)
            {save}
    {after}
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""

#: The seeds' three ways of saving, as rank 0 runs them after each epoch.
SAVES = {
    "state-dict": 'torch.save(model.module.state_dict(), "model.pt")',
    "per-epoch": 'torch.save(model.module.state_dict(), f"model_epoch_{epoch}.pt")',
    "dict": (
        'torch.save({"epoch": epoch, "model_state_dict": model.module.state_dict(), '
        '"optimizer_state_dict": optimizer.state_dict()}, "checkpoint.pt")'
    ),
}


def write_user_folder(folder: Path, save: str, after: str = "", netdef: str = "netdef") -> Path:
    """``folder`` holding ``train.py`` and ``<netdef>.py``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{netdef}.py").write_text(textwrap.dedent(NETDEF))
    script = textwrap.dedent(TRAIN).format(netdef=netdef, save=save, after=after or "pass")
    (folder / "train.py").write_text(script)
    return folder
