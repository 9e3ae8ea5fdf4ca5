"""Collect publishes the newest complete rank-0 checkpoint as one verified safetensors file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors import safe_open

from kubetrain.components.collect_checkpoint.collect import collect_checkpoint
from kubetrain.errors import IntegrityError, InvalidInput
from kubetrain.integrity import sha256_file
from kubetrain.model_artifact import read_model_card


def shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(model_dir / "model.safetensors"), "pt") as handle:
        return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}


def test_ddp_checkpoint_is_published_with_its_card(trained_checkpoints, tmp_path):
    collected = collect_checkpoint(str(trained_checkpoints["ddp"]), str(tmp_path / "model"))
    card = read_model_card(str(tmp_path / "model"))
    assert collected.sha256 == sha256_file(tmp_path / "model" / "model.safetensors")
    assert (card["strategy"], card["epoch"], card["world_size"]) == ("ddp", 2, 1)
    assert card["model"]["spec"] == "mlp" and len(card["metrics"]) == 2
    # rank 0's model file is published as it was written: streamed, not re-serialised
    source = (
        trained_checkpoints["ddp"] / (trained_checkpoints["ddp"] / "LATEST").read_text().strip()
    )
    assert collected.sha256 == sha256_file(source / "model.safetensors")
    assert [p.name for p in tmp_path.iterdir()] == ["model"], "no staging folder is left behind"


def test_fsdp_checkpoint_collects_to_the_same_keys_and_shapes_as_ddp(trained_checkpoints, tmp_path):
    collect_checkpoint(str(trained_checkpoints["ddp"]), str(tmp_path / "ddp"))
    collected = collect_checkpoint(str(trained_checkpoints["fsdp"]), str(tmp_path / "fsdp"))
    assert collected.card["strategy"] == "fsdp" and collected.card["world_size"] == 2
    assert shapes(tmp_path / "fsdp") == shapes(tmp_path / "ddp")


def test_a_flipped_byte_fails_naming_the_file_and_publishes_nothing(trained_checkpoints, tmp_path):
    broken = tmp_path / "ckpt"
    shutil.copytree(trained_checkpoints["ddp"], broken)
    latest = broken / (broken / "LATEST").read_text().strip()
    target = latest / "model.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(
        IntegrityError, match=r"model\.safetensors has sha256 \w+, expected \w+; it is corrupt"
    ):
        collect_checkpoint(str(broken), str(tmp_path / "model"))
    assert not (tmp_path / "model").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_missing_or_empty_checkpoint_folders_fail_clearly(tmp_path):
    with pytest.raises(IntegrityError, match="does not exist"):
        collect_checkpoint(str(tmp_path / "nowhere"), str(tmp_path / "model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(IntegrityError, match="no complete checkpoint"):
        collect_checkpoint(str(tmp_path / "empty"), str(tmp_path / "model"))
    with pytest.raises(InvalidInput, match="checkpoint_dir"):
        collect_checkpoint("", str(tmp_path / "model"))
    assert not (tmp_path / "model").exists()


def test_collect_cli(trained_checkpoints, tmp_path, run_python):
    result = run_python(
        [
            "-m",
            "kubetrain",
            "collect",
            "--checkpoint-dir",
            str(trained_checkpoints["ddp"]),
            "--output",
            str(tmp_path / "m"),
        ]
    )
    assert result.returncode == 0, result.stderr
    assert "collected epoch 2 step" in result.stdout
    assert (tmp_path / "m" / "model.safetensors").is_file()


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_export_is_published_with_the_model_and_verifies(trained_checkpoints, tmp_path, strategy):
    from kubetrain.export import verify_export

    collect_checkpoint(str(trained_checkpoints[strategy]), str(tmp_path / "model"), "torch-export")
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [
        "export.json", "model.json", "model.pt2", "model.safetensors"
    ]  # fmt: skip
    assert verify_export(str(tmp_path / "model")) == tmp_path / "model" / "model.pt2"
    with pytest.raises(InvalidInput, match="export"):
        collect_checkpoint(str(trained_checkpoints[strategy]), str(tmp_path / "m2"), "onnx")
