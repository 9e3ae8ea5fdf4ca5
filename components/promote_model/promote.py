"""Promote step: publish a verified collected model as an immutable version of a model registry
and point ``REGISTRY/PROMOTED`` at it, so serving picks it up.

The registry is a local folder or any fsspec URL (``s3://bucket/models``). A version appears only
complete and verified: locally a staging folder, fsync and rename; on object storage the model
file first and its card ``model.json`` last (:func:`kubetrain.storage.publish_dir`, the road
collect publishes by), so a version without its card is absent to every reader. A version is
never replaced: promoting the same model again is a no-op, another model under a taken version is
refused. ``PROMOTED`` is replaced in one step (a rename locally, one PUT on object storage), so a
server reading it sees the old or the new pointer, never half of one.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kubetrain import bounded_json, storage
from kubetrain.artifacts.model_card import (
    MODEL_CARD,
    MODEL_FILE,
    REGISTRY_POINTER,
    REGISTRY_POINTER_FORMAT,
    read_model_card,
)
from kubetrain.artifacts.output_rule import enclosing_version, registry_version
from kubetrain.artifacts.publish import publish_verified
from kubetrain.artifacts.safetensors_header import tensor_names
from kubetrain.errors import IntegrityError, InvalidInput, KubetrainError
from kubetrain.storage.verified_copy import copy_verified

POINTER, POINTER_FORMAT = REGISTRY_POINTER, REGISTRY_POINTER_FORMAT
# One path segment that cannot be hidden (staging folders are dot-folders) or escape the registry.
VERSION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: What a model and a registry may be, for the fix of a refused one.
MODEL_FORMS = "the folder or URL `kubetrain collect` wrote"
REGISTRY_FORMS = "a folder path or an fsspec URL such as s3://bucket/models"
#: Where the training workflow's promote step mounts the claim ``registry_pvc`` names.
REGISTRY_PVC_MOUNT = "/mnt/registry-pvc"


@dataclass(frozen=True)
class PromotedModel:
    path: str
    version: str
    sha256: str
    pointer: str


def location(text: str, field: str, forms: str, writable: bool = False) -> storage.Location:
    """A model or registry as promote reads or writes it: a local Path (a plain path or a
    ``file://`` URL) or an fsspec URL without its trailing slash; refused in one line when
    empty (``forms`` says what to give), when it names no place, when its protocol is unknown
    or not installed, or (``writable``: a registry) when its filesystem can only be read or it
    is or lies inside another registry's version, which promote would write into."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput(field, "is empty", f"give {forms}")
    (storage.check_writable if writable else storage.check_location)(text, field)
    place = storage.local_path(text, field).expanduser() if storage.is_local(text) else text
    if writable and (version := enclosing_version(place, field)):
        raise InvalidInput(
            field,
            version.describe(text),
            f"give a registry folder outside it, e.g. {version.registry} itself",
        )
    return place if isinstance(place, Path) else place.rstrip("/")


def check_outlives_run(registry: str, run_claim_mount: str, field: str = "registry") -> None:
    """Refuse a local registry under ``run_claim_mount``, the mount of a claim that goes with
    the run: Argo deletes a workflow's ``volumeClaimTemplates`` claim once the run succeeded and
    its exit handler ran (volumeClaimGC OnWorkflowSuccess; argo-workflows v4.1.2 and v3.6.19
    workflow/controller/operator.go ``deletePVCs``, the pvc-protection finalizer stripped unless
    ARGO_REMOVE_PVC_PROTECTION_FINALIZER=false), and every version with it."""
    if not run_claim_mount or not storage.is_local(registry):
        return
    mount = Path(os.path.realpath(run_claim_mount))
    if _lies_within(storage.local_path(registry, field).expanduser(), mount):  # links resolved
        raise InvalidInput(
            field,
            f"{registry} is on the run's own claim (mounted at {mount}), which is deleted when "
            "the run succeeds, and every promoted version with it",
            "give a folder on a claim that outlives the run (the training workflow's "
            f"registry_pvc, mounted at {REGISTRY_PVC_MOUNT}) or a URL such as s3://bucket/models",
        )


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
    model_dir: str,
    registry_dir: str,
    version: str,
    accuracy: float | None = None,
    run_claim_mount: str = "",
) -> PromotedModel:
    """Publish the model in ``model_dir`` as ``registry_dir/version`` and point ``PROMOTED`` at
    it; both may be local or URLs. ``run_claim_mount``: the mount of a claim deleted with the
    run, where no registry may be (see :func:`check_outlives_run`)."""
    model = location(model_dir, "model", MODEL_FORMS)
    registry = location(registry_dir, "registry", REGISTRY_FORMS, writable=True)
    check_outlives_run(registry_dir, run_claim_mount)
    validate_version(version)
    validate_accuracy(accuracy)
    _check_registry_folder(registry)
    # a KFP artifact folder may only point at the model
    source = location(os.fspath(storage.dereference(model)), "model", MODEL_FORMS)
    # a registry may hold the model (a version), not lie inside it
    if _lies_within(registry, model) or _lies_within(registry, source):
        raise InvalidInput(
            "registry",
            f"{registry} is or lies inside the model folder {model}, where promote would add "
            "version folders and PROMOTED",
            "give a registry folder apart from the model",
        )

    card = read_model_card(source)
    target = storage.join(registry, version)
    existing = _published_sha256(target)
    if existing is None and not _publish_version(source, card, target):
        existing = _published_sha256(target)  # another promote published it meanwhile
    if existing is not None and existing != card["sha256"]:
        raise KubetrainError(
            f"version {version} already exists in {registry} with another model (sha256 "
            f"{existing[:12]}…, this model {card['sha256'][:12]}…); versions are never "
            "replaced, pick a new version"
        )
    pointer = storage.join(registry, POINTER)
    if _pointed_at(pointer) != (version, card["sha256"]):
        pointer_record = {
            "format": POINTER_FORMAT,
            "version": version,
            "sha256": card["sha256"],
            "model": card["model"],
            "promoted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "source": str(source.resolve()) if isinstance(source, Path) else str(source),
        }
        if accuracy is not None:
            pointer_record["accuracy"] = accuracy
        storage.write_text(pointer, json.dumps(pointer_record, indent=2, sort_keys=True) + "\n")
    return PromotedModel(
        path=str(target), version=version, sha256=card["sha256"], pointer=str(pointer)
    )


