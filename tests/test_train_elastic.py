"""The trainer under an elastic job (torchrun ``--nnodes MIN:MAX``): every (re)start resumes
from the newest checkpoint at whatever world size the rendezvous gave, re-shards its data,
says so in one line, keeps its records right, and a peer that dies mid-save publishes no
half checkpoint. Real runs resume the session's shared 2-epoch checkpoints (ddp on 1
process, fsdp on 2) at the other size, in this process (1 process) or under torchrun (2)."""

from __future__ import annotations

import math
import shutil
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from kubetrain.artifacts import checkpoint, datasets
from kubetrain.artifacts.checkpoint import (
    latest_checkpoint,
    read_manifest,
    restore_checkpoint,
    verify_checkpoint,
)
from kubetrain.artifacts.models import build_classifier
from kubetrain.errors import KubetrainError, failure_line
from kubetrain.train import distributed, trainer
from kubetrain.train.__main__ import main
from kubetrain.train.data import train_loader
from kubetrain.train.distributed import Runtime, lost_peer, wrap_model
from kubetrain.train.options import parse_options
from kubetrain.train.progress import SilentReporter
from kubetrain.train.trainer import hyperparameters, make_optimizer, resume_line

BATCH = 32  # the trainer's default --batch-size


def train_args(data: Path, ckpt: Path, *extra: str) -> list[str]:
    return ["--data", str(data), "--checkpoint-dir", str(ckpt), "--tensorboard-dir", "", *extra]


def torchrun(port: int, *args: str) -> list[str]:
    return ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port),
            *args]  # fmt: skip


# --- units ----------------------------------------------------------------------------------


def test_the_resume_line_says_the_world_size_and_the_one_it_was_written_at() -> None:
    manifest = {"epoch": 5, "step": 120, "world_size": 2}
    assert resume_line("/c/epoch-000005", manifest, 1) == (
        "resumed epoch 5 at world size 1 (was 2): step 120 from /c/epoch-000005"
    )
    assert resume_line("/c/epoch-000005", manifest, 2) == (
        "resumed epoch 5 at world size 2: step 120 from /c/epoch-000005"
    )


@pytest.mark.parametrize(
    ("pet_nnodes", "group", "local", "world"),
    [("1:2", "1", "1", 1), ("2", "1", "1", 1), ("1:4", "2", "2", 4)],
)
def test_the_nodes_recorded_are_this_rounds_not_the_configured_ones(
    digits_dir: Path, tmp_path: Path, monkeypatch, pet_nnodes, group, local, world
) -> None:
    """PyTorchJob gives an elastic job PET_NNODES "MIN:MAX" (training-operator v1.9.0
    pkg/controller.v1/pytorch/elastic.go); a launcher may leave it at MAX and pass the range
    to torchrun. The nodes trained on are those torchrun's agent counted this round."""
    monkeypatch.setenv("PET_NNODES", pet_nnodes)
    monkeypatch.setenv("GROUP_WORLD_SIZE", group)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    options = parse_options(train_args(digits_dir, tmp_path))
    runtime = Runtime(rank=0, local_rank=0, world_size=world, device=torch.device("cpu"))
    trained = hyperparameters(options, runtime)
    assert (trained["nodes"], trained["procs_per_node"], trained["world_size"]) == (
        int(group),
        int(local),
        world,
    )


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_the_sampler_reshards_the_data_by_the_world_size(world_size: int) -> None:
    """Each rank gets ceil(N / world) samples in ceil(ceil(N / world) / batch) batches, and
    the ranks together cover every sample: what an epoch at a new size trains on."""
    total, batch = 100, 8
    x, y = torch.arange(total, dtype=torch.float32).unsqueeze(1), torch.zeros(total).long()
    seen: list[int] = []
    for rank in range(world_size):
        batches, sampler = train_loader(
            x, y, batch_size=batch, rank=rank, world_size=world_size, seed=0,
            device=torch.device("cpu"),
        )  # fmt: skip
        sampler.set_epoch(3)
        shard = [int(value) for xb, _ in batches for value in xb[:, 0]]
        assert len(shard) == math.ceil(total / world_size)
        assert len(batches) == math.ceil(math.ceil(total / world_size) / batch)
        seen += shard
    assert set(seen) == set(range(total))


