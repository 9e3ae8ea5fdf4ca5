"""Prep's dataset, evaluate's report and launch's dataset staging copy publish by the one road,
:func:`kubetrain.artifacts.publish.publish_verified` (issue 28): a disagreement planted between
what a step verified and what it would publish (a file changed after it was hashed, a marker
recording another digest, a source file its manifest does not describe) is refused, with
nothing published and an earlier output left as it was."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kubetrain import storage
from kubetrain.artifacts import datasets
from kubetrain.artifacts.publish import publish_verified
from kubetrain.components.evaluate_model import report as report_module
from kubetrain.components.launch_trainjob import staging
from kubetrain.errors import IntegrityError

BUCKET = "kubetrain-publish-test"
OTHER = "0" * 64


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def record_other_digest(manifest: Path, split_file: str) -> None:
    """Rewrite a dataset manifest so that it records ``OTHER`` for ``split_file``."""
    content = json.loads(manifest.read_text())
    for entry in content["splits"].values():
        if entry["file"] == split_file:
            entry["sha256"] = OTHER
    manifest.write_text(json.dumps(content))


def plant_before_publish(
    monkeypatch: pytest.MonkeyPatch, module: object, change: Callable[[Path], None]
) -> None:
    """Make ``change`` to the staged folder between the step's hashing and the entry's checks."""

    def changed_then_published(staged: Path, output, verified) -> bool:
        change(staged)
        return publish_verified(staged, output, verified)

    monkeypatch.setattr(module, "publish_verified", changed_then_published)


def write_small_dataset(output: storage.Location, label: int = 0) -> dict:
    x = np.arange(16, dtype=np.float32).reshape(4, 1, 2, 2) + label
    y = np.array([0, 1, 0, 1])
    splits = {"train": (x, y), "test": (x, y)}
    return datasets.write_dataset(output, splits, ["a", "b"], [0.0], [1.0], {"label": label})


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --- prep's dataset ---------------------------------------------------------------------------


def test_a_dataset_split_changed_after_it_was_written_is_not_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "data"
    earlier = write_small_dataset(target, label=0)
    plant_before_publish(monkeypatch, datasets, lambda s: flip_byte(s / "train.safetensors"))
    with pytest.raises(IntegrityError, match="train.safetensors changed after it was verified"):
        write_small_dataset(target, label=1)
    assert datasets.read_manifest(target) == json.loads(json.dumps(earlier))  # kept as it was
    assert datasets.load_split(target, "train")[0].min() == 0
    assert leftovers(tmp_path) == ["data"], "no staging folder is left"


def test_a_dataset_whose_manifest_records_another_digest_is_not_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "data"
    plant_before_publish(
        monkeypatch,
        datasets,
        lambda s: record_other_digest(s / "manifest.json", "test.safetensors"),
    )
    with pytest.raises(IntegrityError, match=f"records sha256 {OTHER} for test.safetensors"):
        write_small_dataset(target)
    assert leftovers(tmp_path) == []


def test_a_dataset_records_the_sha256_of_the_bytes_written(tmp_path: Path) -> None:
    """Each split is hashed as it is written, straight from the arrays: the manifest's digest
    is the file's, and the split reads back as the arrays it was written from (y first in the
    file, so both tensors start 8-byte aligned)."""
    from safetensors.numpy import load_file

    manifest = write_small_dataset(tmp_path / "data", label=3)
    for entry in manifest["splits"].values():
        path = tmp_path / "data" / entry["file"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
        tensors = load_file(str(path))
        assert tensors["x"].dtype == np.float32 and tensors["y"].dtype == np.int64
        np.testing.assert_array_equal(tensors["x"].reshape(-1), np.arange(16) + 3)


def test_a_dataset_is_held_to_the_output_rule_where_it_is_published(tmp_path: Path) -> None:
    """write_dataset makes its CheckedOutput itself: a folder of someone else's files is
    refused before anything is written, whoever calls it."""
    from kubetrain.errors import InvalidInput

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("mine")
    with pytest.raises(InvalidInput, match="output_dir.*not a kubetrain dataset"):
        write_small_dataset(tmp_path / "data")
    assert leftovers(tmp_path / "data") == ["notes.txt"]
    assert leftovers(tmp_path) == ["data"]


def test_on_object_storage_a_changed_split_leaves_the_earlier_dataset_up(
    s3_env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked before the earlier dataset's manifest is taken down: readers keep it."""
    url = f"s3://{BUCKET}/datasets/planted"
    write_small_dataset(url, label=0)
    plant_before_publish(monkeypatch, datasets, lambda s: flip_byte(s / "test.safetensors"))
    with pytest.raises(IntegrityError, match="test.safetensors changed after it was verified"):
        write_small_dataset(url, label=1)
    assert datasets.read_manifest(url)["label"] == 0
    assert datasets.load_split(url, "test")[0].min() == 0


