"""Export a collected model as a self-contained program for serving, next to its
``model.safetensors``: ``model.pt2`` (``torch.export``, preferred) or ``model.torchscript.pt``
(TorchScript, deprecated by PyTorch but still loadable from C++ and older servers). The model
folder is anything :mod:`kubetrain.artifacts.model_card` reads: local, a KFP pointer folder or an
fsspec URL.

A server then needs neither kubetrain nor the model's Python code. Every export is reloaded and
checked against the eager model before it is published, and recorded with its sha256 in
``export.json``, so :func:`verify_export` can refuse a file that changed since.

Security: ``torch.export.load`` may unpickle parts of the file, and unpickling runs code. Load
only programs you produced, after :func:`verify_export` checked them against ``export.json``
(itself written beside a sha256-checked model). As whoever can change a file can change its
sha256 too, the checks load a program so that it runs no code it carries: every ``torch.load``
inside forced to ``weights_only`` and pickled custom objects refused (TorchScript's own
unpickler resolves no Python globals).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import threading
import zipfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, get_args

import torch

from kubetrain import bounded_json, storage
from kubetrain.artifacts.manifest import (
    OBJECT,
    SHA256,
    SHAPE,
    TEXT,
    check_fields,
    check_file_records,
    read_format_manifest,
)
from kubetrain.artifacts.model_card import EXPORT_CARD, load_model
from kubetrain.errors import IntegrityError, InvalidInput, refusal_reason

ExportKind = Literal["torch-export", "torchscript"]
EXPORT_FILES: dict[str, str] = {"torch-export": "model.pt2", "torchscript": "model.torchscript.pt"}
EXPORT_FORMAT = "kubetrain.export/v1"
#: Rows of the random batch the exports are checked on (≥ 2: the batch stays a dynamic dim).
CHECK_BATCH = 8


def _random_batch(sample_shape: list[int]) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(CHECK_BATCH, *sample_shape, generator=generator)


def _serialize(model: torch.nn.Module, kind: ExportKind, sample: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    with torch.no_grad():
        if kind == "torch-export":
            batch = {0: torch.export.Dim("batch")}
            program = torch.export.export(model, (sample,), dynamic_shapes=(batch,))
            torch.export.save(program, buffer)
        else:
            torch.jit.save(torch.jit.trace(model, sample), buffer)
    return buffer.getvalue()


_WEIGHTS_ONLY_ENV = threading.RLock()


@contextlib.contextmanager
def _weights_only_torch_load() -> Iterator[None]:
    """Every ``torch.load`` inside as ``weights_only=True`` (torch reads the variable on each
    call): ``torch.export.load`` retries its sample inputs, and loads pickled weights, with
    ``weights_only=False``, which runs whatever code a planted archive names."""
    names = ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    with _WEIGHTS_ONLY_ENV:  # the environment is the process's: one setter at a time
        saved = {name: os.environ.pop(name, None) for name in names}
        os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
        try:
            yield
        finally:
            for name, value in saved.items():
                os.environ.pop(name, None)
                if value is not None:
                    os.environ[name] = value


def _refuse_pickled_objects(data: bytes, what: str) -> None:
    """Refuse a torch.export archive with pickled custom objects among its constants, which
    ``torch.export.load`` would ``pickle.loads`` (kubetrain's exports have none)."""
    from torch.export.pt2_archive.constants import (
        CUSTOM_OBJ_FILENAME_PREFIX,
        OPAQUE_OBJ_FILENAME_PREFIX,
    )

    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        names = archive.namelist()
        if len(set(names)) != len(names):  # which copy a reader takes is the reader's choice
            raise IntegrityError(
                f"{what} has duplicate archive entries; refused unread: re-export it"
            )
        for name in names:
            if not name.endswith("constants_config.json"):
                continue
            for fqn, entry in bounded_json.loads(archive.read(name)).get("config", {}).items():
                if str(entry.get("path_name", "")).startswith(
                    (CUSTOM_OBJ_FILENAME_PREFIX, OPAQUE_OBJ_FILENAME_PREFIX)
                ):
                    raise IntegrityError(
                        f"{what} holds a pickled object ({fqn}), refused unread; re-export it"
                    )


def _load(kind: str, data: bytes, what: str) -> torch.nn.Module:
    """The serialized program as a callable module, loaded so that it runs no code it carries."""
    if kind == "torch-export":
        _refuse_pickled_objects(data, what)
        with _weights_only_torch_load():
            return torch.export.load(io.BytesIO(data)).module()
    return torch.jit.load(io.BytesIO(data))


def _check_outputs(
    eager: torch.nn.Module, kind: str, data: bytes, sample: torch.Tensor, what: str
) -> None:
    with torch.no_grad():
        expected = eager(sample)
        try:
            program = _load(kind, data, what)
        except IntegrityError:
            raise
        except Exception as exc:  # whatever a damaged or planted archive makes torch raise
            raise IntegrityError(
                f"{what} is not a loadable {kind} program, refused ({refusal_reason(exc)}); "
                "re-export it"
            ) from exc
        actual = program(sample)
    try:
        torch.testing.assert_close(actual, expected)
    except AssertionError as exc:
        raise IntegrityError(
            f"{what} does not compute what the model does ({exc}); re-export it, or export "
            f"the other kind ({' or '.join(EXPORT_FILES)}: --export of collect)"
        ) from exc


_EXPORT_FIELDS = {"file": TEXT, "sha256": SHA256, "model_sha256": SHA256, "sample_shape": SHAPE}


def _read_export_card(folder: storage.Location) -> dict[str, Any]:
    """``export.json`` (none yet: no exports), every entry's file held to the manifest rule and
    every malformed field one IntegrityError."""
    if not storage.exists(storage.join(folder, EXPORT_CARD)):
        return {"format": EXPORT_FORMAT, "exports": {}}
    what = f"model {folder}"
    card = read_format_manifest(
        folder,
        EXPORT_FORMAT,
        what=what,
        if_missing="; export the model again",
        if_foreign="export the model again with this kubetrain",
        name=EXPORT_CARD,
    )
    check_fields(card, {"exports": OBJECT}, what, EXPORT_CARD)
    check_file_records(
        folder, card["exports"], _EXPORT_FIELDS, what, EXPORT_CARD, "export", "exports"
    )
    return card


def exported_files(model_dir: storage.Location) -> dict[str, str]:
    """file -> sha256 of every export ``export.json`` records (held to the manifest rule), as
    each was hashed when written: what publishing checks the files against."""
    exports = _read_export_card(storage.dereference(model_dir))["exports"]
    return {entry["file"]: entry["sha256"] for entry in exports.values()}


def export_model(
    model_dir: storage.Location,
    kind: ExportKind = "torch-export",
    sample: torch.Tensor | None = None,
    model_factory: str | None = None,
) -> Path | str:
    """Write the model in ``model_dir`` as a ``kind`` program beside it and return its path.

    ``sample`` is a batch (≥ 2 rows) to trace and check with; default: random inputs of the
    model's sample shape. The batch dimension stays dynamic. The file is published atomically
    only after its reloaded program matched the eager model, then recorded in ``export.json``.
    ``model_factory`` builds a model of custom code, which the card's spec alone never does
    (:func:`kubetrain.artifacts.models.rebuild_model`).
    """
    if kind not in EXPORT_FILES:
        raise InvalidInput("kind", f"{kind!r} is not one of {get_args(ExportKind)}", "pick one")
    folder = storage.dereference(model_dir)
    record = _read_export_card(folder)  # refused before anything is written
    model, card = load_model(folder, model_factory=model_factory)
    shape = list(card["model"]["sample_shape"])
    if sample is None:
        sample = _random_batch(shape)
    if list(sample.shape[1:]) != shape or sample.shape[0] < 2:
        raise InvalidInput(
            "sample",
            f"is shaped {list(sample.shape)}",
            f"give a batch of at least 2 samples shaped {shape}",
        )
    data = _serialize(model, kind, sample)
    _check_outputs(model, kind, data, sample, f"the {kind} export of {folder}")
    target = storage.join(folder, EXPORT_FILES[kind])
    storage.write_bytes(target, data)
    record["exports"][kind] = {
        "file": EXPORT_FILES[kind],
        "sha256": hashlib.sha256(data).hexdigest(),
        "model_sha256": card["sha256"],
        "sample_shape": shape,
        "torch_version": torch.__version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    storage.write_text(
        storage.join(folder, EXPORT_CARD), json.dumps(record, indent=2, sort_keys=True) + "\n"
    )
    return target


def verify_export(
    model_dir: storage.Location, kind: ExportKind | None = None, model_factory: str | None = None
) -> Path | str:
    """Check an export against ``export.json`` (sha256 first, before anything is unpickled;
    then that it was made from this very model and still computes what it does) and return
    its path. ``kind`` defaults to the preferred kind that was exported; ``model_factory``
    builds a model of custom code, as for :func:`export_model`."""
    folder = storage.dereference(model_dir)
    exports = _read_export_card(folder)["exports"]
    if kind is None:
        kind = next((k for k in EXPORT_FILES if k in exports), None)
    if kind not in exports:
        raise IntegrityError(
            f"model {folder}: no {kind or 'export'} recorded in {EXPORT_CARD}; export it first"
        )
    entry = exports[kind]
    path = storage.join(folder, entry["file"])  # a name the manifest rule allows
    if not storage.is_file(path):
        raise IntegrityError(
            f"model {folder}: {entry['file']} listed in {EXPORT_CARD} is missing; re-export it"
        )
    data = storage.read_bytes(path)  # checked and loaded from the same bytes: no swap between
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise IntegrityError(f"{path} does not match its sha256 in {EXPORT_CARD}; re-export it")
    model, card = load_model(folder, model_factory=model_factory)
    if card["sha256"] != entry["model_sha256"]:
        raise IntegrityError(f"{path} was exported from another model; re-export it")
    _check_outputs(model, kind, data, _random_batch(entry["sample_shape"]), str(path))
    return path
