"""Promote publishes a verified model as an immutable registry version and points PROMOTED at it."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from kubetrain.artifacts.model_card import read_model_card
from kubetrain.components.collect_checkpoint.collect import collect_checkpoint
from kubetrain.components.promote_model import cli
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


def test_a_copy_damaged_on_the_way_is_refused_and_not_published(models, tmp_path, monkeypatch):
    def damaging_copy(source, destination):
        data = bytearray(Path(source).read_bytes())
        data[-1] ^= 0xFF
        Path(destination).write_bytes(bytes(data))

    monkeypatch.setattr(shutil, "copyfile", damaging_copy)
    registry = tmp_path / "registry"
    with pytest.raises(IntegrityError, match=r"registry's copy of .*model\.safetensors"):
        promote_model(str(models["ddp"]), str(registry), "v1")
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
    [("", "is empty"), ("   ", "is empty"), ("s3://bucket/models", "only local paths")],
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
        (True, "/mnt/shared/registry", "s3://bucket/runs", False, "in s3://bucket/runs"),
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
