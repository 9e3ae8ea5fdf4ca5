"""Collect publishes the newest complete rank-0 checkpoint as one verified safetensors file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors import safe_open

from kubetrain.artifacts.checkpoint_manifest import read_manifest
from kubetrain.artifacts.model_card import read_model_card
from kubetrain.components.collect_checkpoint.collect import collect_checkpoint
from kubetrain.errors import IntegrityError, InvalidInput
from kubetrain.storage.integrity import sha256_file


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
    # what the trainer recorded for the report travels into the card (issue 18)
    manifest = read_manifest(source)
    for key in ("history", "hyperparameters", "run"):
        assert card[key] == manifest[key], key
    assert card["hyperparameters"]["world_size"] == 1 and card["run"]["job"] == "ddp"
    assert [entry["step"] for entry in card["history"]] == list(range(1, card["step"] + 1))


def test_fsdp_checkpoint_collects_to_the_same_keys_and_shapes_as_ddp(trained_checkpoints, tmp_path):
    collect_checkpoint(str(trained_checkpoints["ddp"]), str(tmp_path / "ddp"))
    collected = collect_checkpoint(str(trained_checkpoints["fsdp"]), str(tmp_path / "fsdp"))
    assert collected.card["strategy"] == "fsdp" and collected.card["world_size"] == 2
    assert shapes(tmp_path / "fsdp") == shapes(tmp_path / "ddp")
    trained = collected.card["hyperparameters"]  # torchrun's LOCAL_WORLD_SIZE: 2 on 1 node
    assert (trained["nodes"], trained["procs_per_node"], trained["world_size"]) == (1, 2, 2)


@pytest.mark.fault
def test_a_flipped_byte_fails_naming_the_file_and_publishes_nothing(
    trained_checkpoints, tmp_path, injected
):
    broken = tmp_path / "ckpt"
    shutil.copytree(trained_checkpoints["ddp"], broken)
    latest = broken / (broken / "LATEST").read_text().strip()
    target = latest / "model.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    assert (
        target.read_bytes() != (trained_checkpoints["ddp"] / latest.name / target.name).read_bytes()
    )
    injected.struck("one byte of the stored model file flipped")
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
    with pytest.raises(IntegrityError, match=r"empty holds no checkpoint \(looked for our"):
        collect_checkpoint(str(tmp_path / "empty"), str(tmp_path / "model"))
    (tmp_path / "crashed" / "epoch-000001").mkdir(parents=True)  # our layout, never completed
    with pytest.raises(IntegrityError, match="no complete checkpoint"):
        collect_checkpoint(str(tmp_path / "crashed"), str(tmp_path / "model"))
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
    from kubetrain.artifacts.export import verify_export

    collect_checkpoint(str(trained_checkpoints[strategy]), str(tmp_path / "model"), "torch-export")
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [
        "export.json", "model.json", "model.pt2", "model.safetensors"
    ]  # fmt: skip
    assert verify_export(str(tmp_path / "model")) == tmp_path / "model" / "model.pt2"
    with pytest.raises(InvalidInput, match="export"):
        collect_checkpoint(str(trained_checkpoints[strategy]), str(tmp_path / "m2"), "onnx")


def test_safetensors_header_check_agrees_with_safetensors(tmp_path):
    """The numpy-free header check collect uses lists what safetensors lists, and refuses what
    is not a safetensors file (the sha256 alone proves only that it is what the trainer wrote)."""
    import json
    import struct

    import numpy as np
    from safetensors.numpy import save_file

    from kubetrain.artifacts.safetensors_header import tensor_names as safetensors_tensor_names

    good = tmp_path / "good.safetensors"
    tensors = {"b": np.zeros((2, 3), np.float32), "a": np.ones(5, np.int64), "e": np.zeros(0)}
    save_file(tensors, str(good), metadata={"note": "kept"})
    with safe_open(str(good), "np") as handle:
        assert sorted(safetensors_tensor_names(good)) == sorted(handle.keys())

    def header_file(name: str, header: object, data: bytes = b"") -> Path:
        text = json.dumps(header).encode()
        path = tmp_path / name
        path.write_bytes(struct.pack("<Q", len(text)) + text + data)
        return path

    entry = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    bad = [
        tmp_path / "short",
        header_file("not-an-object", [entry], b"\0" * 8),
        header_file("no-offsets", {"w": {"dtype": "F32", "shape": [2]}}, b"\0" * 8),
        header_file("gap", {"w": {**entry, "data_offsets": [4, 12]}}, b"\0" * 12),
        header_file("overlap", {"w": entry, "v": {**entry, "data_offsets": [4, 12]}}, b"\0" * 12),
        header_file("data-missing", {"w": entry}, b"\0" * 4),
        header_file("data-trailing", {"w": entry}, b"\0" * 9),
    ]
    (tmp_path / "short").write_bytes(b"\1\0")
    (tmp_path / "huge-length").write_bytes(struct.pack("<Q", 2**40) + b"{}")
    bad.append(tmp_path / "huge-length")
    (tmp_path / "not-json").write_bytes(struct.pack("<Q", 4) + b"{no}")
    bad.append(tmp_path / "not-json")
    for path in bad:
        with pytest.raises(ValueError):
            safetensors_tensor_names(path)
        with pytest.raises(Exception), safe_open(str(path), "np") as handle:  # noqa: B017
            handle.keys()  # safetensors refuses each of them too
    assert safetensors_tensor_names(header_file("empty", {"__metadata__": {}})) == []


@pytest.mark.parametrize("named", ["model.safetensors", ""], ids=["its-file", "the-folder"])
def test_a_file_of_our_checkpoint_named_with_checkpoint_file_is_verified_too(
    trained_checkpoints, tmp_path, named
):
    """Issue 28: `--checkpoint-file <epoch>/model.safetensors` used to read the file as a
    foreign checkpoint and publish a flipped byte that plain collect refuses; a file of our
    layout takes its folder whole, every file checked against the manifest."""
    broken = tmp_path / "ckpt"
    shutil.copytree(trained_checkpoints["ddp"], broken)
    epoch = (broken / "LATEST").read_text().strip()
    target = broken / epoch / "model.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"model\.safetensors has sha256 \w+, expected"):
        collect_checkpoint(str(broken), str(tmp_path / "model"), checkpoint_file=f"{epoch}/{named}")
    assert not (tmp_path / "model").exists()


@pytest.mark.bad_input
def test_a_promoted_registry_version_is_never_a_collect_output(trained_checkpoints, tmp_path):
    """Issue 28: `collect --output <registry>/<version>` used to replace a promoted version
    (its card is a model's, like any collect output)."""
    from kubetrain.components.promote_model.promote import promote_model

    collect_checkpoint(str(trained_checkpoints["ddp"]), str(tmp_path / "model"))
    registry = tmp_path / "registry"
    promote_model(str(tmp_path / "model"), str(registry), "v1")
    before = {p: p.read_bytes() for p in sorted(registry.rglob("*")) if p.is_file()}
    with pytest.raises(InvalidInput, match=r"is the version v1 of the model registry .* changed"):
        collect_checkpoint(str(trained_checkpoints["ddp"]), str(registry / "v1"))
    with pytest.raises(InvalidInput, match=r"is the version v2 of the model registry"):
        collect_checkpoint(str(trained_checkpoints["ddp"]), str(registry / "v2"))  # a new one too
    assert {p: p.read_bytes() for p in sorted(registry.rglob("*")) if p.is_file()} == before
