"""Collect takes what real training scripts write (issue 16, item 3): every format below is
written by real torch code, collected, and the published ``model.safetensors`` compared tensor
by tensor (``torch.equal``) with what was saved.

The last tests run a script written like the seed documents' DDP examples under
``torchrun --nproc-per-node 2`` (gloo): rank 0 saves ``model.module.state_dict()`` per epoch
and as ``model.pt`` into its working directory, every rank a DCP checkpoint; the folder is
collected and the model evaluated through ``--model-factory``.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch import nn

from kubetrain.artifacts.checkpoint import save_checkpoint
from kubetrain.artifacts.model_card import read_model_card
from kubetrain.cli import main as kubetrain_main
from kubetrain.components.collect_checkpoint.collect import collect_checkpoint
from kubetrain.storage.integrity import sha256_file
from tests.support.seed_script import SAVES, write_user_folder

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*single process.*:UserWarning"),
    pytest.mark.usefixtures("no_hang"),
]
#: Seconds a refusal may take before it is taken to hang on a FIFO or /dev/zero.
HANG_SECONDS = 60


def build(sample_shape: list[int], num_classes: int) -> nn.Module:
    """The users' model: a BatchNorm gives it buffers (an int64 scalar among them)."""
    features = 1
    for dim in sample_shape:
        features *= dim
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(features, 32),
        nn.BatchNorm1d(32),
        nn.ReLU(),
        nn.Linear(32, num_classes),
    )


def trained_state(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = build([1, 8, 8], 10)
    model(torch.randn(8, 1, 8, 8))  # moves the running statistics
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


STATE = trained_state()


def assert_published(out: Path, expected: dict[str, torch.Tensor]) -> dict[str, Any]:
    """``out`` holds exactly ``expected`` (names, dtypes, values) and a card that verifies."""
    got = load_file(str(out / "model.safetensors"))
    assert sorted(got) == sorted(expected)
    for key, tensor in expected.items():
        assert got[key].dtype == tensor.dtype and torch.equal(got[key], tensor), key
    return read_model_card(str(out))


def cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    capsys.readouterr()
    code = kubetrain_main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def collect_cli(capsys, ckpt: Path, out: Path, *extra: object) -> tuple[int, str, str]:
    return cli(capsys, "collect", "--checkpoint-dir", ckpt, "--output", out, *extra)


def refused_in_one_line(code: int, err: str, *named: object) -> str:
    """One line ``kubetrain collect: error: PROBLEM; FIX`` naming each of ``named``."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1, err
    line = lines[0]
    assert line.startswith("kubetrain collect: error: ") and "; " in line, line
    assert "Traceback" not in err
    for name in named:
        assert str(name) in line, f"{name} not named: {line}"
    return line


def nothing_published(out: Path) -> None:
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")], "staging left"


# --- writing each format with torch ------------------------------------------------------------


def prefixed(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` of the DDP-wrapped model."""
    return {f"module.{key}": value for key, value in state.items()}


def optimizer_state(state: dict[str, torch.Tensor]) -> dict[str, Any]:
    model = build([1, 8, 8], 10)
    model.load_state_dict(state)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 1, 8, 8)).sum().backward()
    optimizer.step()
    return optimizer.state_dict()


def write_hf_sharded(folder: Path, state: dict[str, torch.Tensor], suffix: str) -> str:
    """save_pretrained's layout: two shards and the index mapping each tensor to its shard."""
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(state)
    halves = {"-00001-of-00002": names[::2], "-00002-of-00002": names[1::2]}
    stem = "model" if suffix == ".safetensors" else "pytorch_model"
    weight_map = {}
    for part, keys in halves.items():
        shard = f"{stem}{part}{suffix}"
        shard_state = {key: state[key].contiguous() for key in keys}
        if suffix == ".safetensors":
            save_file(shard_state, str(folder / shard), metadata={"format": "pt"})
        else:
            torch.save(shard_state, folder / shard)
        weight_map.update(dict.fromkeys(keys, shard))
    index = f"{stem}{suffix}.index.json"
    (folder / index).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


def torch_save(name: str, saved: Callable[[], Any]) -> Callable[[Path], str]:
    def write(folder: Path) -> str:
        torch.save(saved(), folder / name)
        return name

    return write


def write_safetensors(folder: Path) -> str:
    save_file(STATE, str(folder / "model.safetensors"))
    return "model.safetensors"


