"""What the API server does with a custom resource's body before it stores it: the CRD's
structural ``openAPIV3Schema`` applied the way kube-apiserver's apiextensions handler does.

In the order the server goes (kubernetes ``staging/src/k8s.io/apiextensions-apiserver``,
``pkg/apiserver/customresource_handler.go``, server-side field validation of
kubernetes/kubernetes#105916, documented in "Field validation" of the Kubernetes API concepts):

1. unknown fields: with ``?fieldValidation=Strict`` the request fails with 400 BadRequest
   ``<Kind> in version "<v>" cannot be handled as a <Kind>: strict decoding error: unknown field
   "spec.foo"``; otherwise (``Warn``, the default since Kubernetes 1.27, or ``Ignore``) they are
   pruned, and ``Warn`` answers a ``Warning: 299 - "unknown field \\"spec.foo\\""`` header;
   ``apiVersion``, ``kind`` and ``metadata`` are never pruned at the root or in an
   ``x-kubernetes-embedded-resource``; ``x-kubernetes-preserve-unknown-fields`` keeps a subtree;
2. nulls where the schema is not ``nullable`` are dropped, then ``default`` values applied;
3. validation: ``type`` (``x-kubernetes-int-or-string`` takes both), ``format`` int32/int64/
   date-time, ``enum``, ``required``, ``minimum``/``maximum``, ``minLength``/``maxLength``,
   ``minItems``/``maxItems``, ``pattern``, ``x-kubernetes-list-type: map|set`` uniqueness, and
   the ``x-kubernetes-validations`` CEL rules with ``self`` (and ``oldSelf``: transition rules run
   only on update, where an old value correlates: same object field, same list-map key). A
   failure is a 422 ``Invalid`` whose ``details.causes[]`` name each field, the message shaped as
   the server's ``field.Error`` (``spec.x: Invalid value: "string": <message>``).

CEL runs on ``celpy`` (cel-python). A rule it cannot compile, or whose evaluation fails for a
reason other than a missing field (which real CEL reports as an error too), is skipped and
recorded in ``SKIPPED_RULES``, so a gap of the library never fails a legitimate object.
Compiled rules are cached per rule text for the whole process.
"""

from __future__ import annotations

import datetime
import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

import celpy

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
ALWAYS_KEPT = ("apiVersion", "kind", "metadata")
#: rule text -> why celpy could not run it (reported, never failing an object).
SKIPPED_RULES: dict[str, str] = {}
_CEL = celpy.Environment()


@dataclass
class Cause:
    """One ``details.causes[]`` entry of a 422 Status."""

    field: str
    reason: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}


@dataclass
class Admission:
    """What the server decided about one body: the stored object, the unknown fields it
    pruned (for Warning headers), and the validation failures."""

    obj: dict[str, Any]
    unknown: list[str] = field(default_factory=list)
    causes: list[Cause] = field(default_factory=list)


@functools.cache
def _program(rule: str) -> Any:
    try:
        return _CEL.program(_CEL.compile(rule))
    except Exception as error:  # a CEL feature celpy lacks
        SKIPPED_RULES[rule] = f"celpy cannot compile it: {error}"
        return None


def _go_type(value: Any) -> str:
    """How the server names a JSON value's type in messages."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def _shown(value: Any) -> str:
    """``field.Invalid``'s rendering of a value: scalars quoted or bare, others by type."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(_go_type(value))


def _is_type(value: Any, schema: dict[str, Any]) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    expected = schema.get("type")
    if expected is None:
        return True
    if expected == "integer":
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            or (isinstance(value, float) and value.is_integer())
        )
    if expected == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return _go_type(value) == expected


