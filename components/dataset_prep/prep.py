"""Dataset prep: turn a named or local dataset into a normalised, split, checksummed folder.

Every later step (the trainer, evaluate) reads the folder this writes (see
``kubetrain.artifacts.datasets``), so all checks happen here, before anything is written: a bad
source fails in seconds on the cluster instead of minutes into a distributed training job.

Sample layout. Samples are stored channel-first; the *channel axis is axis 1* of the
stored ``x`` and normalisation statistics are per channel, computed on the train split only:

* ``[N, C, H, W]`` (or any ``[N, C, ...]``) is kept as it is;
* ``[N, H, W]`` is read as single-channel images and becomes ``[N, 1, H, W]``;
* ``[N, F]`` (tabular) is kept as it is: each feature is its own channel, so every feature
  is standardised on its own (features of a table usually have unrelated scales);
* ``[N]`` becomes ``[N, 1]`` (one feature).

Statistics are in the units of the source data (no rescaling to [0, 1] first), so a
serving step normalises a raw sample ``s`` as ``(s - mean) / std`` with the recorded values.
A channel that is constant on the train split is left unscaled (its std is recorded as 1).

Splits. ``test`` is held out (``test_fraction`` of the samples, stratified and seeded, or the
source's own test part) and read once, by evaluate. ``validation`` (``validation_fraction`` of
the rest, stratified by class with the same seed; 0 writes none) is what the trainer scores
each epoch on. It is carved from train after the test split is chosen and normalised, and
the statistics are those of train and validation together, so the test split is
byte-identical to the one a prep without validation writes from the same source and seed.
"""

from __future__ import annotations

import math
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kubetrain import __version__
from kubetrain.artifacts.datasets import VALIDATION, write_dataset
from kubetrain.errors import InvalidInput
from kubetrain.storage.integrity import sha256_file
from kubetrain.storage.urls import file_url_path

DEFAULT_SOURCE = "sklearn:digits"
DEFAULT_VALIDATION_FRACTION = 0.1
#: A validation split above half of train would leave less to train on than to score.
MAX_VALIDATION_FRACTION = 0.5
DEFAULT_CACHE_DIR = "~/.cache/kubetrain"

#: sklearn's bundled datasets (no download): name -> loader function name.
SKLEARN_DATASETS = {
    "digits": "load_digits",
    "iris": "load_iris",
    "wine": "load_wine",
    "breast_cancer": "load_breast_cancer",
}
#: torchvision datasets with their own train/test split (downloaded into the cache folder).
TORCHVISION_DATASETS = ("MNIST", "FashionMNIST", "CIFAR10")

VALID_SOURCES = ", ".join(
    [f"sklearn:{name}" for name in SKLEARN_DATASETS]
    + [f"torchvision:{name}" for name in TORCHVISION_DATASETS]
    + ["a local .npz file or folder (a path or a file:// URL)"]
)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]+")  # 2+ characters, so C:\ is not a scheme


@dataclass
class _Loaded:
    """Raw arrays from a source, before validation: ``parts`` is {"all": ...} or train/test."""

    parts: dict[str, tuple[np.ndarray, np.ndarray]]
    origin: dict[str, str]  # part -> where it came from, for error messages
    classes: list[str] | None = None
    source_sha256: dict[str, str] = field(default_factory=dict)

    @property
    def explicit_split(self) -> bool:
        return "all" not in self.parts


