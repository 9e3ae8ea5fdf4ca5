"""The README's Reliability section quotes the tests: every test it names exists, and the
counts it gives are the sizes of the catalogues the tests run."""

from __future__ import annotations

import re
from pathlib import Path

from test_bad_input import BAD_INPUTS

from kubetrain.testing.reliability_figures import GROUPS

REPO = Path(__file__).resolve().parents[2]
TEST_REFERENCE = re.compile(r"`((?:tests|components)/[\w/]+\.py)::(\w+)")


def reliability_section() -> str:
    readme = (REPO / "README.md").read_text()
    start = readme.index("\n## Reliability\n")
    end = readme.index("\n## ", start + 1)
    return readme[start:end]


def test_every_test_the_readme_names_exists() -> None:
    references = TEST_REFERENCE.findall(reliability_section())
    assert len(references) >= 10
    for path, name in references:
        source = (REPO / path).read_text()
        assert re.search(rf"^def {name}\b", source, re.MULTILINE), f"{path}::{name}"


def test_the_counts_are_the_catalogues() -> None:
    section = reliability_section()
    assert f"**{len(BAD_INPUTS)} bad inputs**" in section
    faults = [line for line in section.splitlines() if line.startswith("| ") and "`tests/" in line]
    named = {path for line in faults for path, _ in TEST_REFERENCE.findall(line)}
    counted = {prefix.split("::")[0] for prefix in GROUPS["faults injected"]}
    assert named <= counted | {"tests/reliability/test_faults.py"}, "README names an uncounted test"
