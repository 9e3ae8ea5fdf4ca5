"""Promote step: publish a verified collected model as an immutable version of a model registry
folder and point ``REGISTRY/PROMOTED`` at it, so serving picks it up.

A version folder appears only complete and verified (staging folder, fsync, rename) and is never
replaced: promoting the same model again is a no-op, another model under a taken version is
refused. ``PROMOTED`` is rewritten atomically, so a server reading it sees the old or the new
pointer, never half of one.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kubetrain.artifacts.model_card import MODEL_CARD, MODEL_FILE, read_model_card
from kubetrain.artifacts.safetensors_header import tensor_names
from kubetrain.errors import IntegrityError, InvalidInput, KubetrainError
from kubetrain.storage import atomic
from kubetrain.storage.integrity import sha256_file
from kubetrain.storage.urls import file_url_path

POINTER = "PROMOTED"
POINTER_FORMAT = "kubetrain.promoted/v1"
# One path segment that cannot be hidden (staging folders are dot-folders) or escape the registry.
VERSION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass(frozen=True)
class PromotedModel:
    path: str
    version: str
    sha256: str
    pointer: str


def local_path(text: str, field: str) -> Path:
    """A plain path or ``file://`` URL as a local path; other URLs wait for fsspec support."""
    if not text or not text.strip():
        raise InvalidInput(field, "is empty", "give a local folder path")
    url = _URL.match(text)
    if url is None:
        return Path(text).expanduser()
    if url.group(1).lower() != "file":
        raise InvalidInput(
            field,
            f"{text!r} is a {url.group(1)}:// URL and only local paths are supported yet",
            "mount the storage and give its local path (or a file:// URL)",
        )
    return file_url_path(text, field)


def validate_version(version: str) -> str:
    # fullmatch: with re.match and "$", "v1\n" would pass.
    if not isinstance(version, str) or not VERSION_PATTERN.fullmatch(version):
        raise InvalidInput(
            "version",
            f"{version!r} is not a single path segment of letters, digits, '.', '_' or '-' "
            "(starting with a letter or digit, at most 128 characters)",
            "give a name like 2024-06-01 or v3",
        )
    if version.upper() == POINTER:  # compared case-blind for case-insensitive filesystems
        raise InvalidInput(
            "version", f"{version!r} is the registry's pointer file", "choose another, e.g. v1"
        )
    return version


def validate_accuracy(accuracy: float | None) -> float | None:
    if accuracy is not None and not (math.isfinite(accuracy) and 0.0 <= accuracy <= 1.0):
        raise InvalidInput(
            "accuracy", f"{accuracy} is outside [0, 1]", "give accuracy as a fraction, e.g. 0.97"
        )
    return accuracy


def promote_model(
    model_dir: str, registry_dir: str, version: str, accuracy: float | None = None
) -> PromotedModel:
    model = local_path(model_dir, "model")
    registry = local_path(registry_dir, "registry")
    validate_version(version)
    validate_accuracy(accuracy)
    if registry.exists() and not registry.is_dir():
        raise InvalidInput("registry", f"{registry} is not a folder", "give a registry folder")
    real_model, real_registry = Path(os.path.realpath(model)), Path(os.path.realpath(registry))
    if real_registry == real_model or real_model in real_registry.parents:
        raise InvalidInput(  # a registry may hold the model (a version), not lie inside it
            "registry",
            f"{registry} is or lies inside the model folder {model}, where promote would add "
            "version folders and PROMOTED",
            "give a registry folder apart from the model",
        )

    card = read_model_card(str(model))
    target = registry / version
    existing = _published_sha256(target)
    if existing is None and not _publish_version(model, card, target):
        existing = _published_sha256(target)  # another promote published it meanwhile
    if existing is not None and existing != card["sha256"]:
        raise KubetrainError(
            f"version {version} already exists in {registry} with another model (sha256 "
            f"{existing[:12]}…, this model {card['sha256'][:12]}…); versions are never "
            "replaced, pick a new version"
        )
    pointer = registry / POINTER
    if _pointed_at(pointer) != (version, card["sha256"]):
        pointer_record = {
            "format": POINTER_FORMAT,
            "version": version,
            "sha256": card["sha256"],
            "model": card["model"],
            "promoted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "source": str(model.resolve()),
        }
        if accuracy is not None:
            pointer_record["accuracy"] = accuracy
        atomic.write_json(pointer, pointer_record)
    return PromotedModel(
        path=str(target), version=version, sha256=card["sha256"], pointer=str(pointer)
    )


def _published_sha256(target: Path) -> str | None:
    """The sha256 of the model already at ``target`` (verified), or None if there is none."""
    if not target.exists():
        return None
    try:
        return read_model_card(str(target))["sha256"]
    except IntegrityError as exc:
        raise IntegrityError(
            f"registry version {target} is damaged ({exc}); remove it or pick a new version"
        ) from exc


def _publish_version(model: Path, card: dict[str, Any], target: Path) -> bool:
    """Check the model is a safetensors file (a registry serves only those), copy it into a
    staging folder, verify the copy and rename it to ``target``; False
    if ``target`` appeared meanwhile. A plain rename never replaces a non-empty folder (unlike
    ``atomic.publish_dir``), so a published version is never overwritten, even by a race."""
    try:
        tensor_names(model / MODEL_FILE)
    except ValueError as exc:
        raise IntegrityError(
            f"model {model}: {MODEL_FILE} is not a safetensors file ({exc}); nothing was "
            "promoted: collect the model again"
        ) from None
    staged = atomic.staging_dir(target)
    try:
        shutil.copyfile(model / MODEL_FILE, staged / MODEL_FILE)
        # The card we verified, not a re-read of the source: it may have been re-collected since.
        (staged / MODEL_CARD).write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
        copied = sha256_file(staged / MODEL_FILE)
        if copied != card["sha256"]:
            raise IntegrityError(
                f"the registry's copy of {model / MODEL_FILE} has sha256 {copied}, not "
                f"{card['sha256']}; check the registry's storage and promote again"
            )
        atomic.fsync_tree(staged)
        os.rename(staged, target)
    except BaseException as exc:
        shutil.rmtree(staged, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        raise
    atomic.fsync_dir(target.parent)
    return True


def _pointed_at(pointer: Path) -> tuple[str, str] | None:
    """(version, sha256) ``PROMOTED`` names now, so a retry leaves an up-to-date pointer as is."""
    try:
        record = json.loads(pointer.read_text())
        return record["version"], record["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