def prepare_dataset(
    source: str,
    output_dir: str,
    test_fraction: float = 0.2,
    seed: int = 0,
    cache_dir: str | None = None,
    validation_fraction: float = DEFAULT_VALIDATION_FRACTION,
) -> dict[str, Any]:
    """Load ``source``, validate, split, normalise and publish it at ``output_dir``.

    Returns the manifest written to ``output_dir/manifest.json``. The same inputs and
    seed give byte-identical files. Sources with their own split (torchvision, a folder
    with train.npz + test.npz) keep it and ignore ``test_fraction``; otherwise the split
    is stratified by class. ``validation_fraction`` of the train part becomes the
    ``validation`` split (0: none). Raises ``InvalidInput`` before writing anything.
    """
    _check_test_fraction(test_fraction)
    _check_validation_fraction(validation_fraction)
    _check_seed(seed)
    check_source(source)
    out = _check_output_dir(output_dir, source, cache_dir)
    loaded = _load_source(source, cache_dir)

    samples: dict[str, np.ndarray] = {}
    labels: dict[str, np.ndarray] = {}
    for part, (x, y) in loaded.parts.items():
        where = loaded.origin[part]
        samples[part] = _as_samples(x, where)
        labels[part] = _check_labels(y, len(samples[part]), where)
    if loaded.explicit_split:
        _check_same_sample_shape(samples, loaded.origin)
    encoded, classes = _encode_labels(labels, loaded.classes, loaded.origin)

    if loaded.explicit_split:
        train = (samples["train"], encoded["train"])
        test = (samples["test"], encoded["test"])
        _check_class_count(train[1], classes, loaded.origin["train"])
        _check_test_classes_seen(train[1], test[1], classes, loaded.origin)
    else:
        x, y = samples["all"], encoded["all"]
        where = loaded.origin["all"]
        train_idx, test_idx = _stratified_split(y, classes, test_fraction, seed, where)
        train, test = (x[train_idx], y[train_idx]), (x[test_idx], y[test_idx])
        del x, samples
    train_where = loaded.origin["train" if loaded.explicit_split else "all"]
    if validation_fraction > 0:  # checked now: nothing is normalised or written if it fails
        fit_idx, validation_idx = _validation_split(
            train[1], classes, validation_fraction, seed, train_where
        )

    mean, std = _normalise(train[0], test[0])
    splits = {"train": train, "test": test}
    if validation_fraction > 0:
        x, y = train
        splits = {
            "train": (x[fit_idx], y[fit_idx]),
            VALIDATION: (x[validation_idx], y[validation_idx]),
            "test": test,
        }
        del x, train
    provenance = {
        "source": source,
        "seed": seed,
        "split": "source" if loaded.explicit_split else "stratified",
        "test_fraction": None if loaded.explicit_split else float(test_fraction),
        "validation_fraction": float(validation_fraction),
        "source_sha256": loaded.source_sha256,
        "kubetrain_version": __version__,
    }
    return write_dataset(out, splits, classes, mean, std, provenance)


# --- argument checks -------------------------------------------------------------------------


def _check_test_fraction(test_fraction: float) -> None:
    ok = isinstance(test_fraction, (int, float)) and not isinstance(test_fraction, bool)
    if not ok or not math.isfinite(test_fraction) or not 0 < test_fraction < 1:
        raise InvalidInput(
            "test_fraction",
            f"{test_fraction!r} is not a number strictly between 0 and 1",
            "give the share of samples held out for testing, e.g. 0.2",
        )


def _check_validation_fraction(validation_fraction: float) -> None:
    ok = isinstance(validation_fraction, (int, float)) and not isinstance(validation_fraction, bool)
    if (
        not ok
        or not math.isfinite(validation_fraction)
        or not (0 <= validation_fraction <= MAX_VALIDATION_FRACTION)
    ):
        raise InvalidInput(
            "validation_fraction",
            f"{validation_fraction!r} is not a number from 0 to {MAX_VALIDATION_FRACTION}",
            f"give the share of training samples scored each epoch, e.g. "
            f"{DEFAULT_VALIDATION_FRACTION}, or 0 for no validation split",
        )


def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise InvalidInput("seed", f"{seed!r} is not an integer in 0..2**32-1", "give e.g. 0")


