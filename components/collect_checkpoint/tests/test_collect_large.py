"""A 1 GiB DDP checkpoint is collected with bounded memory: rank 0's model file is streamed
(sha256 checked on the way), never loaded, and the step does not even import torch."""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
from pathlib import Path

import pytest

from kubetrain.checkpoint_manifest import FORMAT, LATEST, MANIFEST, checkpoint_name
from kubetrain.integrity import sha256_file
from kubetrain.model_artifact import read_model_card
from kubetrain.testing.peak_memory import run_measuring_peak_memory

GIB = 1024**3
MIB = 1024**2


def write_sparse_safetensors(path: Path, tensor_bytes: int) -> None:
    """One float32 tensor of ``tensor_bytes`` bytes: zeros (a sparse file, created at once) with
    a random MiB every 64 MiB, so the data is not all alike."""
    entry = {"dtype": "F32", "shape": [tensor_bytes // 4], "data_offsets": [0, tensor_bytes]}
    header = json.dumps({"weight": entry}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(header)) + header)
        start = out.tell()
        out.truncate(start + tensor_bytes)
        for offset in range(0, tensor_bytes, 64 * MIB):
            out.seek(start + offset)
            out.write(os.urandom(MIB))


def write_ddp_checkpoint(checkpoint_dir: Path, tensor_bytes: int) -> Path:
    folder = checkpoint_dir / checkpoint_name(1)
    folder.mkdir(parents=True)
    write_sparse_safetensors(folder / "model.safetensors", tensor_bytes)
    (folder / "optimizer.pt").write_bytes(b"not read by collect")
    manifest = {
        "format": FORMAT, "epoch": 1, "step": 1, "world_size": 1, "strategy": "ddp",
        "model": {"spec": "mlp", "sample_shape": [1, 8, 8], "num_classes": 10}, "metrics": [],
        "files": {name: sha256_file(folder / name)
                  for name in ("model.safetensors", "optimizer.pt")},
    }  # fmt: skip
    (folder / MANIFEST).write_text(json.dumps(manifest))
    (checkpoint_dir / LATEST).write_text(folder.name + "\n")
    return folder


def test_one_gib_checkpoint_collects_with_peak_memory_under_256_mib(tmp_path):
    if shutil.disk_usage(tmp_path).free < 3 * GIB:
        pytest.skip("needs 3 GiB free")
    source = write_ddp_checkpoint(tmp_path / "ckpt", GIB)
    run = run_measuring_peak_memory(
        [sys.executable, "-m", "kubetrain", "collect", "--checkpoint-dir", str(tmp_path / "ckpt"),
         "--output", str(tmp_path / "model")]
    )  # fmt: skip
    try:
        assert run.returncode == 0, run.stderr
        print(f"\n1 GiB collect: peak RSS {run.peak_mib:.0f} MiB")
        assert run.peak_mib < 256, f"peak RSS {run.peak_mib:.0f} MiB"
        card = read_model_card(str(tmp_path / "model"))  # checks the sha256 again
        manifest = json.loads((source / MANIFEST).read_text())
        assert card["sha256"] == manifest["files"]["model.safetensors"]
        assert (tmp_path / "model" / "model.safetensors").stat().st_size > GIB
    finally:
        shutil.rmtree(tmp_path / "ckpt", ignore_errors=True)
        shutil.rmtree(tmp_path / "model", ignore_errors=True)