def write_dcp_with_model_key(folder: Path) -> str:
    dcp.save({"model": STATE, "step": 300}, checkpoint_id=str(folder / "step-300"), no_dist=True)
    return "step-300/.metadata"


def write_dcp_without_model_key(folder: Path) -> str:
    dcp.save(prefixed(STATE), checkpoint_id=str(folder), no_dist=True)
    return ".metadata"


#: id → (writer returning the source file, expected source_format, expected numbers)
FORMATS = {
    "state dict .pt": (torch_save("model.pt", lambda: STATE), "torch-save", {}),
    "DDP prefix .pt": (torch_save("model.pt", lambda: prefixed(STATE)), "torch-save", {}),
    "dict model_state_dict .pth": (
        torch_save(
            "checkpoint.pth",
            lambda: {
                "epoch": 7,
                "model_state_dict": prefixed(STATE),
                "optimizer_state_dict": optimizer_state(STATE),
                "loss": 0.25,
            },
        ),
        "torch-save-dict",
        {"epoch": 7},
    ),
    "dict state_dict .bin": (
        torch_save("weights.bin", lambda: {"state_dict": STATE, "global_step": 40}),
        "torch-save-dict",
        {"step": 40},
    ),
    "dict model .pt": (
        torch_save("last.pt", lambda: {"model": STATE, "epoch": 0}),
        "torch-save-dict",
        {"epoch": 0},
    ),
    "safetensors": (write_safetensors, "safetensors", {}),
    "DCP with a model key": (write_dcp_with_model_key, "dcp", {"step": 300}),
    "DCP without one": (write_dcp_without_model_key, "dcp", {}),
    "HF sharded safetensors": (
        lambda folder: write_hf_sharded(folder, STATE, ".safetensors"),
        "hf-sharded-safetensors",
        {},
    ),
    "HF sharded bin": (
        lambda folder: write_hf_sharded(folder, STATE, ".bin"),
        "hf-sharded-torch-save",
        {},
    ),
}


@pytest.mark.parametrize(("write", "fmt", "numbers"), FORMATS.values(), ids=FORMATS.keys())
def test_each_format_is_published_as_the_same_tensors(write, fmt, numbers, tmp_path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    source = write(ckpt)
    collected = collect_checkpoint(str(ckpt), str(tmp_path / "model"))
    card = assert_published(tmp_path / "model", STATE)
    assert card == collected.card
    assert (card["source_format"], card["source_file"]) == (fmt, source)
    assert card["source_sha256"] == sha256_file(ckpt / source)
    assert card["source_checkpoint"] == str(ckpt)
    assert {k: card[k] for k in ("epoch", "step") if k in card} == numbers
    assert card["model"] == {} and card["checkpoint_files"][source] == card["source_sha256"]
    assert all(card["checkpoint_files"][name] == sha256_file(ckpt / name) for name in card[
        "checkpoint_files"
    ])  # fmt: skip


def test_every_format_publishes_the_same_bytes(tmp_path) -> None:
    """The published file depends on the tensors only, not on how they were saved."""
    digests = set()
    for index, (write, _fmt, _numbers) in enumerate(FORMATS.values()):
        ckpt = tmp_path / f"ckpt{index}"
        ckpt.mkdir()
        write(ckpt)
        digests.add(collect_checkpoint(str(ckpt), str(tmp_path / f"model{index}")).sha256)
    assert len(digests) == 1


# --- which one is taken -----------------------------------------------------------------------


def write_epochs(folder: Path, epochs: list[int]) -> dict[int, dict[str, torch.Tensor]]:
    states = {}
    folder.mkdir(parents=True, exist_ok=True)
    for epoch in epochs:
        states[epoch] = trained_state(seed=epoch)
        torch.save(states[epoch], folder / f"model_epoch_{epoch}.pt")
    return states


def age(path: Path, seconds_ago: float) -> None:
    when = time.time() - seconds_ago
    os.utime(path, (when, when))


def test_the_highest_epoch_number_wins_over_modification_time(tmp_path) -> None:
    states = write_epochs(tmp_path / "ckpt", [9, 10])
    age(tmp_path / "ckpt" / "model_epoch_10.pt", 600)  # 9 looks newer: the number decides
    age(tmp_path / "ckpt" / "model_epoch_9.pt", 60)
    card = collect_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "model")).card
    assert (card["source_file"], card["epoch"]) == ("model_epoch_10.pt", 10)
    assert_published(tmp_path / "model", states[10])


