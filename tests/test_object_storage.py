"""Datasets, checkpoints and models in object storage, against a real S3-compatible server
(moto in server mode), reached through the same environment variables as real S3."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kubetrain import storage
from kubetrain.artifacts import datasets
from kubetrain.artifacts.checkpoint import (
    latest_checkpoint,
    load_full_state_dict,
    read_manifest,
    restore_checkpoint,
    verify_checkpoint,
)
from kubetrain.artifacts.model_card import load_model_weights, read_model_card
from kubetrain.errors import IntegrityError, InvalidInput
from tests.support.s3_server import S3Server
from tests.test_train import torchrun, train_args

BUCKET = "kubetrain-test"


def subprocess_env(s3: S3Server) -> dict[str, str]:
    topology = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
    env = {key: value for key, value in os.environ.items() if key not in topology}
    return {**env, "OMP_NUM_THREADS": "1", **s3.env()}


def run_python(args: list[str], s3: S3Server, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=Path(__file__).resolve().parents[1],
        env=subprocess_env(s3),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def s3_digits(s3: S3Server, digits_dir: Path) -> str:
    """The digits dataset copied into the bucket through write_dataset's own publish path."""
    url = f"s3://{BUCKET}/datasets/digits"
    saved = {key: os.environ.get(key) for key in s3.env()}
    os.environ.update(s3.env())
    try:
        manifest = datasets.read_manifest(digits_dir)
        splits = {split: datasets.load_split(digits_dir, split) for split in datasets.SPLITS}
        provenance = {
            key: manifest[key]
            for key in manifest
            if key not in {"format", "classes", "num_classes", "sample_shape", "splits"}
            and key != "normalisation"
        }
        datasets.write_dataset(
            url,
            {split: (x.numpy(), y.numpy()) for split, (x, y) in splits.items()},
            manifest["classes"],
            manifest["normalisation"]["mean"],
            manifest["normalisation"]["std"],
            provenance,
        )
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return url


def test_dataset_round_trip_in_s3(s3_env: S3Server, s3_digits: str, digits_dir: Path) -> None:
    assert sorted(s3_env.keys(BUCKET, "datasets/digits/")) == [
        "datasets/digits/manifest.json",
        "datasets/digits/test.safetensors",
        "datasets/digits/train.safetensors",
    ]
    assert (
        datasets.read_manifest(s3_digits)["splits"] == datasets.read_manifest(digits_dir)["splits"]
    )
    x, y = datasets.load_split(s3_digits, "train")
    local_x, local_y = datasets.load_split(digits_dir, "train")
    assert torch.equal(x, local_x) and torch.equal(y, local_y)


def test_dataset_pointer_folder_reads_the_url(s3_env: S3Server, s3_digits: str, tmp_path: Path):
    storage.write_pointer(tmp_path / "artifact", s3_digits)
    assert datasets.read_manifest(tmp_path / "artifact")["format"] == datasets.FORMAT
    assert len(datasets.load_split(tmp_path / "artifact", "test")[1]) > 0


def test_corrupt_object_is_named(s3_env: S3Server, s3_digits: str) -> None:
    bad = f"s3://{BUCKET}/datasets/bad"
    fs, _ = storage.resolve(bad)
    fs.copy(f"{BUCKET}/datasets/digits", f"{BUCKET}/datasets/bad", recursive=True)
    fs.pipe_file(f"{BUCKET}/datasets/bad/test.safetensors", b"not the data")
    with pytest.raises(IntegrityError, match="test.safetensors is corrupt"):
        datasets.load_split(bad, "test")


def test_unknown_protocol_and_missing_manifest_are_clear(s3_env: S3Server) -> None:
    with pytest.raises(InvalidInput, match="unknown protocol"):
        storage.resolve("nosuch://bucket/x", "--data")
    with pytest.raises(IntegrityError, match="no manifest.json"):
        datasets.read_manifest(f"s3://{BUCKET}/nothing-here")


@pytest.fixture(scope="module")
def s3_runs(s3: S3Server, s3_digits: str, free_port) -> dict[str, str]:
    """Real two-process torchrun trainings, DDP and FSDP, checkpointing to the bucket."""
    runs = {}
    for strategy in ("ddp", "fsdp"):
        ckpt = f"s3://{BUCKET}/checkpoints/{strategy}"
        args = train_args(s3_digits, ckpt, "--strategy", strategy, "--epochs", "3")  # type: ignore[arg-type]
        result = run_python(torchrun(free_port(), *args), s3)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[strategy] = ckpt
    return runs


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_process_training_checkpoints_to_s3(
    s3_env: S3Server, s3_runs: dict[str, str], strategy: str
) -> None:
    ckpt = s3_runs[strategy]
    keys = s3_env.keys(BUCKET, f"checkpoints/{strategy}/")
    assert f"checkpoints/{strategy}/LATEST" in keys
    latest = latest_checkpoint(ckpt)
    assert latest == f"{ckpt}/epoch-000003"
    manifest = verify_checkpoint(latest)
    assert (manifest["epoch"], manifest["world_size"], manifest["strategy"]) == (3, 2, strategy)
    payload = {"ddp": {"model.safetensors", "optimizer.pt"}, "fsdp": {"dcp/.metadata"}}
    assert payload[strategy] <= set(manifest["files"])
    if strategy == "fsdp":
        assert {"dcp/__0_0.distcp", "dcp/__1_0.distcp"} <= set(manifest["files"])
    assert load_full_state_dict(latest)


