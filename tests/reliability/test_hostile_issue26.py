"""Hostile review of the "Your own training code" surfaces (issue 26), written from the user
documentation only (README "Your own training code" + the failure-output paragraph, and the
``--help`` of collect, evaluate, wait, logs, run and launch).

Seven classes: checkpoints that are not the model, ``--state-key`` abuse, NaN/Inf, the search,
the ``--model-factory`` check, paths and interpreters, failure output. Every case states what
the docs promise; a case that BROKE asserts the documented (correct) behaviour, so it fails
until the product is fixed. Unit-sized checkpoints (``torch.save``/``dcp.save``) through the
CLI's ``main`` in process; subprocesses only where the process boundary is the point (a
factory that exits, a user's venv, two real torchrun jobs).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save, save_file
from torch import nn

from tests.support.processes import kubetrain_in_process as run_cli
from tests.support.seed_script import NETDEF

KUBETRAIN = Path(sys.executable).parent / "kubetrain"

MODEL_KEYS = {"1.weight", "1.bias", "3.weight", "3.bias"}


# ------------------------------------------------------------------------------- helpers
def model_sd(seed: int = 0) -> dict[str, torch.Tensor]:
    """netdef:build's state dict for digits ([1, 8, 8], 10 classes)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    return model.state_dict()


def optimizer_sd() -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 1, 8, 8)).sum().backward()
    optimizer.step()
    return optimizer.state_dict()


def lightning_ckpt(state_dict: dict, **extra) -> dict:
    """What Lightning's ModelCheckpoint writes, built with torch.save's plain types."""
    return {
        "epoch": 1, "global_step": 20, "pytorch-lightning_version": "2.6.0",
        "state_dict": state_dict, "optimizer_states": [optimizer_sd()], "lr_schedulers": [],
        "callbacks": {}, "loops": {}, "hyper_parameters": {"lr": 0.01}, **extra,
    }  # fmt: skip


def prefixed(prefix: str, seed: int = 0) -> dict[str, torch.Tensor]:
    return {prefix + key: value for key, value in model_sd(seed).items()}


class Collected:
    def __init__(self, code: int, out: str, err: str, output: Path):
        self.code, self.out, self.err, self.output = code, out, err, output
        self.published = (
            load_file(output / "model.safetensors")
            if (output / "model.safetensors").exists()
            else None
        )
        self.card = (
            json.loads((output / "model.json").read_text())
            if (output / "model.json").exists()
            else None
        )


def collect(tmp_path: Path, capsys, *extra, ckpt: Path | None = None, out: str = "out"):
    output = tmp_path / out
    shutil.rmtree(output, ignore_errors=True)
    args = ["collect", "--checkpoint-dir", ckpt or tmp_path / "ck", "--output", output, *extra]
    return Collected(*run_cli(args, capsys), output)


def ck(tmp_path: Path) -> Path:
    folder = tmp_path / "ck"
    folder.mkdir(exist_ok=True)
    return folder


def assert_refused(result: Collected, *needles: str, prog: str = "kubetrain collect") -> str:
    """One line ``PROG: error: PROBLEM; FIX`` naming each needle, exit non-zero, no model."""
    assert result.code != 0, f"exit 0: {result.out}"
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{result.err}"
    assert lines[0].startswith(f"{prog}: error: ") and "; " in lines[0], lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]}"
    assert "\x1b" not in lines[0]
    assert result.published is None and not (result.output / "model.json").exists()
    return lines[0]


def assert_same(published: dict, expected: dict) -> None:
    assert set(published) == set(expected), sorted(published)
    for key, value in expected.items():
        assert torch.equal(published[key], value), key


def write_netdef(folder: Path, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(NETDEF))


# =========================================================== 1. checkpoints not the model
@pytest.mark.bad_input
def test_1a_optimizer_state_dict_saved_as_model_pt_is_refused(tmp_path, capsys):
    torch.save(optimizer_sd(), ck(tmp_path) / "model.pt")
    assert_refused(collect(tmp_path, capsys), "training state")


def test_1b_model_next_to_optimizer_scheduler_scaler_publishes_only_the_model(tmp_path, capsys):
    torch.save(
        {"model": model_sd(), "adam": optimizer_sd(),
         "scaler": {"scale": 65536.0, "_growth_tracker": 0}, "sched": {"last_epoch": 3}},
        ck(tmp_path) / "ckpt.pt",
    )  # fmt: skip
    result = collect(tmp_path, capsys)
    assert result.code == 0, result.err
    assert_same(result.published, model_sd())


@pytest.mark.bad_input
def test_1c_flattened_optimizer_moments_are_not_published_as_a_model(tmp_path, capsys):
    """BROKE: {'state.0.exp_avg': ..., 'state.0.exp_avg_sq': ..., 'state.0.step': ...} is
    published as the model with exit 0 ("optimizer state is never published")."""
    state = optimizer_sd()["state"]
    flat = {f"state.{i}.{name}": t for i, s in state.items() for name, t in s.items()}
    torch.save(flat, ck(tmp_path) / "model.pt")
    assert_refused(collect(tmp_path, capsys), "exp_avg")


