"""The reliability-figures plugin counts what the tests really did: a fault test that passes
without seeing its fault strike fails, one that skips where it stands is a skip (a host
without user namespaces), and every test is counted once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.reliability_figures import FIGURES_FILE

FAULT_TESTS = """
    import pytest

    @pytest.mark.fault
    def test_struck(injected):
        injected.struck("it struck")
        injected.data_intact("data", lambda: None)

    @pytest.mark.fault
    def test_never_struck(injected):
        pass

    @pytest.mark.fault
    def test_skips_where_it_stands(injected):
        pytest.skip("no unprivileged mount namespace here")

    @pytest.fixture
    def unavailable():
        pytest.skip("not on this host")

    @pytest.mark.fault
    def test_skips_in_a_fixture(unavailable, injected):
        injected.struck("never reached")

    @pytest.mark.fault
    def test_fails_after_striking(injected):
        injected.struck("it struck")
        injected.data_intact("data", lambda: 1 / 0)
"""


def test_fault_tests_are_counted_once_and_must_strike(tmp_path: Path) -> None:
    (tmp_path / "test_faults_here.py").write_text(textwrap.dedent(FAULT_TESTS))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.support.reliability_figures",
         "-p", "no:cacheprovider", "-o", "markers=fault", "-rE", "test_faults_here.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    figures = json.loads((tmp_path / FIGURES_FILE).read_text())

    assert "ERROR test_faults_here.py::test_never_struck - Failed: a fault test must" in run.stdout
    assert figures["outcomes"]["faults injected"] == {"passed": 1, "failed": 2, "skipped": 2}
    assert (figures["faults struck"], figures["data checks"], figures["data lost"]) == (2, 2, 1)
