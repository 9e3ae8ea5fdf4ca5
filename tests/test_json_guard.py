"""Every JSON text kubetrain reads goes through kubetrain.bounded_json (size, depth, digits,
finite floats): a test that reads the source (ast), like the HTTP guard's
(tests/test_http_guard.py). A use of a JSON decoder anywhere else in kubetrain/, components/ or
pipelines/ fails it: ``json.loads``/``json.load``, ``json.JSONDecoder``, or another JSON
library's reader. The bounds themselves are tested in tests/test_bounded_json.py."""

from __future__ import annotations

import pytest

from tests.test_http_guard import annotation_nodes, dotted, imported_names
from tests.test_import_layers import package_sources

READER = "kubetrain.bounded_json"
#: What decodes JSON text, by its dotted name.
DECODERS = frozenset(
    {
        "json.loads",
        "json.load",
        "json.JSONDecoder",
        "json.decoder.JSONDecoder",
        "json.scanner.make_scanner",
        "simplejson.loads",
        "simplejson.load",
        "orjson.loads",
        "ujson.loads",
        "ujson.load",
        "rapidjson.loads",
    }
)
#: (module, decoder) allowed outside the reader, each with why.
ALLOWED: dict[tuple[str, str], str] = {}


def uses(source: str) -> list[tuple[int, str]]:
    """(line, name) for each reference to a JSON decoder in ``source`` (called or passed on;
    a name in a type annotation is no use)."""
    import ast

    tree = ast.parse(source)
    names = imported_names(tree)
    in_annotation = annotation_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in in_annotation:
            continue
        if isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Load):
            name = dotted(node, names)
            if name in DECODERS:
                found.append((node.lineno, name))
    return found


def violations(sources: dict[str, str]) -> list[str]:
    """Each use of a JSON decoder outside the reader, as ``module:line: name``."""
    return [
        f"{module}:{line}: {name}"
        for module, source in sorted(sources.items())
        if module != READER
        for line, name in sorted(set(uses(source)))
        if (module, name) not in ALLOWED
    ]


def test_every_json_text_is_read_by_the_bounded_reader() -> None:
    sources = package_sources()
    assert READER in sources
    assert violations(sources) == []


def test_the_reader_itself_decodes_with_json_loads() -> None:
    """The list is not stale: the reader's own decoder is one the guard names."""
    assert {name for _, name in uses(package_sources()[READER])} == {"json.loads"}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import json\n\njson.loads(text)\n", "json.loads"),
        ("import json\n\ndef f(h):\n    return json.load(h)\n", "json.load"),
        ("from json import loads\n\nloads(t)\n", "json.loads"),
        ("from json import loads as parse\n\nparse(t)\n", "json.loads"),
        ("import json as j\n\nj.loads(t)\n", "json.loads"),
        ("import json\n\ndecode = json.loads\n", "json.loads"),
        ("import json\n\njson.JSONDecoder().decode(t)\n", "json.JSONDecoder"),
        ("from json.decoder import JSONDecoder\n\nJSONDecoder()\n", "json.decoder.JSONDecoder"),
        ("import orjson\n\norjson.loads(b)\n", "orjson.loads"),
    ],
)
def test_a_decoder_outside_the_reader_is_caught(source: str, expected: str) -> None:
    module = "kubetrain.backends.kubernetes.doctor"
    found = violations({**package_sources(), module: source})
    assert any(line.startswith(f"{module}:") and line.endswith(f": {expected}") for line in found)


@pytest.mark.parametrize(
    "source",
    [
        "import json\n\njson.dumps(x)\n",
        "from kubetrain import bounded_json\n\nbounded_json.loads(t)\n",
        "import json\n\ndef f(e: json.JSONDecodeError) -> None:\n    pass\n",
        "import json\n\ntry:\n    pass\nexcept json.JSONDecodeError:\n    pass\n",
        "text = 'json.loads(x)'\n",
    ],
)
def test_harmless_uses_pass(source: str) -> None:
    assert violations({"kubetrain.backends.kubernetes.doctor": source}) == []