def test_files_still_being_written_and_helpers_are_passed_over(tmp_path) -> None:
    ckpt = tmp_path / "ckpt"
    states = write_epochs(ckpt, [1, 2])
    for name in ("model_epoch_3.pt.tmp", ".model_epoch_4.pt", "model_epoch_5.partial.pt"):
        torch.save(trained_state(seed=99), ckpt / name)  # newer, and complete: still skipped
    torch.save(optimizer_state(STATE), ckpt / "optimizer.pt")
    (ckpt / "notes.txt").write_text("not a checkpoint\n")
    (ckpt / "data").mkdir()  # a prepared dataset beside them holds no checkpoint
    (ckpt / "data" / "manifest.json").write_text("{}")
    save_file({"x": torch.zeros(2, 3)}, str(ckpt / "data" / "train.safetensors"))
    card = collect_checkpoint(str(ckpt), str(tmp_path / "model")).card
    assert card["source_file"] == "model_epoch_2.pt"
    assert_published(tmp_path / "model", states[2])


def test_differently_named_files_go_by_modification_time(tmp_path) -> None:
    """A final ``model.pt`` saved after the per-epoch files is the newest."""
    ckpt = tmp_path / "ckpt"
    write_epochs(ckpt, [1, 2])
    for name in ("model_epoch_1.pt", "model_epoch_2.pt"):
        age(ckpt / name, 120)
    torch.save(STATE, ckpt / "model.pt")
    card = collect_checkpoint(str(ckpt), str(tmp_path / "model")).card
    assert card["source_file"] == "model.pt" and "epoch" not in card
    assert_published(tmp_path / "model", STATE)


def test_checkpoint_folders_go_by_their_step_number(tmp_path) -> None:
    """Hugging Face Trainer's ``checkpoint-N/``: 200 after 50, whatever their times; the
    optimizer, scheduler and RNG files beside the model are not models."""
    ckpt = tmp_path / "ckpt"
    states = {}
    for step in (200, 50):  # 50 written last
        folder = ckpt / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        states[step] = trained_state(seed=step)
        save_file(states[step], str(folder / "model.safetensors"))
        torch.save(optimizer_state(states[step]), folder / "optimizer.pt")
        torch.save({"lr": torch.tensor(0.1)}, folder / "scheduler.pt")
        torch.save({"cpu": torch.get_rng_state()}, folder / "rng_state.pth")
    card = collect_checkpoint(str(ckpt), str(tmp_path / "model")).card
    assert card["source_file"] == "checkpoint-200/model.safetensors" and card["step"] == 200
    assert_published(tmp_path / "model", states[200])


def test_our_own_layout_stays_first(tmp_path) -> None:
    """A folder with kubetrain's layout is collected as one, a newer script file beside it
    notwithstanding."""
    model = build([1, 8, 8], 10)
    save_checkpoint(
        tmp_path / "ckpt", model, torch.optim.SGD(model.parameters(), lr=0.1), epoch=1, step=1,
        strategy="ddp", model_info={"spec": "mlp", "sample_shape": [1, 8, 8], "num_classes": 10},
        metrics=[],
    )  # fmt: skip
    torch.save(STATE, tmp_path / "ckpt" / "model.pt")
    card = collect_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "model")).card
    assert (card["source_format"], card["source_file"], card["strategy"]) == (
        "kubetrain", "manifest.json", "ddp",
    )  # fmt: skip
    manifest = tmp_path / "ckpt" / "epoch-000001" / "manifest.json"
    assert card["source_sha256"] == sha256_file(manifest)
    assert card["source_checkpoint"] == str(manifest.parent)
    named = collect_checkpoint(
        str(tmp_path / "ckpt"), str(tmp_path / "m2"), checkpoint_file="model.pt"
    )
    assert named.card["source_format"] == "torch-save"
    named = collect_checkpoint(
        str(tmp_path / "ckpt"), str(tmp_path / "m3"), checkpoint_file="epoch-000001"
    )
    assert named.card["source_file"] == "manifest.json" and named.card["epoch"] == 1


