"""What the trainer records for people and the report (issue 18 (1) and (4)): rank 0's progress
records off a terminal, the manifest's per-step ``history``, ``hyperparameters`` and ``run``
(kept across a resume), per-epoch scoring on the validation split (test for an older dataset)
and TensorBoard event files. One process, in this process, one or two epochs of digits."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from kubetrain.artifacts import datasets
from kubetrain.artifacts.checkpoint import read_manifest
from kubetrain.components.dataset_prep.prep import prepare_dataset
from kubetrain.errors import IntegrityError
from kubetrain.progress import parse_record
from kubetrain.train import progress
from kubetrain.train.__main__ import main
from kubetrain.train.distributed import Runtime
from kubetrain.train.events import open_event_files
from kubetrain.train.options import parse_options
from kubetrain.train.trainer import MAX_HISTORY, hyperparameters, thin_history

HYPERPARAMETERS = {
    "model", "dataset", "strategy", "optimizer", "lr", "batch_size", "grad_accum_steps",
    "clip_grad_norm", "epochs", "seed", "nodes", "procs_per_node", "world_size",
}  # fmt: skip


@pytest.fixture(scope="module")
def validated_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Digits prepared by `kubetrain prep` with its default validation split."""
    folder = tmp_path_factory.mktemp("validated") / "digits"
    prepare_dataset("sklearn:digits", str(folder))
    return folder


def train(data: Path, ckpt: Path, *extra: str) -> int:
    return main(["--data", str(data), "--checkpoint-dir", str(ckpt), *extra])


def records(out: str) -> list:
    found = [parse_record(line) for line in out.splitlines() if line.startswith("kubetrain-")]
    assert all(found), out
    return found


