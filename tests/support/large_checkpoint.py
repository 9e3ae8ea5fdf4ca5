"""Large DDP checkpoints made in seconds, for the collect step's memory test and benchmark:
one float32 tensor of any size in a valid ``model.safetensors``, with the manifest and
``LATEST`` the trainer would write."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from kubetrain.artifacts.checkpoint_manifest import FORMAT, LATEST, MANIFEST, checkpoint_name
from kubetrain.storage.integrity import sha256_file

MIB = 1024**2


def finite_random(size: int) -> bytes:
    """Random float32 bytes that are all finite numbers (bit 30 cleared: an exponent never all
    ones), as a trained model's are: collect refuses NaN and Inf."""
    import numpy as np

    data = np.frombuffer(os.urandom(size), dtype=np.uint8).copy()
    data[3::4] &= 0xBF
    return data.tobytes()


def write_safetensors(path: Path, tensor_bytes: int, *, sparse: bool) -> None:
    """``sparse``: zeros (a sparse file, created at once) with a random MiB every 64 MiB;
    otherwise written in full (no holes for ``cp`` to skip), a random 16 MiB block repeated
    (random finite numbers)."""
    entry = {"dtype": "F32", "shape": [tensor_bytes // 4], "data_offsets": [0, tensor_bytes]}
    header = json.dumps({"weight": entry}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(header)) + header)
        start = out.tell()
        if sparse:
            out.truncate(start + tensor_bytes)
            for offset in range(0, tensor_bytes, 64 * MIB):
                out.seek(start + offset)
                out.write(finite_random(MIB))
            return
        block = finite_random(16 * MIB)
        for offset in range(0, tensor_bytes, len(block)):
            out.write(block[: tensor_bytes - offset])


def write_ddp_checkpoint(checkpoint_dir: Path, tensor_bytes: int, *, sparse: bool) -> Path:
    """A complete one-epoch DDP checkpoint (model, optimizer stub, manifest, LATEST); returns
    its folder."""
    folder = checkpoint_dir / checkpoint_name(1)
    folder.mkdir(parents=True)
    write_safetensors(folder / "model.safetensors", tensor_bytes, sparse=sparse)
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
