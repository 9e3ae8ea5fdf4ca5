"""Promote publishes a verified model as an immutable registry version and points PROMOTED at it."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from kubetrain import storage
from kubetrain.artifacts.model_card import read_model_card
from kubetrain.cli import main
from kubetrain.components.collect_checkpoint.collect import collect_checkpoint
from kubetrain.components.promote_model import cli, promote
from kubetrain.components.promote_model.promote import promote_model
from kubetrain.errors import IntegrityError, InvalidInput, KubetrainError
from kubetrain.storage import atomic
from kubetrain.storage.integrity import sha256_file


@pytest.fixture(scope="module")
def models(trained_checkpoints, tmp_path_factory) -> dict[str, Path]:
    """Two different collected models (ddp and fsdp runs)."""
    root = tmp_path_factory.mktemp("models")
    for name in ("ddp", "fsdp"):
        collect_checkpoint(str(trained_checkpoints[name]), str(root / name))
    return {name: root / name for name in ("ddp", "fsdp")}


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (hidden ones too) with its content."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_promotes_and_writes_the_pointer(models, tmp_path):
    registry = tmp_path / "registry"
    promoted = promote_model(str(models["ddp"]), str(registry), "v1", accuracy=0.97)
    card = read_model_card(str(models["ddp"]))
    assert promoted.path == str(registry / "v1") and promoted.version == "v1"
    assert promoted.sha256 == card["sha256"]
    assert promoted.pointer == str(registry / "PROMOTED")
    pointer = json.loads((registry / "PROMOTED").read_text())
    assert pointer["version"] == "v1" and pointer["sha256"] == card["sha256"]
    assert pointer["model"] == card["model"] and pointer["accuracy"] == 0.97
    assert pointer["source"] == str(models["ddp"].resolve())
    assert pointer["promoted_at"].endswith("+00:00")
    assert sorted(p.name for p in registry.iterdir()) == ["PROMOTED", "v1"], "no staging left"


def test_the_copy_verifies(models, tmp_path):
    promoted = promote_model(str(models["ddp"]), str(tmp_path / "registry"), "v1")
    copy = Path(promoted.path)
    assert read_model_card(str(copy)) == read_model_card(str(models["ddp"]))
    assert sha256_file(copy / "model.safetensors") == promoted.sha256
    assert "accuracy" not in json.loads(Path(promoted.pointer).read_text())


def test_a_model_changed_after_its_check_is_refused_and_not_published(
    models, tmp_path, monkeypatch
):
    """The copy is verified against the card's sha256 on the way (copy_verified), so a model
    file that changes between the check and the copy (re-collected, damaged) is not published."""
    source = tmp_path / "model"
    shutil.copytree(models["ddp"], source)

    def checked_then_damaged(folder):
        card = read_model_card(folder)
        data = bytearray((source / "model.safetensors").read_bytes())
        data[-1] ^= 0xFF
        (source / "model.safetensors").write_bytes(bytes(data))
        return card

    monkeypatch.setattr(promote, "read_model_card", checked_then_damaged)
    registry = tmp_path / "registry"
    with pytest.raises(IntegrityError, match=r"model\.safetensors has sha256 .* nothing was"):
        promote_model(str(source), str(registry), "v1")
    assert list(registry.iterdir()) == [], "neither the version, the pointer nor staging remains"


def test_promoting_the_same_model_again_is_a_no_op(models, tmp_path):
    registry = tmp_path / "registry"
    first = promote_model(str(models["ddp"]), str(registry), "v1", accuracy=0.97)
    before = snapshot(registry)
    again = promote_model(str(models["ddp"]), str(registry), "v1", accuracy=0.97)
    assert again == first
    assert snapshot(registry) == before, "the pointer keeps its first promoted_at"


def test_a_retry_after_a_lost_pointer_writes_it(models, tmp_path):
    registry = tmp_path / "registry"
    promote_model(str(models["ddp"]), str(registry), "v1")
    (registry / "PROMOTED").unlink()  # as if the step died between publishing and the pointer
    promoted = promote_model(str(models["ddp"]), str(registry), "v1")
    assert json.loads(Path(promoted.pointer).read_text())["version"] == "v1"


def test_another_model_under_a_taken_version_is_refused(models, tmp_path):
    registry = tmp_path / "registry"
    promote_model(str(models["ddp"]), str(registry), "v1")
    before = snapshot(registry)
    with pytest.raises(KubetrainError, match="v1 already exists .* pick a new version"):
        promote_model(str(models["fsdp"]), str(registry), "v1")
    assert snapshot(registry) == before


def test_a_version_published_by_a_concurrent_promote_is_not_replaced(models, tmp_path, monkeypatch):
    registry = tmp_path / "registry"
    real_fsync_tree = atomic.fsync_tree

    def racing_fsync_tree(root):
        shutil.copytree(models["fsdp"], registry / "v1")  # another promote wins the race
        real_fsync_tree(root)

    monkeypatch.setattr(atomic, "fsync_tree", racing_fsync_tree)
    with pytest.raises(KubetrainError, match="v1 already exists"):
        promote_model(str(models["ddp"]), str(registry), "v1")
    assert read_model_card(str(registry / "v1")) == read_model_card(str(models["fsdp"]))
    assert sorted(p.name for p in registry.iterdir()) == ["v1"]


def test_a_corrupted_model_is_refused_and_nothing_is_published(models, tmp_path):
    registry = tmp_path / "registry"
    promote_model(str(models["ddp"]), str(registry), "v1")
    before = snapshot(registry)
    broken = tmp_path / "broken"
    shutil.copytree(models["fsdp"], broken)
    data = bytearray((broken / "model.safetensors").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (broken / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"model\.safetensors does not match its sha256"):
        promote_model(str(broken), str(registry), "v2")
    assert not (registry / "v2").exists()
    assert snapshot(registry) == before, "PROMOTED still points at v1"
    assert sorted(p.name for p in registry.iterdir() if not p.name.startswith(".")) == [
        "PROMOTED",
        "v1",
    ]


def test_a_damaged_registry_version_is_reported_not_replaced(models, tmp_path):
    registry = tmp_path / "registry"
    promote_model(str(models["ddp"]), str(registry), "v1")
    (registry / "v1" / "model.safetensors").write_bytes(b"damaged")
    before = snapshot(registry)
    with pytest.raises(IntegrityError, match=r"registry version .*v1 is damaged.*remove it"):
        promote_model(str(models["ddp"]), str(registry), "v1")
    assert snapshot(registry) == before


@pytest.mark.parametrize(
    "version", ["../x", "a/b", "", ".hidden", "-v1", "v1\n", "a" * 129, "PROMOTED", "promoted"]
)
def test_bad_versions_are_refused_before_anything_is_created(models, tmp_path, version):
    with pytest.raises(InvalidInput, match="version") as refused:
        promote_model(str(models["ddp"]), str(tmp_path / "registry"), version)
    assert refused.value.field == "version"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("registry", "message"),
    [("", "is empty"), ("   ", "is empty"), ("nosuch://bucket/models", "unknown protocol")],
)
def test_bad_registries_are_refused_before_anything_is_created(models, tmp_path, registry, message):
    with pytest.raises(InvalidInput, match=message) as refused:
        promote_model(str(models["ddp"]), registry, "v1")
    assert refused.value.field == "registry"
    assert list(tmp_path.iterdir()) == []


def test_a_file_url_registry_is_a_local_path(models, tmp_path):
    promoted = promote_model(str(models["ddp"]), f"file://{tmp_path}/registry", "v1")
    assert promoted.path == str(tmp_path / "registry" / "v1")
    assert (tmp_path / "registry" / "PROMOTED").is_file()


@pytest.mark.parametrize("accuracy", [-0.1, 1.5, float("nan")])
def test_accuracy_outside_zero_one_is_refused(models, tmp_path, accuracy):
    with pytest.raises(InvalidInput, match="accuracy"):
        promote_model(str(models["ddp"]), str(tmp_path / "registry"), "v1", accuracy=accuracy)
    assert list(tmp_path.iterdir()) == []


def test_promote_cli_writes_output_parameters(models, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "promote",
            "--model",
            str(models["ddp"]),
            "--registry",
            str(tmp_path / "registry"),
            "--version",
            "2024-06-01",
            "--accuracy",
            "0.97",
            "--output-parameters",
            str(tmp_path / "outputs"),
        ]
    )
    assert args.handler(args) == 0
    sha256 = read_model_card(str(models["ddp"]))["sha256"]
    path = tmp_path / "registry" / "2024-06-01"
    assert capsys.readouterr().out == f"promoted 2024-06-01 (sha256 {sha256}) to {path}\n"
    assert (tmp_path / "outputs" / "promoted_to").read_text() == str(path)
    assert (tmp_path / "outputs" / "sha256").read_text() == sha256
    assert json.loads((tmp_path / "registry" / "PROMOTED").read_text())["accuracy"] == 0.97


def test_the_cli_module_imports_no_heavy_packages(run_python):
    probe = (
        "import sys, kubetrain.components.promote_model.cli; "
        "heavy = {'torch', 'kfp', 'safetensors'} & set(sys.modules); assert not heavy, heavy"
    )
    result = run_python(["-c", probe])
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("passed", "registry", "storage", "promotes", "said"),
    [
        (True, "/mnt/shared/registry", "", True, "promoting to /mnt/shared/registry"),
        (True, "/mnt/shared/registry", "/mnt/shared/store", True, "promoting to"),
        (False, "/mnt/shared/registry", "", False, "did not pass the evaluation"),
        (True, "", "", False, "no model_registry given"),
        # a run in object storage keeps its registry there (issue 27: promote writes URLs)
        (True, "/mnt/shared/registry", "s3://bucket/runs", False, "e.g. s3://bucket/runs/registry"),
        (True, "s3://bucket/models", "s3://bucket/runs", True, "promoting to s3://bucket/models"),
        (True, "s3://bucket/models", "", True, "promoting to s3://bucket/models"),
    ],
)
def test_the_promotion_gate_says_yes_only_when_promote_can_run(
    passed, registry, storage, promotes, said, capsys
):
    """The pipeline's single-output gate (issue 17 (20)): a dsl.If on its one output works under
    KFP's local runner too, where one on evaluate's NamedTuple `passed` is always false
    (kubeflow/pipelines#13313)."""
    from kubetrain.components.promote_model.component import promotion_gate

    assert promotion_gate.python_func(passed, registry, storage) is promotes
    assert said in capsys.readouterr().out


def test_the_kfp_component_promotes_the_model_a_location_pointer_names(models, tmp_path):
    """collect's `model` artifact is a LOCATION pointer when the model went to `storage`."""
    from kfp import dsl

    from kubetrain import storage
    from kubetrain.components.promote_model.component import promote_model as component

    artifact = tmp_path / "artifact"
    artifact.mkdir()
    storage.write_pointer(str(artifact), str(models["ddp"]))
    outputs = component.python_func(
        model=dsl.Model(uri=str(artifact)), registry=str(tmp_path / "registry"), version="v1"
    )
    assert outputs.promoted_to == str(tmp_path / "registry" / "v1")
    assert outputs.sha256 == read_model_card(str(models["ddp"]))["sha256"]


# --- a registry in object storage (issue 27) ---------------------------------------------------

BUCKET = "kubetrain-registry"


def test_promotes_to_s3_with_the_card_last(models, s3_env, monkeypatch):
    """The same layout as a local registry, published through collect's road (publish_dir):
    the model file verified on its way, model.json once it is up, then PROMOTED."""
    registry = f"s3://{BUCKET}/models-first"
    fs = storage.resolve(registry)[0]  # fsspec's cached instance, which promote uses too
    written: list[str] = []

    def recorded(write, name_of_target):
        def writing(*args, **kwargs):
            result = write(*args, **kwargs)
            written.append(name_of_target(*args).rsplit("/", 1)[-1])
            return result

        return writing

    monkeypatch.setattr(
        storage, "copy_verified", recorded(storage.copy_verified, lambda source, target: target)
    )
    monkeypatch.setattr(fs, "put_file", recorded(fs.put_file, lambda lpath, rpath: rpath))
    monkeypatch.setattr(fs, "pipe_file", recorded(fs.pipe_file, lambda path, data: path))
    promoted = promote_model(str(models["ddp"]), registry, "v1", accuracy=0.97)
    card = read_model_card(str(models["ddp"]))
    assert sorted(s3_env.keys(BUCKET, "models-first/")) == [
        "models-first/PROMOTED",
        "models-first/v1/model.json",
        "models-first/v1/model.safetensors",
    ]
    assert written == ["model.safetensors", "model.json", "PROMOTED"]
    assert promoted.path == f"{registry}/v1" and promoted.pointer == f"{registry}/PROMOTED"
    assert read_model_card(promoted.path) == card
    pointer = json.loads(storage.read_text(promoted.pointer))
    assert (pointer["version"], pointer["sha256"]) == ("v1", card["sha256"])
    assert pointer["accuracy"] == 0.97 and pointer["source"] == str(models["ddp"].resolve())


def test_an_s3_registry_keeps_versions_as_a_local_one_does(models, s3_env):
    registry = f"s3://{BUCKET}/models-kept/"  # a trailing slash names the same registry
    first = promote_model(str(models["ddp"]), registry, "v1")
    pointer = storage.read_bytes(first.pointer)
    assert promote_model(str(models["ddp"]), registry, "v1") == first
    assert storage.read_bytes(first.pointer) == pointer, "a no-op keeps the first promoted_at"
    with pytest.raises(KubetrainError, match="v1 already exists .* pick a new version"):
        promote_model(str(models["fsdp"]), registry, "v1")
    assert read_model_card(first.path)["sha256"] == first.sha256
    assert json.loads(storage.read_bytes(first.pointer))["version"] == "v1"
    second = promote_model(str(models["fsdp"]), registry, "v2")
    assert json.loads(storage.read_text(second.pointer))["version"] == "v2"
    promote_model(str(models["ddp"]), registry, "v1")  # a rollback points back at v1
    assert json.loads(storage.read_text(first.pointer))["version"] == "v1"


def test_an_interrupted_s3_publish_is_absent_and_published_over(models, s3_env, monkeypatch):
    """Killed after the model file and before the card: no reader takes the version (no card),
    PROMOTED is not written, and the retry publishes it whole."""
    registry = f"s3://{BUCKET}/models-interrupted"
    fs = storage.resolve(registry)[0]  # fsspec's cached instance, which promote uses too

    def killed(*args, **kwargs):
        raise ConnectionError("the pod was evicted")

    with monkeypatch.context() as patched:
        patched.setattr(fs, "put_file", killed)
        with pytest.raises(ConnectionError):
            promote_model(str(models["ddp"]), registry, "v1")
    assert s3_env.keys(BUCKET, "models-interrupted/") == ["models-interrupted/v1/model.safetensors"]
    with pytest.raises(IntegrityError, match="no model.json"):
        read_model_card(f"{registry}/v1")
    promoted = promote_model(str(models["fsdp"]), registry, "v1")
    assert read_model_card(promoted.path) == read_model_card(str(models["fsdp"]))
    assert json.loads(storage.read_text(promoted.pointer))["sha256"] == promoted.sha256


def test_a_model_in_s3_is_promoted_to_a_local_and_an_s3_registry(models, s3_env, tmp_path):
    """collect's output in object storage (the KFP artifact is a LOCATION pointer to it)."""
    remote = f"s3://{BUCKET}/collected/ddp"
    storage.publish_dir(_staged(models["ddp"]), remote, "model.json")
    artifact = tmp_path / "artifact"
    storage.write_pointer(artifact, remote)
    local = promote_model(str(artifact), str(tmp_path / "registry"), "v1")
    assert read_model_card(local.path) == read_model_card(remote)
    assert json.loads(Path(local.pointer).read_text())["source"] == remote
    in_s3 = promote_model(remote, f"s3://{BUCKET}/models-from-s3", "v1")
    assert in_s3.sha256 == local.sha256 == read_model_card(remote)["sha256"]


def _staged(model: Path) -> Path:
    staged = Path(storage.staging_dir("s3://any/model"))
    shutil.copytree(model, staged, dirs_exist_ok=True)
    return staged


def test_any_fsspec_url_is_a_registry(models):
    registry = "memory://kubetrain-registry-any"
    promoted = promote_model(str(models["ddp"]), registry, "v1")
    assert read_model_card(promoted.path) == read_model_card(str(models["ddp"]))
    assert json.loads(storage.read_text(promoted.pointer))["version"] == "v1"


def test_kubetrain_promote_publishes_to_s3(models, s3_env, capsys):
    registry = f"s3://{BUCKET}/models-cli"
    code = main(
        ["promote", "--model", str(models["ddp"]), "--registry", registry, "--version", "v1"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.endswith(f" to {registry}/v1\n")
    assert "models-cli/v1/model.json" in s3_env.keys(BUCKET, "models-cli/")


# --- a registry on a claim the run deletes ---------------------------------------------------


@pytest.mark.parametrize(
    "registry", ["/mnt/shared/registry", "/mnt/shared", "/mnt/shared/", "file:///mnt/shared/r",
                 "/mnt/registry-pvc/../shared/registry"],
)  # fmt: skip
def test_a_registry_on_the_run_claim_is_refused_in_one_line(models, registry, capsys):
    argv = ["promote", "--model", str(models["ddp"]), "--registry", registry, "--version", "v1",
            "--run-claim-mount", "/mnt/shared"]  # fmt: skip
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("kubetrain promote: error: registry: ") and "run's own claim" in line
    assert "deleted when the run succeeds" in line and "registry_pvc" in line


@pytest.mark.parametrize("registry", ["{tmp}/registry", "memory://kubetrain-registry-lasting"])
def test_a_registry_off_the_run_claim_is_promoted(models, tmp_path, registry):
    registry = registry.format(tmp=tmp_path)
    promoted = promote_model(str(models["ddp"]), registry, "v1", run_claim_mount="/mnt/shared")
    assert promoted.version == "v1"
    assert json.loads(storage.read_text(promoted.pointer))["sha256"] == promoted.sha256


def test_object_storage_promote_cannot_reach_is_refused_in_one_line(models, monkeypatch, capsys):
    """No credentials (no keys, no pod identity): one line naming the registry, not botocore's
    traceback, and nothing promoted."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance identity either
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    from s3fs import S3FileSystem

    argv = ["promote", "--model", str(models["ddp"]), "--registry", "s3://kubetrain-unreachable/m",
            "--version", "v1"]  # fmt: skip
    # fsspec keeps one filesystem per options, not per environment: none from another test
    # is used here, and the one made here goes with it
    S3FileSystem.clear_instance_cache()
    try:
        assert main(argv) == 2
    finally:
        S3FileSystem.clear_instance_cache()
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("kubetrain promote: error: registry: cannot reach s3://")
    assert "NoCredentialsError" in line and "credentials" in line.split("; ")[-1]