def test_records_off_a_terminal_parse_and_count_the_run(
    digits_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """stdout is captured here, not a terminal: rank 0 writes a record per due interval (every
    batch with the interval at 0) and one at each epoch's last batch; steps count from the
    run's start, so a resumed run goes on counting."""
    monkeypatch.setattr(progress.PlainReporter, "RECORD_SECONDS", 0.0)
    ckpt = tmp_path / "ckpt"
    assert train(digits_dir, ckpt, "--epochs", "1", "--grad-accum-steps", "2") == 0
    first = records(capsys.readouterr().out)
    batches = first[0].batches
    assert [r.batch for r in first] == list(range(1, batches + 1))
    # two micro-batches a step; an odd last one makes a step of its own
    assert [r.step for r in first] == [b // 2 for b in range(1, batches)] + [(batches + 1) // 2]
    assert {(r.epoch, r.epochs) for r in first} == {(1, 1)}
    assert all(math.isfinite(r.loss) and r.samples_per_second > 0 for r in first)
    assert first[0].eta_seconds >= first[-1].eta_seconds == 0.0  # (the formula: test_train)

    monkeypatch.setattr(progress.PlainReporter, "RECORD_SECONDS", 3600.0)  # only epoch ends
    assert train(digits_dir, ckpt, "--epochs", "3", "--grad-accum-steps", "2") == 0
    out = capsys.readouterr().out
    resumed = records(out)
    steps = first[-1].step
    assert [(r.epoch, r.batch, r.step) for r in resumed] == [
        (2, batches, 2 * steps),
        (3, batches, 3 * steps),
    ]
    assert resumed[0].eta_seconds >= resumed[1].eta_seconds == 0.0
    # the record's loss is the epoch's mean training loss, as the epoch line says
    line = next(line for line in out.splitlines() if line.startswith("epoch 3/3 "))
    assert f"loss {resumed[1].loss:.4f} " in line


def test_a_terminal_gets_the_bar_and_no_records(monkeypatch) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    reporter = progress.make_reporter(True, world_size=2)
    try:
        assert isinstance(reporter, progress.RichReporter)
        reporter.start_epoch(1, 1, 2)
        reporter.advance(lambda: pytest.fail("the bar reads no loss"))
    finally:
        reporter.close()


def test_manifest_records_history_hyperparameters_and_run_across_a_resume(
    digits_dir: Path, tmp_path: Path, monkeypatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "my-run"
    assert train(digits_dir, ckpt, "--epochs", "1", "--lr", "0.002", "--seed", "3") == 0
    first = read_manifest(ckpt / "epoch-000001")
    steps = first["step"]
    assert [e["step"] for e in first["history"]] == list(range(1, steps + 1))
    assert {e["epoch"] for e in first["history"]} == {1}
    assert all(e["samples_per_second"] > 0 and e["loss"] > 0 for e in first["history"])
    assert set(first["hyperparameters"]) == HYPERPARAMETERS
    assert first["hyperparameters"] | {"dataset": None} == {
        "model": "mlp", "dataset": None, "strategy": "ddp", "optimizer": "adamw", "lr": 0.002,
        "batch_size": 32, "grad_accum_steps": 1, "clip_grad_norm": 1.0, "epochs": 1, "seed": 3,
        "nodes": 1, "procs_per_node": 1, "world_size": 1,
    }  # fmt: skip
    assert first["hyperparameters"]["dataset"] == str(digits_dir)
    run = first["run"]
    assert run["job"] == "my-run" and run["seconds"] > 0
    assert run["started_at"].endswith("+00:00") and run["updated_at"] >= run["started_at"]

    monkeypatch.setenv("KUBETRAIN_JOB_NAME", "train-abc")
    assert train(digits_dir, ckpt, "--epochs", "2", "--lr", "0.002", "--seed", "3") == 0
    second = read_manifest(ckpt / "epoch-000002")
    assert second["history"][:steps] == first["history"]  # carried like metrics
    assert [e["epoch"] for e in second["history"][steps:]] == [2] * steps
    assert second["run"]["job"] == "train-abc"
    assert second["run"]["started_at"] == run["started_at"]  # the run's first start
    assert second["run"]["seconds"] > run["seconds"]  # this attempt's time added
    assert second["hyperparameters"]["epochs"] == 2


def test_hyperparameters_take_the_topology_from_torchrun(monkeypatch) -> None:
    """PET_NNODES is what the Trainer sets per node (kubeflow/trainer v2.3.0
    pkg/constants/constants.go TorchEnvNumNodes); LOCAL_WORLD_SIZE what torchrun sets per
    worker (torch/distributed/run.py); torchrun's elastic ``1:4`` is no count."""
    options = parse_options(["--dataset", "x:y", "--checkpoint-dir", "/tmp/kt-ckpt"])
    runtime = Runtime(rank=0, local_rank=0, world_size=8, device=torch.device("cpu"))
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    trained = hyperparameters(options, runtime)
    assert (trained["nodes"], trained["procs_per_node"], trained["world_size"]) == (2, 4, 8)
    assert trained["dataset"] == "x:y"
    monkeypatch.setenv("PET_NNODES", "1:4")
    assert hyperparameters(options, runtime)["nodes"] == 2  # 8 processes, 4 per node
    monkeypatch.delenv("PET_NNODES")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert hyperparameters(options, runtime)["procs_per_node"] == 8


def test_history_is_thinned_evenly_over_the_whole_run() -> None:
    """A long run keeps at most MAX_HISTORY steps, evenly spaced from start to end, and
    thinning epoch by epoch (as the trainer does) keeps what thinning once would."""
    whole = [{"step": s, "epoch": 1 + (s - 1) // 500} for s in range(1, 9001)]
    once = thin_history(whole)
    assert len(once) <= MAX_HISTORY and len(once) > MAX_HISTORY // 2
    gaps = {b["step"] - a["step"] for a, b in zip(once, once[1:], strict=False)}
    assert gaps == {8} and once[0]["step"] == 8 and once[-1]["step"] == 9000
    growing: list = []
    for start in range(0, 9000, 500):
        growing = thin_history([*growing, *whole[start : start + 500]])
    assert growing == once
    assert thin_history(whole[:MAX_HISTORY]) == whole[:MAX_HISTORY]  # nothing to thin


def test_epochs_are_scored_on_validation_and_the_test_split_is_not_read(
    validated_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    read = []
    load_split = datasets.load_split
    monkeypatch.setattr(
        datasets, "load_split", lambda d, split, **kw: read.append(split) or load_split(d, split)
    )
    assert train(validated_dir, tmp_path / "ckpt", "--epochs", "1") == 0
    assert read == ["train", "validation"]  # the test split is evaluate's, read once there
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("epoch 1/1"))
    assert " validation_accuracy " in line and "test_accuracy" not in line
    (record,) = read_manifest(tmp_path / "ckpt" / "epoch-000001")["metrics"]
    assert {"validation_loss", "validation_accuracy"} <= set(record)
    assert not {"test_loss", "test_accuracy"} & set(record)
    assert record["validation_accuracy"] > 0.5


def test_a_dataset_without_validation_is_scored_on_test_as_before(
    digits_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Datasets prepared before the validation split (the fixture writes train and test
    only) still train, their epochs scored on test, with the keys and line of before."""
    assert "validation" not in datasets.read_manifest(digits_dir)["splits"]
    assert train(digits_dir, tmp_path / "ckpt", "--epochs", "1") == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("epoch 1/1"))
    assert " test_accuracy " in line and "validation" not in line
    (record,) = read_manifest(tmp_path / "ckpt" / "epoch-000001")["metrics"]
    assert {"test_loss", "test_accuracy"} <= set(record) and "validation_loss" not in record


def test_tensorboard_event_files_hold_the_scalars(validated_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="the tensorboard package is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ckpt = tmp_path / "ckpt"
    assert train(validated_dir, ckpt, "--epochs", "2") == 0
    events = EventAccumulator(str(ckpt / "tensorboard"))
    events.Reload()
    steps = read_manifest(ckpt / "epoch-000002")["step"]
    assert set(events.Tags()["scalars"]) == {
        "train/loss", "train/samples_per_second", "train/accuracy",
        "validation/loss", "validation/accuracy",
    }  # fmt: skip
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, steps + 1))
    assert len(events.Scalars("train/samples_per_second")) == steps
    assert [e.step for e in events.Scalars("validation/accuracy")] == [steps // 2, steps]
    metrics = read_manifest(ckpt / "epoch-000002")["metrics"]
    assert events.Scalars("validation/accuracy")[-1].value == pytest.approx(
        metrics[-1]["validation_accuracy"], rel=1e-6
    )


def test_tensorboard_folder_defaults_beside_local_checkpoints(tmp_path: Path) -> None:
    def folder(*extra: str, checkpoint_dir: str = str(tmp_path / "ckpt")) -> str | None:
        argv = ["--dataset", "x:y", "--checkpoint-dir", checkpoint_dir, *extra]
        return parse_options(argv).tensorboard_dir

    assert folder() == str(tmp_path / "ckpt" / "tensorboard")
    assert folder("--tensorboard-dir", "") is None  # disabled
    assert folder("--tensorboard-dir", str(tmp_path / "tb")) == str(tmp_path / "tb")
    assert folder("--tensorboard-dir", (tmp_path / "tb").as_uri()) == str(tmp_path / "tb")
    assert folder(checkpoint_dir="s3://bucket/ckpt") is None  # SummaryWriter writes local files


def test_records_come_every_two_seconds_and_at_the_epoch_end(monkeypatch, capsys) -> None:
    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    reporter = progress.PlainReporter()
    reporter.start_epoch(1, 1, 401)
    for _ in range(401):  # 0.5 s a batch
        clock[0] += 0.5
        reporter.advance(lambda: progress.SoFar(step=1, loss=0.5, samples=1))
    batches = [record.batch for record in records(capsys.readouterr().out)]
    assert batches == [*range(4, 401, 4), 401]


def test_without_tensorboard_nothing_is_written_and_nothing_said(
    digits_dir: Path, tmp_path: Path, monkeypatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    assert open_event_files(str(tmp_path / "tb"), 0) is None
    assert train(digits_dir, tmp_path / "ckpt", "--epochs", "1") == 0
    captured = capsys.readouterr()
    assert not (tmp_path / "ckpt" / "tensorboard").exists()
    usual = ("kubetrain-progress ", "epoch ", "checkpoint saved: ", "training complete: ")
    assert [line for line in captured.out.splitlines() if not line.startswith(usual)] == []
    assert captured.err == ""


def test_a_malformed_history_is_refused_naming_the_field(digits_dir: Path, tmp_path: Path) -> None:
    import json

    ckpt = tmp_path / "ckpt"
    assert train(digits_dir, ckpt, "--epochs", "1", "--tensorboard-dir", "") == 0
    manifest_file = ckpt / "epoch-000001" / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["history"] = "every step"
    manifest_file.write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match="field history is 'every step', not a list"):
        read_manifest(ckpt / "epoch-000001")


def test_a_resumed_run_purges_the_events_it_trains_again(digits_dir: Path, tmp_path: Path) -> None:
    """An attempt that logged epoch 2 but died before its checkpoint: the resumed run trains
    epoch 2 again, and TensorBoard shows each step once (SummaryWriter's purge_step)."""
    pytest.importorskip("tensorboard", reason="the tensorboard package is not installed")
    import shutil

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ckpt = tmp_path / "ckpt"
    assert train(digits_dir, ckpt, "--epochs", "2") == 0
    shutil.rmtree(ckpt / "epoch-000002")  # as if the attempt died while checkpointing
    (ckpt / "LATEST").write_text("epoch-000001\n")
    assert train(digits_dir, ckpt, "--epochs", "2") == 0
    events = EventAccumulator(str(ckpt / "tensorboard"))
    events.Reload()
    steps = read_manifest(ckpt / "epoch-000002")["step"]
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, steps + 1))
    assert [e.step for e in events.Scalars("test/accuracy")] == [steps // 2, steps]


def test_a_run_after_an_attempt_that_never_checkpointed_purges_its_events(
    digits_dir: Path, tmp_path: Path
) -> None:
    """An attempt that died before its first checkpoint left events and no checkpoint: the
    next run starts from step 0 and TensorBoard shows each step once, not twice."""
    pytest.importorskip("tensorboard", reason="the tensorboard package is not installed")
    import shutil

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ckpt = tmp_path / "ckpt"
    assert train(digits_dir, ckpt, "--epochs", "1") == 0
    shutil.rmtree(ckpt / "epoch-000001")  # as if the attempt died while checkpointing
    (ckpt / "LATEST").unlink()
    assert train(digits_dir, ckpt, "--epochs", "1") == 0
    events = EventAccumulator(str(ckpt / "tensorboard"))
    events.Reload()
    steps = read_manifest(ckpt / "epoch-000001")["step"]
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, steps + 1))
