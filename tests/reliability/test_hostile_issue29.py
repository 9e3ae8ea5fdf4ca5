"""Hostile review of issue 29 (DeepSpeed ZeRO in our trainer, the MPI launcher on the local and
trainer backends, collecting ZeRO checkpoints), written from the user documentation only: the
README section "DeepSpeed: ZeRO, the MPI launcher, ZeRO checkpoints" with its table, and the
``--help`` of ``kubetrain launch``, ``run``, ``render trainjob``, ``collect`` and
``python -m kubetrain.train``. No source of kubetrain/ or components/ was read.

Classes: (1) bad input on each face (launch, render, run, submit, the trainer), (2) DeepSpeed
configs that lie (batch sizes, stages, types, deep JSON, non-objects), (3) MPI misuse (a
launcher as the rank's program, auto slots, reserved OMPI_MCA_* env, wrong backends and
runtimes, a real local mpirun job), (4) ZeRO checkpoints that are not the model (optimizer
only, a missing rank, truncated, NaN, planted pickles, stage 0, model-parallel shards,
``latest`` escaping or dangling, links escaping), (5) resume mismatches, (6) security (pickles
never run, no shell strings). A case that BROKE asserts the documented behaviour under
``xfail(strict=True)``.

Cheap by construction: one module-scoped 2-process torchrun writes real ZeRO-1/2/3
checkpoints (a 8-16-2 MLP, 2 steps; torch's Adam, no C++ op build), the variants that need
DeepSpeed's classes to unpickle and the reference state dicts of DeepSpeed's own
``get_fp32_state_dict_from_zero_checkpoint``; one module-scoped trainer run (1 epoch) gives
our trainer's ZeRO checkpoint; every refusal runs in process or stops before training.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from kubetrain.cli import main
from tests.support.processes import kubetrain_in_process as run_cli

VENV_BIN = Path(sys.executable).parent
ENV = {
    **os.environ,
    "PATH": os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")]),
    "TORCH_EXTENSIONS_DIR": os.environ.get(
        "TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions")
    ),
    "OMP_NUM_THREADS": "1",
}
for _key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
    ENV.pop(_key, None)


# ------------------------------------------------------------------------------- helpers
def one_line(err: str, prog: str, *needles: str) -> str:
    """The single error line ``PROG: error: ...`` naming each needle."""
    lines = [
        line
        for line in err.splitlines()
        if line.strip()
        and "Warning" not in line
        and "[WARNING]" not in line
        and "warnings.warn" not in line
    ]
    assert len(lines) == 1, f"expected one line, got:\n{err}"
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for needle in needles:
        assert needle.lower() in lines[0].lower(), f"{needle!r} not in {lines[0]}"
    assert "Traceback" not in lines[0] and "internal error" not in lines[0], lines[0]
    return lines[0]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def trainer(*args: object, torchrun: int = 0, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m kubetrain.train ARGS`` (under torchrun with ``torchrun`` processes)."""
    head = [sys.executable]
    if torchrun:
        head += [
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(torchrun),
            "--master-port",
            str(free_port()),
        ]
    return subprocess.run(
        [*head, "-m", "kubetrain.train", *map(str, args)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
        check=False,
    )


def aged(root: Path, seconds: float = 3600) -> None:
    """Every path under ``root`` an hour old: files long finished, no grace to wait out."""
    when = time.time() - seconds
    for path in [root, *root.rglob("*")]:
        os.utime(path, (when, when), follow_symlinks=False)


def collect(capsys, ckpt: Path, out: Path, *extra: object) -> tuple[int, str, str]:
    aged(ckpt)
    return run_cli(["collect", "--checkpoint-dir", ckpt, "--output", out, *extra], capsys)


def refused_collect(capsys, ckpt: Path, out: Path, *needles: str) -> str:
    code, stdout, err = collect(capsys, ckpt, out)
    assert code != 0, stdout
    line = one_line(err, "kubetrain collect", *needles)
    assert not out.exists() or not any(out.iterdir()), "something was published"
    return line


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


# ------------------------------------------------------------------------ ZeRO checkpoints
GENERATOR = textwrap.dedent(
    """
    import os, shutil, sys, math
    import deepspeed, torch
    from torch import nn

    out, marker = sys.argv[1], sys.argv[2]

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + marker,))

    class Plain:
        pass

    frozen = None
    for stage in (1, 2, 3):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        if stage == 1:
            model[0].bias.requires_grad_(False)
            frozen = model[0].bias.detach().clone()
        cfg = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
               "gradient_accumulation_steps": 1,
               "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
               "zero_optimization": {"stage": stage}, "steps_per_print": 1000}
        params = [p for p in model.parameters() if p.requires_grad]
        eng, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=cfg)
        g = torch.Generator().manual_seed(eng.global_rank)
        for step in range(2):
            x = torch.randn(4, 8, generator=g)
            y = (x.sum(1) > 0).long()
            eng.backward(nn.functional.cross_entropy(eng(x), y))
            eng.step()
        eng.save_checkpoint(f"{out}/s{stage}", tag="global_step2")
        torch.distributed.barrier()

    if torch.distributed.get_rank() == 0:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        for stage in (1, 2, 3):
            ref = get_fp32_state_dict_from_zero_checkpoint(f"{out}/s{stage}")
            torch.save({k: v.detach().clone().contiguous() for k, v in ref.items()},
                       f"{out}/ref_s{stage}.pt")
        torch.save({"0.bias": frozen}, f"{out}/frozen_s1.pt")
        rank0 = "global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt"
        rank1 = "global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt"

        def variant(name, change, files=(rank0,)):
            shutil.copytree(f"{out}/s2", f"{out}/{name}")
            for rel in files:
                sd = torch.load(f"{out}/{name}/{rel}", weights_only=False)
                change(sd)
                torch.save(sd, f"{out}/{name}/{rel}")

        def nan(sd):
            sd["optimizer_state_dict"]["single_partition_of_fp32_groups"][0].data[0] = math.nan
        def stage0(sd):
            from deepspeed.runtime.zero.config import ZeroStageEnum
            sd["optimizer_state_dict"]["zero_stage"] = ZeroStageEnum.disabled
        def evil(sd):
            sd["extra"] = Evil()
        def plain(sd):
            sd["extra"] = Plain()
        variant("nan", nan)
        variant("stage0", stage0, (rank0, rank1))
        variant("evil", evil)
        variant("plain", plain)
    torch.distributed.barrier()
    """
)


@pytest.fixture(scope="module")
def zero(tmp_path_factory) -> dict[str, Path]:
    """Real ZeRO checkpoints of a 2-rank DeepSpeed script (``latest`` + ``global_step2/``):
    s1 (one frozen parameter), s2, s3; variants nan, stage0, evil (os.system pickled), plain
    (a ``__main__`` class pickled); the reference state dicts ref_sN.pt."""
    root = tmp_path_factory.mktemp("zero")
    program = root / "gen.py"
    program.write_text(GENERATOR)
    marker = root / "PWNED"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            str(program),
            str(root / "ck"),
            str(marker),
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=240,
        check=False,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not marker.exists()
    return {"root": root, "marker": marker, **{p.name: p for p in (root / "ck").iterdir()}}


def assert_equal_state(published: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    assert set(published) == set(ref), (sorted(published), sorted(ref))
    for key, tensor in ref.items():
        assert published[key].dtype == torch.float32, key
        assert torch.equal(published[key], tensor.float()), key


# ======================================================================= 4: collect ZeRO
@pytest.mark.parametrize("stage", ["s2", "s3"])
def test_4a_zero_stage_2_and_3_are_published_tensor_for_tensor_as_zero_to_fp32(
    zero, tmp_path, capsys, stage
):
    code, out, err = collect(capsys, zero[stage], tmp_path / "m")
    assert code == 0, err
    ref = torch.load(zero["root"] / "ck" / f"ref_{stage}.pt", weights_only=True)
    assert_equal_state(load_file(tmp_path / "m" / "model.safetensors"), ref)
    assert json.loads((tmp_path / "m" / "model.json").read_text())["source_format"] == (
        "deepspeed-zero"
    )


def test_4b_stage_1_publishes_the_frozen_parameter_zero_to_fp32_drops(zero, tmp_path, capsys):
    code, out, err = collect(capsys, zero["s1"], tmp_path / "m")
    assert code == 0, err
    published = load_file(tmp_path / "m" / "model.safetensors")
    ref = torch.load(zero["root"] / "ck" / "ref_s1.pt", weights_only=True)
    frozen = torch.load(zero["root"] / "ck" / "frozen_s1.pt", weights_only=True)
    assert "0.bias" not in ref  # zero_to_fp32 drops it, as the README says
    assert torch.equal(published.pop("0.bias"), frozen["0.bias"])
    assert_equal_state(published, ref)


def test_4c_the_tag_folder_itself_is_a_checkpoint(zero, tmp_path, capsys):
    code, out, err = collect(capsys, zero["s3"] / "global_step2", tmp_path / "m")
    assert code == 0, err
    ref = torch.load(zero["root"] / "ck" / "ref_s3.pt", weights_only=True)
    assert_equal_state(load_file(tmp_path / "m" / "model.safetensors"), ref)


@pytest.mark.bad_input
def test_4d_optimizer_files_only_are_refused(zero, tmp_path, capsys):
    ck = copy(zero["s2"], tmp_path / "ck")
    (ck / "global_step2" / "mp_rank_00_model_states.pt").unlink()
    refused_collect(capsys, ck, tmp_path / "m")


@pytest.mark.bad_input
@pytest.mark.parametrize("stage", ["s2", "s3"])
def test_4e_a_missing_ranks_optimizer_file_is_refused(zero, tmp_path, capsys, stage):
    ck = copy(zero[stage], tmp_path / "ck")
    (ck / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    refused_collect(capsys, ck, tmp_path / "m", "rank")


@pytest.mark.bad_input
def test_4f_a_missing_stage_3_model_states_file_is_refused_or_harmless(zero, tmp_path, capsys):
    ck = copy(zero["s3"], tmp_path / "ck")
    (ck / "global_step2" / "zero_pp_rank_1_mp_rank_00_model_states.pt").unlink()
    code, out, err = collect(capsys, ck, tmp_path / "m")
    if code == 0:  # the shards are all in the optimizer files: it must be exactly the model
        ref = torch.load(zero["root"] / "ck" / "ref_s3.pt", weights_only=True)
        assert_equal_state(load_file(tmp_path / "m" / "model.safetensors"), ref)
    else:
        one_line(err, "kubetrain collect")


@pytest.mark.bad_input
def test_4g_a_truncated_optimizer_file_is_one_line_and_nothing_published(zero, tmp_path, capsys):
    ck = copy(zero["s2"], tmp_path / "ck")
    f = ck / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    refused_collect(capsys, ck, tmp_path / "m")


@pytest.mark.bad_input
def test_4h_nan_in_the_fp32_master_weights_is_refused(zero, tmp_path, capsys):
    refused_collect(capsys, zero["nan"], tmp_path / "m", "nan")


@pytest.mark.security
@pytest.mark.bad_input
@pytest.mark.parametrize("variant", ["evil", "plain"])
def test_4i_a_planted_pickle_class_is_refused_unread_and_never_runs(
    zero, tmp_path, capsys, variant
):
    refused_collect(capsys, zero[variant], tmp_path / "m")
    assert not zero["marker"].exists(), "the planted pickle ran"


@pytest.mark.bad_input
def test_4j_stage_0_is_refused(zero, tmp_path, capsys):
    refused_collect(capsys, zero["stage0"], tmp_path / "m", "stage")


@pytest.mark.bad_input
def test_4k_model_parallel_shards_are_refused(zero, tmp_path, capsys):
    ck = copy(zero["s2"], tmp_path / "ck")
    tag = ck / "global_step2"
    shutil.copy(tag / "mp_rank_00_model_states.pt", tag / "mp_rank_01_model_states.pt")
    for rank in (0, 1):
        shutil.copy(
            tag / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt",
            tag / f"zero_pp_rank_{rank}_mp_rank_01_optim_states.pt",
        )
    refused_collect(capsys, ck, tmp_path / "m", "mp_rank_01")


@pytest.mark.security
@pytest.mark.bad_input
@pytest.mark.parametrize(
    "pointer", ["../outside/global_step2", "ABS", "global_step2/../../outside/global_step2"]
)
def test_4l_latest_pointing_outside_the_folder_is_refused(zero, tmp_path, capsys, pointer):
    copy(zero["s2"], tmp_path / "outside")
    ck = copy(zero["s2"], tmp_path / "ck")
    shutil.rmtree(ck / "global_step2")
    target = str(tmp_path / "outside" / "global_step2") if pointer == "ABS" else pointer
    (ck / "latest").write_text(target)
    refused_collect(capsys, ck, tmp_path / "m")


@pytest.mark.bad_input
def test_4m_latest_naming_a_missing_tag_is_refused(zero, tmp_path, capsys):
    ck = copy(zero["s2"], tmp_path / "ck")
    (ck / "latest").write_text("global_step99")
    refused_collect(capsys, ck, tmp_path / "m", "global_step99")


@pytest.mark.security
@pytest.mark.bad_input
def test_4n_a_tag_folder_that_is_a_link_out_of_the_checkpoint_is_refused(zero, tmp_path, capsys):
    copy(zero["s2"], tmp_path / "outside")
    ck = copy(zero["s2"], tmp_path / "ck")
    shutil.rmtree(ck / "global_step2")
    (ck / "global_step2").symlink_to(tmp_path / "outside" / "global_step2")
    refused_collect(capsys, ck, tmp_path / "m")


@pytest.mark.security
@pytest.mark.bad_input
def test_4o_a_rank_file_that_is_a_link_out_of_the_checkpoint_is_refused(zero, tmp_path, capsys):
    copy(zero["s2"], tmp_path / "outside")
    ck = copy(zero["s2"], tmp_path / "ck")
    rel = Path("global_step2") / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    (ck / rel).unlink()
    (ck / rel).symlink_to(tmp_path / "outside" / rel)
    refused_collect(capsys, ck, tmp_path / "m")


@pytest.mark.bad_input
def test_4p_a_stage_3_tag_holding_a_stage_2_model_file_is_refused(zero, tmp_path, capsys):
    """A mixed folder: stage-3 rank files plus a stage-2 ``mp_rank_00_model_states.pt``."""
    ck = copy(zero["s3"], tmp_path / "ck")
    shutil.copy(
        zero["s2"] / "global_step2" / "mp_rank_00_model_states.pt",
        ck / "global_step2" / "mp_rank_00_model_states.pt",
    )
    code, out, err = collect(capsys, ck, tmp_path / "m")
    if code == 0:  # if it publishes, it must be the stage-3 model the rank files hold
        ref = torch.load(zero["root"] / "ck" / "ref_s3.pt", weights_only=True)
        assert_equal_state(load_file(tmp_path / "m" / "model.safetensors"), ref)
    else:
        one_line(err, "kubetrain collect")


# ============================================================ our trainer's ZeRO checkpoint
@pytest.fixture(scope="module")
def trained(tmp_path_factory, digits_dir) -> Path:
    """Our trainer, --strategy deepspeed --zero-stage 2, one process, 1 epoch."""
    ck = tmp_path_factory.mktemp("trained") / "ck"
    proc = trainer(
        "--data",
        digits_dir,
        "--checkpoint-dir",
        ck,
        "--strategy",
        "deepspeed",
        "--zero-stage",
        "2",
        "--epochs",
        "1",
        "--tensorboard-dir",
        "",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return ck


def epoch_dirs(ck: Path) -> list[str]:
    return sorted(p.name for p in ck.iterdir() if p.name.startswith("epoch-"))


def test_4q_our_trainers_checkpoint_is_collected(trained, tmp_path, capsys):
    code, out, err = collect(capsys, trained, tmp_path / "m")
    assert code == 0, err
    assert (trained / "epoch-000001" / "zero").is_dir()
    state = load_file(tmp_path / "m" / "model.safetensors")
    assert state and all(
        t.dtype == torch.float32 and torch.isfinite(t).all() for t in state.values()
    )


@pytest.mark.bad_input
def test_4r_a_rank_file_changed_after_the_manifest_is_refused(trained, tmp_path, capsys):
    ck = copy(trained, tmp_path / "ck")
    files = sorted((ck / "epoch-000001" / "zero").rglob("*optim_states.pt"))
    assert files
    data = bytearray(files[0].read_bytes())
    data[-100] ^= 0xFF
    files[0].write_bytes(bytes(data))
    refused_collect(capsys, ck, tmp_path / "m", "sha256")


# ======================================================================== 5: resume
@pytest.mark.bad_input
@pytest.mark.parametrize(
    "stage_options",
    [["--zero-stage", "3"], ["--deepspeed-config", '{"zero_optimization": {"stage": 1}}']],
    ids=["5a-zero-stage-option", "5b-stage-from-the-config"],
)
def test_5ab_resume_with_another_zero_stage_is_one_line(
    trained, digits_dir, tmp_path, stage_options
):
    """5a: --zero-stage 3 on the stage-2 checkpoint; 5b: the config's stage 1 on it."""
    ck = copy(trained, tmp_path / "ck")
    options = ["--data", digits_dir, "--checkpoint-dir", ck, "--strategy", "deepspeed",
               *stage_options, "--epochs", "2", "--tensorboard-dir", ""]  # fmt: skip
    proc = trainer(*options)
    assert proc.returncode != 0
    one_line(proc.stderr, "kubetrain.train", "stage")
    assert epoch_dirs(ck) == ["epoch-000001"]


@pytest.mark.bad_input
def test_5c_resume_with_another_process_count_is_one_line(trained, digits_dir, tmp_path):
    ck = copy(trained, tmp_path / "ck")
    proc = trainer(
        "--data",
        digits_dir,
        "--checkpoint-dir",
        ck,
        "--strategy",
        "deepspeed",
        "--zero-stage",
        "2",
        "--epochs",
        "2",
        "--tensorboard-dir",
        "",
        torchrun=2,
    )
    assert proc.returncode != 0
    # torchrun's own ChildFailedError report wraps it; each rank refuses in one line of ours
    assert "kubetrain.train: error: --resume: " in proc.stderr, proc.stderr[-3000:]
    assert "on 1 processes" in proc.stderr and "on 2" in proc.stderr
    assert "/kubetrain/" not in proc.stderr, "a traceback through kubetrain's code"
    assert epoch_dirs(ck) == ["epoch-000001"]


@pytest.mark.bad_input
def test_5d_resume_a_zero_checkpoint_as_ddp_is_one_line(trained, digits_dir, tmp_path):
    ck = copy(trained, tmp_path / "ck")
    proc = trainer(
        "--data",
        digits_dir,
        "--checkpoint-dir",
        ck,
        "--strategy",
        "ddp",
        "--epochs",
        "2",
        "--tensorboard-dir",
        "",
    )
    assert proc.returncode != 0, "a ZeRO checkpoint was resumed as ddp (or ignored)"
    one_line(proc.stderr, "kubetrain.train")
    assert epoch_dirs(ck) == ["epoch-000001"]


# ================================================================ 2: configs that lie
def run_trainer_refusal(
    digits_dir: Path, tmp_path: Path, config: str, *needles: str, extra: tuple = ()
) -> None:
    ck = tmp_path / "ck"
    proc = trainer(
        "--data",
        digits_dir,
        "--checkpoint-dir",
        ck,
        "--strategy",
        "deepspeed",
        "--epochs",
        "1",
        "--deepspeed-config",
        config,
        *extra,
    )
    assert proc.returncode == 2, proc.stdout[-2000:]
    one_line(proc.stderr, "kubetrain.train", *needles)
    assert not ck.exists(), "the checkpoint folder was made before the refusal"


LYING_CONFIGS = {
    "batch-mismatch-explicit": (
        '{"train_batch_size": 7, "train_micro_batch_size_per_gpu": 4, '
        '"gradient_accumulation_steps": 1}',
        "train_batch_size",
    ),
    "batch-mismatch-accum": (
        '{"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, '
        '"gradient_accumulation_steps": 2}',
        "train_batch_size",
    ),
    "batch-string": ('{"train_batch_size": "32"}', "train_batch_size"),
    "micro-negative": ('{"train_micro_batch_size_per_gpu": -4}', "train_micro_batch_size"),
    "micro-zero": ('{"train_micro_batch_size_per_gpu": 0}', "train_micro_batch_size"),
    "stage-4": ('{"zero_optimization": {"stage": 4}}', "stage"),
    "stage-0": ('{"zero_optimization": {"stage": 0}}', "stage"),
    "stage-true": ('{"zero_optimization": {"stage": true}}', "stage"),
    "stage-string": ('{"zero_optimization": {"stage": "3"}}', "stage"),
    "list": ("[]", "object"),
    "string": ('"zero"', ""),  # taken for a file name: "does not exist" is fair
    "null": ("null", ""),
    "nan": ('{"gradient_clipping": NaN}', "json"),
    "not-json": ("{train_batch_size: 8}", "json"),
    "missing-file": ("/nonexistent/ds_config.json", "does not exist"),
    "folder": ("/", "folder"),
}


@pytest.mark.bad_input
@pytest.mark.parametrize("case", list(LYING_CONFIGS))
def test_2a_a_lying_config_is_one_line_before_anything_starts(digits_dir, tmp_path, case):
    config, needle = LYING_CONFIGS[case]
    run_trainer_refusal(digits_dir, tmp_path, config, needle)


@pytest.mark.bad_input
@pytest.mark.parametrize("shape", ["list", "object"])
def test_2b_a_config_nested_100000_deep_is_one_line(digits_dir, tmp_path, shape):
    depth = 100_000
    text = "[" * depth + "]" * depth if shape == "list" else '{"a":' * depth + "1" + "}" * depth
    (tmp_path / "deep.json").write_text(text)
    run_trainer_refusal(digits_dir, tmp_path, str(tmp_path / "deep.json"), "deep")


@pytest.mark.bad_input
def test_2c_a_huge_config_file_is_one_line_not_a_memory_blowup(digits_dir, tmp_path):
    big = tmp_path / "big.json"
    with big.open("w") as f:  # 64 MiB of one JSON string: no config is that big
        f.write('{"x": "')
        f.write("a" * (64 << 20))
        f.write('", "zero_optimization": {"stage": 9}}')
    run_trainer_refusal(digits_dir, tmp_path, str(big), "")


@pytest.mark.bad_input
def test_2d_a_config_train_batch_size_decides_the_micro_batch(local_root, digits_dir, capsys):
    """The README: a config's train_batch_size decides the micro batch, as DeepSpeed derives
    it (train / (accumulation x world size)), over --batch-size; one no micro batch makes is
    refused in one line saying why, and a launch makes nothing then. (Reported broken by the
    review against the README's first wording, which said --batch-size fills the micro batch
    whatever the config says; the README now says what DeepSpeed users expect.)"""
    args = ["launch", "--procs-per-node", "1", "--strategy", "deepspeed", "--batch-size", "32",
            "--deepspeed-config", '{"train_batch_size": 7}', "--data", digits_dir]  # fmt: skip
    refused(
        capsys,
        "kubetrain launch",
        ["launch", "--nodes", "2", *args[1:]],
        "train_batch_size 7 is not a multiple of gradient_accumulation_steps 1 x world size 2",
    )
    assert not local_root.exists() or not any(local_root.iterdir())
    from kubetrain.train.deepspeed_config import batch_settings

    derived = batch_settings(
        {"train_batch_size": 7}, batch_size=32, grad_accum_steps=1, world_size=1, field="f"
    )
    assert derived == (7, 1, 7)


# ====================================================== 1: bad input on each face
def refused(capsys, prog: str, args: list, *needles: str) -> str:
    code, out, err = run_cli(args, capsys)
    assert code == 2, (code, out, err)
    assert not out.strip(), f"something printed on stdout: {out!r}"
    return one_line(err, prog, *needles)


@pytest.mark.bad_input
@pytest.mark.parametrize("face", ["launch", "render", "run"])
@pytest.mark.parametrize("stage", ["0", "4", "-1"])
def test_1a_a_zero_stage_outside_1_to_3_is_refused_on_every_face(
    local_root, tmp_path, capsys, face, stage
):
    args = {
        "launch": ["launch", "--data", tmp_path],
        "render": ["render", "trainjob", "--name", "j"],
        "run": ["run", "--output", tmp_path / "out", "--registry", tmp_path / "reg"],
    }[face]
    refused(
        capsys,
        f"kubetrain {face}",
        [*args, "--strategy", "deepspeed", f"--zero-stage={stage}"],
        "zero",
    )
    assert not local_root.exists() or not any(local_root.iterdir())
    assert not (tmp_path / "out").exists() and not (tmp_path / "reg").exists()


@pytest.mark.bad_input
@pytest.mark.parametrize("target", ["kfp", "argo"])
@pytest.mark.parametrize("param", ["zero_stage=5", "launcher=slurm", "launcher=mpi"])
def test_1b_submit_refuses_deepspeed_params_before_contacting_the_server(capsys, target, param):
    extra = ["--param", "backend=job"] if param == "launcher=mpi" else []
    refused(
        capsys,
        "kubetrain submit",
        ["submit", target, "--host", "http://127.0.0.1:9", "--param", param, *extra],
        param.split("=")[0],
    )


@pytest.mark.bad_input
def test_1c_run_refuses_object_storage_for_deepspeed_before_prep(tmp_path, capsys):
    refused(
        capsys,
        "kubetrain run",
        [
            "run",
            "--strategy",
            "deepspeed",
            "--storage",
            "s3://bucket/p",
            "--output",
            tmp_path / "out",
            "--registry",
            tmp_path / "reg",
        ],
        "object storage",
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.bad_input
def test_1d_run_checks_train_batch_size_against_nodes_x_procs_before_prep(tmp_path, capsys):
    config = '{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4}'
    refused(
        capsys,
        "kubetrain run",
        [
            "run",
            "--strategy",
            "deepspeed",
            "--nodes",
            "3",
            "--deepspeed-config",
            config,
            "--output",
            tmp_path / "out",
            "--registry",
            tmp_path / "reg",
        ],
        "train_batch_size",
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.bad_input
@pytest.mark.parametrize("where", ["storage", "checkpoint-dir"])
def test_1e_launch_refuses_object_storage_for_deepspeed(local_root, tmp_path, capsys, where):
    opt = ["--storage", "s3://b/p"] if where == "storage" else ["--checkpoint-dir", "s3://b/p"]
    refused(
        capsys,
        "kubetrain launch",
        ["launch", "--strategy", "deepspeed", "--data", tmp_path, *opt],
        "object storage",
    )
    assert not local_root.exists() or not any(local_root.iterdir())


# ======================================================================== 3: MPI misuse
@pytest.mark.bad_input
@pytest.mark.parametrize("backend", ["pytorchjob", "job"])
def test_3a_mpi_on_pytorchjob_or_job_is_refused_before_a_cluster_is_read(
    tmp_path, capsys, monkeypatch, backend
):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    refused(
        capsys,
        "kubetrain launch",
        [
            "launch",
            "--backend",
            backend,
            "--launcher",
            "mpi",
            "--procs-per-node",
            "1",
            "--",
            "python",
            "t.py",
        ],
        "trainer",
        "local",
    )


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "program",
    [
        ["mpirun", "-np", "2", "python", "t.py"],
        ["torchrun", "t.py"],
        ["deepspeed", "t.py"],
        ["/usr/local/bin/mpirun", "python", "t.py"],
        ["mpiexec", "python", "t.py"],
    ],
    ids=["mpirun", "torchrun", "deepspeed", "mpirun-path", "mpiexec"],
)
def test_3b_a_launcher_as_the_ranks_program_is_refused(local_root, capsys, program):
    refused(
        capsys,
        "kubetrain launch",
        ["launch", "--launcher", "mpi", "--procs-per-node", "2", "--", *program],
    )
    assert not local_root.exists() or not any(local_root.iterdir())


@pytest.mark.bad_input
def test_3c_a_launcher_in_command_json_is_refused(local_root, capsys):
    refused(
        capsys,
        "kubetrain launch",
        [
            "launch",
            "--launcher",
            "mpi",
            "--procs-per-node",
            "2",
            "--command-json",
            '["torchrun", "--nproc-per-node", "2", "t.py"]',
        ],
        "torchrun",
    )


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "program",
    [
        ["python", "-m", "torch.distributed.run", "t.py"],
        ["python", "-u", "-m", "deepspeed.launcher.runner", "t.py"],
        ["env", "A=1", "torchrun", "t.py"],
    ],
    ids=["torch.distributed.run", "deepspeed-runner", "env-torchrun"],
)
def test_3d_torchrun_by_its_module_name_is_refused(local_root, capsys, program):
    try:
        refused(
            capsys,
            "kubetrain launch",
            ["launch", "--launcher", "mpi", "--procs-per-node", "2", "--", *program],
        )
    finally:
        for job in local_root.iterdir() if local_root.exists() else []:
            main(["delete", "--ignore-not-found", job.name])


@pytest.mark.bad_input
@pytest.mark.parametrize("face", ["launch", "render", "run"])
def test_3e_mpi_with_auto_procs_and_no_gpu_is_refused(local_root, tmp_path, capsys, face):
    args = {
        "launch": ["launch", "--", "python", "t.py"],
        "render": ["render", "trainjob", "--name", "j"],
        "run": ["run", "--output", tmp_path / "out", "--registry", tmp_path / "reg"],
    }[face]
    refused(
        capsys,
        f"kubetrain {face}",
        [
            *args[: 1 if face != "render" else 2],
            "--launcher",
            "mpi",
            *args[1 if face != "render" else 2 :],
        ],
        "procs",
    )


RESERVED = [
    "OMPI_MCA_orte_keep_fqdn_hostnames",
    "OMPI_MCA_orte_default_hostfile",
    "OMPI_MCA_plm_rsh_args",
    "OMPI_MCA_orte_set_default_slots",
]


@pytest.mark.bad_input
@pytest.mark.security
@pytest.mark.parametrize("name", RESERVED)
def test_3f_a_trainjob_setting_the_trainers_openmpi_env_is_refused(capsys, name):
    refused(
        capsys,
        "kubetrain render",
        [
            "render",
            "trainjob",
            "--name",
            "j",
            "--launcher",
            "mpi",
            "--procs-per-node",
            "1",
            "--env",
            json.dumps({name: "-o ProxyCommand=touch /tmp/x"}),
        ],
        name,
    )


def test_3g_other_openmpi_env_reaches_every_rank_in_the_mpirun_line(capsys):
    code, out, err = run_cli(
        [
            "render",
            "trainjob",
            "--name",
            "j",
            "--launcher",
            "mpi",
            "--procs-per-node",
            "2",
            "--nodes",
            "2",
            "--env",
            "OMPI_MCA_btl_tcp_if_include=eth0",
        ],
        capsys,
    )
    assert code == 0, err
    import yaml

    job = yaml.safe_load(out)
    trainer_spec = job["spec"]["trainer"]
    command = trainer_spec["command"]
    assert command[:4] == ["mpirun", "--hostfile", "/etc/mpi/hostfile", "-np"] and command[4] == "4"
    assert "OMPI_MCA_btl_tcp_if_include" in command[command.index("-x") :]
    assert job["spec"]["runtimeRef"]["name"] == "kubetrain-deepspeed-mpi"
    assert not any(word in ("sh", "bash", "/bin/sh", "-c") for word in command), command


@pytest.mark.bad_input
def test_3h_the_default_runtime_with_mpi_is_ours_and_said_so(capsys):
    """Every face sends the default runtime's name when none is asked for, so torch-ddp-cpu
    with --launcher mpi stands for the launcher's default (README): it is replaced by
    kubetrain-deepspeed-mpi, and a note on stderr says so; another runtime is kept."""
    import yaml

    base = ["render", "trainjob", "--name", "j", "--launcher", "mpi", "--procs-per-node", "1"]
    code, out, err = run_cli([*base, "--runtime", "torch-ddp-cpu"], capsys)
    assert code == 0, err
    assert yaml.safe_load(out)["spec"]["runtimeRef"]["name"] == "kubetrain-deepspeed-mpi"
    assert "runs on runtime kubetrain-deepspeed-mpi, not the default torch-ddp-cpu" in err
    code, out, err = run_cli([*base, "--runtime", "my-mpi-rt"], capsys)
    assert code == 0, err
    assert yaml.safe_load(out)["spec"]["runtimeRef"]["name"] == "my-mpi-rt"
    assert "note" not in err


@pytest.mark.bad_input
def test_3i_mpi_on_a_cluster_runtime_without_mlpolicy_mpi_is_refused_creating_nothing(
    kubeconfig, capsys
):
    from tests.support import objects

    kubeconfig.emulator.create("clustertrainingruntimes", objects.torch_runtime("plain-rt"))
    refused(
        capsys,
        "kubetrain launch",
        [
            "launch",
            "--backend",
            "trainer",
            "--namespace",
            "default",
            "--name",
            "mpi-on-torch",
            "--launcher",
            "mpi",
            "--procs-per-node",
            "1",
            "--runtime",
            "plain-rt",
            "--",
            "python",
            "t.py",
        ],
        "plain-rt",
    )
    assert not kubeconfig.emulator.names("trainjobs", "default")


@pytest.mark.bad_input
def test_3j_torchrun_on_the_mpi_runtime_is_refused_creating_nothing(kubeconfig, capsys):
    from tests.support import objects

    kubeconfig.emulator.create(
        "clustertrainingruntimes", objects.shipped_runtime("kubetrain-deepspeed-mpi")
    )
    refused(
        capsys,
        "kubetrain launch",
        [
            "launch",
            "--backend",
            "trainer",
            "--namespace",
            "default",
            "--name",
            "tr-on-mpi",
            "--runtime",
            "kubetrain-deepspeed-mpi",
            "--",
            "torchrun",
            "t.py",
        ],
        "kubetrain-deepspeed-mpi",
    )
    assert not kubeconfig.emulator.names("trainjobs", "default")


RANK_PROGRAM = """
import os, sys
print("RANK", os.environ.get("OMPI_COMM_WORLD_RANK"), "OF", os.environ.get("OMPI_COMM_WORLD_SIZE"),
      "MCA", os.environ.get("OMPI_MCA_hostile29_mine"), "ARGV", sys.argv[1:], flush=True)
"""


@pytest.mark.security
def test_3k_a_local_mpi_job_runs_every_rank_with_the_users_env_and_no_shell(
    local_root, tmp_path, capsys
):
    program = tmp_path / "rank.py"
    program.write_text(RANK_PROGRAM)
    pwn = tmp_path / "PWN"
    args = [f"$(touch {pwn})", f"; touch {pwn}2", "`id`"]
    code, out, err = run_cli(
        [
            "launch",
            "--launcher",
            "mpi",
            "--nodes",
            "2",
            "--procs-per-node",
            "1",
            "--env",
            "OMPI_MCA_hostile29_mine=hello",
            "--",
            sys.executable,
            program,
            *args,
        ],
        capsys,
    )
    assert code == 0, err
    name = out.strip().splitlines()[-1]
    try:
        code, out, err = run_cli(["wait", "--timeout", "60", name], capsys)
        assert code == 0, err
        code, logs, err = run_cli(["logs", name], capsys)
        for rank in (0, 1):
            assert f"RANK {rank} OF 2 MCA hello ARGV {args!r}" in logs, logs
        assert (local_root / name / "hostfile").read_text().split() == ["127.0.0.1", "slots=2"]
        assert not pwn.exists() and not Path(f"{pwn}2").exists()
    finally:
        main(["delete", "--ignore-not-found", name])


@pytest.mark.bad_input
@pytest.mark.parametrize("face", ["launch", "render"])
def test_3l_an_unknown_launcher_is_refused(local_root, capsys, face):
    args = ["launch"] if face == "launch" else ["render", "trainjob", "--name", "j"]
    refused(
        capsys,
        f"kubetrain {face}",
        [*args, "--launcher", "slurm", "--", "python", "t.py"],
        "launcher",
    )


@pytest.mark.bad_input
def test_2e_an_unknown_key_deepspeed_rejects_is_one_user_line_before_anything_starts(
    digits_dir, tmp_path
):
    run_trainer_refusal(
        digits_dir,
        tmp_path,
        '{"zero_optimization": {"stagee": 3}}',
        "stagee",
        extra=("--tensorboard-dir", ""),
    )
