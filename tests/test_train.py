"""The trainer end to end: one process, real 2-process DDP and FSDP under torchrun, resume,
option errors; plus the pieces whose mistakes would not show as a crash (accumulation, eval
sharding, model specs)."""

from __future__ import annotations

import math
import re
import shutil
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from kubetrain.artifacts import datasets
from kubetrain.artifacts.checkpoint import (
    latest_checkpoint,
    load_full_state_dict,
    load_model,
    read_manifest,
)
from kubetrain.artifacts.models import build_model
from kubetrain.errors import InvalidInput
from kubetrain.train.__main__ import main
from kubetrain.train.data import BatchDataset, TensorBatches, eval_batches, load_data
from kubetrain.train.distributed import Runtime
from kubetrain.train.loop import TorchUpdates, train_epoch
from kubetrain.train.progress import SilentReporter

EPOCH_LINE = re.compile(
    r"^epoch (\d+)/(\d+) step (\d+) loss [\d.]+ train_accuracy [\d.]+ "
    r"test_accuracy ([\d.]+) samples/s [\d.]+$"
)


def train_args(data: Path, ckpt: Path, *extra: str) -> list[str]:
    return ["-m", "kubetrain.train", "--data", str(data), "--checkpoint-dir", str(ckpt), *extra]


def torchrun(port: int, *args: str) -> list[str]:
    return [
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(port),
        *args,
    ]


def epoch_lines(stdout: str) -> list[re.Match[str]]:
    lines = [line for line in stdout.splitlines() if line.startswith("epoch ")]
    matches = [EPOCH_LINE.match(line) for line in lines]
    assert all(matches), lines
    return matches


# --- custom plug-ins, importable as test_train:... in this process --------------------------


def tiny_classifier(sample_shape: list[int], num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(sample_shape), num_classes))