def test_checkpoint_file_names_the_one_to_take(tmp_path, capsys) -> None:
    ckpt = tmp_path / "ckpt"
    states = write_epochs(ckpt, [9, 10])
    write_dcp_with_model_key(ckpt)
    code, out, err = collect_cli(
        capsys, ckpt, tmp_path / "m1", "--checkpoint-file", "model_epoch_9.pt"
    )
    assert code == 0, err
    assert "collected model_epoch_9.pt (torch-save, epoch 9) from" in out
    assert_published(tmp_path / "m1", states[9])
    absolute = ckpt / "step-300"  # a DCP folder, named by its absolute path
    code, out, err = collect_cli(capsys, ckpt, tmp_path / "m2", "--checkpoint-file", absolute)
    assert code == 0, err
    assert read_model_card(str(tmp_path / "m2"))["source_file"] == "step-300/.metadata"
    assert_published(tmp_path / "m2", STATE)


@pytest.mark.fault
def test_a_file_still_growing_is_not_taken(tmp_path, injected) -> None:
    """A save in progress (the next epoch's file, growing as collect looks) is passed over for
    the newest settled one."""
    ckpt = tmp_path / "ckpt"
    states = write_epochs(ckpt, [10])
    buffer = io.BytesIO()
    torch.save(trained_state(seed=11), buffer)
    data, stop, sizes = buffer.getvalue(), threading.Event(), []

    def write_slowly() -> None:
        with open(ckpt / "model_epoch_11.pt", "wb") as handle:
            for start in range(0, len(data), 64):
                if stop.is_set():
                    return
                handle.write(data[start : start + 64])
                handle.flush()
                sizes.append(os.fstat(handle.fileno()).st_size)
                time.sleep(0.02)

    writer = threading.Thread(target=write_slowly)
    writer.start()
    try:
        while not sizes:
            time.sleep(0.01)
        card = collect_checkpoint(str(ckpt), str(tmp_path / "model")).card
        growing = len(sizes)
    finally:
        stop.set()
        writer.join()
    assert growing > 2 and sizes[-1] < len(data), "the file was still being written"
    injected.struck("model_epoch_11.pt grew while collect ran")
    assert card["source_file"] == "model_epoch_10.pt"
    assert_published(tmp_path / "model", states[10])


# --- planted pickles and files outside the folder ---------------------------------------------


class RunsCode:
    """Unpickling this creates ``marker``: the code a malicious pickle runs, made visible."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def test_the_planted_payloads_run_code_when_unpickled_unsafely(tmp_path) -> None:
    """Without this, the cases below could pass because their payload is inert."""
    buffer = io.BytesIO()
    torch.save({"w": RunsCode(tmp_path / "zip")}, buffer)
    buffer.seek(0)
    torch.load(buffer, weights_only=False)
    pickle.loads(pickle.dumps(RunsCode(tmp_path / "raw")))
    assert (tmp_path / "zip").exists() and (tmp_path / "raw").exists()


def plant_torch(name: str, content: Callable[[Path], Any]) -> Callable[[Path, Path], str]:
    def plant(folder: Path, marker: Path) -> str:
        torch.save(content(marker), folder / name)
        return name

    return plant


def plant_raw(name: str) -> Callable[[Path, Path], str]:
    def plant(folder: Path, marker: Path) -> str:
        (folder / name).write_bytes(pickle.dumps(RunsCode(marker), protocol=2))
        return name

    return plant


def plant_dcp_metadata(folder: Path, marker: Path) -> str:
    dcp.save({"model": STATE}, checkpoint_id=str(folder), no_dist=True)
    (folder / ".metadata").write_bytes(pickle.dumps(RunsCode(marker), protocol=2))
    return ".metadata"


def plant_dcp_bytes_entry(folder: Path, marker: Path) -> str:
    """Well-formed DCP metadata (only allowed classes) marking a model tensor as a bytes entry
    that points at a planted pickle: DCP's default planner would unpickle it."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    dcp.save({"model": STATE}, checkpoint_id=str(folder), no_dist=True)
    buffer = io.BytesIO()
    torch.save(RunsCode(marker), buffer)
    (folder / "planted.distcp").write_bytes(buffer.getvalue())
    metadata = pickle.loads((folder / ".metadata").read_bytes())  # written just now: trusted
    fqn = "model.1.weight"
    metadata.state_dict_metadata[fqn] = BytesStorageMetadata()
    metadata.storage_data = {k: v for k, v in metadata.storage_data.items() if k.fqn != fqn}
    metadata.storage_data[MetadataIndex(fqn)] = _StorageInfo(
        "planted.distcp", 0, len(buffer.getvalue())
    )
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    return "1.weight"


