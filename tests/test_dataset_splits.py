"""A split file whose tensors are not the samples its manifest describes is one line naming the
file and the fix, before training starts (issue 28: integer or half samples, 2-D or float
labels and a 0-d x were an "internal error" at the first step, NaN samples trained to a NaN
model, a short y was reported as "1437 samples, manifest says 1437"). The digest is updated
with each change: the bytes are as the manifest says, their meaning is not."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from kubetrain.artifacts.datasets import load_split, write_dataset
from kubetrain.errors import IntegrityError

FIX = "; prepare the dataset again with `kubetrain prep`"
Tensors = dict[str, np.ndarray]


def small_dataset(folder: Path) -> Path:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 1, 4, 4)).astype(np.float32)
    y = np.arange(12) % 3
    write_dataset(
        folder, {"train": (x, y), "test": (x[:6], y[:6])}, ["a", "b", "c"], [0.0], [1.0], {}
    )
    return folder


def rewrite_split(folder: Path, split: str, change: Callable[[Tensors], Tensors]) -> None:
    """Replace ``split``'s tensors by ``change(tensors)`` and give the manifest its new digest."""
    path = folder / f"{split}.safetensors"
    save_file(change(load_file(str(path))), str(path))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["splits"][split]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))


def nan_sample(tensors: Tensors) -> Tensors:
    x = tensors["x"].copy()
    x[3, 0, 1, 1] = np.nan
    x[4, 0, 0, 0] = np.inf
    return {**tensors, "x": x}


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("split", "change", "problem"),
    [
        (
            "train",
            lambda t: {**t, "x": t["x"].astype(np.int64)},
            "train.safetensors (split train) holds x int64 [12, 1, 4, 4]; "
            "the manifest says float32 [12, 1, 4, 4]",
        ),
        (
            "train",
            lambda t: {**t, "x": t["x"].astype(np.float16)},
            "holds x float16 [12, 1, 4, 4]; the manifest says float32 [12, 1, 4, 4]",
        ),
        (
            "test",
            lambda t: {**t, "x": t["x"].reshape(6, 16)},
            "test.safetensors (split test) holds x float32 [6, 16]; "
            "the manifest says float32 [6, 1, 4, 4]",
        ),
        (
            "train",
            lambda t: {**t, "x": np.array(1.0, dtype=np.float32)},
            "holds x float32 []; the manifest says float32 [12, 1, 4, 4]",
        ),
        (
            "train",
            lambda t: {**t, "x": t["x"][:-1]},
            "holds x float32 [11, 1, 4, 4]; the manifest says float32 [12, 1, 4, 4]",
        ),
        (
            "train",
            lambda t: {**t, "y": t["y"][:-1]},
            "holds y int64 [11]; the manifest says int64 [12]",
        ),
        (
            "train",
            lambda t: {**t, "y": t["y"].reshape(-1, 1)},
            "holds y int64 [12, 1]; the manifest says int64 [12]",
        ),
        (
            "train",
            lambda t: {**t, "y": t["y"].astype(np.float32)},
            "holds y float32 [12]; the manifest says int64 [12]",
        ),
        (
            "test",
            lambda t: {**t, "y": t["y"] + 1},
            "test.safetensors (split test) has labels 1..3, outside the manifest's 3 classes 0..2",
        ),
        (
            "train",
            lambda t: {**t, "y": t["y"] - 1},
            "has labels -1..1, outside the manifest's 3 classes 0..2",
        ),
        ("train", nan_sample, "has 2 sample values that are NaN or infinite"),
    ],
)
def test_a_split_that_is_not_what_its_manifest_says_is_one_line(
    tmp_path: Path, split: str, change: Callable[[Tensors], Tensors], problem: str
) -> None:
    folder = small_dataset(tmp_path / "data")
    rewrite_split(folder, split, change)
    with pytest.raises(IntegrityError) as refused:
        load_split(folder, split)
    line = str(refused.value)
    assert line.startswith(f"dataset {folder}: ") and line.endswith(FIX), line
    assert problem in line and "\n" not in line


def test_a_split_as_prep_writes_it_loads(tmp_path: Path) -> None:
    x, y = load_split(small_dataset(tmp_path / "data"), "train")
    assert list(x.shape) == [12, 1, 4, 4] and y.tolist() == [i % 3 for i in range(12)]


def test_the_trainer_refuses_it_before_any_checkpoint(tmp_path: Path) -> None:
    folder = small_dataset(tmp_path / "data")
    rewrite_split(folder, "train", lambda t: {**t, "y": t["y"].astype(np.float32)})
    checkpoints = tmp_path / "checkpoints"
    result = subprocess.run(
        [sys.executable, "-m", "kubetrain.train", "--data", str(folder), "--epochs", "1"]
        + ["--checkpoint-dir", str(checkpoints)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == IntegrityError.exit_code, result.stderr
    (line,) = result.stderr.splitlines()
    assert line == (
        f"kubetrain.train: error: dataset {folder}: train.safetensors (split train) holds y "
        f"float32 [12]; the manifest says int64 [12]{FIX}"
    )
    assert not list(checkpoints.glob("epoch-*"))


def test_a_missing_split_says_how_to_get_it(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    x = np.zeros((4, 2), dtype=np.float32)
    write_dataset(folder, {"train": (x, np.arange(4) % 2)}, ["a", "b"], [0.0], [1.0], {})
    with pytest.raises(IntegrityError) as refused:
        load_split(folder, "test")
    assert str(refused.value) == (
        f"dataset {folder}: no split 'test' (has ['train']); prepare the dataset again with "
        "`kubetrain prep`, which writes train and test"
    )


def negative_labels(data_dir: str | None, split: str) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((4, 2), dtype=np.float32), np.array([-1, 0, 1, 0])


def test_a_loaders_negative_labels_are_refused_with_what_to_return() -> None:
    from kubetrain.errors import InvalidInput
    from kubetrain.train.data import load_data

    with pytest.raises(InvalidInput) as refused:
        load_data("test_dataset_splits:negative_labels", None)
    assert str(refused.value) == (
        "--dataset: labels span -1..1, outside 0..1; return class indices from 0 to the "
        "number of classes - 1 as y"
    )