def _check_output_dir(
    output_dir: str | os.PathLike[str], source: str, cache_dir: str | None
) -> Path | str:
    """Refuse an output the one output rule forbids (:mod:`kubetrain.artifacts.output_rule`: a
    file, a non-dataset folder with content, the source folder or the download cache, or a folder
    inside or around them), and a local folder that cannot be created."""
    from kubetrain.artifacts.output_rule import DATASET, check_output

    inputs: dict[str, str] = {}
    scheme = source.partition(":")[0].lower()
    if scheme == "torchvision":
        inputs["cache_dir"] = os.path.expanduser(cache_dir or DEFAULT_CACHE_DIR)
    elif scheme != "sklearn":
        inputs["source"] = os.path.expanduser(source) if scheme != "file" else source
    text = os.fspath(output_dir) if isinstance(output_dir, str | os.PathLike) else ""
    if "://" in text and not text.startswith("file:"):
        check_output(text, "output_dir", DATASET, inputs)
        return text
    path = file_url_path(text, "output_dir") if text.startswith("file:") else Path(text)
    path = path.expanduser()  # prep writes where a shell would have expanded ~
    check_output(path if text.strip() else text, "output_dir", DATASET, inputs)
    ancestor = path
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise InvalidInput(
            "output_dir",
            f"cannot create {path}: {ancestor} is not a writable folder",
            "choose a folder you can write to",
        )
    return path


# --- sources ---------------------------------------------------------------------------------


def check_source(source: str, field: str = "source") -> None:
    """Refuse a source that names no dataset (empty, unknown scheme or name, missing path)
    without loading it, so that `kubetrain run` refuses it before its pipeline starts;
    ``field`` names the option."""
    if not isinstance(source, str) or not source.strip():
        raise InvalidInput(field, "is empty", f"give one of: {VALID_SOURCES}")
    scheme, sep, rest = source.partition(":")
    lowered = scheme.lower() if sep else ""
    if lowered == "sklearn":
        if rest not in SKLEARN_DATASETS:
            valid = ", ".join(f"sklearn:{n}" for n in SKLEARN_DATASETS)
            raise InvalidInput(field, f"unknown sklearn dataset {rest!r}", f"use one of: {valid}")
        return
    if lowered == "torchvision":
        if rest.lower() not in {n.lower() for n in TORCHVISION_DATASETS}:
            valid = ", ".join(f"torchvision:{n}" for n in TORCHVISION_DATASETS)
            raise InvalidInput(
                field, f"unknown torchvision dataset {rest!r}", f"use one of: {valid}"
            )
        return
    path = file_url_path(source, field) if lowered == "file" else Path(source).expanduser()
    if sep and lowered != "file" and _SCHEME.fullmatch(scheme) and not path.exists():
        raise InvalidInput(
            field, f"unknown scheme {scheme!r} in {source!r}", f"use one of: {VALID_SOURCES}"
        )
    if not path.exists():
        raise InvalidInput(
            field,
            f"{path} does not exist",
            f"give an existing .npz file or folder, or one of: {VALID_SOURCES}",
        )


def _load_source(source: str, cache_dir: str | None) -> _Loaded:
    """Dispatch on the source's scheme: sklearn:, torchvision:, file:, or a plain path."""
    check_source(source)
    scheme, sep, rest = source.partition(":")
    lowered = scheme.lower() if sep else ""
    if lowered == "sklearn":
        return _load_sklearn(rest)
    if lowered == "torchvision":
        return _load_torchvision(rest, cache_dir)
    if lowered == "file":
        return _load_path(file_url_path(source, "source"))
    return _load_path(Path(source).expanduser())


def _load_sklearn(name: str) -> _Loaded:
    import sklearn.datasets

    bunch = getattr(sklearn.datasets, SKLEARN_DATASETS[name])()
    # digits has images [N, 8, 8] (-> [N, 1, 8, 8]); the others are tables [N, F].
    x = bunch.images if name == "digits" else bunch.data
    classes = [str(c) for c in bunch.target_names]
    return _Loaded({"all": (x, bunch.target)}, {"all": f"sklearn:{name}"}, classes)


