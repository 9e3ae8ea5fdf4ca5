"""What a checkpoint holds, not just its file type (issue 26): collect takes the model's state
dict out of nested state the way real scripts save it, never optimizer state, refuses to
guess between candidates (``--state-key`` chooses), searches nested folders, checks the
tensors load into a known model factory, and refuses NaN/Inf models."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from test_collect_formats import (
    STATE,
    assert_published,
    build,
    collect_cli,
    nothing_published,
    optimizer_state,
    refused_in_one_line,
    trained_state,
)
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from kubetrain.artifacts.checkpoint import save_checkpoint

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*single process.*:UserWarning"),
    pytest.mark.usefixtures("no_hang"),
]


def trained_model() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = build([1, 8, 8], 10)
    model.load_state_dict(STATE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 1, 8, 8)).sum().backward()
    optimizer.step()
    return model, optimizer


class AppState(Stateful):
    """The distributed-checkpoint recipe's wrapper: the model's and optimizer's state dicts
    under ``model`` and ``optim``."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optimizer_state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model, self.optimizer, model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )  # fmt: skip


def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def collect_ok(capsys, ckpt: Path, out: Path, *extra: object) -> dict[str, Any]:
    code, stdout, err = collect_cli(capsys, ckpt, out, *extra)
    assert code == 0, err
    return assert_published(out, load_file(str(out / "model.safetensors")))


# --- layouts real scripts write ------------------------------------------------------------------


def test_the_dcp_recipes_app_state_publishes_the_model_not_its_optimizer(tmp_path, capsys):
    model, optimizer = trained_model()
    dcp.save(
        {"app": AppState(model, optimizer)}, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True
    )
    card = collect_ok(capsys, tmp_path / "ckpt", tmp_path / "model")
    assert_published(tmp_path / "model", model_state(model))
    assert (card["source_format"], card["state_key"]) == ("dcp", "app.model")


def test_the_ddp_tutorials_snapshot_dict(tmp_path, capsys) -> None:
    (tmp_path / "ckpt").mkdir()
    torch.save(
        {"MODEL_STATE": {f"module.{k}": v for k, v in STATE.items()}, "EPOCHS_RUN": 5},
        tmp_path / "ckpt" / "snapshot.pt",
    )
    card = collect_ok(capsys, tmp_path / "ckpt", tmp_path / "model")
    assert_published(tmp_path / "model", STATE)
    assert (card["source_format"], card["state_key"], card["epoch"]) == (
        "torch-save-dict", "MODEL_STATE", 5,
    )  # fmt: skip


def lightning_checkpoint(state: dict[str, torch.Tensor], epoch: int, step: int) -> dict:
    """What Lightning's ``dump_checkpoint`` writes for a LightningModule holding ``self.model``
    (trainer/connectors/checkpoint_connector.py): the module's state dict with its attribute
    prefix, training state beside it, and a callback's tensor scores."""
    model, optimizer = trained_model()
    return {
        "epoch": epoch,
        "global_step": step,
        "pytorch-lightning_version": "2.5.0",
        "state_dict": {f"model.{k}": v for k, v in state.items()},
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": epoch}}}},
        "callbacks": {
            "ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min'}": {
                "best_model_score": torch.tensor(0.25),
                "best_model_path": "/ckpt/epoch=1.ckpt",
            }
        },
        "optimizer_states": [optimizer.state_dict()],
        "lr_schedulers": [],
        "hparams_name": "kwargs",
        "hyper_parameters": {"lr": 0.001, "hidden": 32},
    }


def test_lightning_checkpoints_in_their_version_folders(tmp_path, capsys) -> None:
    """The newest version's newest epoch is taken from lightning_logs/version_N/checkpoints/,
    its state_dict without the LightningModule's ``model.`` prefix."""
    states = {}
    for version, epoch in ((0, 3), (1, 0), (1, 1)):
        folder = tmp_path / "ckpt" / "lightning_logs" / f"version_{version}" / "checkpoints"
        folder.mkdir(parents=True, exist_ok=True)
        states[version, epoch] = trained_state(seed=10 * version + epoch)
        checkpoint = lightning_checkpoint(states[version, epoch], epoch, 10 * (epoch + 1))
        torch.save(checkpoint, folder / f"epoch={epoch}-step={10 * (epoch + 1)}.ckpt")
    card = collect_ok(capsys, tmp_path / "ckpt", tmp_path / "model")
    assert_published(tmp_path / "model", states[1, 1])
    assert card["source_file"] == "lightning_logs/version_1/checkpoints/epoch=1-step=20.ckpt"
    assert (card["source_format"], card["epoch"], card["step"]) == ("lightning", 1, 20)


