"""Checks of Argo documents against the Argo Workflows v4.1.2 JSON schema vendored in ../shared.

The upstream schema declares no ``additionalProperties: false``, so it accepts misspelt keys;
``argo_schema_errors`` also reports every key a definition does not declare. IntOrString is
``{"type": "string"}`` there and is kept as is: our YAML must quote such values.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema
from referencing import Registry, Resource
from shared_material import SHARED, shared_file

ARGO_SCHEMA = SHARED / "schemas" / "argo" / "schema.json"
DEFINITION = "io.argoproj.workflow.v1alpha1."


@functools.cache
def _schema() -> dict[str, Any]:
    return json.loads(ARGO_SCHEMA.read_text())


def argo_schema_errors(document: dict[str, Any]) -> list[str]:
    """Schema violations and undeclared keys of a Workflow or WorkflowTemplate document;
    skips the test when ../shared is absent (fails it under CI=true)."""
    shared_file(ARGO_SCHEMA, "conformance to the Argo Workflows schema")
    schema = _schema()
    registry = Registry().with_resource(schema["$id"], Resource.from_contents(schema))
    root = {"$ref": f"{schema['$id']}#/definitions/{DEFINITION}{document['kind']}"}
    validator = jsonschema.Draft202012Validator(root, registry=registry)
    errors = [
        f"/{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(document)
    ]
    definition = schema["definitions"][DEFINITION + document["kind"]]
    return errors + _undeclared(document, definition, schema["definitions"], "")


def _resolve(node: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = definitions[node["$ref"].rsplit("/", 1)[-1]]
    return node


def _undeclared(
    instance: Any, node: dict[str, Any], definitions: dict[str, Any], path: str
) -> list[str]:
    node = _resolve(node, definitions)
    found: list[str] = []
    if isinstance(instance, dict) and "properties" in node:
        for key, value in instance.items():
            if key not in node["properties"]:
                found.append(f"{path}/{key}: not declared by the schema")
            else:
                found += _undeclared(value, node["properties"][key], definitions, f"{path}/{key}")
    elif isinstance(instance, dict) and isinstance(node.get("additionalProperties"), dict):
        for key, value in instance.items():
            found += _undeclared(value, node["additionalProperties"], definitions, f"{path}/{key}")
    elif isinstance(instance, list) and "items" in node:
        for index, item in enumerate(instance):
            found += _undeclared(item, node["items"], definitions, f"{path}/{index}")
    return found
