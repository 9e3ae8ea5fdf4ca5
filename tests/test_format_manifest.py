"""Dataset and checkpoint manifests, model cards and export.json: every unusable record, every
malformed field and every name against the manifest rule is one clear IntegrityError."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kubetrain.artifacts import checkpoint, checkpoint_manifest, datasets, model_card
from kubetrain.artifacts.export import verify_export
from kubetrain.artifacts.manifest import check_entry
from kubetrain.bounded_json import MAX_DEPTH
from kubetrain.errors import IntegrityError

READERS = [
    pytest.param(datasets.read_manifest, "dataset", id="dataset"),
    pytest.param(checkpoint_manifest.read_manifest, "checkpoint", id="checkpoint"),
]


@pytest.mark.parametrize(("read", "kind"), READERS)
@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "no manifest.json"),
        (b"{not json", "is not valid JSON"),
        (b"\xff\xfe\x00", "is not UTF-8 text"),
        (b"[1, 2]", "format 'list' is not"),
        (b'{"format": "someone.else/v9"}', "format 'someone.else/v9' is not"),
    ],
)
def test_unusable_manifest_is_one_integrity_error_naming_the_folder(
    tmp_path, read, kind, content, problem
):
    if content is not None:
        (tmp_path / "manifest.json").write_bytes(content)
    with pytest.raises(IntegrityError, match=problem) as caught:
        read(tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{kind} {tmp_path}: ") and "\n" not in message


# --- malformed fields: one IntegrityError, never a KeyError or TypeError -----------------------


@pytest.fixture(scope="module")
def records(tmp_path_factory, digits_dir) -> dict[str, Path]:
    """A real checkpoint folder, a collected model with export.json, and the digits dataset."""
    import torch

    from kubetrain.artifacts.checkpoint import save_checkpoint
    from kubetrain.artifacts.models import mlp
    from kubetrain.components.collect_checkpoint.collect import collect_checkpoint

    root = tmp_path_factory.mktemp("records")
    model = mlp([1, 8, 8], 10)
    save_checkpoint(
        root / "ckpt", model, torch.optim.SGD(model.parameters(), lr=0.1), epoch=1, step=1,
        strategy="ddp", model_info={"spec": "mlp", "sample_shape": [1, 8, 8], "num_classes": 10},
        metrics=[],
    )  # fmt: skip
    collect_checkpoint(str(root / "ckpt"), str(root / "model"), "torch-export")
    return {"ckpt": root / "ckpt" / "epoch-000001", "model": root / "model", "data": digits_dir}


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set the field at ``path`` (keys joined by "/": names hold dots)."""

    def change(record: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        for key in parents:
            record = record[key]
        record[last] = value

    return change


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def change(record: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        for key in parents:
            record = record[key]
        del record[last]

    return change


READERS_OF = {
    "checkpoint": ("ckpt", "manifest.json", lambda folder: checkpoint.verify_checkpoint(folder)),
    "dataset": ("data", "manifest.json", lambda folder: datasets.load_split(folder, "test")),
    "model card": ("model", "model.json", lambda folder: model_card.read_model_card(folder)),
    "export.json": ("model", "export.json", lambda folder: verify_export(folder)),
}
MALFORMED = {
    "checkpoint": {
        "files not an object": _set("files", ["model.safetensors"]),
        "sha256 not hex": _set("files/model.safetensors", "not-a-sha256"),
        "sha256 uppercase": _set("files/optimizer.pt", "A" * 64),
        "sha256 a number": _set("files/model.safetensors", 7),
        "epoch a string": _set("epoch", "1"),
        "step negative": _set("step", -1),
        "world_size zero": _set("world_size", 0),
        "strategy unknown": _set("strategy", "zero3"),
        "strategy a list": _set("strategy", ["ddp"]),
        "model not an object": _set("model", "mlp"),
        "model spec missing": _drop("model/spec"),
        "sample_shape with zero": _set("model/sample_shape", [1, 0, 8]),
        "num_classes a bool": _set("model/num_classes", True),
        "metrics not a list": _set("metrics", {"epoch": 1}),
        "files missing": _drop("files"),
    },
    "dataset": {
        "splits a list": _set("splits", ["train", "test"]),
        "split not an object": _set("splits/test", "test.safetensors"),
        "count a string": _set("splits/test/count", "360"),
        "count a float": _set("splits/test/count", 360.0),
        "sha256 missing": _drop("splits/test/sha256"),
        "sha256 short": _set("splits/test/sha256", "ab12"),
        "num_classes a string": _set("num_classes", "10"),
        "classes not strings": _set("classes", list(range(10))),
        "classes and num_classes disagree": _set("num_classes", 9),
        "sample_shape empty": _set("sample_shape", []),
    },
    "model card": {
        "sha256 missing": _drop("sha256"),
        "sha256 a number": _set("sha256", 0),
        "model a string": _set("model", "mlp"),
        "model spec empty": _set("model/spec", ""),
        "num_classes zero": _set("model/num_classes", 0),
        "metrics of numbers": _set("metrics", [1, 2]),
    },
    "export.json": {
        "exports a list": _set("exports", []),
        "export not an object": _set("exports/torch-export", "model.pt2"),
        "sha256 missing": _drop("exports/torch-export/sha256"),
        "model_sha256 not hex": _set("exports/torch-export/model_sha256", "z" * 64),
        "sample_shape a string": _set("exports/torch-export/sample_shape", "1x8x8"),
    },
}


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("kind", "change"),
    [
        pytest.param(kind, change, id=f"{kind}: {label}")
        for kind, changes in MALFORMED.items()
        for label, change in changes.items()
    ],
)
def test_a_malformed_field_is_one_integrity_error(kind, change, records, tmp_path) -> None:
    source, record, read = READERS_OF[kind]
    folder = tmp_path / "folder"
    shutil.copytree(records[source], folder)
    content = json.loads((folder / record).read_text())
    change(content)
    (folder / record).write_text(json.dumps(content))
    with pytest.raises(IntegrityError) as caught:
        read(folder)
    message = str(caught.value)
    assert "\n" not in message and str(folder) in message and "; " in message, message


# --- the rule itself ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    ["../x", "a/../../x", "/etc/hostname", "a\\b", "a\x00b", "", "a//b", "./a", "a/", 3, None],
)
def test_object_storage_entries_are_held_to_the_rule_by_name(entry) -> None:
    with pytest.raises(IntegrityError, match="which"):
        check_entry("s3://bucket/prefix", entry, "dataset s3://bucket/prefix", "it lists")