def _check_registry_folder(registry: storage.Location) -> None:
    """Refuse a registry that is a file, or in object storage that cannot be reached (no
    credentials, a wrong endpoint), in one line before anything is created."""
    try:
        not_a_folder = storage.exists(registry, "registry") and not storage.is_dir(registry)
    except KubetrainError:
        raise
    except Exception as exc:  # botocore's NoCredentialsError, a refused connection...
        if isinstance(registry, Path):
            raise
        raise InvalidInput(
            "registry",
            f"cannot reach {registry} ({type(exc).__name__}: {' '.join(str(exc).split())})",
            "check its endpoint and credentials (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY, or the pod's identity)",
        ) from exc
    if not_a_folder:
        raise InvalidInput("registry", f"{registry} is not a folder", "give a registry folder")


def _lies_within(registry: storage.Location, model: storage.Location) -> bool:
    """Whether ``registry`` is ``model`` or lies inside it (links resolved locally)."""
    if isinstance(registry, Path) != isinstance(model, Path):
        return False
    if isinstance(registry, Path):
        real_model, real_registry = Path(os.path.realpath(model)), Path(os.path.realpath(registry))
        return real_registry == real_model or real_model in real_registry.parents
    model = str(model).rstrip("/")
    return registry == model or registry.startswith(f"{model}/")


def _published_sha256(target: storage.Location) -> str | None:
    """The sha256 of the model already at ``target`` (verified), or None if there is none.

    On object storage a version is there only with its card, written last: files without it
    are an interrupted publish, absent to readers and published over. A local version appears
    whole by a rename, so a local folder without its card is damage, reported."""
    card = target if storage.is_local(target) else storage.join(target, MODEL_CARD)
    if not storage.exists(card, "registry"):
        return None
    try:
        return read_model_card(target)["sha256"]
    except IntegrityError as exc:
        raise IntegrityError(
            f"registry version {target} is damaged ({exc}); remove it or pick a new version"
        ) from exc


def _publish_version(source: storage.Location, card: dict[str, Any], target: Path | str) -> bool:
    """Copy the model file (verified against the card's sha256 on the way) and the card into a
    staging folder, check the file is a safetensors file (a registry serves only those) and
    publish it at ``target`` by the one road (:func:`kubetrain.artifacts.publish.publish_verified`,
    a registry version); False if a local ``target`` appeared meanwhile. Locally a plain
    rename, which never replaces a non-empty folder, so a published version is never
    overwritten, even by a race; on object storage the card last."""
    staged = storage.staging_dir(target)
    try:
        copied = copy_verified(
            str(storage.join(source, MODEL_FILE)),
            str(staged / MODEL_FILE),
            expected_sha256=card["sha256"],
        )
        try:
            tensor_names(staged / MODEL_FILE)
        except ValueError as exc:
            raise IntegrityError(
                f"model {source}: {MODEL_FILE} is not a safetensors file ({exc}); nothing was "
                "promoted: collect the model again"
            ) from None
        # The card we verified, not a re-read of the source: it may have been re-collected since.
        (staged / MODEL_CARD).write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
        return publish_verified(staged, registry_version(target), {MODEL_FILE: copied.sha256})
    finally:
        storage.discard_staging(staged)  # gone once published


def _pointed_at(pointer: storage.Location) -> tuple[str, str] | None:
    """(version, sha256) ``PROMOTED`` names now, so a retry leaves an up-to-date pointer as is."""
    try:
        record = bounded_json.loads(storage.read_text(pointer))
        return record["version"], record["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
