"""The bounds of kubetrain.bounded_json, the one JSON reader (tests/test_json_guard.py): each
text below was a traceback, a hang or a value that is no number before it."""

from __future__ import annotations

import json

import pytest

from kubetrain import bounded_json


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("1e400", "out of range"),
        ('{"accuracy": -1e400}', "out of range"),
        ("9" * 5000, "more than 40 digits"),  # json.loads: ValueError from int's str limit
        ("-" + "9" * 41, "more than 40 digits"),
        ("NaN", "NaN is not a JSON number"),
        ('{"loss": Infinity}', "Infinity is not a JSON number"),
        ("-Infinity", "-Infinity is not a JSON number"),
        ("[" * 100_000 + "]" * 100_000, "nested more than 64 deep"),  # RecursionError before
        ('{"a":' * 65 + "1" + "}" * 65, "nested more than 64 deep"),
        (b"\xff\xfe{}", "not UTF-8"),
    ],
)
def test_a_text_past_a_bound_is_refused_as_bad_json(text: str | bytes, says: str) -> None:
    with pytest.raises(json.JSONDecodeError, match=says):
        bounded_json.loads(text)


def test_the_size_bound_is_checked_before_parsing() -> None:
    with pytest.raises(bounded_json.BoundedJSONError, match="more than 10 bytes"):
        bounded_json.loads(b'"' + b"x" * 20 + b'"', max_bytes=10)
    with pytest.raises(bounded_json.BoundedJSONError, match="more than 10 characters"):
        bounded_json.loads('"' + "x" * 20 + '"', max_bytes=10)


@pytest.mark.parametrize(
    "text",
    [
        '{"a": [1, 2.5, -3, 1e308, "x"]}',
        "9" * 40,
        '{"brackets in a string": "[[[[[[' + "[" * 200 + '", "esc\\"[": 1}',
        "[" * 64 + "]" * 64,
        '"\\u0000"',
        b'{"utf8": "\xc3\xa9"}',
    ],
)
def test_json_within_the_bounds_reads_as_json_loads_does(text: str | bytes) -> None:
    assert bounded_json.loads(text) == json.loads(text)


def test_malformed_json_is_the_decoders_own_error() -> None:
    with pytest.raises(json.JSONDecodeError, match="line 1 column 2"):
        bounded_json.loads("{bad")