def _load_torchvision(name: str, cache_dir: str | None) -> _Loaded:
    """Download (once, into the cache) and read a torchvision dataset with its own split."""
    canonical = {n.lower(): n for n in TORCHVISION_DATASETS}[name.lower()]  # check_source'd
    try:
        from torchvision import datasets
    except ModuleNotFoundError as exc:
        raise InvalidInput(
            "source", "torchvision is not installed", "pip install 'kubetrain[vision]'"
        ) from exc
    except (ImportError, RuntimeError) as exc:  # e.g. a torchvision built for another torch
        raise InvalidInput(
            "source",
            f"torchvision could not be imported ({exc})",
            "pip install 'kubetrain[vision]' to get a torchvision matching your torch",
        ) from exc

    root = Path(cache_dir or DEFAULT_CACHE_DIR).expanduser() / "torchvision"
    dataset_class = getattr(datasets, canonical)
    parts, origin, classes = {}, {}, None
    for split, is_train in (("train", True), ("test", False)):
        try:
            dataset = dataset_class(root=str(root), train=is_train, download=True)
        except (OSError, RuntimeError) as exc:  # urllib's URLError is an OSError
            raise InvalidInput(
                "source",
                f"could not download or read torchvision:{canonical} into {root} ({exc})",
                "check network access, or copy the dataset's files into the cache folder "
                "(--cache-dir)",
            ) from exc
        x = np.asarray(dataset.data)  # MNIST-like: uint8 [N, H, W]; CIFAR10: uint8 [N, H, W, C]
        if canonical == "CIFAR10":
            x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
        parts[split] = (x, np.asarray(dataset.targets))
        origin[split] = f"torchvision:{canonical} ({split})"
        classes = [str(c) for c in dataset.classes]
    return _Loaded(parts, origin, classes)


def _load_path(path: Path) -> _Loaded:
    """A .npz file, or a folder with data.npz, or with train.npz + test.npz (its own split);
    it exists (see check_source)."""
    if path.is_file():
        x, y, classes = _read_npz(path)
        return _Loaded({"all": (x, y)}, {"all": str(path)}, classes, {path.name: sha256_file(path)})
    data, train, test = path / "data.npz", path / "train.npz", path / "test.npz"
    has_split = train.exists() or test.exists()
    if data.exists() and has_split:
        raise InvalidInput(
            "source",
            f"folder {path} has both data.npz and train.npz/test.npz, so its split is ambiguous",
            "keep either data.npz (split here) or train.npz + test.npz (your own split)",
        )
    if data.exists():
        x, y, classes = _read_npz(data)
        return _Loaded({"all": (x, y)}, {"all": str(data)}, classes, {data.name: sha256_file(data)})
    if has_split:
        missing = test if train.exists() else train
        if not missing.exists():
            raise InvalidInput(
                "source",
                f"folder {path} has {'train' if train.exists() else 'test'}.npz but no "
                f"{missing.name}",
                "add the missing file, or put all samples in one data.npz to split here",
            )
        x_train, y_train, classes_train = _read_npz(train)
        x_test, y_test, classes_test = _read_npz(test)
        if classes_train and classes_test and classes_train != classes_test:
            raise InvalidInput(
                "source",
                f"{train} and {test} list different classes ({classes_train} vs {classes_test})",
                "save the same `classes` array in both files",
            )
        return _Loaded(
            {"train": (x_train, y_train), "test": (x_test, y_test)},
            {"train": str(train), "test": str(test)},
            classes_train or classes_test,
            {train.name: sha256_file(train), test.name: sha256_file(test)},
        )
    raise InvalidInput(
        "source",
        f"folder {path} has no data.npz and no train.npz + test.npz",
        "put the samples in data.npz (keys x, y), or in train.npz and test.npz",
    )