def test_1d_model_three_levels_deep_is_found_without_optimizer(tmp_path, capsys):
    torch.save(
        {"trainer": {"state": {"model": model_sd()}}, "optim": optimizer_sd()},
        ck(tmp_path) / "ckpt.pt",
    )
    result = collect(tmp_path, capsys)
    assert result.code == 0, result.err
    assert_same(result.published, model_sd())
    assert result.card["state_key"] == "trainer.state.model"


@pytest.mark.bad_input
def test_1e_model_and_ema_are_refused_listing_both(tmp_path, capsys):
    torch.save({"model": model_sd(0), "ema": model_sd(1)}, ck(tmp_path) / "ckpt.pt")
    assert_refused(collect(tmp_path, capsys), "'ema'", "'model'", "--state-key")


def test_1e2_state_key_ema_publishes_the_ema(tmp_path, capsys):
    torch.save({"model": model_sd(0), "ema": model_sd(1)}, ck(tmp_path) / "ckpt.pt")
    result = collect(tmp_path, capsys, "--state-key", "ema")
    assert result.code == 0, result.err
    assert_same(result.published, model_sd(1))


@pytest.mark.bad_input
def test_1f_timm_state_dict_and_state_dict_ema_are_refused(tmp_path, capsys):
    """BROKE: timm's {'state_dict', 'state_dict_ema'} silently publishes 'state_dict', while
    {'model', 'model_ema'} is refused as two candidate models."""
    torch.save(
        {"epoch": 3, "arch": "mlp", "state_dict": model_sd(0), "state_dict_ema": model_sd(1),
         "optimizer": optimizer_sd()},
        ck(tmp_path) / "checkpoint-3.pth",
    )  # fmt: skip
    assert_refused(collect(tmp_path, capsys), "state_dict_ema", "--state-key")


@pytest.mark.bad_input
def test_1g_teacher_and_student_are_refused(tmp_path, capsys):
    torch.save({"teacher": model_sd(0), "student": model_sd(1)}, ck(tmp_path) / "ckpt.pt")
    assert_refused(collect(tmp_path, capsys), "'student'", "'teacher'", "--state-key")


def dcp_model_and_optim() -> tuple[nn.Module, dict, dict]:
    """A stepped model and its (model, optimizer) state dicts as DCP's get_state_dict gives."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 1, 8, 8)).sum().backward()
    optimizer.step()
    model_state, optim_state = get_state_dict(model, optimizer)
    return model, model_state, optim_state


def _dcp_save(state: dict, folder: Path) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=str(folder))


def test_1h_dcp_app_model_with_optimizer_and_extras_publishes_only_the_model(tmp_path, capsys):
    model, model_state, optim_state = dcp_model_and_optim()
    _dcp_save(
        {"app": {"model": model_state, "optim": optim_state, "epoch": 4, "note": "hello",
                 "rng": torch.get_rng_state()}, "step": 10},
        ck(tmp_path) / "checkpoint",
    )  # fmt: skip
    result = collect(tmp_path, capsys)
    assert result.code == 0, result.err
    assert_same(result.published, {k: v.detach() for k, v in model.state_dict().items()})
    assert result.card["source_format"] == "dcp" and result.card["state_key"] == "app.model"


@pytest.mark.bad_input
def test_1i_dcp_optimizer_only_is_refused(tmp_path, capsys):
    _dcp_save({"optim": dcp_model_and_optim()[2]}, ck(tmp_path) / "checkpoint")
    assert_refused(collect(tmp_path, capsys), "training state")


def test_1j_lightning_ckpt_publishes_the_model_without_its_prefix(tmp_path, capsys):
    folder = ck(tmp_path) / "lightning_logs/version_0/checkpoints"
    folder.mkdir(parents=True)
    torch.save(lightning_ckpt(prefixed("model.")), folder / "epoch=1-step=20.ckpt")
    result = collect(tmp_path, capsys)
    assert result.code == 0, result.err
    assert_same(result.published, model_sd())
    assert result.card["source_format"] == "lightning" and result.card["step"] == 20


@pytest.mark.bad_input
@pytest.mark.parametrize("second", ["ema_model.", "teacher."])
def test_1k_lightning_module_holding_two_models_is_refused(second, tmp_path, capsys):
    """BROKE: a LightningModule with self.model and self.ema_model (or a teacher) publishes
    both sets of tensors, prefixes kept, as one "model" with exit 0 (a real Lightning run
    with an EMA copy does the same)."""
    folder = ck(tmp_path) / "lightning_logs/version_0/checkpoints"
    folder.mkdir(parents=True)
    state = {**prefixed("model."), **prefixed(second, 1)}
    torch.save(lightning_ckpt(state), folder / "epoch=1-step=20.ckpt")
    assert_refused(collect(tmp_path, capsys), second.rstrip("."), "--state-key")


def test_1l_state_key_picks_one_model_of_a_lightning_module(tmp_path, capsys, digits_dir):
    """BROKE: with --model-factory, the refusal's fix says --state-key, but no --state-key
    selects one model in a Lightning state_dict ('state_dict.model' is 'no state dict'),
    although DCP's flat key paths are selectable the same way ('app.model')."""
    write_netdef(tmp_path / "code", "netdef_h26")
    folder = ck(tmp_path) / "lightning_logs/version_0/checkpoints"
    folder.mkdir(parents=True)
    state = {**prefixed("model."), **prefixed("ema_model.", 1)}
    torch.save(lightning_ckpt(state), folder / "epoch=1-step=20.ckpt")
    cwd = os.getcwd()
    os.chdir(tmp_path / "code")
    try:
        result = collect(
            tmp_path, capsys, "--state-key", "state_dict.model",
            "--model-factory", "netdef_h26:build", "--data", digits_dir,
        )  # fmt: skip
    finally:
        os.chdir(cwd)
    assert result.code == 0, result.err
    assert_same(result.published, model_sd())