def test_the_fsdp2_examples_timestamped_dcp_folders(tmp_path, capsys) -> None:
    """pytorch/examples' FSDP2 saves under checkpoints/<api>/<timestamp>/: the latest wins."""
    states = {}
    for stamp in ("1764201600", "1764288000", "1764205200"):
        states[stamp] = trained_state(seed=int(stamp) % 97)
        folder = tmp_path / "ckpt" / "checkpoints" / "dcp_api" / stamp
        dcp.save(
            {"model": states[stamp], "optim": optimizer_state(states[stamp])},
            checkpoint_id=str(folder), no_dist=True,
        )  # fmt: skip
    card = collect_ok(capsys, tmp_path / "ckpt", tmp_path / "model")
    assert_published(tmp_path / "model", states["1764288000"])
    assert card["source_file"] == "checkpoints/dcp_api/1764288000/.metadata"


# --- refusals: never optimizer state, never a guess ----------------------------------------------

REFUSED = {
    "optimizer state alone": (
        lambda: optimizer_state(STATE),
        ["only training state (the top level)", "state_dict()"],
    ),
    "optimizer under its key alone": (
        lambda: {"optimizer_state_dict": optimizer_state(STATE), "epoch": 2},
        ["only training state", "'optimizer_state_dict'"],
    ),
    "two candidates": (
        lambda: {"model": STATE, "ema": trained_state(seed=3), "epoch": 1},
        ["several state dicts", "'ema', 'model'", "--state-key"],
    ),
    "only unknown keys": (
        lambda: {"weights": STATE, "teacher": trained_state(seed=4)},
        ["'teacher', 'weights'", "no state dict under a model key", "--state-key"],
    ),
}


@pytest.mark.bad_input
@pytest.mark.parametrize(("saved", "named"), REFUSED.values(), ids=REFUSED.keys())
def test_what_cannot_be_told_a_model_is_refused(saved, named, tmp_path, capsys) -> None:
    (tmp_path / "ckpt").mkdir()
    torch.save(saved(), tmp_path / "ckpt" / "checkpoint.pt")
    code, _, err = collect_cli(capsys, tmp_path / "ckpt", tmp_path / "model")
    refused_in_one_line(code, err, "checkpoint.pt", *named)
    nothing_published(tmp_path / "model")


def test_state_key_chooses_among_candidates(tmp_path, capsys) -> None:
    ema = trained_state(seed=3)
    (tmp_path / "ckpt").mkdir()
    torch.save({"model": STATE, "ema": ema}, tmp_path / "ckpt" / "checkpoint.pt")
    card = collect_ok(capsys, tmp_path / "ckpt", tmp_path / "model", "--state-key", "ema")
    assert_published(tmp_path / "model", ema)
    assert card["state_key"] == "ema"


STATE_KEYS = {
    "an optimizer": ("optim", "is training state"),
    "inside an optimizer": ("optim.state.0", "is training state"),
    "absent": ("model.encoder", "holds no state dict at 'model.encoder'"),
}


@pytest.mark.bad_input
@pytest.mark.parametrize(("key", "problem"), STATE_KEYS.values(), ids=STATE_KEYS.keys())
def test_a_bad_state_key_is_one_line(key, problem, tmp_path, capsys) -> None:
    model, optimizer = trained_model()
    dcp.save({"model": model.state_dict(), "optim": optimizer.state_dict()},
             checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)  # fmt: skip
    code, _, err = collect_cli(capsys, tmp_path / "ckpt", tmp_path / "model", "--state-key", key)
    assert code == 2, err
    refused_in_one_line(code, err, "state_key", problem)
    nothing_published(tmp_path / "model")