def _read_npz(path: Path) -> tuple[np.ndarray, np.ndarray, list[str] | None]:
    """Read keys x, y (and optional classes) without ever unpickling (allow_pickle=False)."""
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise InvalidInput(
            "source",
            f"{path} is not a readable .npz file ({exc})",
            "save it with numpy.savez(path, x=samples, y=labels)",
        ) from exc
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise InvalidInput(
            "source",
            f"{path} is a single .npy array, not an .npz archive",
            "save it with numpy.savez(path, x=samples, y=labels)",
        )
    with archive:
        for key in ("x", "y"):
            if key not in archive.files:
                raise InvalidInput(
                    "source",
                    f"{path} has no array {key!r} (it has: {', '.join(archive.files) or 'none'})",
                    "save it with numpy.savez(path, x=samples, y=labels)",
                )
        arrays = {}
        for key in ("x", "y", "classes"):
            if key not in archive.files:
                continue
            try:
                arrays[key] = archive[key]
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
                raise InvalidInput(
                    "source",
                    f"{path}: array {key!r} cannot be read ({exc}); object (pickled) arrays "
                    "are refused for safety",
                    f"save {key} as a plain numeric or string numpy array",
                ) from exc
    classes = None
    if "classes" in arrays:
        classes = _class_names(arrays["classes"], str(path))
    return arrays["x"], arrays["y"], classes


def _class_names(raw: np.ndarray, where: str) -> list[str]:
    if raw.ndim != 1 or len(raw) == 0:
        raise InvalidInput(
            "source",
            f"{where}: classes must be a non-empty 1-D array of names, got shape {list(raw.shape)}",
            "save classes as e.g. numpy.array(['cat', 'dog'])",
        )
    names = [v.decode() if isinstance(v, bytes) else str(v) for v in raw.tolist()]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidInput(
            "source", f"{where}: classes has duplicates {duplicates}", "give each class once"
        )
    return names


# --- validation ------------------------------------------------------------------------------


def _as_samples(x: np.ndarray, where: str) -> np.ndarray:
    """Validate ``x`` and return a fresh float32 channel-first copy (see the module docstring)."""
    x = np.asarray(x)
    if x.dtype.kind not in "biuf":
        raise InvalidInput(
            "source",
            f"{where}: x has dtype {x.dtype}, not numbers",
            "save x as a numeric array (int or float)",
        )
    if x.ndim == 0:
        raise InvalidInput(
            "source", f"{where}: x is a single value", "give x as an array with one row per sample"
        )
    if x.shape[0] == 0:
        raise InvalidInput(
            "source",
            f"{where}: the dataset is empty (x has 0 samples)",
            "give at least a few samples of each class",
        )
    if x.ndim in (1, 3):
        x = x[:, np.newaxis]
    if 0 in x.shape[1:]:
        raise InvalidInput(
            "source",
            f"{where}: samples have no values (x has shape {list(x.shape)})",
            "give samples with at least one value",
        )
    x = x.astype(np.float32, order="C")
    finite = np.isfinite(x.reshape(len(x), -1)).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise InvalidInput(
            "source",
            f"{where}: x has NaN or infinite values (or values too large for float32) in "
            f"{len(bad)} samples, the first at index {int(bad[0])}",
            "drop or impute those samples before prep",
        )
    return x