@pytest.mark.bad_input
def test_1m_lightning_ema_callback_state_is_refused(tmp_path, capsys):
    folder = ck(tmp_path)
    state = lightning_ckpt(
        prefixed("model."), callbacks={"EMA": {"ema_state_dict": prefixed("model.", 1)}}
    )
    torch.save(state, folder / "epoch=1-step=20.ckpt")
    assert_refused(collect(tmp_path, capsys), "callbacks.EMA.ema_state_dict", "state_dict")


def _hf(folder: Path, extra: dict | None = None, drop: str | None = None) -> None:
    state = model_sd()
    keys = sorted(state)
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    save_file({k: state[k].contiguous() for k in keys[:2]}, folder / names[0])
    save_file({k: state[k].contiguous() for k in keys[2:]}, folder / names[1])
    weight_map = {k: names[0] if i < 2 else names[1] for i, k in enumerate(keys)}
    weight_map.update(extra or {})
    if drop:
        weight_map.pop(drop)
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.bad_input
def test_1n_hf_index_naming_a_tensor_its_shard_lacks_is_refused(tmp_path, capsys):
    _hf(ck(tmp_path), extra={"4.weight": "model-00002-of-00002.safetensors"})
    assert_refused(collect(tmp_path, capsys), "'4.weight'")


@pytest.mark.bad_input
def test_1o_hf_index_naming_a_missing_shard_is_refused(tmp_path, capsys):
    _hf(ck(tmp_path), extra={"4.weight": "model-00003-of-00003.safetensors"})
    assert_refused(collect(tmp_path, capsys), "model-00003-of-00003.safetensors")


def test_1p_hf_shard_tensor_missing_from_index_is_not_silently_dropped(tmp_path, capsys):
    """BROKE: a shard holds '3.bias' that the index omits; the model is published without it,
    exit 0 (an incomplete model that evaluate cannot load)."""
    _hf(ck(tmp_path), drop="3.bias")
    result = collect(tmp_path, capsys)
    assert result.code != 0 or set(result.published) == MODEL_KEYS, sorted(result.published)


# ================================================================== 2. --state-key abuse
@pytest.fixture
def nested(tmp_path):
    torch.save(
        {"model": model_sd(0), "ema": model_sd(1), "optimizer": optimizer_sd(),
         "a.b": model_sd(2), "epoch": 3, "t": torch.ones(3)},
        ck(tmp_path) / "ckpt.pt",
    )  # fmt: skip
    return tmp_path


@pytest.mark.bad_input
def test_2a_empty_state_key_on_an_ambiguous_checkpoint_publishes_nothing(nested, capsys):
    assert_refused(collect(nested, capsys, "--state-key", ""), "--state-key")


@pytest.mark.bad_input
@pytest.mark.parametrize("key", ["model.nope", "does.not.exist", ".model", "model..", "MODEL"])
def test_2b_dotted_path_that_does_not_exist_is_refused(key, nested, capsys):
    line = assert_refused(collect(nested, capsys, "--state-key", key), "state_key", "'ema'")
    assert "'model'" in line


@pytest.mark.bad_input
@pytest.mark.parametrize("key", ["optimizer", "optimizer.state", "optimizer.state.0"])
def test_2c_path_into_optimizer_state_is_refused(key, nested, capsys):
    assert_refused(collect(nested, capsys, "--state-key", key), "state_key", "training state")


@pytest.mark.bad_input
@pytest.mark.parametrize("key", ["t", "model.1.weight", "epoch", "optimizer.state.0.exp_avg"])
def test_2d_key_naming_a_tensor_or_number_is_refused(key, nested, capsys):
    assert_refused(collect(nested, capsys, "--state-key", key), "state_key")