def digits_from_folder(data_dir: str | None, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    assert data_dir is not None
    return datasets.load_split(data_dir, split)


def mismatched_dataset(data_dir: str | None, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(4, 3), torch.zeros(5, dtype=torch.long)


def not_a_model(sample_shape: list[int], num_classes: int) -> str:
    return "nope"


# --- one process, no torchrun ---------------------------------------------------------------


def test_single_process_checkpoints_every_epoch_and_resumes(
    digits_dir: Path, tmp_path: Path, run_python
) -> None:
    ckpt = tmp_path / "ckpt"
    first = run_python(train_args(digits_dir, ckpt, "--epochs", "2"))
    assert first.returncode == 0, first.stderr
    assert [m.group(1, 2) for m in epoch_lines(first.stdout)] == [("1", "2"), ("2", "2")]
    assert f"checkpoint saved: {ckpt / 'epoch-000001'}" in first.stdout
    assert (ckpt / "LATEST").read_text().strip() == "epoch-000002"
    first_manifest = read_manifest(ckpt / "epoch-000002")
    steps_per_epoch = first_manifest["step"] // 2
    assert first.stdout.strip().splitlines()[-1] == (
        f"training complete: epoch 2 step {2 * steps_per_epoch} checkpoint {ckpt / 'epoch-000002'}"
    )

    resumed = run_python(train_args(digits_dir, ckpt, "--epochs", "3"))
    assert resumed.returncode == 0, resumed.stderr
    resumed_from = ckpt / "epoch-000002"
    assert (
        f"resumed epoch 2 at world size 1: step {2 * steps_per_epoch} from {resumed_from}"
        in resumed.stdout
    )
    lines = epoch_lines(resumed.stdout)
    assert [m.group(1, 2) for m in lines] == [("3", "3")]  # epochs 1 and 2 are not redone
    assert int(lines[0].group(3)) == 3 * steps_per_epoch
    manifest = read_manifest(latest_checkpoint(ckpt))
    assert (manifest["epoch"], manifest["step"]) == (3, 3 * steps_per_epoch)
    assert [m["epoch"] for m in manifest["metrics"]] == [1, 2, 3]
    assert manifest["metrics"][:2] == first_manifest["metrics"]

    # Resuming restores the optimizer too: the weights match an uninterrupted 3-epoch run.
    straight = run_python(train_args(digits_dir, tmp_path / "straight", "--epochs", "3"))
    assert straight.returncode == 0, straight.stderr
    resumed_weights = load_full_state_dict(ckpt / "epoch-000003")
    straight_weights = load_full_state_dict(tmp_path / "straight" / "epoch-000003")
    for key, value in straight_weights.items():
        torch.testing.assert_close(resumed_weights[key], value)

    again = run_python(train_args(digits_dir, ckpt, "--epochs", "3"))
    assert again.returncode == 0, again.stderr
    assert epoch_lines(again.stdout) == []
    assert f"training complete: epoch 3 step {3 * steps_per_epoch}" in again.stdout


def test_custom_dataset_and_model_callables_train_in_process(
    digits_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--dataset", "test_train:digits_from_folder", "--data", str(digits_dir),
        "--model", "test_train:tiny_classifier", "--epochs", "1", "--optimizer", "sgd",
        "--lr", "0.05", "--grad-accum-steps", "2", "--checkpoint-dir", str(tmp_path),
    ]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert len(epoch_lines(out)) == 1
    manifest = read_manifest(tmp_path / "epoch-000001")
    assert manifest["model"] == {
        "spec": "test_train:tiny_classifier",
        "sample_shape": [1, 8, 8],
        "num_classes": 10,
    }
    explicit = load_model(tmp_path / "epoch-000001", model_factory="test_train:tiny_classifier")
    assert isinstance(explicit[1], nn.Linear)

    other_model = [*argv, "--model", "mlp", "--epochs", "2"]
    assert main(other_model) == 2  # resuming tiny_classifier weights into an mlp is refused
    err = capsys.readouterr().err.strip()
    assert err.startswith("kubetrain.train: error: --resume:") and "\n" not in err


# --- real multi-process runs ----------------------------------------------------------------


@pytest.fixture(scope="module")
def ddp_run(digits_dir: Path, tmp_path_factory: pytest.TempPathFactory, run_python, free_port):
    ckpt = tmp_path_factory.mktemp("ddp") / "ckpt"
    started = time.perf_counter()
    result = run_python(torchrun(free_port(), *train_args(digits_dir, ckpt)), timeout=180)
    return result, ckpt, time.perf_counter() - started


def assert_converged_two_process_run(stdout: str, ckpt: Path, strategy: str) -> None:
    lines = epoch_lines(stdout)
    assert [int(m.group(1)) for m in lines] == list(range(1, 11))  # rank 0 alone logs
    assert float(lines[-1].group(4)) >= 0.95
    manifest = read_manifest(latest_checkpoint(ckpt))
    assert (manifest["epoch"], manifest["world_size"], manifest["strategy"]) == (10, 2, strategy)
    assert manifest["metrics"][-1]["test_accuracy"] >= 0.95
    assert f"training complete: epoch 10 step {manifest['step']}" in stdout


def test_ddp_two_processes_reach_95_percent(ddp_run, digits_dir: Path) -> None:
    result, ckpt, seconds = ddp_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert_converged_two_process_run(result.stdout, ckpt, "ddp")
    # Each rank sees half the data: ceil(ceil(N/2)/32) steps per epoch, not ceil(N/32).
    train_count = len(datasets.load_split(digits_dir, "train")[1])
    first = epoch_lines(result.stdout)[0]
    assert int(first.group(3)) == math.ceil(math.ceil(train_count / 2) / 32)
    print(f"ddp 2x10 epochs: {seconds:.1f}s")


def test_fsdp_two_processes_match_ddp_checkpoint(
    ddp_run, digits_dir: Path, tmp_path: Path, run_python, free_port
) -> None:
    _, ddp_ckpt, _ = ddp_run
    ckpt = tmp_path / "ckpt"
    started = time.perf_counter()
    result = run_python(
        torchrun(free_port(), *train_args(digits_dir, ckpt, "--strategy", "fsdp")), timeout=180
    )
    print(f"fsdp 2x10 epochs: {time.perf_counter() - started:.1f}s")
    assert result.returncode == 0, result.stderr[-3000:]
    assert_converged_two_process_run(result.stdout, ckpt, "fsdp")
    assert sorted(p.name for p in (ckpt / "epoch-000010" / "dcp").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]

    fsdp_weights = load_full_state_dict(ckpt / "epoch-000010")
    ddp_weights = load_full_state_dict(ddp_ckpt / "epoch-000010")
    assert {k: v.shape for k, v in fsdp_weights.items()} == {
        k: v.shape for k, v in ddp_weights.items()
    }
    # Same seed, same data order, same math: sharding must not change the result.
    for key, value in ddp_weights.items():
        torch.testing.assert_close(fsdp_weights[key], value, atol=1e-3, rtol=1e-3)


def test_fsdp_resumes_a_ddp_checkpoint(
    ddp_run, digits_dir: Path, tmp_path: Path, run_python, free_port
) -> None:
    _, ddp_ckpt, _ = ddp_run
    ckpt = tmp_path / "ckpt"
    shutil.copytree(ddp_ckpt, ckpt)
    args = train_args(digits_dir, ckpt, "--strategy", "fsdp", "--epochs", "11")
    result = run_python(torchrun(free_port(), *args), timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    step = read_manifest(ckpt / "epoch-000010")["step"]
    assert (
        f"resumed epoch 10 at world size 2: step {step} from {ckpt / 'epoch-000010'}"
        in result.stdout
    )
    assert [int(m.group(1)) for m in epoch_lines(result.stdout)] == [11]
    manifest = read_manifest(latest_checkpoint(ckpt))
    assert (manifest["epoch"], manifest["strategy"]) == (11, "fsdp")
    assert manifest["metrics"][-1]["test_accuracy"] >= 0.95


# --- options --------------------------------------------------------------------------------


def test_bad_option_exits_nonzero_with_one_line(digits_dir: Path, tmp_path: Path, run_python):
    result = run_python(train_args(digits_dir, tmp_path / "ckpt", "--epochs", "0"))
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "kubetrain.train: error: --epochs: 0 is below 1; pass --epochs 1 or more"
    )
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("extra", "option"),
    [
        (["--batch-size", "0"], "--batch-size"),
        (["--lr", "0"], "--lr"),
        (["--lr", "nan"], "--lr"),
        (["--lr", "inf"], "--lr"),
        (["--grad-accum-steps", "0"], "--grad-accum-steps"),
        (["--clip-grad-norm", "-1"], "--clip-grad-norm"),
        (["--checkpoint-every", "0"], "--checkpoint-every"),
        (["--keep-checkpoints", "-1"], "--keep-checkpoints"),
        (["--keep-checkpoints", "two"], "--keep-checkpoints"),
        (["--strategy", "zero3"], "--strategy"),
        (["--optimizer", "lion"], "--optimizer"),
        (["--resume", "maybe"], "--resume"),
        (["--device", "tpu"], "--device"),
        (["--model", "resnet"], "--model"),
        (["--model", "no_such_module_kt:build"], "--model"),
        (["--model", "test_train:missing"], "--model"),
        (["--model", "test_train:not_a_model"], "--model"),
        (["--dataset", "imagenet"], "--dataset"),
        (["--data", "/nonexistent/kubetrain-data"], "--data"),
        (["--epochs", "ten"], "--epochs"),
        (["--tensorboard-dir", "s3://bucket/events"], "--tensorboard-dir"),
        (["--tensorboard-dir", __file__], "--tensorboard-dir"),
        (["--strategy", "deepspeed", "--zero-stage", "4"], "--zero-stage"),
        (["--zero-stage", "3"], "--zero-stage"),  # strategy ddp
        (["--strategy", "fsdp", "--deepspeed-config", "{}"], "--deepspeed-config"),
        (["--strategy", "deepspeed", "--deepspeed-config", "/no/ds.json"], "--deepspeed-config"),
        (["--strategy", "deepspeed", "--deepspeed-config", "{"], "--deepspeed-config"),
        (["--strategy", "deepspeed", "--deepspeed-config", "[1]"], "--deepspeed-config"),
        (
            ["--strategy", "deepspeed", "--deepspeed-config", '{"zero_optimization":{"stage":0}}'],
            "--deepspeed-config",
        ),
        (
            [
                "--strategy",
                "deepspeed",
                "--deepspeed-config",
                '{"train_batch_size":33,'
                '"train_micro_batch_size_per_gpu":8,"gradient_accumulation_steps":2}',
            ],
            "--deepspeed-config",
        ),
        (["--strategy", "deepspeed", "--checkpoint-dir", "memory://b/ckpt"], "--checkpoint-dir"),
    ],
)
def test_bad_options_name_the_option(
    digits_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra, option
) -> None:
    argv = ["--data", str(digits_dir), "--checkpoint-dir", str(tmp_path / "ckpt"), *extra]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own checks (choices, types)
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert "\n" not in err
    assert err.startswith("kubetrain.train: error:") and option in err, err


def test_missing_checkpoint_dir_is_refused(digits_dir: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--data", str(digits_dir)])
    assert exc.value.code == 2
    assert "--checkpoint-dir" in capsys.readouterr().err


# --- pieces ---------------------------------------------------------------------------------

CPU = Runtime(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def _sgd_copy(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = build_model("mlp", [1, 8, 8], 10)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_gradient_accumulation_equals_one_large_batch() -> None:
    torch.manual_seed(1)
    x, y = torch.randn(64, 1, 8, 8), torch.randint(0, 10, (64,))
    small = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 64, 8)]
    large = [(x[i : i + 32], y[i : i + 32]) for i in range(0, 64, 32)]
    accumulated, opt_a = _sgd_copy()
    direct, opt_d = _sgd_copy()
    common = {"runtime": CPU, "reporter": SilentReporter()}

    stats_a = train_epoch(
        TorchUpdates(accumulated, opt_a, 0.5), small, num_batches=8, grad_accum_steps=4, **common
    )
    stats_d = train_epoch(
        TorchUpdates(direct, opt_d, 0.5), large, num_batches=2, grad_accum_steps=1, **common
    )

    assert stats_a.steps == stats_d.steps == 2
    assert stats_a.samples == stats_d.samples == 64
    for a, d in zip(accumulated.parameters(), direct.parameters(), strict=True):
        torch.testing.assert_close(a, d, atol=1e-6, rtol=1e-5)
    uneven, opt_u = _sgd_copy()
    stats_u = train_epoch(
        TorchUpdates(uneven, opt_u, 0.5), small[:7], num_batches=7, grad_accum_steps=4, **common
    )
    assert stats_u.steps == 2  # 4 + 3 micro-batches: the short tail still steps
    # the manifest's per-step history: each step's mean loss over its own micro-batches
    assert [step.samples for step in stats_u.per_step] == [32, 24]
    for a, d in zip(stats_a.per_step, stats_d.per_step, strict=True):
        assert a.loss == pytest.approx(d.loss, rel=1e-5) and a.samples == d.samples == 32
    assert stats_d.loss == pytest.approx(sum(step.loss for step in stats_d.per_step) / 2)


@pytest.mark.parametrize("total", [1, 7, 360])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_eval_batches_count_each_sample_once_in_lockstep(total: int, world_size: int) -> None:
    x, y = torch.arange(total, dtype=torch.float32).unsqueeze(1), torch.arange(total)
    counted: list[int] = []
    batch_counts = set()
    for rank in range(world_size):
        batches = list(eval_batches(x, y, batch_size=4, rank=rank, world_size=world_size))
        batch_counts.add(len(batches))
        for _xb, yb, weight in batches:
            counted += yb[weight > 0].tolist()
    assert sorted(counted) == list(range(total))
    assert len(batch_counts) == 1  # every rank runs the same number of forwards


@pytest.mark.parametrize("total", [1, 10, 37])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_tensor_batches_are_the_data_loaders_batches(total: int, world_size: int) -> None:
    """The batches of data held where the model computes are, epoch by epoch, those of the
    pinned DataLoader path (host data for a GPU): both follow the same DistributedSampler."""
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

    x, y = torch.randn(total, 3), torch.arange(total)
    for rank in range(world_size):
        sampler = DistributedSampler(
            BatchDataset(x, y), num_replicas=world_size, rank=rank, shuffle=True, seed=5
        )
        batches = TensorBatches(x, y, sampler, batch_size=4)
        loader = DataLoader(
            BatchDataset(x, y), sampler=BatchSampler(sampler, 4, drop_last=False), batch_size=None
        )
        for epoch in (1, 2):
            sampler.set_epoch(epoch)
            ours, theirs = list(batches), list(loader)
            assert len(ours) == len(batches) == len(theirs) == len(loader)
            for (xa, ya), (xb, yb) in zip(ours, theirs, strict=True):
                assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.parametrize("shape", [[1, 8, 8], [1, 28, 28], [3, 32, 32]])
@pytest.mark.parametrize("spec", ["mlp", "cnn", "test_train:tiny_classifier"])
def test_build_model_fits_common_image_shapes(spec: str, shape: list[int]) -> None:
    model = build_model(spec, shape, 10)
    assert model(torch.randn(2, *shape)).shape == (2, 10)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("resnet", "unknown model"),
        ("no_such_module_kt:build", "cannot import"),
        ("test_train:missing", "no attribute"),
        ("test_train:", "package.module:callable"),
        ("test_train:not_a_model", "not a torch.nn.Module"),
    ],
)
def test_build_model_rejects_bad_specs(spec: str, problem: str) -> None:
    with pytest.raises(InvalidInput, match=problem) as exc:
        build_model(spec, [1, 8, 8], 10)
    assert exc.value.field == "--model"
    assert "use mlp, cnn or package.module:callable" in str(exc.value)