def _check_labels(y: np.ndarray, count: int, where: str) -> np.ndarray:
    """1-D labels, one per sample; integral floats become ints, bytes become str."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise InvalidInput(
            "source",
            f"{where}: y must be 1-D class labels, got shape {list(y.shape)}",
            "give one label per sample (for one-hot labels use y.argmax(axis=1))",
        )
    if len(y) != count:
        raise InvalidInput(
            "source",
            f"{where}: x has {count} samples but y has {len(y)} labels",
            "give exactly one label per sample",
        )
    if y.dtype.kind == "f":
        if not np.isfinite(y).all():
            raise InvalidInput(
                "source", f"{where}: y has NaN or infinite labels", "drop those samples"
            )
        if not (y == np.round(y)).all():
            raise InvalidInput(
                "source",
                f"{where}: y has non-integer values such as {y[y != np.round(y)][0]!r}; "
                "kubetrain trains classifiers",
                "give class labels as integers or strings",
            )
        return y.astype(np.int64)
    if y.dtype.kind == "S":
        try:
            return np.array([v.decode() for v in y.tolist()])
        except UnicodeDecodeError as exc:
            raise InvalidInput(
                "source",
                f"{where}: y has byte-string labels that are not UTF-8 ({exc})",
                "save labels as integers or str",
            ) from exc
    if y.dtype.kind not in "biuU":
        raise InvalidInput(
            "source",
            f"{where}: y has dtype {y.dtype}",
            "give class labels as integers or strings",
        )
    return y


def _encode_labels(
    labels: dict[str, np.ndarray], classes: list[str] | None, origin: dict[str, str]
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Map labels to 0..K-1 (consistently across splits) and name the classes.

    With a ``classes`` list, integer labels index it and string labels must be in it.
    Without one, the sorted distinct values become the classes (names are their str()).
    """
    if classes is not None:
        index = {name: i for i, name in enumerate(classes)}
        encoded = {}
        for part, y in labels.items():
            if y.dtype.kind == "U":
                unknown = sorted(set(np.unique(y).tolist()) - index.keys())
                if unknown:
                    raise InvalidInput(
                        "source",
                        f"{origin[part]}: y has labels {unknown[:5]} that are not in classes",
                        "make every label one of the classes, or drop the classes array",
                    )
                encoded[part] = np.array([index[v] for v in y.tolist()], dtype=np.int64)
            else:
                y64 = y.astype(np.int64)
                outside = y64[(y64 < 0) | (y64 >= len(classes))]
                if len(outside):
                    raise InvalidInput(
                        "source",
                        f"{origin[part]}: y has label {int(outside[0])} outside "
                        f"0..{len(classes) - 1} of the {len(classes)} classes",
                        "integer labels must index the classes array",
                    )
                encoded[part] = y64
        return encoded, list(classes)

    kinds = {"U" if y.dtype.kind == "U" else "number" for y in labels.values()}
    if len(kinds) > 1:
        raise InvalidInput(
            "source",
            f"{' and '.join(origin.values())} mix string and numeric labels",
            "use the same kind of labels in every file",
        )
    values = np.unique(np.concatenate(list(labels.values())))
    encoded = {part: np.searchsorted(values, y).astype(np.int64) for part, y in labels.items()}
    return encoded, [str(v) for v in values.tolist()]


def _check_same_sample_shape(samples: dict[str, np.ndarray], origin: dict[str, str]) -> None:
    shapes = {part: list(x.shape[1:]) for part, x in samples.items()}
    if shapes["train"] != shapes["test"]:
        raise InvalidInput(
            "source",
            f"samples in {origin['train']} are {shapes['train']} but in {origin['test']} "
            f"{shapes['test']}",
            "give train and test samples of the same shape",
        )


def _check_class_count(y: np.ndarray, classes: list[str], where: str) -> np.ndarray:
    """At least two classes must be present; returns the per-class counts."""
    counts = np.bincount(y, minlength=len(classes))
    present = np.flatnonzero(counts)
    if len(present) < 2:
        only = classes[present[0]] if len(present) else "none"
        raise InvalidInput(
            "source",
            f"{where}: only one class ({only!r}) is present; a classifier needs at least 2",
            "include samples of at least two classes",
        )
    return counts


def _check_test_classes_seen(
    y_train: np.ndarray, y_test: np.ndarray, classes: list[str], origin: dict[str, str]
) -> None:
    """A class only in the test split cannot be learnt, and would make evaluation misleading."""
    unseen = sorted(set(np.unique(y_test).tolist()) - set(np.unique(y_train).tolist()))
    if unseen:
        names = [classes[i] for i in unseen]
        raise InvalidInput(
            "source",
            f"{origin['test']} has classes {names[:5]} that never occur in {origin['train']}",
            "add training samples of those classes, or drop them from the test file",
        )