def test_fsdp_and_ddp_s3_checkpoints_hold_the_same_model(s3_env, s3_runs) -> None:
    ddp = load_full_state_dict(latest_checkpoint(s3_runs["ddp"]))
    fsdp = load_full_state_dict(latest_checkpoint(s3_runs["fsdp"]))
    for key, value in ddp.items():
        torch.testing.assert_close(fsdp[key], value, atol=1e-3, rtol=1e-3)


def test_resume_from_s3_in_a_new_run(s3_env, s3_runs, s3_digits: str, free_port) -> None:
    """--resume auto reads LATEST and restores across strategies from the bucket."""
    ckpt = f"s3://{BUCKET}/checkpoints/resumed"
    fs, _ = storage.resolve(ckpt)
    fs.copy(f"{BUCKET}/checkpoints/ddp", f"{BUCKET}/checkpoints/resumed", recursive=True)
    args = train_args(s3_digits, ckpt, "--strategy", "fsdp", "--epochs", "4")  # type: ignore[arg-type]
    result = run_python(torchrun(free_port(), *args), s3_env)
    assert result.returncode == 0, result.stderr[-3000:]
    step = read_manifest(f"{ckpt}/epoch-000003")["step"]
    assert f"resumed epoch 3 at world size 2: step {step} from {ckpt}/epoch-000003" in result.stdout
    assert read_manifest(latest_checkpoint(ckpt))["epoch"] == 4


