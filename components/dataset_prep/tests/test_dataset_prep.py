"""Tests of the dataset prep step: the function, its CLI and its KFP component."""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kubetrain.artifacts.datasets import load_split, read_manifest
from kubetrain.components.dataset_prep import cli as prep_cli
from kubetrain.components.dataset_prep.prep import DEFAULT_SOURCE, prepare_dataset
from kubetrain.errors import InvalidInput

REPO = Path(__file__).resolve().parents[3]


def _blobs(n_per_class: int = 10, classes: int = 3, features: int = 5, seed: int = 1):
    """Separable synthetic tabular data: class k is centred at k on every feature."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(classes), n_per_class)
    x = rng.normal(size=(len(y), features)) + y[:, None]
    return x, y


def _entries(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


# --- good inputs -----------------------------------------------------------------------------


def test_digits_counts_shape_classes_and_load_split(tmp_path):
    out = tmp_path / "digits"
    manifest = prepare_dataset("sklearn:digits", str(out))

    assert manifest == read_manifest(out)
    assert manifest["classes"] == [str(i) for i in range(10)]
    assert manifest["sample_shape"] == [1, 8, 8]
    assert manifest["splits"]["train"]["count"] == 1293  # 1437 - ceil(0.1 * 1437)
    assert manifest["splits"]["validation"]["count"] == 144
    assert min(manifest["splits"]["validation"]["class_counts"]) >= 13  # stratified: ~14.4
    assert manifest["splits"]["test"]["count"] == 360  # ceil(0.2 * 1797)
    assert sum(manifest["splits"]["test"]["class_counts"]) == 360
    assert min(manifest["splits"]["test"]["class_counts"]) >= 35  # stratified: ~36 per class
    assert manifest["source"] == "sklearn:digits"
    assert manifest["seed"] == 0 and manifest["test_fraction"] == 0.2
    assert manifest["validation_fraction"] == 0.1
    assert manifest["split"] == "stratified"
    assert len(manifest["normalisation"]["mean"]) == 1

    x, y = load_split(out, "train")
    assert tuple(x.shape) == (1293, 1, 8, 8)
    assert str(x.dtype) == "torch.float32" and str(y.dtype) == "torch.int64"
    assert int(y.min()) == 0 and int(y.max()) == 9
    # Normalised with the statistics of train and validation together.
    pool = np.concatenate([x.numpy(), load_split(out, "validation")[0].numpy()])
    assert abs(float(pool.mean())) < 1e-4 and abs(float(pool.std()) - 1) < 1e-3
    x_test, y_test = load_split(out, "test")
    assert tuple(x_test.shape) == (360, 1, 8, 8) and len(y_test) == 360
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no staging left


def test_tabular_source_is_standardised_per_feature(tmp_path):
    manifest = prepare_dataset("sklearn:iris", str(tmp_path / "iris"))
    assert manifest["sample_shape"] == [4]
    assert manifest["classes"] == ["setosa", "versicolor", "virginica"]
    assert len(manifest["normalisation"]["mean"]) == 4
    pool = np.concatenate(
        [load_split(tmp_path / "iris", split)[0].numpy() for split in ("train", "validation")]
    )
    np.testing.assert_allclose(pool.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(pool.std(axis=0), 1, atol=1e-4)


def test_same_seed_gives_identical_files_and_other_seed_differs(tmp_path):
    first = prepare_dataset("sklearn:digits", str(tmp_path / "a"), seed=7)
    again = prepare_dataset("sklearn:digits", str(tmp_path / "b"), seed=7)
    other = prepare_dataset("sklearn:digits", str(tmp_path / "c"), seed=8)
    for split in ("train", "validation", "test"):
        assert first["splits"][split]["sha256"] == again["splits"][split]["sha256"]
        assert first["splits"][split]["sha256"] != other["splits"][split]["sha256"]
        same = (tmp_path / "a" / f"{split}.safetensors").read_bytes()
        assert same == (tmp_path / "b" / f"{split}.safetensors").read_bytes()
    manifests = [(tmp_path / name / "manifest.json").read_bytes() for name in ("a", "b")]
    assert manifests[0] == manifests[1]


def test_validation_is_carved_from_train_and_leaves_the_test_split_byte_identical(tmp_path):
    """The trainer scores epochs on validation, so evaluate's test split must not change: the
    same seed gives the same test file whether or not a validation split is carved."""
    with_validation = prepare_dataset("sklearn:digits", str(tmp_path / "v"), seed=4)
    without = prepare_dataset("sklearn:digits", str(tmp_path / "n"), seed=4, validation_fraction=0)

    assert sorted(without["splits"]) == ["test", "train"]
    assert sorted(with_validation["splits"]) == ["test", "train", "validation"]
    assert with_validation["splits"]["test"] == without["splits"]["test"]
    test_file = "test.safetensors"
    assert (tmp_path / "v" / test_file).read_bytes() == (tmp_path / "n" / test_file).read_bytes()
    # train and validation together are the samples the run without validation trains on
    carved = np.concatenate(
        [load_split(tmp_path / "v", split)[0].numpy() for split in ("train", "validation")]
    ).reshape(1437, -1)
    whole = load_split(tmp_path / "n", "train")[0].numpy().reshape(1437, -1)
    np.testing.assert_array_equal(np.unique(carved, axis=0), np.unique(whole, axis=0))
    assert with_validation["normalisation"] == without["normalisation"]


def test_cli_validation_fraction_reaches_prep_and_is_checked(tmp_path):
    args = _prep_parser().parse_args(
        ["prep", "--output", str(tmp_path / "out"), "--validation-fraction", "0.25"]
    )
    assert args.handler(args) == 0
    assert read_manifest(tmp_path / "out")["splits"]["validation"]["count"] == 360  # of 1437
    bad = _prep_parser().parse_args(
        ["prep", "--output", str(tmp_path / "bad"), "--validation-fraction", "0.7"]
    )
    with pytest.raises(InvalidInput, match="^validation_fraction: 0.7 is not a number from 0"):
        bad.handler(bad)
    assert not (tmp_path / "bad").exists()


def test_rerun_replaces_an_earlier_dataset(tmp_path):
    out = tmp_path / "out"
    prepare_dataset("sklearn:digits", str(out), seed=1)
    manifest = prepare_dataset("sklearn:digits", str(out), seed=2)
    assert read_manifest(out)["seed"] == 2 == manifest["seed"]
    load_split(out, "train")


def test_npz_file_with_string_labels_as_path_and_file_url(tmp_path):
    x, y = _blobs(n_per_class=10, classes=3)
    names = np.array(["cat", "dog", "emu"])[y]
    source = tmp_path / "blobs.npz"
    np.savez(source, x=x, y=names)

    options = {"test_fraction": 0.3, "seed": 3, "validation_fraction": 0}
    by_path = prepare_dataset(str(source), str(tmp_path / "p"), **options)
    by_url = prepare_dataset(source.as_uri(), str(tmp_path / "u"), **options)

    assert by_path["classes"] == ["cat", "dog", "emu"]
    assert by_path["sample_shape"] == [5]
    assert by_path["splits"]["train"]["count"] == 21 and by_path["splits"]["test"]["count"] == 9
    assert by_path["splits"]["test"]["class_counts"] == [3, 3, 3]
    assert by_path["source_sha256"]["blobs.npz"] == by_url["source_sha256"]["blobs.npz"]
    assert by_path["splits"]["train"]["sha256"] == by_url["splits"]["train"]["sha256"]
    assert by_url["source"] == source.as_uri()


def test_npz_label_values_are_mapped_to_indices(tmp_path):
    x, y = _blobs(n_per_class=6, classes=3)
    np.savez(tmp_path / "d.npz", x=x, y=np.array([3, 7, 9])[y].astype(np.float64))
    manifest = prepare_dataset(
        str(tmp_path / "d.npz"), str(tmp_path / "out"), validation_fraction=0
    )
    assert manifest["classes"] == ["3", "7", "9"]
    _, labels = load_split(tmp_path / "out", "train")
    assert sorted(set(labels.tolist())) == [0, 1, 2]


def test_npz_classes_array_names_integer_labels(tmp_path):
    x, y = _blobs(n_per_class=6, classes=2)
    np.savez(tmp_path / "d.npz", x=x, y=y, classes=np.array(["no", "yes"]))
    manifest = prepare_dataset(
        str(tmp_path / "d.npz"), str(tmp_path / "out"), validation_fraction=0
    )
    assert manifest["classes"] == ["no", "yes"]


def test_images_without_channel_get_one(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, size=(20, 6, 6), dtype=np.uint8)
    np.savez(tmp_path / "img.npz", x=x, y=np.arange(20) % 2)
    manifest = prepare_dataset(str(tmp_path / "img.npz"), str(tmp_path / "out"))
    assert manifest["sample_shape"] == [1, 6, 6]


def test_folder_with_data_npz(tmp_path):
    x, y = _blobs()
    (tmp_path / "src").mkdir()
    np.savez(tmp_path / "src" / "data.npz", x=x, y=y)
    manifest = prepare_dataset(str(tmp_path / "src"), str(tmp_path / "out"))
    assert manifest["split"] == "stratified"
    counts = [manifest["splits"][split]["count"] for split in ("train", "validation", "test")]
    assert counts == [21, 3, 6]  # 3 validation samples: one of each class
    assert set(manifest["source_sha256"]) == {"data.npz"}


def test_folder_with_explicit_split_keeps_it_and_uses_train_statistics(tmp_path):
    x_train, y_train = _blobs(n_per_class=8, classes=3, seed=1)
    x_test, y_test = _blobs(n_per_class=2, classes=3, seed=2)
    x_test = x_test + 100  # would shift the statistics if test leaked into them
    (tmp_path / "src").mkdir()
    np.savez(tmp_path / "src" / "train.npz", x=x_train, y=y_train)
    np.savez(tmp_path / "src" / "test.npz", x=x_test, y=y_test)

    manifest = prepare_dataset((tmp_path / "src").as_uri(), str(tmp_path / "out"), seed=5)

    assert manifest["split"] == "source" and manifest["test_fraction"] is None
    assert manifest["splits"]["train"]["count"] == 21
    assert manifest["splits"]["validation"]["count"] == 3  # ceil(0.1 * 24): one per class
    assert manifest["splits"]["validation"]["class_counts"] == [1, 1, 1]
    assert manifest["splits"]["test"]["count"] == 6
    np.testing.assert_allclose(manifest["normalisation"]["mean"], x_train.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(manifest["normalisation"]["std"], x_train.std(axis=0), rtol=1e-5)
    stored, labels = load_split(tmp_path / "out", "test")
    mean = np.array(manifest["normalisation"]["mean"], dtype=np.float32)
    std = np.array(manifest["normalisation"]["std"], dtype=np.float32)
    expected = (x_test.astype(np.float32) - mean) / std  # the recorded stats reproduce it
    np.testing.assert_array_equal(stored.numpy(), expected)
    assert labels.tolist() == y_test.tolist()  # order kept


def test_constant_feature_is_left_unscaled(tmp_path):
    x, y = _blobs()
    x[:, 2] = 4.0
    np.savez(tmp_path / "d.npz", x=x, y=y)
    manifest = prepare_dataset(str(tmp_path / "d.npz"), str(tmp_path / "out"))
    assert manifest["normalisation"]["std"][2] == 1.0
    stored, _ = load_split(tmp_path / "out", "train")
    assert np.isfinite(stored.numpy()).all() and (stored.numpy()[:, 2] == 0).all()


# --- bad inputs ------------------------------------------------------------------------------


def _npz(tmp_path: Path, **arrays) -> str:
    path = tmp_path / "in" / "d.npz"
    path.parent.mkdir(exist_ok=True)
    np.savez(path, **arrays)
    return str(path)


def _folder(tmp_path: Path, files: dict[str, dict]) -> str:
    folder = tmp_path / "in"
    folder.mkdir(exist_ok=True)
    for name, arrays in files.items():
        np.savez(folder / name, **arrays)
    return str(folder)


X, Y = _blobs()
BAD_INPUTS = {
    "unknown scheme": (lambda t: {"source": "s3://bucket/data.npz"}, "source", "sklearn:digits"),
    "unknown sklearn": (lambda t: {"source": "sklearn:nope"}, "source", "sklearn:digits"),
    "unknown torchvision": (lambda t: {"source": "torchvision:ImageNet"}, "source", "MNIST"),
    "missing path": (lambda t: {"source": str(t / "in" / "nope.npz")}, "source", "does not exist"),
    "bad file url": (lambda t: {"source": "file://host/x.npz"}, "source", "file:///"),
    "empty": (
        lambda t: {"source": _npz(t, x=np.zeros((0, 3)), y=np.zeros(0, dtype=int))},
        "source",
        "empty",
    ),
    "x/y mismatch": (lambda t: {"source": _npz(t, x=X, y=Y[:-1])}, "source", "29 labels"),
    "nan": (
        lambda t: {"source": _npz(t, x=np.where(np.arange(30)[:, None] == 4, np.nan, X), y=Y)},
        "source",
        "index 4",
    ),
    "inf": (lambda t: {"source": _npz(t, x=X * np.inf, y=Y)}, "source", "infinite"),
    "one class": (lambda t: {"source": _npz(t, x=X, y=np.zeros(30, int))}, "source", "at least 2"),
    "single-sample class": (
        lambda t: {"source": _npz(t, x=X[:21], y=Y[:21])},
        "source",
        "class '2' has only 1 sample",
    ),
    "too few test samples": (
        lambda t: {"source": _npz(t, x=X, y=Y), "test_fraction": 0.05},
        "test_fraction",
        "3 classes",
    ),
    "non-integer labels": (lambda t: {"source": _npz(t, x=X, y=Y + 0.5)}, "source", "integer"),
    "one-hot labels": (lambda t: {"source": _npz(t, x=X, y=np.eye(3)[Y])}, "source", "argmax"),
    "label outside classes": (
        lambda t: {"source": _npz(t, x=X, y=Y, classes=np.array(["a", "b"]))},
        "source",
        "outside 0..1",
    ),
    "string x": (lambda t: {"source": _npz(t, x=X.astype(str), y=Y)}, "source", "not numbers"),
    "pickled y": (
        lambda t: {"source": _npz(t, x=X, y=np.array(list(Y), dtype=object))},
        "source",
        "pickled",
    ),
    "npz without x": (lambda t: {"source": _npz(t, data=X, y=Y)}, "source", "no array 'x'"),
    "npz without y": (lambda t: {"source": _npz(t, x=X, labels=Y)}, "source", "no array 'y'"),
    "not an npz": (
        lambda t: {"source": str(_write(t / "in" / "d.npz", b"hello"))},
        "source",
        "not a readable .npz",
    ),
    "empty folder": (lambda t: {"source": _folder(t, {})}, "source", "no data.npz"),
    "train without test": (
        lambda t: {"source": _folder(t, {"train.npz": {"x": X, "y": Y}})},
        "source",
        "no test.npz",
    ),
    "ambiguous folder": (
        lambda t: {
            "source": _folder(
                t, {n: {"x": X, "y": Y} for n in ("data.npz", "train.npz", "test.npz")}
            )
        },
        "source",
        "ambiguous",
    ),
    "train/test shapes differ": (
        lambda t: {
            "source": _folder(
                t, {"train.npz": {"x": X, "y": Y}, "test.npz": {"x": X[:, :2], "y": Y}}
            )
        },
        "source",
        "same shape",
    ),
    "class only in test": (
        lambda t: {
            "source": _folder(
                t,
                {
                    "train.npz": {"x": X[Y < 2], "y": Y[Y < 2]},
                    "test.npz": {"x": X, "y": Y},
                },
            )
        },
        "source",
        "never occur",
    ),
    "test_fraction 0": (lambda t: {"test_fraction": 0.0}, "test_fraction", "between 0 and 1"),
    "test_fraction 1": (lambda t: {"test_fraction": 1}, "test_fraction", "between 0 and 1"),
    "test_fraction < 0": (lambda t: {"test_fraction": -0.1}, "test_fraction", "between 0 and 1"),
    "test_fraction nan": (lambda t: {"test_fraction": float("nan")}, "test_fraction", "0.2"),
    "test_fraction bool": (lambda t: {"test_fraction": True}, "test_fraction", "0.2"),
    "negative seed": (lambda t: {"seed": -1}, "seed", "integer"),
    "validation_fraction < 0": (
        lambda t: {"validation_fraction": -0.1},
        "validation_fraction",
        "from 0 to 0.5",
    ),
    "validation_fraction above 0.5": (
        lambda t: {"validation_fraction": 0.6},
        "validation_fraction",
        "from 0 to 0.5",
    ),
    "validation_fraction nan": (
        lambda t: {"validation_fraction": float("nan")},
        "validation_fraction",
        "0.1",
    ),
    "validation_fraction bool": (
        lambda t: {"validation_fraction": True},
        "validation_fraction",
        "0 for no validation",
    ),
    "validation split without every class": (
        lambda t: {"source": _npz(t, x=X, y=Y), "test_fraction": 0.5},  # 2 of 15 for 3 classes
        "validation_fraction",
        "3 classes",
    ),
    "single-sample class in the source's train": (
        lambda t: {
            "source": _folder(
                t,
                {
                    "train.npz": {"x": X[:21], "y": Y[:21]},  # class 2 once
                    "test.npz": {"x": X, "y": Y},
                },
            )
        },
        "validation_fraction",
        "class '2' has only 1 training sample",
    ),
    "output is a file": (
        lambda t: {"output_dir": str(_write(t / "in" / "f.txt", b"x"))},
        "output_dir",
        "not a folder",
    ),
    "output is a non-dataset folder": (
        lambda t: {"output_dir": str(_write(t / "in" / "keep.txt", b"x").parent)},
        "output_dir",
        "not a kubetrain dataset",
    ),
    "output protocol unknown": (
        lambda t: {"output_dir": "nosuch://bucket/out"},
        "output_dir",
        "unknown protocol",
    ),
}


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_refused_naming_the_field_and_writes_nothing(tmp_path, case):
    make_kwargs, field, words = BAD_INPUTS[case]
    kwargs = {"source": "sklearn:digits", "output_dir": str(tmp_path / "out")}
    kwargs.update(make_kwargs(tmp_path))
    before = _entries(tmp_path)
    input_files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    with pytest.raises(InvalidInput) as raised:
        prepare_dataset(**kwargs)

    assert raised.value.field == field
    assert str(raised.value).startswith(f"{field}: ")
    assert words in str(raised.value)
    assert not (tmp_path / "out").exists()
    assert _entries(tmp_path) == before  # no staging folder either
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == input_files


def test_missing_torchvision_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # as if not installed
    with pytest.raises(InvalidInput) as raised:
        prepare_dataset("torchvision:MNIST", str(tmp_path / "out"), cache_dir=str(tmp_path / "c"))
    assert raised.value.field == "source"
    assert "torchvision is not installed" in str(raised.value)
    assert "pip install 'kubetrain[vision]'" in str(raised.value)
    assert _entries(tmp_path) == set()


# --- CLI -------------------------------------------------------------------------------------


def _prep_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubetrain")
    prep_cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_cli_defaults_match_the_function():
    defaults = inspect.signature(prepare_dataset).parameters
    args = _prep_parser().parse_args(["prep", "--output", "x"])
    assert args.source == DEFAULT_SOURCE == "sklearn:digits"
    assert args.test_fraction == defaults["test_fraction"].default
    assert args.seed == defaults["seed"].default
    assert args.validation_fraction == defaults["validation_fraction"].default == 0.1
    assert args.cache_dir is None and defaults["cache_dir"].default is None


def test_cli_help_describes_every_option():
    subparsers = argparse.ArgumentParser().add_subparsers()
    parser = prep_cli.register(subparsers)
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help, action.dest


def test_cli_handler_prepares_and_prints_a_summary(tmp_path, capsys):
    out = tmp_path / "out"
    args = _prep_parser().parse_args(
        ["prep", "--output", str(out), "--seed", "3", "--test-fraction", "0.25"]
    )
    assert args.handler(args) == 0
    printed = capsys.readouterr().out
    assert f"prepared sklearn:digits -> {out}" in printed
    assert "train: 1212 samples, validation: 135 samples, test: 450 samples" in printed
    assert "classes (10): 0, 1, 2" in printed and "[1, 8, 8]" in printed
    assert read_manifest(out)["seed"] == 3


def _run_cli_only_prep(*argv: str) -> subprocess.CompletedProcess:
    """kubetrain.cli.main with only this step registered (the other steps may not exist yet)."""
    code = (
        "import sys, kubetrain.cli as c\n"
        "c.SUBCOMMAND_MODULES = ('kubetrain.components.dataset_prep.cli',)\n"
        "sys.exit(c.main(sys.argv[1:]))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120
    )


def test_cli_main_success_and_error_exit_codes(tmp_path):
    ok = _run_cli_only_prep("prep", "--output", str(tmp_path / "out"))
    assert ok.returncode == 0, ok.stderr
    assert "train: 1293 samples, validation: 144 samples, test: 360 samples" in ok.stdout

    bad = _run_cli_only_prep("prep", "--output", str(tmp_path / "bad"), "--test-fraction", "1.5")
    assert bad.returncode == 2
    assert bad.stderr.startswith("kubetrain prep: error: test_fraction: 1.5 ")
    assert not (tmp_path / "bad").exists()


def test_cli_module_import_is_light():
    code = (
        "import sys, kubetrain.components.dataset_prep.cli\n"
        "heavy = [m for m in ('numpy', 'torch', 'kfp', 'sklearn') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def _all_subcommands_exist() -> bool:
    from kubetrain.cli import SUBCOMMAND_MODULES

    try:
        return all(importlib.util.find_spec(name) for name in SUBCOMMAND_MODULES)
    except ModuleNotFoundError:
        return False


@pytest.mark.skipif(not _all_subcommands_exist(), reason="other steps' CLI modules not written yet")
def test_python_m_kubetrain_prep(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "kubetrain", "prep", "--output", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert "prepared sklearn:digits" in done.stdout
    load_split(tmp_path / "out", "test")


# --- KFP component ---------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:You may be attemping to run a task:RuntimeWarning")
def test_kfp_component_runs_in_the_local_runner(tmp_path, monkeypatch):
    from kfp import local

    from kubetrain.components.dataset_prep.component import dataset_prep

    monkeypatch.chdir(tmp_path)  # the local runner may write logs beside the caller
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    task = dataset_prep(source="sklearn:digits", seed=4)

    artifact = task.outputs["dataset"]
    manifest = read_manifest(artifact.path)
    assert manifest["seed"] == 4 and manifest["classes"] == [str(i) for i in range(10)]
    x, y = load_split(artifact.path, "train")
    assert tuple(x.shape) == (1293, 1, 8, 8) and len(y) == 1293
    assert artifact.metadata["train_count"] == 1293
    assert artifact.metadata["validation_count"] == 144
    assert artifact.metadata["classes"] == manifest["classes"]
    assert list(artifact.metadata["sample_shape"]) == [1, 8, 8]
    assert artifact.metadata["train_sha256"] == manifest["splits"]["train"]["sha256"]
    assert json.loads(Path(artifact.path, "manifest.json").read_text()) == manifest


@pytest.mark.parametrize("verify", [True, False])
def test_a_split_file_that_is_not_safetensors_is_refused_naming_it(tmp_path, verify):
    """Even with a manifest rewritten to match (so the sha256 check passes), a split file that
    is no safetensors file, or lacks x/y, is an IntegrityError naming it, not a library error."""
    import hashlib

    from kubetrain.errors import IntegrityError

    data = tmp_path / "digits"
    prepare_dataset(DEFAULT_SOURCE, str(data))
    manifest = read_manifest(data)
    split_file = data / manifest["splits"]["test"]["file"]
    split_file.write_bytes(b"not a safetensors file at all")
    manifest["splits"]["test"]["sha256"] = hashlib.sha256(split_file.read_bytes()).hexdigest()
    (data / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match=rf"{split_file.name} is not a dataset split"):
        load_split(data, "test", verify=verify)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--validation-fraction", "0.7"], "0.7 is not a number from 0 to 0.5"),
        (["--validation-fraction", "-0.1"], "-0.1 is not a number from 0 to 0.5"),
        (["--validation-fraction", "nan"], "nan is not a number"),
        (["--test-fraction", "0.5", "--source", "{blobs}"], "each of the 3 classes"),
    ],
)
def test_cli_refuses_a_bad_validation_fraction_in_one_line(tmp_path, capsys, extra, words):
    """`kubetrain prep`: a validation split out of range, or too small to hold every class,
    is one line naming validation_fraction, before anything is written."""
    from kubetrain.cli import main

    np.savez(tmp_path / "blobs.npz", x=X, y=Y)  # 30 samples, 3 classes
    extra = [arg.replace("{blobs}", str(tmp_path / "blobs.npz")) for arg in extra]
    code = main(["prep", "--output", str(tmp_path / "out"), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("kubetrain prep: error: validation_fraction: ") and "\n" not in err
    assert words in err
    assert not (tmp_path / "out").exists()