def plant_hf_shard(folder: Path, marker: Path) -> str:
    index = write_hf_sharded(folder, STATE, ".bin")
    shard = json.loads((folder / index).read_text())["weight_map"]["1.weight"]
    torch.save({"1.weight": RunsCode(marker)}, folder / shard)
    return shard


PLANTED = {
    "torch.save zip as model.pt": plant_torch("model.pt", lambda m: {"w": RunsCode(m)}),
    "raw pickle as pytorch_model.bin": plant_raw("pytorch_model.bin"),
    "inside a dict beside model_state_dict": plant_torch(
        "checkpoint.pth",
        lambda m: {"epoch": 1, "model_state_dict": STATE, "optimizer_state_dict": RunsCode(m)},
    ),
    "raw pickle as model.safetensors": plant_raw("model.safetensors"),
    "DCP .metadata": plant_dcp_metadata,
    "DCP entry turned into pickled bytes": plant_dcp_bytes_entry,
    "HF .bin shard": plant_hf_shard,
}


@pytest.mark.security
@pytest.mark.parametrize("plant", PLANTED.values(), ids=PLANTED.keys())
def test_a_planted_pickle_is_refused_unrun(plant, tmp_path, capsys) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    marker = tmp_path / "ran"
    named = plant(ckpt, marker)
    code, _, err = collect_cli(capsys, ckpt, tmp_path / "model")
    assert not marker.exists(), "the planted pickle ran"
    refused_in_one_line(code, err, named)
    nothing_published(tmp_path / "model")


def outside_file(tmp_path: Path) -> Path:
    torch.save(STATE, tmp_path / "elsewhere.pt")  # a readable checkpoint, but not in the folder
    return tmp_path / "elsewhere.pt"


def index_naming(shard: str) -> Callable[[Path, Path], str]:
    def plant(folder: Path, tmp_path: Path) -> str:
        save_file(STATE, str(tmp_path / "outside.safetensors"))
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"1.weight": shard}})
        )
        return shard

    return plant


def link(name: str, target: Callable[[Path], Path | str]) -> Callable[[Path, Path], str]:
    def plant(folder: Path, tmp_path: Path) -> str:
        (folder / name).symlink_to(target(tmp_path))
        return name

    return plant


def fifo(folder: Path, tmp_path: Path) -> str:
    os.mkfifo(folder / "model.pt")
    return "model.pt"


OUTSIDE = {
    "a link out of the folder": link("model.pt", outside_file),
    "a link to /dev/zero": link("model.safetensors", lambda tmp_path: "/dev/zero"),
    "a FIFO": fifo,
    "an index naming ../x": index_naming("../outside.safetensors"),
    "an index naming /etc/hostname": index_naming("/etc/hostname"),
}


@pytest.mark.security
@pytest.mark.parametrize("plant", OUTSIDE.values(), ids=OUTSIDE.keys())
def test_a_file_that_is_no_regular_file_inside_is_refused_unread(plant, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    named = plant(ckpt, tmp_path)
    code, _, err = collect_cli(capsys, ckpt, tmp_path / "model")
    refused_in_one_line(code, err, named)
    nothing_published(tmp_path / "model")


@pytest.mark.security
@pytest.mark.parametrize("given", ["/dev/zero", "zero-link.pt"])
def test_a_checkpoint_file_naming_a_device_is_refused_unread(given, tmp_path, capsys) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "zero-link.pt").symlink_to("/dev/zero")
    code, _, err = collect_cli(capsys, ckpt, tmp_path / "model", "--checkpoint-file", given)
    refused_in_one_line(code, err, "checkpoint_file", given)
    nothing_published(tmp_path / "model")


# --- bad inputs --------------------------------------------------------------------------------


def saved(name: str, content: Callable[[], Any]) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        torch.save(content(), folder / name)

    return write


def truncated(folder: Path) -> None:
    buffer = io.BytesIO()
    torch.save(STATE, buffer)
    (folder / "model.pt").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])


def bad_header(folder: Path) -> None:
    save_file(STATE, str(folder / "model.safetensors"))
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[8:9] = b"["  # the header no longer a JSON object
    (folder / "model.safetensors").write_bytes(bytes(data))