# --- evaluate's report ------------------------------------------------------------------------


def test_a_report_file_changed_after_it_was_hashed_is_not_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "report"
    report_module.write_report(report_module.Report("<p>earlier</p>", {"a.png": b"png"}), target)
    plant_before_publish(monkeypatch, report_module, lambda s: flip_byte(s / "a.png"))
    with pytest.raises(IntegrityError, match="a.png changed after it was verified"):
        report_module.write_report(report_module.Report("<p>later</p>", {"a.png": b"png"}), target)
    assert (target / "report.html").read_text() == "<p>earlier</p>"
    assert (target / "a.png").read_bytes() == b"png"
    assert leftovers(tmp_path) == ["report"]


def test_a_report_marker_records_each_files_sha256(tmp_path: Path) -> None:
    html = report_module.write_report(
        report_module.Report("<p>é</p>", {"a.png": b"png", "b.png": b"other"}), tmp_path / "r"
    )
    marker = json.loads((html.parent / "report.json").read_text())
    files = ["report.html", "a.png", "b.png"]
    assert marker["sha256"] == {
        name: hashlib.sha256((html.parent / name).read_bytes()).hexdigest() for name in files
    }
    assert html.read_text(encoding="utf-8") == "<p>é</p>"


# --- launch's dataset staging copy ------------------------------------------------------------


@pytest.fixture
def source(tmp_path: Path) -> Path:
    write_small_dataset(tmp_path / "source")
    return tmp_path / "source"


def test_a_staged_copy_of_a_split_its_manifest_does_not_describe_is_refused(
    source: Path, tmp_path: Path
) -> None:
    """A byte flipped in the source after prep: the copy onto the shared volume was published
    as it was (the trainer's pods found out, or trained on it); now it is refused."""
    flip_byte(source / "train.safetensors")
    with pytest.raises(IntegrityError, match="sha256"):
        staging.stage_dataset(str(source), str(tmp_path / "shared" / "data"))
    assert not (tmp_path / "shared" / "data").exists()
    assert not (tmp_path / "shared").exists() or leftovers(tmp_path / "shared") == []


def test_a_staged_manifest_rewritten_after_it_was_read_is_refused(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source manifest changes (a prep publishing anew) between its reading and its copy:
    the files were verified to what was read, the copied manifest records other digests."""
    read = staging.read_manifest

    def read_then_rewritten(folder: str) -> dict:
        manifest = read(folder)
        if Path(folder) == source:
            record_other_digest(source / "manifest.json", "train.safetensors")
        return manifest

    monkeypatch.setattr(staging, "read_manifest", read_then_rewritten)
    with pytest.raises(IntegrityError, match=f"records sha256 {OTHER} for train.safetensors"):
        staging.stage_dataset(str(source), str(tmp_path / "shared" / "data"))
    assert not (tmp_path / "shared" / "data").exists()


def test_a_staged_split_changed_after_its_verified_copy_is_refused(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plant_before_publish(monkeypatch, staging, lambda s: flip_byte(s / "test.safetensors"))
    with pytest.raises(IntegrityError, match="test.safetensors changed after it was verified"):
        staging.stage_dataset(str(source), str(tmp_path / "shared" / "data"))
    assert not (tmp_path / "shared" / "data").exists()
    monkeypatch.undo()
    staged = Path(staging.stage_dataset(str(source), str(tmp_path / "shared" / "data")))
    assert datasets.read_manifest(staged) == datasets.read_manifest(source)
    assert leftovers(tmp_path / "shared") == ["data"], "no staging folder is left"


# --- collect --export: the exported program is published only as verified as the model -------
def exported_then_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``export_model`` as collect calls it, and then a byte of the program it wrote flipped:
    a program changed between its check against the model and the publish."""
    from kubetrain.artifacts import export

    real = export.export_model

    def export_and_flip(model_dir, kind="torch-export", sample=None, model_factory=None):
        path = real(model_dir, kind, sample, model_factory)
        flip_byte(Path(path))
        return path

    monkeypatch.setattr(export, "export_model", export_and_flip)


def test_collect_export_changed_after_it_was_written_is_not_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubetrain.components.collect_checkpoint.collect import collect_checkpoint
    from tests.reliability.test_manifest_rule import write_checkpoint

    ckpt = write_checkpoint(tmp_path / "ckpt", "ddp")
    collect_checkpoint(str(ckpt), str(tmp_path / "model"), export="torchscript")
    published = json.loads((tmp_path / "model" / "export.json").read_text())["exports"]
    assert list(published) == ["torchscript"]  # the unchanged export publishes
    exported_then_changed(monkeypatch)
    with pytest.raises(IntegrityError, match="model.torchscript.pt"):
        collect_checkpoint(str(ckpt), str(tmp_path / "other"), export="torchscript")
    assert not (tmp_path / "other").exists()
    assert leftovers(tmp_path) == ["ckpt", "model"]  # no staging folder left
