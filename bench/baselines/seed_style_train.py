"""B3 baseline: training written the way the seeds' reference loop is, run under torchrun.

A map-style Dataset that converts and normalises one sample at a time in ``__getitem__``, the
default DataLoader (collating sample by sample) over a DistributedSampler, and the same model
(``kubetrain.artifacts.models.build_model``), optimizer (AdamW), gradient clipping, data, batch
size and epochs as ``python -m kubetrain.train``. Rank 0 prints one ``epoch N samples/s X``
line per epoch, timed over the training loop only, with samples summed over all ranks, as ours does.

The GPU mode (``--device cuda``) keeps that data path, moves each collated batch to the GPU,
and gets what ours gets there: bf16 autocast, DDP over NCCL, or FSDP2 on each
parameter-owning child and the root (``--strategy fsdp``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.numpy import load_file
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from kubetrain.artifacts.models import build_model


class PerSampleDataset(Dataset):
    """Samples kept as a NumPy array; each item is converted and normalised on its own."""

    def __init__(self, data_dir: Path, split: str) -> None:
        arrays = load_file(str(data_dir / f"{split}.safetensors"))
        self.x = arrays["x"]
        self.y = arrays["y"]
        self.mean = torch.tensor(float(self.x.mean()))
        self.std = torch.tensor(float(self.x.std()) + 1e-8)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        sample = torch.tensor(self.x[index], dtype=torch.float32)
        return (sample - self.mean) / self.std, int(self.y[index])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--strategy", default="ddp", choices=("ddp", "fsdp"))
    args = parser.parse_args()
    train(args)
    # After train() has freed DDP: a reducer that outlives destroy_process_group holds the
    # group's last reference, and its destructor at exit joins gloo's thread while holding
    # the GIL that thread waits for (a deadlock in 2 of 23 runs).
    dist.destroy_process_group()


def train(args: argparse.Namespace) -> None:
    cuda = args.device == "cuda"
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    num_classes = int(json.loads((args.data / "manifest.json").read_text())["num_classes"])
    dataset = PerSampleDataset(args.data, "train")
    sample_shape = list(np.shape(dataset.x)[1:])
    torch.manual_seed(args.seed)
    model = build_model(args.model, sample_shape, num_classes).to(device)
    if args.strategy == "fsdp":
        for child in model.children():
            if any(True for _ in child.parameters()):
                fully_shard(child)
        fully_shard(model)
    else:
        model = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        model.train()
        seen = 0
        started = time.perf_counter()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            seen += len(y)
        if cuda:
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - started
        total = torch.tensor(float(seen), device=device)
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}/{args.epochs} samples/s {total.item() / seconds:.1f}", flush=True)


if __name__ == "__main__":
    main()
