"""Multi-node DDP with a resumable snapshot, written in the style of pytorch/examples
``distributed/ddp-tutorial-series/multinode.py``: a ``Trainer`` class that reads torchrun's
``LOCAL_RANK``/``RANK``, resumes from ``snapshot.pt`` when it exists, and has rank 0 save
``{"MODEL_STATE": model.module.state_dict(), "EPOCHS_RUN": epoch}`` to ``snapshot.pt`` in its
working folder every ``save_every`` epochs. Gloo on CPU; digits from ``$KUBETRAIN_DATA_DIR``.

    torchrun --nnodes 2 --nproc-per-node 1 ddp_snapshot.py TOTAL_EPOCHS SAVE_EVERY

At the end rank 0 scores the final model on the test split and writes ``script_accuracy.json``.
"""

import argparse
import json
import os

import torch
import torch.nn.functional as F
from netdef import build
from safetensors.torch import load_file
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def ddp_setup():
    init_process_group(backend="gloo")


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location="cpu", weights_only=True)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"] + 1
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch):
        batch_size = len(next(iter(self.train_data))[0])
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            loss = self._run_batch(source, targets)
        print(
            f"[CPU{self.global_rank}] Epoch {epoch} | Batchsize: {batch_size} | "
            f"Steps: {len(self.train_data)} | loss {loss:.4f}",
            flush=True,
        )

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def read_split(split):
    tensors = load_file(os.path.join(os.environ["KUBETRAIN_DATA_DIR"], f"{split}.safetensors"))
    return TensorDataset(tensors["x"], tensors["y"])


def load_train_objs():
    train_set = read_split("train")
    torch.manual_seed(0)
    model = build(list(train_set.tensors[0].shape[1:]), 10)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int):
    return DataLoader(
        dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(dataset)
    )


def score_test_split(model):
    test_set = read_split("test")
    with torch.no_grad():
        predicted = model(test_set.tensors[0]).argmax(dim=1)
    return (predicted == test_set.tensors[1]).double().mean().item()


def main(save_every, total_epochs, batch_size, snapshot_path="snapshot.pt"):
    ddp_setup()
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs)
    if trainer.global_rank == 0:
        accuracy = score_test_split(trainer.model.module.eval())
        with open("script_accuracy.json", "w") as file:
            json.dump({"accuracy": accuracy}, file)
        print(f"test accuracy {accuracy:.4f}", flush=True)
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size per rank")
    args = parser.parse_args()
    main(args.save_every, args.total_epochs, args.batch_size)
