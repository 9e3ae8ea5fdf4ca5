"""The README's Reliability section quotes the tests: every figure it gives is computed here
from the test ids pytest collects with each mark (``fault``, ``bad_input``, ``security``), and
every test it names exists and carries the mark of its table."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from tests.support.reliability_figures import COLLECTED_MARKS_ENV, whole_suite_marks

REPO = Path(__file__).resolve().parents[2]
TEST_REFERENCE = re.compile(r"`((?:tests|components)/[\w/]+\.py)::(\w+)")


def reliability_section() -> str:
    readme = (REPO / "README.md").read_text()
    start = readme.index("\n## Reliability\n")
    end = readme.index("\n## ", start + 1)
    return readme[start:end]


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """The node ids of the whole suite's tests of each mark, as `make test` collects them:
    this session's own collection where it is the whole suite's, else `pytest --collect-only`."""
    if (marks := whole_suite_marks()) is not None:
        return marks
    target = tmp_path_factory.mktemp("marks") / "marks.json"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q"],
        cwd=REPO,
        env={**os.environ, COLLECTED_MARKS_ENV: str(target)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(target.read_text())


@cache
def function_source(path: str, name: str) -> str:
    tree = ast.parse((REPO / path).read_text())
    (function,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    return ast.get_source_segment((REPO / path).read_text(), function) or ""


def _function(nodeid: str) -> tuple[str, str]:
    path, _, rest = nodeid.partition("::")
    return path, rest.split("::")[-1].split("[")[0]


def test_the_figures_are_the_collected_tests(collected: dict[str, list[str]]) -> None:
    section = reliability_section()
    faults, bad, security = (len(collected[m]) for m in ("fault", "bad_input", "security"))
    assert faults and bad and security
    assert f"**{faults} faults injected**" in section
    assert f"**{bad} bad inputs refused**" in section
    assert f"**{security} security checks**" in section
    checking = [i for i in collected["fault"] if "data_intact" in function_source(*_function(i))]
    assert f"{len(checking)} of the fault tests check" in section


def test_every_fault_test_confirms_that_its_fault_struck(collected: dict[str, list[str]]) -> None:
    """(the ``injected`` fixture also fails such a test at run time; this says which.)"""
    silent = {
        i for i in collected["fault"] if "injected.struck" not in function_source(*_function(i))
    }
    assert silent == set()


def test_every_test_the_readme_names_exists_with_its_mark(
    collected: dict[str, list[str]],
) -> None:
    section = reliability_section()
    references = TEST_REFERENCE.findall(section)
    assert len(references) >= 10
    by_mark = {mark: {_function(i) for i in ids} for mark, ids in collected.items()}
    table_start = section.index("| fault injected |")
    fault_table = section[table_start : section.index("\n\n", table_start)]
    for path, name in references:
        source = (REPO / path).read_text()
        assert re.search(rf"^def {name}\b", source, re.MULTILINE), f"{path}::{name}"
        if f"{path}::{name}" in fault_table:
            assert (path, name) in by_mark["fault"], f"{path}::{name} is not marked fault"
