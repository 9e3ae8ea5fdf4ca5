"""Every publish goes through the output rule and verification (issue 28): a test that reads
the source (ast), like the HTTP client guard (tests/test_http_guard.py).

The one road is :func:`kubetrain.artifacts.publish.publish_verified`: it takes a
``CheckedOutput`` (made only by the output rule: ``check_output``, and ``registry_version`` for
promote alone) and the sha256 of the files the step verified, and has no option. This test
fails on any use (a call, or the function passed on) of a low-level publishing function or a
rename into place outside ``kubetrain.storage`` (the low level itself) and that entry, on a
``CheckedOutput`` made anywhere but the output rule, on ``registry_version`` used anywhere but
promote, and on an option added to the entry. ``Path.rename`` is caught by its method name;
``Path.replace`` is not told apart from ``str.replace`` and is not used to publish."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator

import pytest

from tests.test_http_guard import annotation_nodes, dotted, imported_names
from tests.test_import_layers import package_sources

ENTRY_MODULE, ENTRY = "kubetrain.artifacts.publish", "publish_verified"
RULE_MODULE = "kubetrain.artifacts.output_rule"
CHECKED_OUTPUT = f"{RULE_MODULE}.CheckedOutput"
REGISTRY_VERSION = f"{RULE_MODULE}.registry_version"
PROMOTE = "kubetrain.components.promote_model.promote"
#: The low level: folders published (staging folder renamed, or uploaded manifest last).
LOW_LEVEL = frozenset(
    {
        "kubetrain.storage.publish_dir",
        "kubetrain.storage.publish_new_dir",
        "kubetrain.storage.atomic.publish_dir",
        "kubetrain.storage.atomic.publish_new_dir",
        "os.rename",
        "os.renames",
        "os.replace",
        "shutil.move",
    }
)
#: (module, low-level name) allowed outside the entry for good, each with why.
ALLOWED = {
    ("kubetrain.artifacts.checkpoint", "kubetrain.storage.atomic.publish_dir"): (
        "the trainer's own epoch folder, inside the checkpoint folder its lock holds, is no "
        "step output: its manifest of sha256 is what collect verifies every file against"
    ),
    ("kubetrain.cli.compile", "kubetrain.storage.atomic.publish_dir"): (
        "compiled YAML is no step output (no output kind, no marker) and the compiler that "
        "writes it is its only source: nothing records a digest to verify it against"
    ),
    ("kubetrain.cli.compile", "os.replace"): (
        "the same compiled YAML, each file replaced whole in an existing folder (`.` in a "
        "source checkout, the sources beside it)"
    ),
    ("kubetrain.cli.run", "shutil.move"): (
        "rank 0's TensorBoard event files, a viewer's log appended while training, moved out "
        "of the job's checkpoint folder into the run's: no step output, and no manifest "
        "records their digests to verify them against"
    ),
}
#: The modules that publish a step's output, each by the entry.
PUBLISHERS = (
    "kubetrain.components.collect_checkpoint.collect",
    PROMOTE,
    "kubetrain.artifacts.datasets",
    "kubetrain.components.evaluate_model.report",
    "kubetrain.components.launch_trainjob.staging",
)


def function_of(tree: ast.AST) -> dict[int, str]:
    """id of each node -> the name of the function (innermost ``def``) it lies in."""
    enclosing: dict[int, str] = {}

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        for child in ast.iter_child_nodes(node):
            enclosing[id(child)] = function
            visit(child, function)

    visit(tree, "")
    return enclosing


def uses(source: str, module: str) -> Iterator[tuple[int, str, str]]:
    """(line, name, function) for each use in ``source`` of a low-level publisher, of the
    ``CheckedOutput`` constructor or of ``registry_version``, and each ``.rename(...)``."""
    tree = ast.parse(source)
    names = imported_names(tree)
    if module == RULE_MODULE:  # its own names, unqualified
        names.update(CheckedOutput=CHECKED_OUTPUT, registry_version=REGISTRY_VERSION)
    in_annotation, enclosing = annotation_nodes(tree), function_of(tree)
    watched = LOW_LEVEL | {REGISTRY_VERSION}
    for node in ast.walk(tree):
        if id(node) in in_annotation:
            continue
        where = enclosing.get(id(node), "")
        if isinstance(node, ast.Call):
            if dotted(node.func, names) == CHECKED_OUTPUT:
                yield node.lineno, CHECKED_OUTPUT, where
            elif isinstance(node.func, ast.Attribute) and node.func.attr == "rename":
                if dotted(node.func, names) not in LOW_LEVEL:  # Path.rename, a method
                    yield node.lineno, ".rename", where
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
            name = dotted(node, names)
            if name in watched:
                yield node.lineno, name, where


def violations(sources: dict[str, str]) -> list[str]:
    """Each use the guard refuses, as ``module:line: name``."""
    found = []
    for module, source in sorted(sources.items()):
        if module.startswith("kubetrain.storage"):
            continue  # the low level itself
        for line, name, function in sorted(set(uses(source, module))):
            if name == CHECKED_OUTPUT:
                allowed = module == RULE_MODULE
            elif name == REGISTRY_VERSION:
                allowed = module in (RULE_MODULE, PROMOTE)
            else:
                allowed = (module, function) == (ENTRY_MODULE, ENTRY) or (module, name) in ALLOWED
            if not allowed:
                found.append(f"{module}:{line}: {name}")
    return found


def test_every_publish_goes_through_the_one_entry() -> None:
    sources = package_sources()
    assert ENTRY_MODULE in sources and PROMOTE in sources  # the walk found them
    assert violations(sources) == []


def test_the_entry_publishes_by_the_low_level_and_the_steps_by_the_entry() -> None:
    """What the guard lists is what the entry uses (the list is not stale), and every step
    that publishes an output (collect, promote, prep's dataset, evaluate's report, launch's
    dataset staging copy) publishes by the entry."""
    sources = package_sources()
    in_entry = {name for _, name, f in uses(sources[ENTRY_MODULE], ENTRY_MODULE) if f == ENTRY}
    assert {"kubetrain.storage.publish_dir", "kubetrain.storage.publish_new_dir"} <= in_entry
    for module in PUBLISHERS:
        assert f"{ENTRY_MODULE}.{ENTRY}" in imported_names(ast.parse(sources[module])).values()


def test_each_allowance_is_still_needed() -> None:
    sources = package_sources()
    for module, name in ALLOWED:
        assert name in {found for _, found, _ in uses(sources[module], module)}, (module, name)


def test_the_entry_has_no_option_that_skips_a_check() -> None:
    from kubetrain.artifacts.publish import publish_verified

    parameters = inspect.signature(publish_verified).parameters.values()
    assert [p.name for p in parameters] == ["staged", "output", "verified"]
    assert all(p.default is inspect.Parameter.empty for p in parameters)


COLLECT = "kubetrain.components.collect_checkpoint.collect"


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        (
            COLLECT,
            "from kubetrain import storage\n\n"
            "def _publish(s, o):\n    storage.publish_dir(s, o, 'm')\n",
            "kubetrain.storage.publish_dir",
        ),
        (
            COLLECT,
            "from kubetrain.storage.atomic import publish_dir as p\n\nf = p\n",
            "kubetrain.storage.atomic.publish_dir",
        ),
        (PROMOTE, "import os\n\ndef f(a, b):\n    os.rename(a, b)\n", "os.rename"),
        (PROMOTE, "from pathlib import Path\n\nPath('a').rename('b')\n", ".rename"),
        (COLLECT, "import shutil\n\nshutil.move('a', 'b')\n", "shutil.move"),
        (
            COLLECT,
            "from kubetrain.artifacts.output_rule import MODEL, CheckedOutput\n\n"
            "CheckedOutput('/x', MODEL, True)\n",
            CHECKED_OUTPUT,
        ),
        (
            COLLECT,
            "from kubetrain.artifacts import output_rule\n\n"
            "output_rule.registry_version('/r/v1')\n",
            REGISTRY_VERSION,
        ),
        (
            ENTRY_MODULE,
            "from kubetrain import storage\n\n"
            "def helper(s, o):\n    storage.publish_dir(s, o, 'm')\n",
            "kubetrain.storage.publish_dir",
        ),
    ],
    ids=[
        "storage.publish_dir in collect",
        "atomic.publish_dir passed on",
        "os.rename in promote",
        "Path.rename",
        "shutil.move",
        "a forged CheckedOutput",
        "registry_version outside promote",
        "the entry's module, outside the entry",
    ],
)
def test_a_publish_outside_the_entry_is_caught(module: str, source: str, expected: str) -> None:
    found = violations({**package_sources(), module: source})
    assert any(line.startswith(f"{module}:") and line.endswith(f": {expected}") for line in found)


def test_the_entry_refuses_what_the_rule_did_not_check_and_unverified_files(tmp_path) -> None:
    """At run time too: a location that is no CheckedOutput, a card whose sha256 is not the
    verified one, a verified name with no staged file, a verified file the card does not
    record, a file that changed after it was verified: refused, nothing published."""
    import hashlib
    import json

    from kubetrain.artifacts.model_card import MODEL_CARD, MODEL_FILE, MODEL_FORMAT
    from kubetrain.artifacts.output_rule import MODEL, check_output
    from kubetrain.artifacts.publish import publish_verified
    from kubetrain.errors import IntegrityError

    staged, target = tmp_path / "staged", tmp_path / "model"
    staged.mkdir()
    (staged / MODEL_FILE).write_bytes(b"weights")
    (staged / "extra.bin").write_bytes(b"extra")
    digest, other = hashlib.sha256(b"weights").hexdigest(), "b" * 64
    (staged / MODEL_CARD).write_text(json.dumps({"format": MODEL_FORMAT, "sha256": other}))
    with pytest.raises(TypeError, match="takes a CheckedOutput, not str"):
        publish_verified(staged, str(target), {MODEL_FILE: digest})  # type: ignore[arg-type]
    output = check_output(str(target), "output", MODEL)
    with pytest.raises(IntegrityError, match=f"records sha256 {other} for {MODEL_FILE}"):
        publish_verified(staged, output, {MODEL_FILE: digest})
    with pytest.raises(IntegrityError, match="absent.bin was not staged with a verified sha256"):
        publish_verified(staged, output, {MODEL_FILE: other, "absent.bin": digest})
    with pytest.raises(IntegrityError, match="no verified file to publish"):
        publish_verified(staged, output, {})
    with pytest.raises(IntegrityError, match=f"{MODEL_FILE} changed after it was verified"):
        publish_verified(staged, output, {MODEL_FILE: other})  # the card agrees, the file not
    (staged / MODEL_CARD).write_text(json.dumps({"format": MODEL_FORMAT, "sha256": digest}))
    extra = hashlib.sha256(b"extra").hexdigest()
    with pytest.raises(IntegrityError, match="extra.bin was verified but its model.json does not"):
        publish_verified(staged, output, {MODEL_FILE: digest, "extra.bin": extra})
    assert not target.exists()
    assert publish_verified(staged, output, {MODEL_FILE: digest}) is True
    assert (target / MODEL_FILE).read_bytes() == b"weights"


@pytest.mark.parametrize(
    ("kind", "marker", "expected"),
    [
        ("dataset", {"splits": {"train": {"file": "a.bin", "sha256": "c" * 64}}}, "records sha256"),
        ("dataset", {"splits": {"train": {"file": "a.bin", "sha256": "A"}}}, "records sha256 A"),
        ("dataset", {"splits": {}}, "records no sha256 by file name"),
        ("dataset", {"splits": {"train": "a.bin"}}, "records no sha256 by file name"),
        (
            "dataset",
            {
                "splits": {
                    "train": {"file": "a.bin", "sha256": "DIGEST"},
                    "test": {"file": "b.bin", "sha256": "c" * 64},
                }
            },
            "records sha256 c+ for b.bin, but no digest was verified",
        ),
        ("report", {"files": ["a.bin"]}, "records no sha256 by file name"),
        ("report", {"sha256": {"a.bin": "c" * 64}}, "records sha256"),
        (
            "report",
            {"sha256": {"a.bin": "DIGEST", "b.bin": "c" * 64}},
            "records sha256 c+ for b.bin, but no digest was verified",
        ),
    ],
    ids=[
        "dataset: another digest",
        "dataset: no digest",
        "dataset: no split",
        "dataset: a split that is no record",
        "dataset: a split not written",
        "report: no digests",
        "report: another digest",
        "report: a file not written",
    ],
)
def test_a_dataset_or_report_marker_must_record_what_was_verified(
    tmp_path, kind: str, marker: dict, expected: str
) -> None:
    """A dataset's manifest records its split files' sha256, a report's marker each file's:
    where they disagree with the files the step verified (another digest, none, a file it
    did not write), nothing is published."""
    import hashlib
    import json

    from kubetrain.artifacts.output_rule import DATASET, REPORT, check_output
    from kubetrain.artifacts.publish import publish_verified
    from kubetrain.errors import IntegrityError

    output_kind = {"dataset": DATASET, "report": REPORT}[kind]
    staged, target = tmp_path / "staged", tmp_path / kind
    staged.mkdir()
    (staged / "a.bin").write_bytes(b"a")
    digest = hashlib.sha256(b"a").hexdigest()
    text = json.dumps({**marker, "format": output_kind.format}).replace("DIGEST", digest)
    (staged / output_kind.marker).write_text(text)
    output = check_output(str(target), "output", output_kind)
    with pytest.raises(IntegrityError, match=expected):
        publish_verified(staged, output, {"a.bin": digest})
    assert not target.exists()
