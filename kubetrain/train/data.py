"""Training data held as in-memory tensors and served a whole batch at a time.

Indexing one sample at a time and collating costs more than the small models we train, so
each batch is one tensor gather by a list of the sampler's indices.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler

from kubetrain.artifacts import datasets
from kubetrain.callables import import_callable
from kubetrain.errors import InvalidInput

DATASET_FIX = "use prepared or a package.module:callable returning (x, y) tensors"


@dataclass(frozen=True)
class TrainData:
    """The train split and the one each epoch is scored on: ``validation`` when the dataset
    has it (the test split is then left to evaluate, which reads it once), else ``test``."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    eval_x: torch.Tensor
    eval_y: torch.Tensor
    num_classes: int
    eval_split: str = "test"

    @property
    def sample_shape(self) -> list[int]:
        return list(self.train_x.shape[1:])


def _checked(x: object, y: object, source: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Coerce a custom dataset's split to float32 x / int64 y, refusing shapes we cannot train."""
    try:
        xt = torch.as_tensor(x, dtype=torch.float32)
        yt = torch.as_tensor(y).long()
    except (TypeError, ValueError, RuntimeError) as exc:
        raise InvalidInput(
            "--dataset", f"{source} {split}: not tensors ({exc})", DATASET_FIX
        ) from exc
    if yt.dim() != 1 or xt.dim() < 2 or len(xt) != len(yt) or len(yt) == 0:
        raise InvalidInput(
            "--dataset",
            f"{source} {split}: need x [N, ...] and y [N] with N > 0, got x {list(xt.shape)} "
            f"and y {list(yt.shape)}",
            DATASET_FIX,
        )
    return xt, yt


def load_data(dataset: str, data_dir: str | None) -> TrainData:
    """Read the train split and the split epochs are scored on, from a prepared folder (its
    ``validation`` split when it has one: datasets prepared before it existed have none) or
    a user's callable (called for "train" and "test": it has no validation split)."""
    if dataset == "prepared":
        assert data_dir is not None, "options validation requires --data for prepared"
        manifest = datasets.read_manifest(data_dir)
        eval_split = datasets.VALIDATION if datasets.VALIDATION in manifest["splits"] else "test"
        train_x, train_y = datasets.load_split(data_dir, "train")
        eval_x, eval_y = datasets.load_split(data_dir, eval_split)
        num_classes = int(manifest["num_classes"])
        if len(train_y) == 0 or len(eval_y) == 0:
            raise InvalidInput(
                "--data",
                f"{data_dir} has {len(train_y)} train and {len(eval_y)} {eval_split} samples",
                "prepare a dataset with samples in both splits",
            )
    else:
        eval_split = "test"
        loader = import_callable(dataset, "--dataset", DATASET_FIX)
        train_x, train_y = _checked(*loader(data_dir, "train"), dataset, "train")
        eval_x, eval_y = _checked(*loader(data_dir, "test"), dataset, "test")
        num_classes = int(max(train_y.max(), eval_y.max())) + 1
    if list(train_x.shape[1:]) != list(eval_x.shape[1:]):
        raise InvalidInput(
            "--dataset",
            f"train samples are {list(train_x.shape[1:])} but {eval_split} samples "
            f"{list(eval_x.shape[1:])}",
            "give both splits the same sample shape",
        )
    low = int(min(train_y.min(), eval_y.min()))
    high = int(max(train_y.max(), eval_y.max()))
    if low < 0 or high >= num_classes:
        raise InvalidInput(
            "--dataset",
            f"labels span {low}..{high}, outside 0..{num_classes - 1}",
            "return class indices from 0 to the number of classes - 1 as y",
        )
    return TrainData(train_x, train_y, eval_x, eval_y, num_classes, eval_split)


class BatchDataset(Dataset):
    """In-memory (x, y) whose items are whole batches: ``dataset[list_of_indices]``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        return self.x[index], self.y[index]


class TensorBatches:
    """This rank's shuffled batches of (x, y) held where the model computes.

    The epoch's indices are moved to x's device once, and each batch is one gather there:
    on a GPU no step waits on a host-to-device copy (PyTorch synchronises the stream after
    each one from pageable memory), and on CPU no DataLoader machinery runs per step.
    """

    def __init__(
        self, x: torch.Tensor, y: torch.Tensor, sampler: DistributedSampler, batch_size: int
    ) -> None:
        self.x, self.y, self.sampler, self.batch_size = x, y, sampler, batch_size

    def __len__(self) -> int:
        return math.ceil(len(self.sampler) / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = torch.tensor(list(self.sampler), dtype=torch.long, device=self.x.device)
        for start in range(0, len(order), self.batch_size):
            index = order[start : start + self.batch_size]
            yield self.x[index], self.y[index]


def on_device_if_it_fits(
    x: torch.Tensor, y: torch.Tensor, device: torch.device, share: float = 0.25
) -> tuple[torch.Tensor, torch.Tensor]:
    """Move the train split to the GPU when it takes under ``share`` of the free memory.

    Each batch is then one gather on the device: no host-side gather, pinning or copy per
    step, which is what keeps a GPU busy on small images. Otherwise (and on CPU) x, y stay.
    """
    if device.type != "cuda":
        return x, y
    free_bytes, _ = torch.cuda.mem_get_info(device)
    if x.nbytes + y.nbytes > free_bytes * share:
        return x, y
    return x.to(device), y.to(device)


def train_loader(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    device: torch.device,
) -> tuple[Iterable[tuple[torch.Tensor, torch.Tensor]], DistributedSampler]:
    """This rank's shuffled shard, batched; call ``sampler.set_epoch`` before each epoch.

    DistributedSampler pads the shards to equal length, so every rank runs the same number
    of steps, which DDP and FSDP collectives require. Data already where the model computes
    is served by ``TensorBatches``; host data for a GPU goes through a DataLoader that pins
    each batch, so that its copy to the device does not block.
    """
    dataset = BatchDataset(x, y)
    sampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed
    )
    if x.device == device:  # on CPU always; on a GPU when on_device_if_it_fits moved it
        return TensorBatches(x, y, sampler, batch_size), sampler
    batches = BatchSampler(sampler, batch_size=batch_size, drop_last=False)
    loader = DataLoader(dataset, sampler=batches, batch_size=None, pin_memory=True)
    return loader, sampler


def eval_batches(
    x: torch.Tensor, y: torch.Tensor, *, batch_size: int, rank: int, world_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """This rank's slice of the split an epoch is scored on, as ``(x, y, weight)`` batches.

    Slices differ in length by at most one; the shorter ones are padded with weight-0 samples
    so that every rank runs the same number of forwards (FSDP all-gathers in each one) and
    the summed metrics count each sample exactly once.
    """
    total = len(y)
    per_rank = math.ceil(total / world_size)
    start = min(rank * per_rank, total)
    stop = min(start + per_rank, total)
    index = torch.arange(start, stop)
    weight = torch.ones(per_rank)
    if len(index) < per_rank:
        weight[len(index) :] = 0
        index = torch.cat([index, torch.zeros(per_rank - len(index), dtype=torch.long)])
    for begin in range(0, per_rank, batch_size):
        chunk = index[begin : begin + batch_size]
        yield x[chunk], y[chunk], weight[begin : begin + batch_size]