@pytest.mark.bad_input
def test_state_key_on_a_flat_file_is_refused(tmp_path, capsys) -> None:
    (tmp_path / "ckpt").mkdir()
    torch.save(STATE, tmp_path / "ckpt" / "model.pt")
    # a plain state dict has no nesting: the top level is the only node
    code, _, err = collect_cli(capsys, tmp_path / "ckpt", tmp_path / "m", "--state-key", "model")
    refused_in_one_line(code, err, "state_key", "holds no state dict at 'model'")


# --- the model factory, when known ---------------------------------------------------------------


def wrong_build(sample_shape: list[int], num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, num_classes))


def owned_build(sample_shape: list[int], num_classes: int) -> nn.Module:
    """A model whose own first attribute is ``model`` (its names keep the prefix)."""
    holder = nn.Module()
    holder.model = build(sample_shape, num_classes)
    return holder


FACTORY = __name__


def test_a_factory_the_tensors_do_not_load_into_is_refused(digits_dir, tmp_path, capsys) -> None:
    (tmp_path / "ckpt").mkdir()
    torch.save({"model_state_dict": STATE}, tmp_path / "ckpt" / "model.pt")
    code, _, err = collect_cli(
        capsys, tmp_path / "ckpt", tmp_path / "model", "--model-factory",
        f"{FACTORY}:wrong_build", "--data", digits_dir,
    )  # fmt: skip
    refused_in_one_line(
        code, err, "does not load into model_factory", "wrong_build", "lacks '3.bias'"
    )
    nothing_published(tmp_path / "model")
    code, _, err = collect_cli(
        capsys, tmp_path / "ckpt", tmp_path / "model", "--model-factory", f"{FACTORY}:build",
        "--data", digits_dir,
    )  # fmt: skip
    assert code == 0, err


def test_the_factory_decides_whether_lightnings_prefix_stays(digits_dir, tmp_path, capsys):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    torch.save(lightning_checkpoint(STATE, 1, 20), folder / "last.ckpt")
    collect_ok(
        capsys, folder, tmp_path / "plain", "--model-factory", f"{FACTORY}:build", "--data",
        digits_dir,
    )  # fmt: skip
    assert_published(tmp_path / "plain", STATE)
    collect_ok(
        capsys, folder, tmp_path / "owned", "--model-factory", f"{FACTORY}:owned_build", "--data",
        digits_dir,
    )  # fmt: skip
    assert_published(tmp_path / "owned", {f"model.{k}": v for k, v in STATE.items()})


# --- NaN and Inf ---------------------------------------------------------------------------------

NONFINITE = {
    "float32 NaN": (torch.float32, float("nan")),
    "bfloat16 Inf": (torch.bfloat16, float("inf")),
    "float16 -Inf": (torch.float16, float("-inf")),
}


@pytest.mark.bad_input
@pytest.mark.parametrize(("dtype", "value"), NONFINITE.values(), ids=NONFINITE.keys())
def test_a_model_holding_nan_or_inf_is_refused_unless_allowed(dtype, value, tmp_path, capsys):
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in STATE.items()}
    state["4.weight"] = state["4.weight"].clone()
    state["4.weight"][3, 7] = value
    (tmp_path / "ckpt").mkdir()
    torch.save(state, tmp_path / "ckpt" / "model.pt")
    code, _, err = collect_cli(capsys, tmp_path / "ckpt", tmp_path / "model")
    refused_in_one_line(code, err, "'4.weight'", "NaN or Inf", "element 103", "--allow-nonfinite")
    nothing_published(tmp_path / "model")
    code, _, err = collect_cli(capsys, tmp_path / "ckpt", tmp_path / "model", "--allow-nonfinite")
    assert code == 0, err
    published = load_file(str(tmp_path / "model" / "model.safetensors"))
    assert sorted(published) == sorted(state)
    for name, tensor in state.items():  # bit for bit, NaN included
        assert torch.equal(
            published[name].reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8)
        ), name


@pytest.mark.bad_input
def test_our_own_checkpoint_of_a_diverged_model_is_refused(tmp_path, capsys) -> None:
    model = build([1, 8, 8], 10)
    with torch.no_grad():
        model[1].bias[0] = float("nan")
    save_checkpoint(
        tmp_path / "ckpt", model, torch.optim.SGD(model.parameters(), lr=0.1), epoch=1, step=1,
        strategy="ddp", model_info={"spec": "mlp", "sample_shape": [1, 8, 8], "num_classes": 10},
        metrics=[],
    )  # fmt: skip
    code, _, err = collect_cli(capsys, tmp_path / "ckpt", tmp_path / "model")
    refused_in_one_line(code, err, "'1.bias'", "NaN or Inf")
    nothing_published(tmp_path / "model")


