"""Collect reads DeepSpeed ZeRO checkpoints (issue 29, item 4): one real ``torchrun
--nproc-per-node 2`` run of DeepSpeed 0.19.8 writes a stage 1 (fp32), 2 (bf16: ``bf16_``
files) and 3 (fp32) checkpoint of a tiny model with a buffer, a frozen parameter and a tied
one, and our layout's ``epoch-NNNNNN/zero/``; each collected ``model.safetensors`` must equal,
tensor for tensor, what DeepSpeed's own ``get_fp32_state_dict_from_zero_checkpoint`` returns.
Broken checkpoints are refused in one line, nothing published."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from kubetrain.artifacts.checkpoint_manifest import FORMAT
from kubetrain.artifacts.model_card import read_model_card
from kubetrain.cli import main as kubetrain_main
from kubetrain.storage import folder_digests

pytest.importorskip("deepspeed")

#: Stage → (folder, bf16) of the user's checkpoints the run writes.
STAGES = {1: ("stage1", False), 2: ("stage2", True), 3: ("stage3", False)}
#: Every stage in one process group: DeepSpeed's start-up (~5 s) paid once.
WRITE_ZERO = """
import os, sys, torch, deepspeed
from torch import nn

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.frozen = nn.Linear(6, 6)
        self.frozen.requires_grad_(False)
        self.hidden = nn.Linear(6, 7)  # odd sizes: ZeRO pads every partition
        self.out = nn.Linear(7, 6)
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight  # tied: DeepSpeed's shared_params
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 6))
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))

    def forward(self, ids):
        x = self.embed(ids) * self.scale.to(self.embed.weight.dtype)
        return self.head(self.out(torch.relu(self.hidden(self.frozen(x)))))

folder = sys.argv[1]
for stage, name, bf16 in ((1, "stage1", False), (2, "stage2", True), (3, "stage3", False)):
    torch.manual_seed(stage)
    model = Tiny()
    config = {
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
        "zero_optimization": {"stage": stage}, "bf16": {"enabled": bf16},
    }
    trained = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=trained, config=config)
    for step in range(2):
        loss = engine(torch.randint(0, 11, (4, 3))).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(os.path.join(folder, "user", name))
    if stage == 3:  # our trainer's layout: the step folder, tag "zero", no "latest"
        engine.save_checkpoint(os.path.join(folder, "ours", "step"), tag="zero", save_latest=False)
# a process group left for the interpreter's exit to tear down once aborted rank 0 ("terminate
# called without an active exception", exit -6) on a loaded machine
torch.distributed.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _aged(folder: Path) -> Path:
    """Every file an hour old: held still past the settling grace, so none is waited for."""
    old = time.time() - 3600
    for path in folder.rglob("*"):
        os.utime(path, (old, old))
    return folder


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("zero")
    script = root / "write_zero.py"
    script.write_text(WRITE_ZERO)
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")},
        "OMP_NUM_THREADS": "1",
    }
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(_free_port()), str(script), str(root)],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return _aged(root)