def test_a_factory_that_raises_is_named_as_the_users_code_not_a_bug_of_ours() -> None:
    """`--model json:dumps` (a callable of the wrong kind) raised TypeError inside the trainer
    and was reported as 'internal error ... a bug in kubetrain'."""
    with pytest.raises(InvalidInput) as exc:
        build_model("json:dumps", [1, 8, 8], 10)
    assert exc.value.field == "--model"
    assert "json:dumps([1, 8, 8], 10) raised TypeError" in str(exc.value)
    assert "callable(sample_shape, num_classes)" in str(exc.value)


def test_cnn_refuses_flat_samples() -> None:
    with pytest.raises(InvalidInput, match="channels, height, width"):
        build_model("cnn", [64], 10)


def test_custom_dataset_is_checked(digits_dir: Path) -> None:
    data = load_data("test_train:digits_from_folder", digits_dir)
    assert data.sample_shape == [1, 8, 8] and data.num_classes == 10
    with pytest.raises(InvalidInput, match="--dataset"):
        load_data("test_train:mismatched_dataset", digits_dir)


def test_a_long_epoch_logs_a_record_at_least_a_minute_for_the_stall_check(
    monkeypatch, capsys
) -> None:
    """In a log (no terminal) rank 0's progress records are the heartbeat: one every
    RECORD_SECONDS, and however slow that is set, one a minute, so `wait --stall-timeout`
    never takes a slow epoch for a hung rank. The loss (a device read) is asked for only
    when a record is due."""
    from kubetrain.progress import parse_record
    from kubetrain.train import progress

    clock = [0.0]
    asked = []
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(progress.PlainReporter, "RECORD_SECONDS", 120.0)

    def so_far() -> progress.SoFar:
        asked.append(clock[0])
        return progress.SoFar(step=7, loss=0.5, samples=32 * len(asked))

    reporter = progress.PlainReporter(world_size=4)
    reporter.start_epoch(3, 10, 1000)
    for _ in range(400):  # 400 batches, 0.5 s each: 200 s
        clock[0] += 0.5
        reporter.advance(so_far)
    records = [parse_record(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r.epoch, r.epochs, r.batch, r.batches) for r in records] == [
        (3, 10, 120, 1000),
        (3, 10, 240, 1000),
        (3, 10, 360, 1000),
    ]
    assert asked == [60.0, 120.0, 180.0]
    assert records[0].samples_per_second == round(32 / 60 * 4, 1)  # rank 0's rate × world size
    assert records[0].eta_seconds == 60 / 120 * (1000 - 120 + 7 * 1000)


