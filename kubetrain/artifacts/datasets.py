"""The prepared-dataset folder: what dataset prep writes and the trainer and evaluate read.

Layout (format ``kubetrain.dataset/v1``)::

    DIR/manifest.json        counts, classes, sample shape, normalisation, sha256 of each file
    DIR/train.safetensors    x: float32 [N, *sample_shape] (already normalised), y: int64 [N]
    DIR/validation.safetensors  same, carved from train: what the trainer scores each epoch
                             on (optional: absent from datasets prepared before it existed)
    DIR/test.safetensors     same, the held-out split, read once, by evaluate

The folder is published atomically: it either does not exist or is complete. DIR may be a
local path or an fsspec URL (``s3://bucket/prefix``); see :mod:`kubetrain.storage`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from kubetrain import storage
from kubetrain.artifacts.manifest import (
    MANIFEST,
    OBJECT,
    POSITIVE,
    REWRITE,
    SHA256,
    SHAPE,
    TEXT,
    WHOLE,
    Rule,
    check_fields,
    check_file_records,
    read_format_manifest,
    verify_digests,
)
from kubetrain.artifacts.output_rule import DATASET, check_output
from kubetrain.artifacts.publish import publish_verified
from kubetrain.errors import IntegrityError, refusal_reason

FORMAT = "kubetrain.dataset/v1"
#: The splits every dataset has; ``VALIDATION`` is optional.
SPLITS = ("train", "test")
VALIDATION = "validation"


def write_dataset(
    output_dir: storage.Location,
    splits: dict[str, tuple[np.ndarray, np.ndarray]],
    classes: list[str],
    mean: list[float],
    std: list[float],
    provenance: dict[str, Any],
) -> dict[str, Any]:
    """Write normalised ``(x, y)`` arrays per split and the manifest, then publish them at
    ``output_dir`` (the option ``output_dir``, held to the output rule here too) by the one
    road, :func:`kubetrain.artifacts.publish.publish_verified`: each split file with the sha256
    it was hashed to as it was written, which the manifest must record."""
    output = check_output(output_dir, "output_dir", DATASET)
    staged = storage.staging_dir(output_dir)
    try:
        manifest, written = _write_staged(staged, splits, classes, mean, std, provenance)
        publish_verified(staged, output, written)
    except BaseException:
        storage.discard_staging(staged)
        raise
    return manifest


def _write_staged(
    staged: Path,
    splits: dict[str, tuple[np.ndarray, np.ndarray]],
    classes: list[str],
    mean: list[float],
    std: list[float],
    provenance: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, str]]:
    """The manifest, and each split file's sha256 as it was written."""
    split_entries, written = {}, {}
    for split, (x, y) in splits.items():
        filename = f"{split}.safetensors"
        x32, y64 = np.ascontiguousarray(x, dtype="<f4"), np.ascontiguousarray(y, dtype="<i8")
        written[filename] = _write_split(staged / filename, x32, y64)
        split_entries[split] = {
            "file": filename,
            "count": int(len(y64)),
            "class_counts": np.bincount(y64, minlength=len(classes)).tolist(),
            "sha256": written[filename],
        }
    sample_shape = list(next(iter(splits.values()))[0].shape[1:])
    manifest = {
        "format": FORMAT,
        "classes": classes,
        "num_classes": len(classes),
        "sample_shape": sample_shape,
        "normalisation": {"mean": mean, "std": std},
        "splits": split_entries,
        **provenance,
    }
    (staged / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest, written


def _write_split(path: Path, x32: np.ndarray, y64: np.ndarray) -> str:
    """Write one split as safetensors straight from the arrays' memory (little-endian; ``y``
    first, so both start 8-byte aligned); its sha256, of the bytes as they were written."""
    from kubetrain.artifacts.checkpoint_formats.writer import Entry, write_safetensors

    entries = [Entry("y", "I64", y64.shape, y64.nbytes), Entry("x", "F32", x32.shape, x32.nbytes)]
    as_bytes = [array.reshape(-1).view(np.uint8) for array in (y64, x32)]  # empty ones too
    return write_safetensors(path, entries, as_bytes).sha256


_FIELDS = {
    "classes": Rule(
        lambda value: isinstance(value, list) and all(isinstance(c, str) for c in value),
        "a list of strings",
    ),
    "num_classes": POSITIVE,
    "sample_shape": SHAPE,
    "splits": OBJECT,
}
_SPLIT_FIELDS = {"file": TEXT, "count": WHOLE, "sha256": SHA256}


def read_manifest(data_dir: storage.Location) -> dict[str, Any]:
    """The manifest of a dataset folder, or of the one a pointer folder names; every malformed
    field, and every split file against the manifest rule, is one IntegrityError."""
    data_dir = storage.dereference(data_dir)
    what = f"dataset {data_dir}"
    manifest = read_format_manifest(
        data_dir,
        FORMAT,
        what=what,
        if_missing="; point --data at a folder written by `kubetrain prep`",
        if_foreign="re-run `kubetrain prep`",
    )
    check_fields(manifest, _FIELDS, what, MANIFEST)
    if len(manifest["classes"]) != manifest["num_classes"]:
        raise IntegrityError(
            f"{what}: {MANIFEST} names {len(manifest['classes'])} classes but says num_classes "
            f"{manifest['num_classes']}; {REWRITE}"
        )
    check_file_records(
        data_dir, manifest["splits"], _SPLIT_FIELDS, what, MANIFEST, "split", "splits"
    )
    return manifest


def load_split(data_dir: storage.Location, split: str, verify: bool = True):
    """Return ``(x, y)`` torch tensors of one split, checked against the manifest's sha256."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    data_dir = storage.dereference(data_dir)
    manifest = read_manifest(data_dir)  # which holds the split's file to the manifest rule
    entry = manifest["splits"].get(split)
    if entry is None:
        raise IntegrityError(
            f"dataset {data_dir}: no split {split!r} (has {sorted(manifest['splits'])}); "
            f"prepare the dataset again with `kubetrain prep`, which writes {' and '.join(SPLITS)}"
        )
    if verify:
        verify_digests(data_dir, {entry["file"]: entry["sha256"]}, f"dataset {data_dir}")
    try:
        tensors = load(storage.read_bytes(storage.join(data_dir, entry["file"])))
        x, y = tensors["x"], tensors["y"]
    except (SafetensorError, KeyError) as exc:
        raise IntegrityError(
            f"dataset {data_dir}: {entry['file']} is not a dataset split "
            f"({refusal_reason(exc)}); prepare the dataset again with `kubetrain prep`"
        ) from None
    problem = _split_problem(
        x, y, entry["count"], manifest["sample_shape"], manifest["num_classes"]
    )
    if problem:
        raise IntegrityError(
            f"dataset {data_dir}: {entry['file']} (split {split}) {problem}; prepare the "
            "dataset again with `kubetrain prep`"
        )
    return x, y


def _layout(tensor: Any) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')} {list(tensor.shape)}"


def _split_problem(
    x: Any, y: Any, count: int, sample_shape: list[int], num_classes: int
) -> str | None:
    """What keeps a split's tensors from being the samples its manifest describes, or None.

    The digest covers the bytes, not their meaning: a split written by something other than
    prep (or with its manifest rewritten to match) reached the trainer as an "internal error"
    at the first step (integer or half samples, 2-D labels), a wrong count was reported with
    the sample count as both numbers, and NaN samples trained to a NaN model."""
    import torch

    expected_x = f"float32 {[count, *sample_shape]}"
    if _layout(x) != expected_x:
        return f"holds x {_layout(x)}; the manifest says {expected_x}"
    if _layout(y) != f"int64 {[count]}":
        return f"holds y {_layout(y)}; the manifest says int64 {[count]}"
    if count and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        return (
            f"has labels {int(y.min())}..{int(y.max())}, outside the manifest's "
            f"{num_classes} classes 0..{num_classes - 1}"
        )
    non_finite = int((~torch.isfinite(x)).sum())
    if non_finite:
        return f"has {non_finite} sample values that are NaN or infinite"
    return None