def index_text(text: str) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        save_file(STATE, str(folder / "model-00001-of-00001.safetensors"))
        (folder / "model.safetensors.index.json").write_text(text)

    return write


def dcp_model_with(extra: dict[str, Any]) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        dcp.save({"model": {**STATE, **extra}}, checkpoint_id=str(folder), no_dist=True)

    return write


def nothing(folder: Path) -> None:
    (folder / "README.txt").write_text("the script saved nowhere near here\n")
    torch.save(optimizer_state(STATE), folder / "optimizer.pt")
    torch.save(STATE, folder / "model.pt.tmp")


BAD = {
    "non-tensor value": (
        saved("model.pt", lambda: {**STATE, "note": "trained on digits"}), ["'note'", "str"]
    ),
    "a list": (saved("model.pt", lambda: list(STATE.values())), ["a list, not a state dict"]),
    "no state dict under a known key": (
        saved("ckpt.pt", lambda: {"epoch": 3, "weights": STATE}), ["'weights'", "state_dict"]
    ),
    "empty state dict": (saved("model.pt", dict), ["empty state dict"]),
    "non-string key": (saved("model.pt", lambda: {0: torch.ones(2)}), ["key 0"]),
    "complex tensor": (
        saved("model.pt", lambda: {"w": torch.ones(2, dtype=torch.complex64)}), ["complex64"]
    ),
    "non-tensor under model_state_dict": (
        saved("ckpt.pth", lambda: {"epoch": 1, "model_state_dict": {**STATE, "n": 3}}),
        ["model_state_dict", "'n'"],
    ),
    "truncated torch.save": (truncated, ["model.pt", "refused"]),
    "safetensors header not an object": (bad_header, ["model.safetensors", "not a safetensors"]),
    "index not JSON": (index_text("{not json"), ["index.json", "not a JSON index"]),
    "index without weight_map": (index_text('{"metadata": {}}'), ["no weight_map"]),
    "index maps a missing tensor": (
        index_text(json.dumps({"weight_map": {"absent": "model-00001-of-00001.safetensors"}})),
        ["lacks tensor 'absent'"],
    ),
    "DCP model entry not a tensor": (dcp_model_with({"version": 3}), ["'version'", "not a tensor"]),
    "DCP state dict beside a non-tensor": (
        lambda folder: dcp.save({**STATE, "note": "x"}, checkpoint_id=str(folder), no_dist=True),
        ["'note'", "not a tensor"],
    ),
    "nothing to collect": (
        nothing,
        ["checkpoint_dir: ", "holds no checkpoint (looked for our manifest/LATEST, "
         "*.safetensors, *.pt/*.pth/*.bin, Lightning *.ckpt, a DCP .metadata, an HF index, a "
         "Ray Train run's recorded checkpoint_*, in any folder below); point "
         "--checkpoint-dir at the folder your script saves into, or name the file with "
         "--checkpoint-file"],
    ),
}  # fmt: skip