def test_restore_checkpoint_from_s3_in_process(s3_env, s3_runs) -> None:
    from kubetrain.artifacts.models import build_model

    latest = latest_checkpoint(s3_runs["ddp"])
    info = read_manifest(latest)["model"]
    model = build_model(info["spec"], info["sample_shape"], info["num_classes"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert restore_checkpoint(latest, model, optimizer)["epoch"] == 3
    for key, value in load_full_state_dict(latest).items():
        torch.testing.assert_close(model.state_dict()[key], value)


def test_half_written_checkpoint_is_not_latest(s3_env, s3_runs) -> None:
    """Files of a newer epoch without a manifest (a crash mid-write), even if LATEST names it."""
    ckpt = f"s3://{BUCKET}/checkpoints/half"
    fs, _ = storage.resolve(ckpt)
    fs.copy(f"{BUCKET}/checkpoints/ddp", f"{BUCKET}/checkpoints/half", recursive=True)
    fs.copy(
        f"{BUCKET}/checkpoints/half/epoch-000003/model.safetensors",
        f"{BUCKET}/checkpoints/half/epoch-000004/model.safetensors",
    )
    assert latest_checkpoint(ckpt) == f"{ckpt}/epoch-000003"
    storage.write_text(f"{ckpt}/LATEST", "epoch-000004\n")
    assert latest_checkpoint(ckpt) == f"{ckpt}/epoch-000003"
    with pytest.raises(IntegrityError, match="no manifest.json"):
        read_manifest(f"{ckpt}/epoch-000004")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_collect_from_s3_to_s3_and_to_local(
    s3_env: S3Server, s3_runs: dict[str, str], tmp_path: Path, strategy: str
) -> None:
    from kubetrain.components.collect_checkpoint.collect import collect_checkpoint

    remote = f"s3://{BUCKET}/models/{strategy}"
    to_s3 = collect_checkpoint(s3_runs[strategy], remote)
    assert sorted(s3_env.keys(BUCKET, f"models/{strategy}/")) == [
        f"models/{strategy}/model.json",
        f"models/{strategy}/model.safetensors",
    ]
    to_local = collect_checkpoint(s3_runs[strategy], str(tmp_path / "model"))
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [
        "model.json",
        "model.safetensors",
    ]
    # (safetensors writes header metadata in hash order, so the two files' bytes may differ)
    assert to_s3.sha256 == read_model_card(remote)["sha256"]
    assert to_local.sha256 == read_model_card(tmp_path / "model")["sha256"]
    assert read_model_card(remote)["epoch"] == read_model_card(tmp_path / "model")["epoch"] == 3
    weights = load_model_weights(remote)
    for key, value in load_model_weights(tmp_path / "model").items():
        assert torch.equal(weights[key], value)
    # a pointer folder (the KFP artifact) reads the same model
    storage.write_pointer(tmp_path / "artifact", remote)
    assert read_model_card(tmp_path / "artifact")["sha256"] == to_s3.sha256


def test_tampered_model_in_s3_is_refused(s3_env, s3_runs) -> None:
    from kubetrain.components.collect_checkpoint.collect import collect_checkpoint

    remote = f"s3://{BUCKET}/models/tampered"
    collect_checkpoint(s3_runs["ddp"], remote)
    card = json.loads(storage.read_text(f"{remote}/model.json"))
    card["sha256"] = "0" * 64
    storage.write_text(f"{remote}/model.json", json.dumps(card))
    with pytest.raises(IntegrityError, match="does not match its sha256"):
        read_model_card(remote)


def test_publish_dir_checks_uploads_against_known_digests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A digest the caller already verified is what the upload is checked against (the file is
    not hashed once more to learn it): a staged file that no longer matches it is refused and
    the folder is not published (its manifest never written)."""
    import hashlib

    import fsspec

    fs = fsspec.filesystem("memory")

    def staged_folder() -> Path:
        folder = tmp_path / f"staged-{len(list(tmp_path.iterdir()))}"
        (folder / "sub").mkdir(parents=True)
        (folder / "model.bin").write_bytes(b"weights")
        (folder / "sub" / "other.bin").write_bytes(b"other")
        (folder / "card.json").write_text("{}")
        return folder

    hashed: list[str] = []
    real_sha256_file = storage.sha256_file

    def sha256_file(path: Path) -> str:
        hashed.append(path.name)
        return real_sha256_file(path)

    monkeypatch.setattr(storage, "sha256_file", sha256_file)
    known = {"model.bin": hashlib.sha256(b"weights").hexdigest()}
    try:
        storage.publish_dir(staged_folder(), "memory://published/ok", "card.json", known)
        assert hashed == ["other.bin"], "the known digest was not recomputed"
        assert fs.cat("/published/ok/model.bin") == b"weights"
        assert fs.exists("/published/ok/card.json")

        stale = {"model.bin": hashlib.sha256(b"what was verified earlier").hexdigest()}
        with pytest.raises(IntegrityError):
            storage.publish_dir(staged_folder(), "memory://published/bad", "card.json", stale)
        assert not fs.exists("/published/bad/card.json")
        assert not fs.exists("/published/bad/model.bin")
    finally:
        if fs.exists("/published"):
            fs.rm("/published", recursive=True)


def test_kubetrain_run_with_storage_keeps_everything_in_the_bucket(
    s3: S3Server, tmp_path: Path
) -> None:
    """THE acceptance test: the whole pipeline with --storage s3://bucket/prefix."""
    s3.create_bucket("kubetrain-run")
    env = {**subprocess_env(s3), "KUBETRAIN_LOCAL_ROOT": str(tmp_path / "jobs")}
    result = subprocess.run(
        [sys.executable, "-m", "kubetrain", "run", "--output", str(tmp_path / "runs")]
        + ["--storage", "s3://kubetrain-run/team-a"],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    accuracy = float(re.search(r"^accuracy (\d\.\d{3}) ", result.stdout, re.MULTILINE).group(1))
    assert accuracy >= 0.95
    keys = s3.keys("kubetrain-run", "team-a/")
    (run,) = {key.split("/")[2] for key in keys}
    for expected in (
        f"team-a/datasets/{run}/manifest.json",
        f"team-a/datasets/{run}/train.safetensors",
        f"team-a/checkpoints/{run}/LATEST",
        f"team-a/checkpoints/{run}/epoch-000010/manifest.json",
        f"team-a/checkpoints/{run}/epoch-000010/model.safetensors",
        f"team-a/models/{run}/model.json",
        f"team-a/models/{run}/model.safetensors",
    ):
        assert expected in keys, sorted(keys)
    assert re.search(rf"^model\s+s3://kubetrain-run/team-a/models/{run}$", result.stdout, re.M)
    # Locally: only KFP's bookkeeping (pointer files, metrics, report) and the local backend's
    # job record and logs; no dataset, checkpoint or model bytes.
    local_files = [p for p in tmp_path.rglob("*") if p.is_file()]
    heavy = [p for p in local_files if p.suffix in {".safetensors", ".pt", ".distcp"}]
    assert heavy == []
    pointers = [p for p in local_files if p.name == storage.POINTER]
    assert sorted(p.read_text().split("/")[4] for p in pointers) == ["datasets", "models"]
