"""Multi-node DDP with Lightning, written in the style of Lightning's own examples
(Lightning-AI/pytorch-lightning ``examples/pytorch/basics/backbone_image_classifier.py``: a
``LightningModule`` holding the network as an attribute, ``Trainer(...).fit``), run by torchrun
with ``Trainer(accelerator="cpu", strategy="ddp", num_nodes=N, devices=M)``. Its default
``ModelCheckpoint`` (``src/lightning/pytorch/callbacks/model_checkpoint.py``) writes
``lightning_logs/version_N/checkpoints/epoch=E-step=S.ckpt`` in the working folder: a
``torch.save``d dict whose ``state_dict`` holds the module's weights as ``model.*`` beside
``epoch``, ``global_step``, ``optimizer_states``, ``loops``, ``callbacks`` and
``hyper_parameters`` (``trainer/connectors/checkpoint_connector.py``, ``dump_checkpoint``).
Digits from ``$KUBETRAIN_DATA_DIR``; Lightning adds the DistributedSampler itself.

    torchrun --nnodes 2 --nproc-per-node 1 lightning_ddp.py --num-nodes 2 [--devices 1]

At the end global rank 0 scores the final model on the test split and writes
``script_accuracy.json``.
"""

import argparse
import json
import os

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from netdef import build
from safetensors.torch import load_file
from torch.utils.data import DataLoader, TensorDataset


class DigitsClassifier(L.LightningModule):
    def __init__(self, sample_shape, num_classes, lr=3e-3):
        super().__init__()
        self.save_hyperparameters()
        self.model = build(sample_shape, num_classes)

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def read_split(split):
    tensors = load_file(os.path.join(os.environ["KUBETRAIN_DATA_DIR"], f"{split}.safetensors"))
    return tensors["x"], tensors["y"]


def main(args):
    x, y = read_split("train")
    L.seed_everything(0)
    classifier = DigitsClassifier(list(x.shape[1:]), 10)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    trainer = L.Trainer(
        accelerator="cpu",
        strategy="ddp",
        num_nodes=args.num_nodes,
        devices=args.devices,
        max_epochs=args.epochs,
        callbacks=[ModelCheckpoint()],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(classifier, loader)
    if trainer.is_global_zero:
        test_x, test_y = read_split("test")
        classifier.eval()
        with torch.no_grad():
            predicted = classifier.model(test_x).argmax(dim=1)
        accuracy = (predicted == test_y).double().mean().item()
        with open("script_accuracy.json", "w") as file:
            json.dump({"accuracy": accuracy}, file)
        print(f"test accuracy {accuracy:.4f}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="digits with Lightning DDP")
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=6)
    main(parser.parse_args())