@pytest.mark.bad_input
@pytest.mark.parametrize("key", ["ema\n", "ema ", "\\x65ma", "\x1b[2Jema"])
def test_2e_trailing_newline_and_escapes_are_refused_escaped(key, nested, capsys):
    line = assert_refused(collect(nested, capsys, "--state-key", key), "state_key")
    assert "\n" not in line.strip() and "\x1b" not in line


def test_2f_key_with_a_dot_inside_is_selectable(nested, capsys):
    result = collect(nested, capsys, "--state-key", "a.b")
    assert result.code == 0, result.err
    assert_same(result.published, model_sd(2))


@pytest.mark.bad_input
def test_2g_ambiguous_dotted_path_is_refused(tmp_path, capsys):
    """BROKE: {'a': {'b': sd0}, 'a.b': sd1}: the refusal lists "'a.b', 'a.b'" and
    --state-key a.b then publishes one of them (the nested one) with exit 0; the other cannot
    be named at all."""
    torch.save({"a": {"b": model_sd(0)}, "a.b": model_sd(1)}, ck(tmp_path) / "ckpt.pt")
    assert_refused(collect(tmp_path, capsys, "--state-key", "a.b"), "a.b")


@pytest.mark.bad_input
def test_2h_dcp_state_key_into_the_optimizer_is_refused(tmp_path, capsys):
    _, model_state, optim_state = dcp_model_and_optim()
    _dcp_save({"app": {"model": model_state, "optim": optim_state}}, ck(tmp_path) / "c")
    assert_refused(collect(tmp_path, capsys, "--state-key", "app.optim"), "training state")


# ============================================================================== 3. NaN/Inf
def _nonfinite(tmp_path, mutate, name="model.pt"):
    state = model_sd()
    mutate(state)
    if name.endswith(".safetensors"):
        save_file({k: v.contiguous() for k, v in state.items()}, ck(tmp_path) / name)
    else:
        torch.save(state, ck(tmp_path) / name)


def _set(key, value, dtype=None, index=0):
    def mutate(state):
        tensor = state.get(key, torch.zeros(64))
        if dtype is not None:
            tensor = tensor.to(dtype)
        tensor.view(-1)[index] = value
        state[key] = tensor

    return mutate


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("name", "mutate", "tensor"),
    [
        ("model.pt", lambda s: s.update({"bn.num_batches_tracked": torch.tensor(float("nan"))}),
         "bn.num_batches_tracked"),
        ("model.pt", _set("3.weight", float("inf"), torch.bfloat16), "3.weight"),
        ("model.safetensors", _set("3.bias", float("-inf"), torch.float16, 5), "3.bias"),
        ("model.pt", _set("3.bias", 70000.0, torch.float16, 5), "3.bias"),  # overflows to inf
        ("model.pt", _set("bn.running_var", float("nan"), None, 3), "bn.running_var"),
    ],
    ids=["nan-int-looking-buffer", "inf-bf16", "inf-fp16-safetensors", "fp16-overflow",
         "nan-batchnorm-running-var"],
)  # fmt: skip
def test_3a_nonfinite_tensor_is_refused_naming_it(name, mutate, tensor, tmp_path, capsys):
    _nonfinite(tmp_path, mutate, name)
    assert_refused(collect(tmp_path, capsys), f"'{tensor}'", "--allow-nonfinite")


def test_3b_huge_finite_values_are_published(tmp_path, capsys):
    _nonfinite(tmp_path, _set("1.weight", 3.0e38))
    result = collect(tmp_path, capsys)
    assert result.code == 0, result.err
    assert result.published["1.weight"].view(-1)[0].item() == pytest.approx(3.0e38)


@pytest.mark.parametrize(
    ("spelling", "published"),
    [([], True), (["true"], True), (["True"], True), (["false"], False)],
)
def test_3c_allow_nonfinite_spellings(spelling, published, tmp_path, capsys):
    _nonfinite(tmp_path, _set("1.weight", float("nan")))
    result = collect(tmp_path, capsys, "--allow-nonfinite", *spelling)
    assert (result.published is not None) is published, result.err
    assert (result.code == 0) is published


@pytest.mark.bad_input
@pytest.mark.parametrize("spelling", ["1", "yes", "0", "no", "maybe", ""])
def test_3d_allow_nonfinite_other_spellings_are_refused(spelling, tmp_path, capsys):
    _nonfinite(tmp_path, _set("1.weight", float("nan")))
    result = collect(tmp_path, capsys, "--allow-nonfinite", spelling)
    assert result.code == 2
    assert_refused(result, "--allow-nonfinite")


def test_3e_nan_only_in_optimizer_state_does_not_block_the_model(tmp_path, capsys):
    optimizer = optimizer_sd()
    optimizer["state"][0]["exp_avg"].view(-1)[0] = float("nan")
    torch.save({"model": model_sd(), "optimizer": optimizer}, ck(tmp_path) / "ckpt.pt")
    result = collect(tmp_path, capsys)
    assert result.code == 0, result.err
    assert_same(result.published, model_sd())