@pytest.mark.bad_input
@pytest.mark.parametrize(("write", "named"), BAD.values(), ids=BAD.keys())
def test_a_bad_checkpoint_is_one_line_and_publishes_nothing(write, named, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    write(ckpt)
    code, _, err = collect_cli(capsys, ckpt, tmp_path / "model")
    refused_in_one_line(code, err, str(ckpt), *named)
    nothing_published(tmp_path / "model")


CHECKPOINT_FILE = {
    "missing": ("model_epoch_99.pt", "does not exist"),
    "outside, absolute": ("{tmp}/elsewhere.pt", "is outside checkpoint_dir"),
    "outside, relative": ("../elsewhere.pt", "climbs out of the folder"),
    "of no format": ("notes.txt", "of no format collect reads"),
    "a folder of nothing": ("logs", "holding no DCP .metadata"),
    "one shard of several": ("hf/model-00001-of-00002.safetensors", "is one shard of"),
}


@pytest.mark.bad_input
@pytest.mark.parametrize(("given", "problem"), CHECKPOINT_FILE.values(), ids=CHECKPOINT_FILE.keys())
def test_a_bad_checkpoint_file_is_one_line(given, problem, tmp_path, capsys) -> None:
    ckpt = tmp_path / "ckpt"
    write_epochs(ckpt, [1])
    (ckpt / "notes.txt").write_text("notes\n")
    (ckpt / "logs").mkdir()
    write_hf_sharded(ckpt / "hf", STATE, ".safetensors")
    outside_file(tmp_path)
    given = given.format(tmp=tmp_path)
    code, _, err = collect_cli(capsys, ckpt, tmp_path / "model", "--checkpoint-file", given)
    assert code == 2, err
    refused_in_one_line(code, err, "checkpoint_file", problem)
    nothing_published(tmp_path / "model")


@pytest.mark.bad_input
def test_an_export_of_a_scripts_checkpoint_is_refused_before_reading(tmp_path, capsys) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch.save(STATE, ckpt / "model.pt")
    code, _, err = collect_cli(capsys, ckpt, tmp_path / "model", "--export", "torch-export")
    refused_in_one_line(code, err, "export", "records no sample shape")
    nothing_published(tmp_path / "model")


# --- a script written like the seeds', under torchrun ------------------------------------------

NETDEF = f"collect_formats_netdef_{uuid.uuid4().hex[:8]}"
#: The seeds' DDP example: per-epoch files, then a DCP checkpoint of both ranks and model.pt.
AFTER_TRAINING = """import torch.distributed.checkpoint as dcp

    dcp.save({"model": model.state_dict()}, checkpoint_id="dcp-final")
    dist.barrier()
    if rank == 0:
        torch.save(model.module.state_dict(), "model.pt")"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def script_run(tmp_path_factory: pytest.TempPathFactory, digits_dir: Path) -> dict[str, Path]:
    """`torchrun --nproc-per-node 2 train.py` run in its checkpoint folder, as a TrainJob's
    node runs a user's script there."""
    root = tmp_path_factory.mktemp("script")
    code, workdir = root / "code", root / "workdir"
    workdir.mkdir()
    write_user_folder(code, SAVES["per-epoch"], after=AFTER_TRAINING, netdef=NETDEF)
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")},
        "KUBETRAIN_DATA_DIR": str(digits_dir),
        "PYTHONPATH": str(code),
        "OMP_NUM_THREADS": "1",
    }
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), str(code / "train.py")],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return {"code": code, "workdir": workdir}


def test_a_seed_style_ddp_script_is_collected_and_evaluated(
    script_run, digits_dir, tmp_path, capsys, monkeypatch
) -> None:
    workdir = script_run["workdir"]
    code, out, err = collect_cli(capsys, workdir, tmp_path / "model")
    assert code == 0, err
    card = read_model_card(str(tmp_path / "model"))
    assert (card["source_file"], card["source_format"]) == ("model.pt", "torch-save")
    assert_published(tmp_path / "model", load_file_via_torch(workdir / "model.pt"))
    # the card records no model code: evaluate builds it with the factory the user names
    code, _, err = cli(capsys, "evaluate", "--model", tmp_path / "model", "--data", digits_dir)
    refused = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(refused) == 1 and "model_factory" in refused[0], err
    monkeypatch.syspath_prepend(str(script_run["code"]))
    code, out, err = cli(
        capsys, "evaluate", "--model", tmp_path / "model", "--data", digits_dir,
        "--model-factory", f"{NETDEF}:build", "--threshold", "0.9", "--json",
    )  # fmt: skip
    assert code == 0, err
    accuracy = json.loads(out[: out.rindex("}") + 1])["accuracy"]
    assert accuracy >= 0.9, accuracy


def load_file_via_torch(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def test_the_scripts_epochs_and_its_two_process_dcp_checkpoint(script_run, tmp_path) -> None:
    workdir = script_run["workdir"]
    final = load_file_via_torch(workdir / "model.pt")
    per_epoch = tmp_path / "per-epoch"  # the seeds' per-epoch files alone: the last epoch wins
    per_epoch.mkdir()
    for path in workdir.glob("model_epoch_*.pt"):
        shutil.copy2(path, per_epoch / path.name)
    card = collect_checkpoint(str(per_epoch), str(tmp_path / "m1")).card
    assert (card["source_file"], card["epoch"]) == ("model_epoch_8.pt", 8)
    assert_published(tmp_path / "m1", final)
    # written by both ranks, of the DDP-wrapped model: module. prefixes stripped
    card = collect_checkpoint(str(workdir), str(tmp_path / "m2"), checkpoint_file="dcp-final").card
    assert (card["source_format"], card["source_file"]) == ("dcp", "dcp-final/.metadata")
    assert_published(tmp_path / "m2", final)