def _stratified_split(
    y: np.ndarray, classes: list[str], test_fraction: float, seed: int, where: str
) -> tuple[np.ndarray, np.ndarray]:
    """Stratified, seeded split into train/test indices, checked before sklearn would fail."""
    from sklearn.model_selection import train_test_split

    counts = _check_class_count(y, classes, where)
    too_few = [(classes[i], int(c)) for i, c in enumerate(counts) if c == 1]
    if too_few:
        name, _count = too_few[0]
        raise InvalidInput(
            "source",
            f"{where}: class {name!r} has only 1 sample ({len(too_few)} such classes); a "
            "stratified split needs at least 2 per class",
            "add samples of that class or remove it",
        )
    total, present = len(y), int((counts > 0).sum())
    n_test = math.ceil(test_fraction * total)  # how sklearn rounds
    n_train = total - n_test
    if n_test < present or n_train < present:
        raise InvalidInput(
            "test_fraction",
            f"{test_fraction} of {total} samples gives {n_train} train and {n_test} test "
            f"samples, but each side needs one sample of each of the {present} classes",
            "choose a test_fraction nearer 0.5, or add samples",
        )
    try:
        train_idx, test_idx = train_test_split(
            np.arange(total), test_size=test_fraction, random_state=seed, shuffle=True, stratify=y
        )
    except ValueError as exc:  # a case the checks above missed: still the user's data
        raise InvalidInput(
            "source",
            f"{where}: cannot split stratified ({exc})",
            "add samples or change test_fraction",
        ) from exc
    return train_idx, test_idx


def _validation_split(
    y: np.ndarray, classes: list[str], validation_fraction: float, seed: int, where: str
) -> tuple[np.ndarray, np.ndarray]:
    """Stratified, seeded split of the train part's indices into train and validation, each
    holding every class the train part has; refused in one line before sklearn would fail."""
    from sklearn.model_selection import train_test_split

    counts = np.bincount(y, minlength=len(classes))
    single = [classes[i] for i, c in enumerate(counts) if c == 1]
    if single:
        raise InvalidInput(
            "validation_fraction",
            f"{where}: class {single[0]!r} has only 1 training sample ({len(single)} such "
            "classes); a stratified validation split needs at least 2 per class",
            "add samples of that class, or pass validation_fraction 0 for no validation split",
        )
    total, present = len(y), int((counts > 0).sum())
    n_validation = math.ceil(validation_fraction * total)  # how sklearn rounds
    if n_validation < present or total - n_validation < present:
        raise InvalidInput(
            "validation_fraction",
            f"{validation_fraction} of {total} training samples gives {n_validation} validation "
            f"samples, but each side needs one sample of each of the {present} classes",
            "choose a larger validation_fraction, add samples, or pass 0 for no validation split",
        )
    try:
        return train_test_split(
            np.arange(total),
            test_size=validation_fraction,
            random_state=seed,
            shuffle=True,
            stratify=y,
        )
    except ValueError as exc:  # a case the checks above missed: still the user's data
        raise InvalidInput(
            "validation_fraction",
            f"{where}: cannot carve a stratified validation split ({exc})",
            "add samples, or change validation_fraction (0: no validation split)",
        ) from exc


# --- normalisation ---------------------------------------------------------------------------


def _normalise(train: np.ndarray, test: np.ndarray) -> tuple[list[float], list[float]]:
    """Standardise both splits in place with per-channel statistics of the train split.

    The statistics are rounded to float32 before use and recorded as used, so applying the
    manifest's values reproduces the stored samples exactly.
    """
    axes = (0, *range(2, train.ndim))
    mean = train.mean(axis=axes, dtype=np.float64).astype(np.float32)
    std = train.std(axis=axes, dtype=np.float64).astype(np.float32)
    constant = train.min(axis=axes) == train.max(axis=axes)
    std = np.where(constant | (std <= 0), np.float32(1.0), std).astype(np.float32)
    shape = (1, len(mean), *([1] * (train.ndim - 2)))
    for x in (train, test):
        x -= mean.reshape(shape)
        x /= std.reshape(shape)
    return [float(v) for v in mean], [float(v) for v in std]
