"""A 1 GiB DDP checkpoint is collected with bounded memory: rank 0's model file is streamed
(sha256 checked on the way), never loaded, and the step does not even import torch."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from kubetrain.artifacts.checkpoint_manifest import MANIFEST
from kubetrain.artifacts.model_card import read_model_card
from tests.support.large_checkpoint import write_ddp_checkpoint
from tests.support.peak_memory import run_measuring_peak_memory

GIB = 1024**3


def test_one_gib_checkpoint_collects_with_peak_memory_under_256_mib(tmp_path):
    if shutil.disk_usage(tmp_path).free < 3 * GIB:
        pytest.skip("needs 3 GiB free")
    source = write_ddp_checkpoint(tmp_path / "ckpt", GIB, sparse=True)
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