def test_the_search_goes_deep_but_not_into_our_own_folders(tmp_path, capsys) -> None:
    deep = tmp_path / "ckpt" / "a" / "b" / "c" / "d"
    deep.mkdir(parents=True)
    torch.save(STATE, deep / "model.pt")
    old = time.time() - 3600
    os.utime(deep / "model.pt", (old, old))
    card = collect_ok(capsys, tmp_path / "ckpt", tmp_path / "model")
    assert card["source_file"] == "a/b/c/d/model.pt"


def test_a_pickled_attribute_dict_is_read_as_a_dict_without_running_lightning(tmp_path, capsys):
    """Lightning's AttributeDict (older releases pickle ``hparams`` as one) is allowlisted by
    name as a plain dict: weights_only alone refuses the file."""
    data = pytest.importorskip("lightning.fabric.utilities.data")
    checkpoint = lightning_checkpoint(STATE, 2, 30)
    checkpoint["hyper_parameters"] = data.AttributeDict(lr=0.001, hidden=32)
    (tmp_path / "ckpt").mkdir()
    torch.save(checkpoint, tmp_path / "ckpt" / "last.ckpt")
    with pytest.raises(Exception, match="Unsupported global"):
        torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    card = collect_ok(capsys, tmp_path / "ckpt", tmp_path / "model")
    assert_published(tmp_path / "model", STATE)
    assert (card["source_format"], card["epoch"], card["step"]) == ("lightning", 2, 30)


@pytest.mark.parametrize("seed", range(6))
def test_the_streaming_scan_finds_what_a_second_read_finds(seed, tmp_path) -> None:
    """The scan that watches the bytes as they are written (split anywhere, mid-element and
    mid-header included, over tensors of mixed widths at unaligned offsets) names the same
    first NaN/Inf as reading the file again, and nothing in a finite file."""
    from safetensors.torch import save_file

    from kubetrain.artifacts.checkpoint_formats.writer import NonfiniteScan, refuse_nonfinite
    from kubetrain.errors import IntegrityError

    generator = torch.Generator().manual_seed(seed)
    state = {
        "a.int": torch.arange(7, dtype=torch.int8),
        "b.half": torch.randn(13, generator=generator).half(),
        "c.bf16": torch.randn(5, 3, generator=generator).bfloat16(),
        "d.float": torch.randn(33, generator=generator),
        "e.double": torch.randn(9, generator=generator).double(),
    }
    for poisoned in (None, "c.bf16", "d.float", "e.double"):
        if poisoned is not None:
            flat = state[poisoned].reshape(-1)
            flat[int(torch.randint(flat.numel(), (1,), generator=generator))] = float("nan")
        path = tmp_path / f"{seed}-{poisoned}.safetensors"
        save_file(state, str(path))
        data = path.read_bytes()
        scan, offset = NonfiniteScan(), 0
        while offset < len(data):
            step = int(torch.randint(1, 40, (1,), generator=generator))
            scan.feed(offset, data[offset : offset + step])
            offset += step
        assert not scan.incomplete(len(data))
        try:
            refuse_nonfinite(path, "m")
            expected = None
        except IntegrityError as exc:
            expected = str(exc)
        if expected is None:
            assert scan.found is None
            scan.refuse(path, "m")
        else:
            with pytest.raises(IntegrityError) as raised:
                scan.refuse(path, "m")
            assert str(raised.value) == expected


def test_a_relative_checkpoint_dir_is_recorded_absolute(tmp_path, capsys, monkeypatch) -> None:
    (tmp_path / "ckpt").mkdir()
    torch.save(STATE, tmp_path / "ckpt" / "model.pt")
    monkeypatch.chdir(tmp_path)
    card = collect_ok(capsys, Path("ckpt"), Path("model"))
    assert card["source_checkpoint"] == str(tmp_path / "ckpt")