@pytest.mark.bad_input
def test_3f_inf_in_a_dcp_model_is_refused(tmp_path, capsys):
    state = model_sd()
    state["3.bias"][9] = float("inf")
    _dcp_save({"app": {"model": state}}, ck(tmp_path) / "checkpoint")
    assert_refused(collect(tmp_path, capsys), "'3.bias'")


# =============================================================================== 4. search
def _deep(root: Path, depth: int) -> Path:
    folder = root.joinpath(*[f"l{i}" for i in range(depth)])
    folder.mkdir(parents=True)
    return folder


def test_4a_checkpoint_nine_folders_below_is_found(tmp_path, capsys):
    """BROKE: the search stops at 8 folders; 9 below is "holds no checkpoint ... in any folder
    below"."""
    torch.save(model_sd(), _deep(ck(tmp_path), 9) / "model.pt")
    result = collect(tmp_path, capsys)
    assert result.code == 0, result.err
    assert_same(result.published, model_sd())


def test_4b_newest_deep_checkpoint_wins_over_a_stale_shallow_one(tmp_path, capsys):
    """BROKE (data): a stale shallow model is published, exit 0, while the newest sits 9
    folders below."""
    (ck(tmp_path) / "old").mkdir()
    torch.save(model_sd(1), ck(tmp_path) / "old/model.pt")
    os.utime(ck(tmp_path) / "old/model.pt", (1e9, 1e9))
    torch.save(model_sd(2), _deep(ck(tmp_path), 9) / "model.pt")
    result = collect(tmp_path, capsys)
    assert result.code == 0, result.err
    assert_same(result.published, model_sd(2))


@pytest.mark.bad_input
@pytest.mark.parametrize("target", ["outside", "/etc/passwd"])
def test_4c_symlink_out_of_the_folder_is_refused_unread(target, tmp_path, capsys):
    outside = tmp_path / "outside.pt"
    torch.save(model_sd(5), outside)
    (ck(tmp_path) / "model.pt").symlink_to(outside if target == "outside" else target)
    assert_refused(collect(tmp_path, capsys), "outside")


@pytest.mark.bad_input
@pytest.mark.parametrize("given", [False, True], ids=["searched", "checkpoint-file"])
def test_4d_fifo_named_model_pt_is_refused_without_hanging(given, tmp_path, capsys):
    os.mkfifo(ck(tmp_path) / "model.pt")
    alarm = threading.Timer(30, lambda: os.open(ck(tmp_path) / "model.pt", os.O_WRONLY))
    alarm.daemon = True
    alarm.start()  # unblocks a reader that opened the FIFO, so a hang fails instead of hanging
    started = time.monotonic()
    extra = ["--checkpoint-file", "model.pt"] if given else []
    result = collect(tmp_path, capsys, *extra)
    alarm.cancel()
    assert time.monotonic() - started < 20
    assert_refused(result, "FIFO")


def _grow(path: Path, data: bytes, pause: float, chunks: int = 6) -> None:
    """Write ``data`` in ``chunks`` pieces, ``pause`` seconds apart (a slow writer)."""
    with open(path, "wb") as file:
        step = len(data) // chunks + 1
        for i in range(chunks):
            file.write(data[i * step : (i + 1) * step])
            file.flush()
            time.sleep(pause)


@pytest.mark.parametrize("kind", ["pt", "safetensors"])
def test_4e_a_file_still_being_written_is_never_taken(kind, tmp_path, capsys):
    """BROKE: a writer that pauses about a second between writes (a slow or network file
    system) has its half-written model_2 taken and the collect refused ("truncated or
    corrupt" / "the tensors' data is N bytes, the file holds M"), exit 1, instead of taking
    the complete model_1.pt. A writer pausing 0.3 s or less is skipped correctly."""
    torch.save(model_sd(1), ck(tmp_path) / "model_1.pt")
    os.utime(ck(tmp_path) / "model_1.pt", (time.time() - 600,) * 2)
    if kind == "pt":
        buffer = io.BytesIO()
        torch.save(model_sd(2), buffer)
        data, target = buffer.getvalue(), ck(tmp_path) / "model_2.pt"
    else:
        data = save({k: v.contiguous() for k, v in model_sd(2).items()})
        target = ck(tmp_path) / "model_2.safetensors"
    writer = threading.Thread(target=_grow, args=(target, data, 1.0))
    writer.start()
    time.sleep(1.5)
    try:
        result = collect(tmp_path, capsys)
        still_writing = writer.is_alive()
    finally:
        writer.join()
    assert still_writing
    assert result.code == 0, result.err
    assert result.card["source_file"] == "model_1.pt"


