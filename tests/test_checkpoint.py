"""Checkpoint layout, atomicity under SIGKILL, integrity checks and resume state."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from kubetrain.artifacts import checkpoint
from kubetrain.artifacts.checkpoint import (
    latest_checkpoint,
    load_full_state_dict,
    load_model,
    prune_checkpoints,
    restore_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from kubetrain.artifacts.models import build_model
from kubetrain.errors import IntegrityError, InvalidInput

MODEL_INFO = {"spec": "mlp", "sample_shape": [1, 8, 8], "num_classes": 10}


def trained(seed: int = 0, steps: int = 2) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small model and an AdamW with real state (moments, step counts)."""
    torch.manual_seed(seed)
    model = build_model("mlp", [1, 8, 8], 10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def save(ckpt_dir: Path, model, optimizer, epoch: int, strategy: str = "ddp") -> Path:
    return save_checkpoint(
        ckpt_dir,
        model,
        optimizer,
        epoch=epoch,
        step=10 * epoch,
        strategy=strategy,
        model_info=MODEL_INFO,
        metrics=[{"epoch": e, "test_accuracy": 0.5} for e in range(1, epoch + 1)],
    )


def assert_same_weights(actual: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    expected = model.state_dict()
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        torch.testing.assert_close(actual[key], value, rtol=0, atol=0)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_save_writes_layout_latest_and_manifest(tmp_path: Path, strategy: str) -> None:
    model, optimizer = trained()
    save(tmp_path, model, optimizer, epoch=1, strategy=strategy)
    path = save(tmp_path, model, optimizer, epoch=2, strategy=strategy)

    assert path == tmp_path / "epoch-000002"
    assert (tmp_path / "LATEST").read_text() == "epoch-000002\n"
    assert latest_checkpoint(tmp_path) == path
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    manifest = verify_checkpoint(path)
    assert manifest["format"] == "kubetrain.checkpoint/v1"
    assert (manifest["epoch"], manifest["step"], manifest["world_size"]) == (2, 20, 1)
    assert manifest["strategy"] == strategy
    assert manifest["model"] == MODEL_INFO
    assert [m["epoch"] for m in manifest["metrics"]] == [1, 2]
    expected = {"ddp": {"model.safetensors", "optimizer.pt"}, "fsdp": {"dcp/.metadata"}}
    assert expected[strategy] <= set(manifest["files"])
    assert_same_weights(load_full_state_dict(path), model)
    assert_same_weights(load_model(path).state_dict(), model)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_restore_brings_back_model_and_optimizer(tmp_path: Path, strategy: str) -> None:
    model, optimizer = trained(seed=0)
    path = save(tmp_path, model, optimizer, epoch=3, strategy=strategy)
    fresh_model, fresh_optimizer = trained(seed=1, steps=1)
    fresh_optimizer.param_groups[0]["lr"] = 5e-4  # a resumed run's own --lr must win

    manifest = restore_checkpoint(path, fresh_model, fresh_optimizer)

    assert (manifest["epoch"], manifest["step"]) == (3, 30)
    assert_same_weights(fresh_model.state_dict(), model)
    for before, after in zip(model.parameters(), fresh_model.parameters(), strict=True):
        old, new = optimizer.state[before], fresh_optimizer.state[after]
        torch.testing.assert_close(new["exp_avg"], old["exp_avg"])
        torch.testing.assert_close(new["exp_avg_sq"], old["exp_avg_sq"])
        assert float(new["step"]) == float(old["step"]) == 2
    assert fresh_optimizer.param_groups[0]["lr"] == 5e-4


def test_latest_checkpoint_skips_incomplete_and_hidden_folders(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "missing") is None
    assert latest_checkpoint(tmp_path) is None
    model, optimizer = trained()
    good = save(tmp_path, model, optimizer, epoch=2)
    (tmp_path / "epoch-000007").mkdir()  # no manifest: a folder someone made by hand
    hidden = tmp_path / ".tmp-epoch-000009"
    hidden.mkdir()
    (hidden / "manifest.json").write_text((good / "manifest.json").read_text())
    broken = tmp_path / "epoch-000008"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")

    (tmp_path / "LATEST").write_text("epoch-000008\n")
    assert latest_checkpoint(tmp_path) == good
    (tmp_path / "LATEST").write_text("../../etc\n")
    assert latest_checkpoint(tmp_path) == good
    (tmp_path / "LATEST").unlink()
    assert latest_checkpoint(tmp_path) == good


def _epochs_1_to_6(ckpt_dir: Path) -> None:
    """Six complete FSDP checkpoints (folders of DCP shards), a staging folder, a manifest-less
    folder and LATEST naming epoch 6: what a 6-epoch run leaves with retention off."""
    model, optimizer = trained()
    first = save(ckpt_dir, model, optimizer, epoch=1, strategy="fsdp")
    for epoch in range(2, 7):
        shutil.copytree(first, ckpt_dir / f"epoch-{epoch:06d}")
    (ckpt_dir / ".tmp-epoch-000007-0a1b").mkdir()  # being written
    (ckpt_dir / "epoch-000000").mkdir()  # no manifest: not ours to judge
    (ckpt_dir / "LATEST").write_text("epoch-000006\n")


def _epoch_folders(ckpt_dir: Path) -> list[str]:
    return sorted(path.name for path in ckpt_dir.iterdir() if path.name != "LATEST")


def test_retention_keeps_the_newest_n_and_what_a_reader_may_hold(tmp_path: Path) -> None:
    _epochs_1_to_6(tmp_path)
    removed = prune_checkpoints(tmp_path, 2, latest_before="epoch-000005")
    assert sorted(Path(path).name for path in removed) == [f"epoch-00000{e}" for e in (1, 2, 3, 4)]
    assert _epoch_folders(tmp_path) == [
        ".tmp-epoch-000007-0a1b", "epoch-000000", "epoch-000005", "epoch-000006"
    ]  # fmt: skip
    verify_checkpoint(tmp_path / "epoch-000006")


def test_retention_of_one_deletes_the_previous_latest_only_an_epoch_later(tmp_path: Path) -> None:
    _epochs_1_to_6(tmp_path)
    prune_checkpoints(tmp_path, 1, latest_before="epoch-000005")
    assert [name for name in _epoch_folders(tmp_path) if name.startswith("epoch-0000")] == [
        "epoch-000000", "epoch-000005", "epoch-000006"
    ]  # fmt: skip


def test_retention_never_deletes_what_latest_names(tmp_path: Path) -> None:
    _epochs_1_to_6(tmp_path)
    (tmp_path / "LATEST").write_text("epoch-000002\n")  # pointed back at an older epoch
    prune_checkpoints(tmp_path, 2, latest_before="epoch-000003")
    assert [name for name in _epoch_folders(tmp_path) if name.startswith("epoch-0000")] == [
        "epoch-000000", "epoch-000002", "epoch-000003", "epoch-000004", "epoch-000005",
        "epoch-000006",
    ]  # fmt: skip


def test_retention_of_zero_keeps_all(tmp_path: Path) -> None:
    _epochs_1_to_6(tmp_path)
    before = _epoch_folders(tmp_path)
    assert prune_checkpoints(tmp_path, 0, latest_before="epoch-000005") == []
    assert prune_checkpoints(tmp_path, 2, latest_before=None) == []  # the first checkpoint
    assert _epoch_folders(tmp_path) == before


@pytest.mark.security
@pytest.mark.usefixtures("no_hang")
def test_a_fifo_as_latest_is_not_read_by_retention(tmp_path: Path) -> None:
    _epochs_1_to_6(tmp_path)
    (tmp_path / "LATEST").unlink()
    os.mkfifo(tmp_path / "LATEST")  # opening it to read would block the trainer for ever
    assert checkpoint.latest_name(tmp_path) is None
    prune_checkpoints(tmp_path, 2, latest_before="epoch-000005")
    assert sorted(path.name for path in tmp_path.glob("epoch-0*")) == [
        "epoch-000000", "epoch-000005", "epoch-000006"
    ]  # fmt: skip


BUCKET = "kubetrain-retention"  # the s3 fixture's bucket


def test_retention_on_object_storage_takes_each_folder_down_manifest_first(
    tmp_path: Path, s3_env
) -> None:
    from kubetrain import storage

    _epochs_1_to_6(tmp_path / "local")
    ckpt = f"s3://{BUCKET}/ckpt"
    fs, _ = storage.resolve(ckpt)
    for epoch in range(1, 7):
        name = f"epoch-{epoch:06d}"
        fs.put(str(tmp_path / "local" / name), f"{BUCKET}/ckpt/{name}", recursive=True)
    storage.write_text(f"{ckpt}/LATEST", "epoch-000006\n")
    removed = prune_checkpoints(ckpt, 2, latest_before="epoch-000005")
    assert removed == [f"{ckpt}/epoch-00000{epoch}" for epoch in (1, 2, 3, 4)]
    assert sorted(storage.list_dirs(ckpt)) == ["epoch-000005", "epoch-000006"]
    assert latest_checkpoint(ckpt) == f"{ckpt}/epoch-000006"


@pytest.mark.bad_input
@pytest.mark.parametrize("keep", [-1, 1.5, True])
def test_a_bad_retention_count_is_refused_in_one_line(tmp_path: Path, keep) -> None:
    _epochs_1_to_6(tmp_path)
    with pytest.raises(InvalidInput, match="^--keep-checkpoints: .*; pass 0 to keep all") as exc:
        prune_checkpoints(tmp_path, keep, latest_before="epoch-000005")
    assert "\n" not in str(exc.value)
    assert len(list(tmp_path.glob("epoch-*"))) == 7


@pytest.mark.fault
def test_flipped_byte_in_model_file_is_caught_and_named(tmp_path: Path, injected) -> None:
    model, optimizer = trained()
    path = save(tmp_path, model, optimizer, epoch=1)
    payload = path / "model.safetensors"
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0x01
    payload.write_bytes(bytes(data))
    assert payload.read_bytes() == bytes(data)
    injected.struck("one bit of the stored model file flipped")

    with pytest.raises(IntegrityError, match=r"model\.safetensors.*corrupt"):
        verify_checkpoint(path)
    with pytest.raises(IntegrityError, match=r"model\.safetensors"):
        load_full_state_dict(path)
    with pytest.raises(IntegrityError, match=r"model\.safetensors"):
        restore_checkpoint(path, *trained())


# The child saves epoch 1 cleanly, then SIGKILLs itself at one point of saving epoch 2.
KILL_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import torch
    from safetensors.torch import save as to_bytes, save_file
    from kubetrain.storage import atomic
    from kubetrain.artifacts import checkpoint
    sys.path.insert(0, sys.argv[4])
    from test_checkpoint import save, trained

    ckpt_dir, point, strategy = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    model, optimizer = trained(seed=0)
    save(ckpt_dir, model, optimizer, epoch=1, strategy=strategy)
    save_file(model.state_dict(), str(ckpt_dir.parent / "epoch1-weights.safetensors"))
    trained_more, optimizer_more = trained(seed=1, steps=3)

    def die(*_args, **_kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    def half_write(path, tensors):
        data = to_bytes(tensors)
        with open(path, "wb") as handle:
            handle.write(data[: len(data) // 2])
            handle.flush()
            os.fsync(handle.fileno())
        die()

    if point == "payload":
        checkpoint._write_model_file = half_write
    elif point == "manifest":
        checkpoint.storage.folder_digests = die
    elif point == "publish":
        atomic.fsync_tree = die
    elif point == "latest":
        atomic.write_text = die
    save(ckpt_dir, trained_more, optimizer_more, epoch=2, strategy=strategy)
    sys.exit("not killed")
    """
)


@pytest.mark.fault
@pytest.mark.parametrize(
    ("point", "strategy"),
    [("payload", "ddp"), ("manifest", "fsdp"), ("publish", "ddp"), ("latest", "ddp")],
)
def test_killed_save_is_never_returned_as_latest(
    tmp_path: Path, run_python, point: str, strategy: str, injected
) -> None:
    ckpt_dir = tmp_path / "ckpt"
    script = tmp_path / "kill_during_save.py"
    script.write_text(KILL_SCRIPT)
    tests_dir = str(Path(__file__).parent)

    child = run_python([str(script), str(ckpt_dir), point, strategy, tests_dir], timeout=60)

    assert child.returncode == -signal.SIGKILL, child.stderr
    injected.struck(f"the saving process was SIGKILLed at {point}")
    latest = latest_checkpoint(ckpt_dir)
    assert latest == ckpt_dir / "epoch-000001"
    assert (ckpt_dir / "LATEST").read_text().strip() == "epoch-000001"
    if point == "latest":
        assert verify_checkpoint(ckpt_dir / "epoch-000002")["epoch"] == 2  # complete, unnamed
    else:
        assert not (ckpt_dir / "epoch-000002").exists()
        (debris,) = ckpt_dir.glob(".tmp-epoch-000002-*")  # stays hidden, its name unique
        assert debris.is_dir()
    from safetensors.torch import load_file

    expected = load_file(str(tmp_path / "epoch1-weights.safetensors"))

    def previous_checkpoint_is_bit_identical() -> None:
        verify_checkpoint(latest)
        actual = load_full_state_dict(latest)
        assert sorted(actual) == sorted(expected)
        for key in expected:
            torch.testing.assert_close(actual[key], expected[key], rtol=0, atol=0)

    injected.data_intact("the previous checkpoint", previous_checkpoint_is_bit_identical)

    # The next save of the same epoch clears the debris and publishes normally.
    model, optimizer = trained(seed=2)
    assert save(ckpt_dir, model, optimizer, epoch=2, strategy=strategy) == latest.with_name(
        "epoch-000002"
    )
    assert latest_checkpoint(ckpt_dir) == ckpt_dir / "epoch-000002"
    assert not list(ckpt_dir.glob(".tmp-epoch-000002*")), "the next attempt removed the debris"
    assert_same_weights(load_full_state_dict(ckpt_dir / "epoch-000002"), model)


def test_checkpoint_name_sorts_by_epoch() -> None:
    names = [checkpoint.checkpoint_name(epoch) for epoch in (2, 10, 100)]
    assert names == sorted(names) == ["epoch-000002", "epoch-000010", "epoch-000100"]


# --- one writer per checkpoint folder ---------------------------------------------------------

_HOLDER = textwrap.dedent(
    """
    import sys
    from kubetrain.artifacts.checkpoint import lock_checkpoint_dir
    lock = lock_checkpoint_dir(sys.argv[1])
    print("held", flush=True)
    sys.stdin.read()  # holds the folder until killed or told to end
    """
)


def _hold_in_another_process(ckpt_dir: Path, job: str) -> subprocess.Popen[str]:
    """A process of job ``job`` holding ``ckpt_dir``'s lock (as a training job's rank 0 does)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(ckpt_dir)],
        env={**os.environ, "KUBETRAIN_JOB_NAME": job},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_job_on_the_same_checkpoint_dir_is_refused_at_once(
    tmp_path: Path, digits_dir: Path, capsys, monkeypatch
) -> None:
    """Job A (another process) holds the folder; job B's trainer stops before training with one
    line naming the folder and job A, and writes nothing; once A has died (a crash), the same
    job restarted takes the folder again."""
    from kubetrain.train.__main__ import main

    ckpt_dir = tmp_path / "ckpt"
    holder = _hold_in_another_process(ckpt_dir, "job-a")
    try:
        before = sorted(p.name for p in ckpt_dir.iterdir())
        monkeypatch.setenv("KUBETRAIN_JOB_NAME", "job-b")
        code = main(["--data", str(digits_dir), "--epochs", "1", "--checkpoint-dir", str(ckpt_dir)])
        err = capsys.readouterr().err.strip()
        assert code == 2
        assert "\n" not in err, err
        assert err.startswith("kubetrain.train: error: --checkpoint-dir: "), err
        assert str(ckpt_dir) in err and "job job-a" in err and f"pid {holder.pid}" in err, err
        assert sorted(p.name for p in ckpt_dir.iterdir()) == before == [".lock"]
        assert holder.poll() is None, "job A was left alone"
    finally:
        holder.kill()
        holder.wait()
    assert holder.returncode == -signal.SIGKILL
    monkeypatch.setenv("KUBETRAIN_JOB_NAME", "job-a")  # A restarted after its crash
    lock = checkpoint.lock_checkpoint_dir(ckpt_dir)
    assert lock is not None
    assert json.loads((ckpt_dir / ".lock").read_text())["job"] == "job-a"
    lock.release()


def test_the_lock_is_released_when_the_run_ends(tmp_path: Path) -> None:
    first = checkpoint.lock_checkpoint_dir(tmp_path / "ckpt")
    with pytest.raises(InvalidInput, match="being written by another job"):
        checkpoint.lock_checkpoint_dir(tmp_path / "ckpt")  # another open file: refused too
    assert first is not None
    first.release()
    second = checkpoint.lock_checkpoint_dir(tmp_path / "ckpt")
    assert second is not None
    second.release()


@pytest.mark.bad_input
def test_a_checkpoint_dir_that_is_a_file_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "ckpt").write_text("x")
    with pytest.raises(InvalidInput) as refused:
        checkpoint.lock_checkpoint_dir(tmp_path / "ckpt")
    assert refused.value.field == "--checkpoint-dir"
    assert (tmp_path / "ckpt").read_text() == "x"


def test_object_storage_checkpoint_dirs_have_no_lock() -> None:
    assert checkpoint.lock_checkpoint_dir("s3://bucket/ckpt") is None


@pytest.mark.fault
def test_a_second_training_job_on_a_running_jobs_folder_fails_and_loses_nothing(
    tmp_path: Path, digits_dir: Path, injected
) -> None:
    """The issue's case with real trainers: job B is started on the folder job A is writing.
    B stops with one line naming A before it trains; A goes on; A's LATEST and checkpoints
    are A's and still verify and load."""
    ckpt_dir = tmp_path / "ckpt"
    env = {key: v for key, v in os.environ.items() if key not in {"RANK", "WORLD_SIZE"}}
    train = [sys.executable, "-m", "kubetrain.train", "--data", str(digits_dir)]
    job_a = subprocess.Popen(
        [*train, "--epochs", "1000", "--checkpoint-dir", str(ckpt_dir)],
        env={**env, "OMP_NUM_THREADS": "1", "KUBETRAIN_JOB_NAME": "job-a"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = 120 / 0.05
        while latest_checkpoint(ckpt_dir) is None and job_a.poll() is None and deadline > 0:
            time.sleep(0.05)
            deadline -= 1
        assert latest_checkpoint(ckpt_dir) is not None, "job A checkpointed"
        job_b = subprocess.run(
            [*train, "--epochs", "1", "--seed", "7", "--checkpoint-dir", str(ckpt_dir)],
            env={**env, "OMP_NUM_THREADS": "1", "KUBETRAIN_JOB_NAME": "job-b"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert job_a.poll() is None, "job A was still writing when job B was refused"
    finally:
        job_a.send_signal(signal.SIGKILL)
        job_a.wait()
    lines = job_b.stderr.strip().splitlines()
    assert job_b.returncode == 2 and len(lines) == 1, job_b.stderr
    assert lines[0].startswith("kubetrain.train: error: --checkpoint-dir: "), lines
    assert f"{ckpt_dir} is being written by another job (job job-a" in lines[0]
    injected.struck("a second trainer started on the folder job A was writing")

    def every_checkpoint_is_job_as() -> None:
        newest = latest_checkpoint(ckpt_dir)
        assert newest is not None
        manifest = verify_checkpoint(newest)
        assert [entry["epoch"] for entry in manifest["metrics"]] == list(
            range(1, manifest["epoch"] + 1)
        )
        load_model(newest)  # loads
        # A is killed at any moment, possibly after publishing epoch N and before moving LATEST
        # to it: A's history is the longest one any verified folder holds.
        folders = {folder: verify_checkpoint(folder) for folder in ckpt_dir.glob("epoch-*")}
        history = max((held["metrics"] for held in folders.values()), key=len)
        assert manifest["metrics"] == history[: manifest["epoch"]]
        assert manifest["epoch"] >= len(history) - 1, "LATEST is at most one epoch behind"
        for folder, earlier in folders.items():  # every epoch is A's: in A's history
            assert earlier["metrics"] == history[: earlier["epoch"]], folder

    injected.data_intact("job A's checkpoints", every_checkpoint_is_job_as)


def test_a_filesystem_without_locks_trains_unlocked(tmp_path: Path, monkeypatch) -> None:
    import errno
    import fcntl

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert checkpoint.lock_checkpoint_dir(tmp_path / "ckpt") is None