def _child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class SchemaAdmission:
    """One CRD version's schema, applied to the bodies of create, replace and patch."""

    def __init__(self, schema: dict[str, Any], kind: str, version: str) -> None:
        self.schema = schema
        self.kind = kind
        self.version = version

    def admit(self, obj: dict[str, Any], old: dict[str, Any] | None) -> Admission:
        """Prune (recording unknown fields), default and validate ``obj`` (a copy it owns)."""
        result = Admission(obj)
        self._prune(obj, self.schema, "", result.unknown, root=True)
        self._default(obj, self.schema)
        self._validate(obj, old, self.schema, "", result.causes, root=True)
        return result

    # ------------------------------------------------------------------------- pruning
    def _prune(
        self, value: Any, schema: dict[str, Any], path: str, unknown: list[str], root=False
    ) -> None:
        if isinstance(value, dict):
            properties = schema.get("properties")
            extra = schema.get("additionalProperties")
            keep_all = schema.get("x-kubernetes-preserve-unknown-fields")
            kept = ALWAYS_KEPT if root or schema.get("x-kubernetes-embedded-resource") else ()
            for key in list(value):
                sub_path = _child(path, key)
                if key in kept:  # ObjectMeta is the server's own, never pruned by the schema
                    continue
                if properties is not None and key in properties:
                    self._prune(value[key], properties[key], sub_path, unknown)
                elif isinstance(extra, dict):
                    self._prune(value[key], extra, sub_path, unknown)
                elif keep_all or extra is True:
                    continue
                elif properties is not None or schema.get("type") == "object":
                    unknown.append(sub_path)
                    del value[key]
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            for index, item in enumerate(value):
                self._prune(item, schema["items"], f"{path}[{index}]", unknown)

    # ----------------------------------------------------------------------- defaulting
    def _default(self, value: Any, schema: dict[str, Any]) -> None:
        if isinstance(value, dict):
            properties = schema.get("properties") or {}
            for key in list(value):
                sub = properties.get(key)
                if value[key] is None and sub is not None and not sub.get("nullable"):
                    del value[key]
            for key, sub in properties.items():
                if key not in value and "default" in sub:
                    value[key] = json.loads(json.dumps(sub["default"]))
                if key in value:
                    self._default(value[key], sub)
            extra = schema.get("additionalProperties")
            if isinstance(extra, dict):
                for key in value:
                    if key not in properties:
                        self._default(value[key], extra)
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            for item in value:
                self._default(item, schema["items"])

    # ----------------------------------------------------------------------- validation
    def _validate(
        self,
        value: Any,
        old: Any,
        schema: dict[str, Any],
        path: str,
        causes: list[Cause],
        root: bool = False,
    ) -> None:
        shown_path = path or "<nil>"
        if value is None:
            if not schema.get("nullable"):
                causes.append(Cause(path, "FieldValueRequired", f"{shown_path}: Required value"))
            return
        if not _is_type(value, schema):
            expected = (
                "integer or string"
                if schema.get("x-kubernetes-int-or-string")
                else (schema.get("type"))
            )
            causes.append(
                Cause(
                    path,
                    "FieldValueTypeInvalid",
                    f"{shown_path}: Invalid value: {json.dumps(_go_type(value))}: {path} in body "
                    f"must be of type {expected}: {json.dumps(_go_type(value))}",
                )
            )
            return
        before = len(causes)
        self._check_scalar(value, schema, path, causes)
        if isinstance(value, dict):
            self._check_object(value, old if isinstance(old, dict) else None, schema, path, causes)
        elif isinstance(value, list):
            self._check_array(value, old if isinstance(old, list) else None, schema, path, causes)
        if len(causes) == before:  # the server runs CEL only on values that passed the schema
            self._check_rules(value, old, schema, path, causes, root)

    def _check_scalar(
        self, value: Any, schema: dict[str, Any], path: str, causes: list[Cause]
    ) -> None:
        def invalid(detail: str, reason: str = "FieldValueInvalid") -> None:
            causes.append(Cause(path, reason, f"{path}: Invalid value: {_shown(value)}: {detail}"))

        if "enum" in schema and value not in schema["enum"]:
            supported = ", ".join(json.dumps(v) for v in schema["enum"])
            causes.append(
                Cause(
                    path,
                    "FieldValueNotSupported",
                    f"{path}: Unsupported value: {_shown(value)}: supported values: {supported}",
                )
            )
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            bounds = {"int32": INT32, "int64": INT64}.get(schema.get("format", ""))
            if bounds and not bounds[0] <= value <= bounds[1]:
                invalid(f"{path} in body must be of type {schema['format']}: {_shown(value)}")
            if "minimum" in schema and value < schema["minimum"]:
                invalid(f"{path} in body should be greater than or equal to {schema['minimum']}")
            if "maximum" in schema and value > schema["maximum"]:
                invalid(f"{path} in body should be less than or equal to {schema['maximum']}")
        if isinstance(value, str):
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                causes.append(
                    Cause(
                        path,
                        "FieldValueTooLong",
                        f"{path}: Too long: may not be more than {schema['maxLength']} bytes",
                    )
                )
            if "minLength" in schema and len(value) < schema["minLength"]:
                invalid(f"{path} in body should be at least {schema['minLength']} chars long")
            if "pattern" in schema and not re.search(schema["pattern"], value):
                invalid(f"{path} in body should match '{schema['pattern']}'")
            if schema.get("format") == "date-time" and not _is_date_time(value):
                invalid(f"{path} in body must be of type date-time: {_shown(value)}")

    def _check_object(
        self,
        value: dict[str, Any],
        old: dict[str, Any] | None,
        schema: dict[str, Any],
        path: str,
        causes: list[Cause],
    ) -> None:
        for name in schema.get("required") or []:
            if name not in value:
                causes.append(
                    Cause(
                        _child(path, name),
                        "FieldValueRequired",
                        f"{_child(path, name)}: Required value",
                    )
                )
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = properties.get(key) if key in properties else extra
            if isinstance(sub, dict):
                previous = old.get(key) if old is not None else None
                self._validate(item, previous, sub, _child(path, key), causes)

    def _check_array(
        self,
        value: list[Any],
        old: list[Any] | None,
        schema: dict[str, Any],
        path: str,
        causes: list[Cause],
    ) -> None:
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            causes.append(
                Cause(
                    path,
                    "FieldValueTooMany",
                    f"{path}: Too many: {len(value)}: must have at most {schema['maxItems']} items",
                )
            )
        if "minItems" in schema and len(value) < schema["minItems"]:
            causes.append(
                Cause(
                    path,
                    "FieldValueInvalid",
                    f"{path}: Invalid value: {len(value)}: {path} in body should have at least "
                    f"{schema['minItems']} items",
                )
            )
        items = schema.get("items")
        list_type = schema.get("x-kubernetes-list-type")
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen: dict[Any, int] = {}
        old_by_key: dict[Any, Any] = {}
        if list_type == "map" and old:
            old_by_key = {_map_key(item, keys): item for item in old if isinstance(item, dict)}
        for index, item in enumerate(value):
            item_path = f"{path}[{index}]"
            identity = None
            if list_type == "map" and isinstance(item, dict):
                identity = _map_key(item, keys)
            elif list_type == "set":
                identity = json.dumps(item, sort_keys=True)
            if identity is not None:
                if identity in seen:
                    causes.append(
                        Cause(
                            item_path,
                            "FieldValueDuplicate",
                            f"{item_path}: Duplicate value: {_duplicate(item, keys)}",
                        )
                    )
                seen[identity] = index
            if isinstance(items, dict):
                # Transition rules correlate list-map items by key; other lists do not correlate.
                previous = old_by_key.get(identity) if list_type == "map" else None
                self._validate(item, previous, items, item_path, causes)

    def _check_rules(
        self,
        value: Any,
        old: Any,
        schema: dict[str, Any],
        path: str,
        causes: list[Cause],
        root: bool,
    ) -> None:
        for rule in schema.get("x-kubernetes-validations") or []:
            text = rule.get("rule", "")
            transition = "oldSelf" in text
            if transition and old is None:
                continue
            program = _program(text)
            if program is None:
                continue
            activation = {"self": celpy.json_to_cel(value)}
            if transition:
                activation["oldSelf"] = celpy.json_to_cel(old)
            try:
                passed = bool(program.evaluate(activation))
            except celpy.CELEvalError as error:
                if "no such member" not in str(error) and "KeyError" not in str(error):
                    SKIPPED_RULES[text] = f"celpy cannot evaluate it: {error}"
                    continue
                passed, rule = False, {**rule, "message": f"{text}: no such key"}
            if passed:
                continue
            message = rule.get("message") or f"failed rule: {text}"
            target = _child(path, rule["fieldPath"].lstrip(".")) if rule.get("fieldPath") else path
            shown = json.dumps(_go_type(value))
            causes.append(
                Cause(
                    target,
                    rule.get("reason") and f"Field{rule['reason']}" or "FieldValueInvalid",
                    f"{target or '<nil>'}: Invalid value: {shown}: {message}",
                )
            )


def _map_key(item: dict[str, Any], keys: list[str]) -> tuple[Any, ...]:
    return tuple(json.dumps(item.get(key)) for key in keys)


def _duplicate(item: Any, keys: list[str]) -> str:
    if isinstance(item, dict) and keys:
        return "{" + ", ".join(f'"{k}":{json.dumps(item.get(k))}' for k in keys) + "}"
    return json.dumps(item)


def _is_date_time(value: str) -> bool:
    try:
        datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def admissions_of(crd: dict[str, Any]) -> dict[str, SchemaAdmission]:
    """version name -> its schema's admission, for every served version with a schema."""
    spec = crd.get("spec") or {}
    kind = (spec.get("names") or {}).get("kind", "")
    found = {}
    for version in spec.get("versions") or []:
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if version.get("served", True) and schema:
            found[version["name"]] = SchemaAdmission(schema, kind, version["name"])
    return found