@pytest.mark.parametrize(
    "newer",
    [".model.pt", "model.pt.tmp", "model.pt.partial", ".hidden/model.pt", "x.tmp/model.pt",
     "x.partial/model.pt", ".ipynb_checkpoints/model.pt"],
)  # fmt: skip
def test_4f_hidden_and_temporary_names_are_skipped(newer, tmp_path, capsys):
    torch.save(model_sd(1), ck(tmp_path) / "model.pt")
    os.utime(ck(tmp_path) / "model.pt", (1e9, 1e9))
    (ck(tmp_path) / newer).parent.mkdir(parents=True, exist_ok=True)
    torch.save(model_sd(2), ck(tmp_path) / newer)
    result = collect(tmp_path, capsys)
    assert result.code == 0, result.err
    assert result.card["source_file"] == "model.pt"


@pytest.mark.parametrize(
    ("files", "newest"),
    [
        (["epoch=10-step=100.ckpt", "epoch=9-step=90.ckpt"], "epoch=10-step=100.ckpt"),
        (["model_epoch_10.pt", "model_epoch_9.pt"], "model_epoch_10.pt"),
        (["lightning_logs/version_10/checkpoints/epoch=1-step=10.ckpt",
          "lightning_logs/version_1/checkpoints/epoch=1-step=10.ckpt"],
         "lightning_logs/version_10/checkpoints/epoch=1-step=10.ckpt"),
    ],
    ids=["epoch=9-vs-10", "model_epoch_9-vs-10", "version_1-vs-10"],
)  # fmt: skip
def test_4g_numbered_families_take_the_highest_number_not_the_newest_mtime(
    files, newest, tmp_path, capsys
):
    for i, name in enumerate(files):  # the lower number is written last
        path = ck(tmp_path) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        state = prefixed("model.", i)
        torch.save(lightning_ckpt(state) if name.endswith(".ckpt") else model_sd(i), path)
        os.utime(path, (1e9 + i, 1e9 + i))
    result = collect(tmp_path, capsys)
    assert result.code == 0, result.err
    assert result.card["source_file"] == newest


@pytest.mark.bad_input
def test_4h_folder_of_only_non_checkpoint_files_is_refused(tmp_path, capsys):
    for name, text in [("train.log", "x"), ("config.yaml", "a: 1"), ("metrics.json", "{}")]:
        (ck(tmp_path) / name).write_text(text)
    assert_refused(collect(tmp_path, capsys), "holds no checkpoint", "--checkpoint-file")


# ================================================================ 5. the model-factory check
FACTORIES = """
import sys
from torch import nn


def wider(sample_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, num_classes))


def renamed(sample_shape, num_classes):
    model = nn.Module()
    model.fc1, model.fc2 = nn.Linear(64, 64), nn.Linear(64, num_classes)
    return model


def raises(sample_shape, num_classes):
    raise RuntimeError("factory boom \\x1b[2J")


def exits(sample_shape, num_classes):
    sys.exit(0)
"""


@pytest.fixture
def factory_folder(tmp_path, monkeypatch, digits_dir):
    code = tmp_path / "code"
    write_netdef(code, "netdef_h26")
    (code / "factories_h26.py").write_text(textwrap.dedent(FACTORIES))
    torch.save(model_sd(), ck(tmp_path) / "model.pt")
    monkeypatch.chdir(code)
    return tmp_path


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("factory", "needles"),
    [
        ("factories_h26:wider", ["'1.bias'", "[128]"]),
        ("factories_h26:renamed", ["'fc1.bias'"]),
        ("factories_h26:raises", ["model_factory", "RuntimeError"]),
        ("nomodule_h26:build", ["model_factory", "nomodule_h26"]),
    ],
    ids=["shapes-differ", "keys-differ", "raises", "not-importable"],
)
def test_5a_factory_mismatch_or_failure_is_refused(
    factory, needles, factory_folder, capsys, digits_dir
):
    result = collect(factory_folder, capsys, "--model-factory", factory, "--data", digits_dir)
    assert_refused(result, *needles)


def test_5b_factory_module_in_the_current_folder_is_imported(factory_folder, capsys, digits_dir):
    result = collect(
        factory_folder, capsys, "--model-factory", "netdef_h26:build", "--data", digits_dir
    )
    assert result.code == 0, result.err
    assert result.card["model"]["spec"] == "netdef_h26:build"


def test_5c_factory_without_data_is_not_checked_as_documented(factory_folder, capsys):
    """Documented: the load check needs --model-factory *and* --data."""
    result = collect(factory_folder, capsys, "--model-factory", "factories_h26:wider")
    assert result.code == 0, result.err