#: What a gloo collective raised on rank 0 when rank 1's process died (torch 2.13, here).
GLOO_PEER_ERRORS = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
    "by peer [127.0.0.1]:34229. This is typically caused by a remote worker crashing. Check the "
    "logs of the remote worker before reporting an error. GLHF!",
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
    "[127.0.0.1]:13196: Connection reset by peer. This is typically caused by a remote worker "
    "hanging or bugs in the application code.",
)


@pytest.mark.parametrize("message", GLOO_PEER_ERRORS)
def test_a_collective_failing_on_a_lost_peer_is_said_so_not_called_our_bug(
    message: str, digits_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """Every surviving rank of an elastic job that loses a node fails its collective so; its
    log says a process was lost (the lost one's log says why), not "a bug in kubetrain"."""

    def collective_fails(*args: Any) -> None:
        raise RuntimeError(message)

    monkeypatch.setattr(trainer, "_train", collective_fails)
    options = parse_options(train_args(digits_dir, tmp_path / "ckpt"))
    two_ranks = Runtime(rank=0, local_rank=0, world_size=2, device=torch.device("cpu"))
    with pytest.raises(KubetrainError) as raised:
        trainer.run(options, two_ranks, SilentReporter())
    line, code = failure_line(raised.value)
    assert line.startswith("another process of this job was lost (gloo: Connection ")
    assert "--max-restarts" in line and "bug" not in line and code == 1
    assert lost_peer(RuntimeError("[gloo/transport/tcp/pair.cc:1] Timed out waiting")) is None
    assert lost_peer(ValueError(message)) is None


# --- an fsdp checkpoint of 2 ranks restored whole on 1 --------------------------------------


def _tensor_paths(tree: Any, path: tuple = ()) -> dict[tuple, torch.Tensor]:
    """Every tensor of nested dicts, keyed by its path of keys."""
    if isinstance(tree, torch.Tensor):
        return {path: tree}
    if isinstance(tree, Mapping):
        return {
            found: tensor
            for key, value in tree.items()
            for found, tensor in _tensor_paths(value, (*path, str(key))).items()
        }
    return {}


def _dcp_tensors(dcp_path: Path) -> dict[tuple, torch.Tensor]:
    """Every tensor of a DCP checkpoint read whole, in this process alone (no process group,
    none of the checkpoint's sharding): what a resharded restore must reproduce."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = checkpoint._dcp_reader(dcp_path).read_metadata()
    request: dict[str, Any] = {}
    for key, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            *parents, leaf = metadata.planner_data[key]
            node = request
            for parent in parents:
                node = node.setdefault(str(parent), {})
            node[str(leaf)] = torch.empty(entry.size, dtype=entry.properties.dtype)
    checkpoint._dcp_load(request, dcp_path, no_dist=True)
    return _tensor_paths(request)


def test_an_fsdp_checkpoint_of_two_ranks_restores_whole_on_one(trained_checkpoints) -> None:
    """DCP reshards on load: the weights and AdamW moments of 2 ranks' shards all come back,
    bit for bit, in a 1-process FSDP model, so an elastic fsdp job may shrink."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    ckpt = latest_checkpoint(trained_checkpoints["fsdp"])
    manifest = read_manifest(ckpt)
    assert (manifest["strategy"], manifest["world_size"]) == ("fsdp", 2)
    expected = _dcp_tensors(ckpt / "dcp")
    assert any(path[0] == "optim" for path in expected)

    runtime = distributed.init_runtime("cpu")
    try:
        assert runtime.world_size == 1
        info = manifest["model"]
        module = build_classifier(info["spec"], info["sample_shape"], info["num_classes"])
        model = wrap_model(module, "fsdp", runtime)
        optimizer = make_optimizer("adamw", model.parameters(), 1e-3)
        restore_checkpoint(ckpt, model, optimizer)
        model_state, optim_state = get_state_dict(
            model, optimizer, options=StateDictOptions(full_state_dict=True)
        )
    finally:
        distributed.shutdown()
    actual = _tensor_paths({"model": model_state, "optim": optim_state})
    assert sorted(actual) == sorted(expected)
    for path, tensor in expected.items():
        torch.testing.assert_close(actual[path], tensor, rtol=0, atol=0, msg=str(path))


# --- real resumes at the other world size ---------------------------------------------------


def steps_per_epoch(digits_dir: Path, world_size: int) -> int:
    train_count = len(datasets.load_split(digits_dir, "train")[1])
    return math.ceil(math.ceil(train_count / world_size) / BATCH)


def resume_here(argv: list[str], capsys) -> str:
    """``python -m kubetrain.train ARGV`` in this process: one process, world size 1."""
    assert main(argv) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def assert_continued(
    ckpt: Path, out: str, *, resumed: Path, world_sizes: list[int], digits_dir: Path
) -> dict[str, Any]:
    """The run said it resumed ``resumed`` at the last of ``world_sizes`` (one per epoch
    trained so far), trained only the epochs after it, each with its size's steps, and its
    newest checkpoint records every epoch once, at its size, steps without gap or repeat,
    the layout it ran at and a clock that went on. Return that checkpoint's manifest."""
    before = read_manifest(resumed)
    now = world_sizes[-1]
    assert resume_line(str(resumed), before, now) in out.splitlines()
    manifest = read_manifest(latest_checkpoint(ckpt))
    epochs = len(world_sizes)
    assert manifest["epoch"] == epochs
    trained = range(before["epoch"] + 1, epochs + 1)
    lines = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert [line.split()[1] for line in lines] == [f"{epoch}/{epochs}" for epoch in trained]
    metrics = manifest["metrics"]
    assert metrics[: before["epoch"]] == before["metrics"]
    assert [record["world_size"] for record in metrics] == world_sizes
    steps = [0] + [record["step"] for record in metrics]
    for epoch, size in enumerate(world_sizes, start=1):
        assert steps[epoch] - steps[epoch - 1] == steps_per_epoch(digits_dir, size)
    assert [entry["step"] for entry in manifest["history"]] == list(range(1, steps[-1] + 1))
    for epoch in trained:  # the weights came back: the loss goes on falling from there
        assert metrics[epoch - 1]["train_loss"] < metrics[epoch - 2]["train_loss"]
    layout = manifest["hyperparameters"]
    assert (layout["nodes"], layout["world_size"]) == (1, now)
    assert manifest["run"]["started_at"] == before["run"]["started_at"]
    assert manifest["run"]["seconds"] > before["run"]["seconds"]
    return manifest


def test_a_ddp_run_resumes_on_two_processes_and_back_on_one(
    trained_checkpoints, digits_dir: Path, tmp_path: Path, run_python, free_port, capsys
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained_checkpoints["ddp"], ckpt)
    assert read_manifest(ckpt / "epoch-000002")["world_size"] == 1

    grown = run_python(torchrun(free_port(), "-m", "kubetrain.train",
                                *train_args(digits_dir, ckpt, "--epochs", "3")))  # fmt: skip
    assert grown.returncode == 0, grown.stderr[-3000:]
    assert_continued(ckpt, grown.stdout, resumed=ckpt / "epoch-000002", world_sizes=[1, 1, 2],
                     digits_dir=digits_dir)  # fmt: skip
    assert "resumed epoch 2 at world size 2 (was 1): " in grown.stdout

    out = resume_here(train_args(digits_dir, ckpt, "--epochs", "4"), capsys)
    manifest = assert_continued(ckpt, out, resumed=ckpt / "epoch-000003",
                                world_sizes=[1, 1, 2, 1], digits_dir=digits_dir)  # fmt: skip
    assert "resumed epoch 3 at world size 1 (was 2): " in out
    assert manifest["metrics"][-1]["test_accuracy"] >= 0.9


#: Under torchrun: rank 1 SIGKILLs itself when it starts writing its shard of epoch DIE_AT's
#: checkpoint (a node lost mid-save), after its part of DCP's planning with rank 0.
PEER_DIES_MID_SAVE = textwrap.dedent(
    """
    import os, signal, sys
    from kubetrain.artifacts import checkpoint
    from kubetrain.train.__main__ import main

    die_at, argv = f"epoch-{int(sys.argv[1]):06d}", sys.argv[2:]
    writer_of = checkpoint._dcp_writer

    def dying_writer(path):
        writer = writer_of(path)
        if os.environ["RANK"] == "1" and die_at in str(path):
            writer.write_data = lambda plan, planner: os.kill(os.getpid(), signal.SIGKILL)
        return writer

    checkpoint._dcp_writer = dying_writer
    sys.exit(main(argv))
    """
)


@pytest.mark.fault
def test_an_fsdp_run_shrinks_grows_and_a_peer_lost_mid_save_publishes_nothing(
    trained_checkpoints, digits_dir, tmp_path: Path, run_python, free_port, capsys, injected
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained_checkpoints["fsdp"], ckpt)
    assert read_manifest(ckpt / "epoch-000002")["world_size"] == 2
    fsdp = ("--strategy", "fsdp")

    out = resume_here(train_args(digits_dir, ckpt, *fsdp, "--epochs", "3"), capsys)
    assert "resumed epoch 2 at world size 1 (was 2): " in out
    assert_continued(ckpt, out, resumed=ckpt / "epoch-000002", world_sizes=[2, 2, 1],
                     digits_dir=digits_dir)  # fmt: skip

    script = tmp_path / "peer_dies_mid_save.py"
    script.write_text(PEER_DIES_MID_SAVE)
    args = train_args(digits_dir, ckpt, *fsdp, "--epochs", "5")
    grown = run_python(torchrun(free_port(), str(script), "5", *args))
    assert grown.returncode != 0, grown.stdout[-2000:]
    assert "exitcode  : -9" in grown.stderr, grown.stderr[-3000:]  # torchrun's report of rank 1
    injected.struck("rank 1 was SIGKILLed as it began writing its shard of epoch 5")
    assert "bug in kubetrain" not in grown.stderr  # rank 0's collective failed on a lost peer
    assert "resumed epoch 3 at world size 2 (was 1): " in grown.stdout
    assert f"checkpoint saved: {ckpt / 'epoch-000004'}" in grown.stdout
    assert f"checkpoint saved: {ckpt / 'epoch-000005'}" not in grown.stdout
    assert not (ckpt / "epoch-000005").exists()
    (debris,) = ckpt.glob(".tmp-epoch-000005-*")  # begun, hidden, never published
    assert not (debris / "manifest.json").exists()
    assert (ckpt / "LATEST").read_text() == "epoch-000004\n"
    injected.data_intact("the newest checkpoint", lambda: verify_checkpoint(ckpt / "epoch-000004"))
    # the survivor restarts alone, from the newest complete checkpoint; the debris goes
    out = resume_here(train_args(digits_dir, ckpt, *fsdp, "--epochs", "5"), capsys)
    assert "resumed epoch 4 at world size 1 (was 2): " in out
    manifest = assert_continued(ckpt, out, resumed=ckpt / "epoch-000004",
                                world_sizes=[2, 2, 1, 2, 1], digits_dir=digits_dir)  # fmt: skip
    assert manifest["metrics"][-1]["test_accuracy"] >= 0.9
    assert not list(ckpt.glob(".tmp-*"))
