"""Names, labels, annotations and owner references shared by every object we render.

The ``kubetrain.io/spec*`` annotations let a backend that finds an existing object of the same
name (a retried step) tell whether it is the job it would create, and say what differs.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kubetrain import rules
from kubetrain.errors import InvalidInput
from kubetrain.jobspec import TrainJobSpec

#: Standard label saying which tool manages an object; value MANAGED_BY.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kubetrain"
#: On every object of a job (TrainJob/Job, Service, ConfigMap) and on its node pods (on both
#: backends), so one selector finds them all; with ``batch.kubernetes.io/job-completion-index=0``
#: it finds rank 0's pod.
JOB_NAME_LABEL = "kubetrain.io/job-name"
#: Canonical JSON of ``TrainJobSpec.to_dict()`` (sorted keys, no spaces) and its sha256.
SPEC_ANNOTATION = "kubetrain.io/spec"
SPEC_SHA256_ANNOTATION = "kubetrain.io/spec-sha256"
#: sha256 of the shipped script's bytes: the spec holds only its path, not its content.
SCRIPT_SHA256_ANNOTATION = "kubetrain.io/script-sha256"

OWNER_FIELDS = ("apiVersion", "kind", "name", "uid")


def validate_namespace(namespace: str) -> str:
    return rules.namespace(namespace, "namespace")


def canonical_spec_json(spec: TrainJobSpec) -> str:
    """One byte-exact text per spec, so equal specs give equal annotations."""
    return json.dumps(spec.to_dict(), sort_keys=True, separators=(",", ":"))


def spec_annotations(spec: TrainJobSpec, script_sha256: str = "") -> dict[str, str]:
    text = canonical_spec_json(spec)
    annotations = {
        SPEC_ANNOTATION: text,
        SPEC_SHA256_ANNOTATION: hashlib.sha256(text.encode()).hexdigest(),
    }
    if script_sha256:
        annotations[SCRIPT_SHA256_ANNOTATION] = script_sha256
    return annotations


def object_labels(spec: TrainJobSpec) -> dict[str, str]:
    """The user's labels plus ours; ours win so the backend can always find its objects."""
    return {**spec.labels, MANAGED_BY_LABEL: MANAGED_BY, JOB_NAME_LABEL: spec.name}


def pod_labels(spec: TrainJobSpec) -> dict[str, str]:
    """Labels of every node pod: the user's pod labels plus ours."""
    return {**spec.pod_labels, MANAGED_BY_LABEL: MANAGED_BY, JOB_NAME_LABEL: spec.name}


def owner_references(owner: dict[str, Any] | None) -> list[dict[str, Any]]:
    """``[owner]`` as an ownerReference, so deleting the owner (e.g. the pipeline run's
    Workflow) garbage-collects the job.

    ``controller`` is true: the owner is the one thing that manages this object.
    ``blockOwnerDeletion`` is false: setting it true needs ``update`` on the owner's
    ``finalizers`` (OwnerReferencesPermissionEnforcement), a right the steps do not have.
    """
    if owner is None:
        return []
    missing = [key for key in OWNER_FIELDS if not isinstance(owner.get(key), str) or not owner[key]]
    if missing:
        raise InvalidInput(
            "owner",
            f"has no {', '.join(missing)}",
            "give a full ownerReference: apiVersion, kind, name and uid of the owner",
        )
    return [
        {
            **{key: owner[key] for key in OWNER_FIELDS},
            "controller": True,
            "blockOwnerDeletion": False,
        }
    ]


def object_metadata(
    name: str,
    namespace: str,
    labels: dict[str, str],
    owner: dict[str, Any] | None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A plain ObjectMeta dict with only the fields that are set."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if annotations:
        metadata["annotations"] = annotations
    references = owner_references(owner)
    if references:
        metadata["ownerReferences"] = references
    return metadata