def _collect_process(folder: Path, factory: str, data: Path, cwd: Path):
    command = [
        sys.executable, "-m", "kubetrain", "collect", "--checkpoint-dir", str(folder / "ck"),
        "--output", str(folder / "out"), "--model-factory", factory, "--data", str(data),
    ]  # fmt: skip
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.bad_input
def test_5d_factory_that_exits_zero_does_not_pass_for_a_collect(tmp_path, digits_dir):
    """BROKE: a factory (or its module) calling sys.exit(0) makes collect exit 0 with no
    output and nothing published: a pipeline goes on as if a model was collected."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "factories_h26.py").write_text(textwrap.dedent(FACTORIES))
    torch.save(model_sd(), ck(tmp_path) / "model.pt")
    result = _collect_process(tmp_path, "factories_h26:exits", digits_dir, code)
    assert not (tmp_path / "out/model.safetensors").exists()
    assert result.returncode != 0, "exit 0 with nothing published"
    assert result.stderr.strip().startswith("kubetrain collect: error:"), result.stderr
    assert "model_factory" in result.stderr


@pytest.mark.bad_input
def test_5e_factory_module_parsing_argv_is_refused_in_one_line(tmp_path, digits_dir):
    """BROKE: a factory module that runs argparse at import prints argparse's own
    "usage: kubetrain ... error: unrecognized arguments: collect ..." (it looks like kubetrain
    rejected its own command) instead of the one-line refusal naming model_factory."""
    code = tmp_path / "code"
    write_netdef(code, "netdef_h26")
    (code / "argfactory_h26.py").write_text(
        "import argparse\nfrom netdef_h26 import build\nargparse.ArgumentParser().parse_args()\n"
    )
    torch.save(model_sd(), ck(tmp_path) / "model.pt")
    result = _collect_process(tmp_path, "argfactory_h26:build", digits_dir, code)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("kubetrain collect: error:"), result.stderr
    assert "model_factory" in lines[0]


# ====================================================== 6. paths and interpreters
def test_6a_relative_folders_from_another_folder_become_absolute(tmp_path, capsys, monkeypatch):
    torch.save(model_sd(), ck(tmp_path) / "model.pt")
    elsewhere = tmp_path / "a" / "b"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    code, out, err = run_cli(
        ["collect", "--checkpoint-dir", "../../ck", "--output", "../../out"], capsys
    )
    assert code == 0, err
    card = json.loads((tmp_path / "out/model.json").read_text())
    assert card["source_checkpoint"] == str(tmp_path / "ck")


@pytest.mark.bad_input
@pytest.mark.parametrize("name", ["../outside.pt", "OUTSIDE"])
def test_6b_checkpoint_file_outside_the_folder_is_refused(name, tmp_path, capsys):
    torch.save(model_sd(1), ck(tmp_path) / "model.pt")
    torch.save(model_sd(3), tmp_path / "outside.pt")
    name = str(tmp_path / "outside.pt") if name == "OUTSIDE" else name
    assert_refused(collect(tmp_path, capsys, "--checkpoint-file", name), "checkpoint_file")


EVAL = """
import json, os
print("EVAL data", os.environ.get("KUBETRAIN_DATA_DIR"))
json.dump({"mse": 0.5, "loss": 0.1}, open(os.environ["KUBETRAIN_METRICS_FILE"], "w"))
"""


@pytest.fixture
def published_model(tmp_path, capsys, monkeypatch):
    torch.save(model_sd(), ck(tmp_path) / "model.pt")
    assert collect(tmp_path, capsys, out="model").code == 0
    work = tmp_path / "work"
    work.mkdir()
    (work / "eval.py").write_text(textwrap.dedent(EVAL))
    monkeypatch.chdir(work)
    return tmp_path


@pytest.mark.parametrize("with_data", [True, False])
def test_6c_evaluate_own_program_with_and_without_data(
    with_data, published_model, capsys, digits_dir
):
    data = ["--data", os.path.relpath(digits_dir)] if with_data else []
    program = ["--", sys.executable, "eval.py"]
    code, out, err = run_cli(
        ["evaluate", "--model", "../model", *data, "--metric", "loss", "--below", "0.2",
         *program],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    # the program's stdout is its own process's; its verdict line is ours
    assert "passed (loss < 0.2)" in out


@pytest.mark.bad_input
def test_6d_metric_without_a_bound_is_refused(published_model, capsys):
    code, out, err = run_cli(
        ["evaluate", "--model", "../model", "--metric", "mse", "--", sys.executable, "eval.py"],
        capsys,
    )
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("kubetrain evaluate: error:"), err
    assert "--threshold" in lines[0] and "--below" in lines[0]


@pytest.mark.bad_input
def test_6e_threshold_and_below_together_do_not_pass_a_model_under_the_threshold(
    published_model, capsys
):
    """BROKE: --threshold 0.9 --below 1.0 on mse 0.5: "passed (mse < 1)", exit 0: the
    threshold is silently dropped (with our accuracy, the verdict even reads "below threshold
    (accuracy < 0.02)" for accuracy 0.044). Either both gates apply (exit 3) or the pair is
    refused."""
    code, out, err = run_cli(
        ["evaluate", "--model", "../model", "--metric", "mse", "--threshold", "0.9",
         "--below", "1.0", "--", sys.executable, "eval.py"],
        capsys,
    )  # fmt: skip
    assert code == 2, out
    (line,) = [line for line in err.splitlines() if line.strip()]
    field = "below"  # the refusal names the field and both options
    assert f"error: {field}: " in line and "--threshold" in line and "not both" in line


TRAIN_PATH = """
import os, sys, torch
print("TRAIN python", sys.executable, flush=True)
print("TRAIN data", os.environ["KUBETRAIN_DATA_DIR"], flush=True)
print("TRAIN cwd", os.getcwd(), flush=True)
torch.save({"w": torch.zeros(1)}, "model.pt")
"""


def test_6f_launch_runs_your_venvs_python_first_on_path(tmp_path, digits_dir):
    """`python -m venv --system-site-packages /tmp/uv && source /tmp/uv/bin/activate`, then
    the absolute kubetrain path: the program runs the venv's python, with absolute paths."""
    venv = tmp_path / "uv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)  # fmt: skip
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "zz_kubetrain_torch.pth").write_text(
        next(Path(sys.prefix).glob("lib/python*/site-packages")).as_posix() + "\n"
    )  # the user's venv has torch too
    project = tmp_path / "project"
    project.mkdir()
    (project / "train_path.py").write_text(textwrap.dedent(TRAIN_PATH))
    env = {
        **os.environ, "VIRTUAL_ENV": str(venv),
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "KUBETRAIN_LOCAL_ROOT": str(tmp_path / "jobs"), "OMP_NUM_THREADS": "1",
    }  # fmt: skip
    data = os.path.relpath(digits_dir, project)
    launch = subprocess.run(
        [str(KUBETRAIN), "launch", "--nodes", "1", "--data", data, "--checkpoint-dir", "../ckl",
         "--script", "train_path.py", "--", "python", "train_path.py"],
        cwd=project, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert launch.returncode == 0, launch.stderr
    name = launch.stdout.strip().splitlines()[-1]
    wait = subprocess.run([str(KUBETRAIN), "wait", name], cwd=project, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert wait.returncode == 0, wait.stdout + wait.stderr
    assert f"TRAIN python {venv / 'bin' / 'python'}" in wait.stdout
    assert f"TRAIN data {digits_dir}" in wait.stdout
    assert f"TRAIN cwd {tmp_path / 'ckl'}" in wait.stdout
    assert (tmp_path / "ckl/model.pt").exists()


# ============================================================================ 7. failure output
FAIL = """
import sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"hello from rank {rank}", flush=True)
if rank == 1:
    raise RuntimeError("boom \\x1b[2J on rank 1 " + "L" * int(sys.argv[1]) + " END")
dist.barrier()
time.sleep(1)
"""


@pytest.mark.parametrize(
    ("nodes", "procs", "length", "node"), [(2, 1, 10000, 1), (1, 2, 0, 0)],
    ids=["2-nodes-x-1-long-escaped-message", "1-node-x-2"],
)  # fmt: skip
def test_7a_rank_1_fails_traceback_once_folded_and_all_ranks(nodes, procs, length, node, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "fail.py").write_text(textwrap.dedent(FAIL))
    env = {**os.environ, "KUBETRAIN_LOCAL_ROOT": str(tmp_path / "jobs"), "OMP_NUM_THREADS": "1"}
    kubetrain = [sys.executable, "-m", "kubetrain"]

    def cli(*args):
        return subprocess.run([*kubetrain, *args], cwd=project, env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip

    launch = cli("launch", "--nodes", str(nodes), "--procs-per-node", str(procs),
                 "--script", "fail.py", "--", "torchrun", "fail.py", str(length))  # fmt: skip
    assert launch.returncode == 0, launch.stderr
    name = launch.stdout.strip().splitlines()[-1]
    wait = cli("wait", name)
    both = wait.stdout + wait.stderr
    assert wait.returncode == 1, both
    # the failing rank's traceback, once
    assert both.count('raise RuntimeError("boom') == 1, both
    assert both.count("[rank1]: Traceback (most recent call last):") == 1, both
    # torchrun's ChildFailedError boilerplate folded
    assert "ChildFailedError" not in both.replace("ChildFailedError report folded", "")
    assert re.search(r"torchrun: \S*fail\.py FAILED; root cause: rank \d \(local rank \d\)", both)
    error = [line for line in wait.stderr.splitlines() if "kubetrain wait: error:" in line]
    assert len(error) == 1, wait.stderr
    assert f"node {node} exited with code 1: [rank 1] RuntimeError: boom" in error[0]
    assert "\x1b" not in error[0] and "\\x1b[2J" in error[0]
    if length:
        assert error[0].split("; torchrun")[0].endswith(" END")
    # logs: rank 1's tagged lines only with --all-ranks
    logs, all_ranks = cli("logs", name), cli("logs", "--all-ranks", name)
    assert "[rank1]:" not in logs.stdout
    assert "[rank1]: Traceback" in all_ranks.stdout and "hello from rank 1" in all_ranks.stdout