@pytest.mark.parametrize("entry", ["model.safetensors", "dcp/__0_0.distcp", "a.b/c-d_e"])
def test_plain_relative_names_pass_without_touching_storage(entry) -> None:
    """No filesystem is opened for an object-storage folder (this bucket does not exist)."""
    assert check_entry("s3://no-such-bucket/prefix", entry, "dataset", "it lists") == entry


def test_a_link_to_a_file_inside_the_folder_is_allowed(tmp_path) -> None:
    (tmp_path / "real.bin").write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "alias.bin").symlink_to(tmp_path / "real.bin")
    assert check_entry(tmp_path, "sub/alias.bin", "folder", "it lists") == "sub/alias.bin"
    assert check_entry(tmp_path, "missing.bin", "folder", "it lists") == "missing.bin"


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("content", "problem"),
    [("[" * 200_000, f"nested more than {MAX_DEPTH} deep"), (None, "over 64 MiB")],
    ids=["nested-200k-deep", "65-MiB"],
)
def test_a_record_too_deep_or_too_big_is_one_integrity_error(content, problem, tmp_path) -> None:
    """Python's JSON parser recurses (a RecursionError) and reads all it is given: the bounded
    reader stops at its depth, the record read at its size, both refused as records no
    kubetrain step writes."""
    from kubetrain.artifacts.manifest import MAX_RECORD_BYTES, read_format_manifest

    record = tmp_path / "manifest.json"
    if content is None:
        with open(record, "wb") as sparse:
            sparse.truncate(MAX_RECORD_BYTES + (1 << 20))
    else:
        record.write_text(content)
    with pytest.raises(IntegrityError, match=problem):
        read_format_manifest(tmp_path, "x", what="folder", if_missing="", if_foreign="")
