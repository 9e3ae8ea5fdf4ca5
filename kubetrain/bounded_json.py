"""The one reader of every JSON text a user or a server gives kubetrain, with bounds.

``json.loads`` alone takes anything: a 5000-digit integer is a ``ValueError`` from deep in the
decoder (Python's int/str limit), ``1e400`` is ``inf``, ``NaN`` and ``Infinity`` are accepted,
nesting a few thousand deep is a ``RecursionError`` (a crafted safetensors header), and a
gigabyte of text is read whole. Here each is refused before or while it is parsed, as a
``BoundedJSONError``: a ``json.JSONDecodeError``, so every caller's ``except`` for bad JSON
takes it and gives its own one line. The guard test (tests/test_json_guard.py) fails on a
``json.load``/``json.loads`` anywhere else.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: The most bytes one JSON text may hold unless the caller says otherwise.
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
#: The deepest nesting of arrays and objects: ours and Kubernetes' go about 10 deep.
MAX_DEPTH = 64
#: The most digits of an integer: a byte offset or a step count has under 20.
MAX_INT_DIGITS = 40
#: Strings (with their escapes), then the brackets left outside them.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


class BoundedJSONError(json.JSONDecodeError):
    """JSON refused past one of the bounds; its text says which, without the decoder's
    "line 1 column 1" (the bound is not at a place in the text)."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, message)
        self.msg, self.doc, self.pos, self.lineno, self.colno = message, "", 0, 1, 1


def loads(text: str | bytes | bytearray, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """The value of the JSON ``text``: at most ``max_bytes`` long, nested at most
    ``MAX_DEPTH`` deep, integers of at most ``MAX_INT_DIGITS`` digits, every float finite
    (no ``NaN``, ``Infinity``, nor a literal that overflows to one)."""
    if isinstance(text, bytes | bytearray):
        if len(text) > max_bytes:
            raise BoundedJSONError(f"more than {max_bytes} bytes of JSON")
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BoundedJSONError(f"not UTF-8 text (byte {exc.start})") from None
    elif len(text) > max_bytes:
        raise BoundedJSONError(f"more than {max_bytes} characters of JSON")
    _check_depth(text)
    return json.loads(
        text, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant
    )


def _check_depth(text: str) -> None:
    depth = 0
    for bracket in _BRACKET.finditer(_STRING.sub('""', text)):
        depth += 1 if bracket.group() in "[{" else -1
        if depth > MAX_DEPTH:
            raise BoundedJSONError(f"nested more than {MAX_DEPTH} deep")


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise BoundedJSONError(f"an integer of more than {MAX_INT_DIGITS} digits")
    return int(digits)


def _finite_float(literal: str) -> float:
    value = float(literal)
    if value in (float("inf"), float("-inf")):
        raise BoundedJSONError(f"the number {literal[:40]} is out of range")
    return value


def _no_constant(name: str) -> float:
    raise BoundedJSONError(f"{name} is not a JSON number")
