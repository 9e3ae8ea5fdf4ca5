"""Every refusal the code can raise has a bad-input case (issue 14, "honest figures").

The fields product code names in ``InvalidInput(FIELD, ...)`` and ``rules.RULE(value, FIELD)``
(string literals, found by reading the code's syntax tree) must each appear in a test module
that holds ``bad_input`` cases, so a refusal nobody tried does not go unnoticed: add a case
where one is reported here. Fields no face can reach are listed with the reason.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("kubetrain", "components", "pipelines")
#: Fields no command, component or template lets a user set, and why.
UNREACHABLE = {
    "chunk_size": "verified_copy's own argument; every caller passes a constant",
    "expected_sha256": "verified_copy's own argument; callers pass a manifest's checked digest",
    "owner": "built by backends/kubernetes/owner.py from the pod's environment, not by a user",
    "run_name": "the KFP pipeline always passes its run's resource name with --storage",
    "sample": "export_model's own argument; collect --export traces a random batch",
    "working_dir": "plan_launch derives it from --checkpoint-dir, refused first as checkpoint_dir",
    "tolerations.operator": "--toleration's grammar (KEY[=VALUE]:EFFECT) yields Equal or Exists",
}


def _python_files(*roots: Path) -> Iterator[Path]:
    for root in roots:
        yield from (p for p in root.rglob("*.py") if ".venv" not in p.parts)


def refusal_fields() -> dict[str, str]:
    """Each literal field a refusal in product code names → where (first place)."""
    found: dict[str, str] = {}
    for path in _python_files(*(REPO / root for root in PRODUCT)):
        if {"tests", "testing"} & set(path.parts):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func, field = node.func, None
            if isinstance(func, ast.Name) and func.id == "InvalidInput" and node.args:
                field = node.args[0]
            elif (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id == "rules"
                and len(node.args) >= 2
            ):
                field = node.args[1]
            if isinstance(field, ast.Constant) and isinstance(field.value, str):
                found.setdefault(field.value, f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def strings_of_bad_input_tests() -> set[str]:
    """Every string literal of the test modules that hold ``bad_input`` cases."""
    strings: set[str] = set()
    for path in _python_files(REPO / "tests", REPO / "components"):
        text = path.read_text()
        if "tests" not in path.parts or "mark.bad_input" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.add(node.value)
    return strings


def test_every_refusal_has_a_bad_input_case() -> None:
    fields = refusal_fields()
    assert len(fields) > 40, "the scan found the refusals"
    tried = strings_of_bad_input_tests()
    untried = {f: where for f, where in fields.items() if f not in tried and f not in UNREACHABLE}
    assert untried == {}, "refusals with no bad-input case (add one, or say why unreachable)"


def test_the_unreachable_list_names_only_real_refusals() -> None:
    assert set(UNREACHABLE) <= set(refusal_fields())
