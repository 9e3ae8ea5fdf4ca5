"""Label and field selectors as the API server applies them to list and watch requests.

kmock's emulator ignores ``labelSelector``/``fieldSelector``; a backend that filters pods by
JobSet labels or watches one object by ``metadata.name`` needs the server to honour them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Matcher = Callable[[Mapping[str, Any]], bool]

_SET_TERM = re.compile(r"^\s*(!?)([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside ``in (a, b)`` parentheses."""
    terms, depth, current = [], 0, []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return [term.strip() for term in terms if term.strip()]


def _label_term(term: str) -> Callable[[Mapping[str, str]], bool]:
    match = _SET_TERM.match(term)
    if match:
        _, key, operator, values_text = match.groups()
        values = {value.strip() for value in values_text.split(",") if value.strip()}
        if operator == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    for operator in ("!=", "==", "="):
        if operator in term:
            key, value = (part.strip() for part in term.split(operator, 1))
            if operator == "!=":
                return lambda labels: labels.get(key) != value
            return lambda labels: labels.get(key) == value
    if term.startswith("!"):
        key = term[1:].strip()
        return lambda labels: key not in labels
    return lambda labels: term in labels


def label_matcher(selector: str | None) -> Matcher:
    """A predicate on objects for ``labelSelector`` (equality and set-based terms)."""
    terms = [_label_term(term) for term in _split_terms(selector or "")]

    def matches(obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(term(labels) for term in terms)

    return matches


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def field_matcher(selector: str | None) -> Matcher:
    """A predicate on objects for ``fieldSelector`` (``a.b=v``, ``a.b==v``, ``a.b!=v``)."""
    terms: list[tuple[str, str, bool]] = []
    for term in _split_terms(selector or ""):
        negate = "!=" in term
        path, value = re.split(r"!=|==|=", term, maxsplit=1)
        terms.append((path.strip(), value.strip(), negate))

    def matches(obj: Mapping[str, Any]) -> bool:
        return all((_field_value(obj, path) == value) != negate for path, value, negate in terms)

    return matches


def selector_matcher(params: Mapping[str, str]) -> Matcher:
    """Both selectors of a request's query parameters."""
    labels = label_matcher(params.get("labelSelector"))
    fields = field_matcher(params.get("fieldSelector"))
    return lambda obj: labels(obj) and fields(obj)
