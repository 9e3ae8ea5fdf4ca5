"""A user's Ray Train script written the way seed 004's is (its "Ray Train训练脚本" section:
``TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=...), run_config=
RunConfig(name=..., storage_path=..., checkpoint_config=CheckpointConfig(num_to_keep=...,
checkpoint_score_attribute="loss", ...)))``, ``train.torch.prepare_model``,
``train.torch.prepare_data_loader``, ``train.report``), small: the seeds' MLP on the prepared
digits dataset (``KUBETRAIN_DATA_DIR``), a few epochs. Each epoch rank 0 reports a checkpoint
holding ``model.pt`` (the model's state dict); the run's storage path is
``KUBETRAIN_CHECKPOINT_DIR``, absolute, so Ray writes ``<it>/digits/checkpoint_<time>/`` and its
record there, where collect reads them (a relative one would land in Ray's session folder).
The model factory beside it (``netdef:build``) rebuilds the model for collect and evaluate.

Other tests copy it with ``write_program`` (the script and its factory into a folder) or read
``TRAIN``/``NETDEF``."""

from __future__ import annotations

from pathlib import Path

from tests.support.seed_script import NETDEF

#: The run's name under the storage path (RunConfig(name=...)): collect reads
#: ``KUBETRAIN_CHECKPOINT_DIR``, whose ``RUN_NAME/`` holds the checkpoints and Ray's record.
RUN_NAME = "digits"
EPOCHS = 3
KEEP = 2

#: {num_workers}: ScalingConfig's workers (nodes x processes per node of the job).
TRAIN = """
import os
import tempfile

import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader, TensorDataset

from ray import train
from ray.train import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from netdef import build

EPOCHS = {epochs}


def train_func(config):
    torch.manual_seed(0)
    tensors = load_file(os.path.join(config["data_dir"], "train.safetensors"))
    dataset = TensorDataset(tensors["x"], tensors["y"])
    loader = train.torch.prepare_data_loader(DataLoader(dataset, batch_size=32, shuffle=True))
    model = train.torch.prepare_model(build(list(tensors["x"].shape[1:]), 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    loss_fn = torch.nn.CrossEntropyLoss()
    rank = train.get_context().get_world_rank()
    for epoch in range(1, EPOCHS + 1):
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if rank == 0:
                state = getattr(model, "module", model).state_dict()
                torch.save(state, os.path.join(folder, "model.pt"))
                checkpoint = Checkpoint.from_directory(folder)
                print(f"epoch {{epoch}} loss {{loss.item():.4f}}", flush=True)
            train.report({{"loss": loss.item(), "epoch": epoch}}, checkpoint=checkpoint)


trainer = TorchTrainer(
    train_func,
    train_loop_config={{"data_dir": os.environ["KUBETRAIN_DATA_DIR"], "lr": 0.003}},
    scaling_config=ScalingConfig(num_workers={num_workers}, use_gpu=False),
    run_config=RunConfig(
        name="{run_name}",
        storage_path=os.environ["KUBETRAIN_CHECKPOINT_DIR"],
        checkpoint_config=CheckpointConfig(
            num_to_keep={keep},
            checkpoint_score_attribute="epoch",
            checkpoint_score_order="max",
        ),
    ),
)
result = trainer.fit()
print(f"trained: {{result.checkpoint.path}}", flush=True)
"""


def program_text(num_workers: int) -> str:
    return TRAIN.format(epochs=EPOCHS, num_workers=num_workers, run_name=RUN_NAME, keep=KEEP)


def write_program(folder: Path, num_workers: int) -> Path:
    """``folder`` holding ``train.py`` and its model factory ``netdef.py``; the script's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "netdef.py").write_text(NETDEF.lstrip())
    program = folder / "train.py"
    program.write_text(program_text(num_workers).lstrip())
    return program