def test_the_eta_counts_whole_epochs_validation_and_checkpoints_included(
    monkeypatch, capsys
) -> None:
    """Once an epoch has ended, the epochs to come are estimated at the wall time an epoch
    took (seen in tmux: digits' 0.1 s of batches and 0.4 s of validation and checkpoint per
    epoch gave 'eta 4s' with 25 s to go). A resumed process counts only its own epochs."""
    from kubetrain.progress import parse_record
    from kubetrain.train import progress

    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(progress.PlainReporter, "RECORD_SECONDS", 3600.0)  # epoch ends only
    reporter = progress.PlainReporter()
    for epoch in (4, 5, 6):  # resumed at epoch 4 of 10
        reporter.start_epoch(epoch, 10, 10)
        for _ in range(10):  # 1 s of batches
            clock[0] += 0.1
            reporter.advance(lambda: progress.SoFar(step=1, loss=0.5, samples=32))
        clock[0] += 4.0  # validation and a checkpoint
    etas = [parse_record(line).eta_seconds for line in capsys.readouterr().out.splitlines()]
    assert etas == [round(1.0 * 6, 1), 5.0 * 5, 5.0 * 4]


def test_a_40_epoch_run_keeps_at_most_n_checkpoints(digits_dir: Path, tmp_path: Path) -> None:
    """Issue 18 (3): retention holds through a long run: each epoch deletes only what is older
    than the checkpoint LATEST named before it (a reader may hold that one), so N stay at the
    end, LATEST names the last, and no staging folder is left."""
    ckpt = tmp_path / "ckpt"
    argv = [
        "--data", str(digits_dir), "--checkpoint-dir", str(ckpt), "--epochs", "40",
        "--batch-size", "4096", "--keep-checkpoints", "3", "--tensorboard-dir", "",
    ]  # fmt: skip
    assert main(argv) == 0
    kept = sorted(path.name for path in ckpt.glob("epoch-*"))
    assert kept == ["epoch-000038", "epoch-000039", "epoch-000040"]
    assert (ckpt / "LATEST").read_text().strip() == "epoch-000040"
    assert len(read_manifest(ckpt / "epoch-000040")["metrics"]) == 40
    assert not list(ckpt.glob(".tmp-*"))
