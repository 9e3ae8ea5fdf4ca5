"""Checks of rendered objects against the Kubeflow Trainer v2.3 CRDs vendored in ../shared.

jsonschema alone accepts fields a CRD does not declare, which the API server would silently
prune; ``schema_errors`` also reports those, so a misspelt or misplaced field fails here.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from shared_material import SHARED, shared_file

REPO_ROOT = Path(__file__).resolve().parent.parent
TRAINER_SCHEMAS = SHARED / "schemas" / "kubeflow-trainer"
TRAINJOB_CRD = "trainer.kubeflow.org_trainjobs.yaml"
CLUSTER_RUNTIME_CRD = "trainer.kubeflow.org_clustertrainingruntimes.yaml"


def crd_schema(filename: str) -> dict[str, Any]:
    """The v1alpha1 openAPIV3Schema of a vendored CRD; skips the test when ../shared is absent
    (fails it under CI=true)."""
    shared_file(TRAINER_SCHEMAS / filename, "conformance to the Kubeflow Trainer CRD")
    return _load_schema(filename)


@functools.cache
def _load_schema(filename: str) -> dict[str, Any]:
    crd = yaml.safe_load((TRAINER_SCHEMAS / filename).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return version["schema"]["openAPIV3Schema"]


def subschema(schema: dict[str, Any], *path: str) -> dict[str, Any]:
    """The schema at ``path`` (property names; "[]" steps into array items)."""
    for step in path:
        schema = schema["items"] if step == "[]" else schema["properties"][step]
    return schema


def schema_errors(instance: Any, schema: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    errors = [
        f"/{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(instance)
    ]
    return errors + unknown_fields(instance, schema)


def unknown_fields(instance: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the schema does not declare (the API server would prune them)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(instance, dict):
        properties = schema.get("properties")
        if properties is not None:
            found = []
            for key, value in instance.items():
                if key not in properties:
                    found.append(f"{path}/{key}: not in the schema")
                else:
                    found += unknown_fields(value, properties[key], f"{path}/{key}")
            return found
        values = schema.get("additionalProperties")
        if isinstance(values, dict):
            return [
                e for k, v in instance.items() for e in unknown_fields(v, values, f"{path}/{k}")
            ]
        return []
    if isinstance(instance, list) and isinstance(schema.get("items"), dict):
        return [
            e
            for i, v in enumerate(instance)
            for e in unknown_fields(v, schema["items"], f"{path}/{i}")
        ]
    return []