def deepspeed_merge(folder: Path, tag: str | None = None) -> dict[str, torch.Tensor]:
    """DeepSpeed's own reconstruction (it prints progress: kept out of the test's output)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return get_fp32_state_dict_from_zero_checkpoint(str(folder), tag=tag)


def assert_same(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name], tensor), name


def collect(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str]:
    capsys.readouterr()
    code = kubetrain_main(["collect", *(str(arg) for arg in argv)])
    return code, capsys.readouterr().err


def refused_in_one_line(code: int, err: str, out: Path, *named: object) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1, err
    assert lines[0].startswith("kubetrain collect: error: ") and "Traceback" not in err
    for name in named:
        assert str(name) in lines[0], f"{name} not named: {lines[0]}"
    assert not out.exists()
    return lines[0]


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_each_stage_is_collected_as_zero_to_fp32_merges_it(
    written: Path, stage: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = written / "user" / STAGES[stage][0]
    code, err = collect(capsys, "--checkpoint-dir", folder, "--output", tmp_path / "model")
    assert code == 0, err
    got = load_file(str(tmp_path / "model" / "model.safetensors"))
    expected = deepspeed_merge(folder)
    assert_same(got, expected)
    # stage 1 keeps the frozen parameter in the model states only; zero_to_fp32 drops it,
    # collect publishes it as saved, so the model loads whole
    extra = {"frozen.weight", "frozen.bias"} if stage == 1 else set()
    assert set(got) - set(expected) == extra
    if extra:
        states = torch.load(
            folder / "global_step2" / "mp_rank_00_model_states.pt", weights_only=True
        )
        assert_same(got, {name: states["module"][name] for name in extra})
    assert torch.equal(got["head.weight"], got["embed.weight"])  # the tied parameter
    card = read_model_card(str(tmp_path / "model"))
    model_states = ("zero_pp_rank_0_" if stage == 3 else "") + "mp_rank_00_model_states.pt"
    assert card["source_format"] == "deepspeed-zero" and card["step"] == 2
    assert card["source_file"] == f"global_step2/{model_states}"
    optim = "bf16_zero_pp_rank_1" if STAGES[stage][1] else "zero_pp_rank_1"
    assert {"latest", f"global_step2/{optim}_mp_rank_00_optim_states.pt"} <= set(
        card["checkpoint_files"]
    )


def _our_checkpoint(written: Path, into: Path) -> Path:
    """``CKPT/epoch-000002`` as our trainer publishes a deepspeed checkpoint: the step folder
    (``zero/`` and DeepSpeed's scripts beside it) and a manifest listing every file."""
    epoch = into / "epoch-000002"
    shutil.copytree(written / "ours" / "step", epoch)
    manifest = {
        "format": FORMAT, "epoch": 2, "step": 2, "world_size": 2, "strategy": "deepspeed",
        "zero_stage": 3, "metrics": [], "files": folder_digests(epoch),
        "model": {"spec": "write_zero:Tiny", "sample_shape": [3],
                  "num_classes": 11},
    }  # fmt: skip
    (epoch / "manifest.json").write_text(json.dumps(manifest))
    (into / "LATEST").write_text("epoch-000002\n")
    return epoch


def test_our_deepspeed_checkpoint_is_collected_from_its_zero_folder(
    written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    epoch = _our_checkpoint(written, tmp_path / "ckpt")
    code, err = collect(capsys, "--checkpoint-dir", tmp_path / "ckpt", "--output", tmp_path / "m")
    assert code == 0, err
    got = load_file(str(tmp_path / "m" / "model.safetensors"))
    expected = deepspeed_merge(written / "ours" / "step", tag="zero")
    assert set(got) == set(expected)
    assert_same(got, expected)
    card = read_model_card(str(tmp_path / "m"))
    assert (card["source_format"], card["strategy"], card["epoch"]) == ("kubetrain", "deepspeed", 2)
    # a file changed after the manifest was written is refused before it is unpickled
    optim = epoch / "zero" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    data = bytearray(optim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    optim.write_bytes(bytes(data))
    code, err = collect(
        capsys, "--checkpoint-dir", tmp_path / "ckpt", "--output", tmp_path / "again"
    )
    refused_in_one_line(code, err, tmp_path / "again", optim, "corrupt")


def test_a_zero_folder_is_named_whole_and_its_files_never_taken_one_by_one(
    written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = written / "user" / "stage3"
    expected = load_file(str(_collected(capsys, root, tmp_path / "searched")))
    for index, named in enumerate(
        ["global_step2", ".", "global_step2/zero_pp_rank_0_mp_rank_00_model_states.pt"]
    ):
        out = tmp_path / f"named-{index}"
        got = load_file(str(_collected(capsys, root, out, "--checkpoint-file", named)))
        assert set(got) == set(expected)
        assert_same(got, expected)
    optim = "global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt"
    code, err = collect(
        capsys, "--checkpoint-dir", root, "--output", tmp_path / "one",
        "--checkpoint-file", optim,
    )  # fmt: skip
    refused_in_one_line(code, err, tmp_path / "one", optim, "one shard")


def _collected(capsys: Any, root: Path, out: Path, *extra: object) -> Path:
    code, err = collect(capsys, "--checkpoint-dir", root, "--output", out, *extra)
    assert code == 0, err
    return out / "model.safetensors"


def test_a_zero_checkpoint_still_being_written_is_not_taken(
    written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without ``latest``, the newest tag folder whose files are settled is taken: one whose
    rank file a process still holds open for writing is passed over."""
    root = tmp_path / "run"
    for tag in ("global_step2", "global_step4"):
        shutil.copytree(written / "user" / "stage3" / "global_step2", root / tag)
    _aged(root)
    writing = root / "global_step4" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    with open(writing, "ab"):
        code, err = collect(capsys, "--checkpoint-dir", root, "--output", tmp_path / "model")
    assert code == 0, err
    card = read_model_card(str(tmp_path / "model"))
    assert card["source_file"].startswith("global_step2/")


def _save_back(path: Path, change: Any) -> None:
    saved = torch.load(path, weights_only=False)
    change(saved)
    torch.save(saved, path)


class Planted:
    """A pickle that would run a command when loaded without weights_only."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _nan_in_flat_group(saved: dict) -> None:
    saved["optimizer_state_dict"]["fp32_flat_groups"][0].data[3] = float("nan")


BREAKS = {
    "optimizer-only": (
        lambda tag, tmp: [p.unlink() for p in tag.glob("*model_states.pt")],
        ("optimizer states only", "model_states.pt"),
    ),
    "missing-rank": (
        lambda tag, tmp: (tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink(),
        ("rank 1", "zero_pp_rank_1_mp_rank_00_optim_states.pt"),
    ),
    "planted-class": (
        lambda tag, tmp: torch.save(
            {"optimizer_state_dict": {}, "payload": Planted(tmp / "ran")},
            tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt",
        ),
        ("zero_pp_rank_1_mp_rank_00_optim_states.pt", "system", "refused unread"),
    ),
    "nan": (
        lambda tag, tmp: _save_back(
            tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt", _nan_in_flat_group
        ),
        ("NaN or Inf", "--allow-nonfinite"),
    ),
    "truncated": (
        lambda tag, tmp: os.truncate(tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt", 4096),
        ("zero_pp_rank_1_mp_rank_00_optim_states.pt", "truncated or corrupt"),
    ),
}


@pytest.mark.parametrize("broken", sorted(BREAKS))
def test_a_broken_zero_checkpoint_is_refused_in_one_line(
    written: Path, broken: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "run"
    shutil.copytree(written / "user" / "stage3", root)
    tag = root / "global_step2"
    damage, named = BREAKS[broken]
    damage(tag, tmp_path)
    _aged(root)
    code, err = collect(capsys, "--checkpoint-dir", root, "--output", tmp_path / "model")
    refused_in_one_line(code, err, tmp_path / "model", *named)
    assert not (tmp_path / "ran").exists()  # the planted pickle ran nothing
