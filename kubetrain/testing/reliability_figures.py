"""A pytest plugin: the reliability figures the README quotes, as a test run produced them.

Tests are counted by group (faults injected, bad inputs, security checks) from their node ids;
fault tests record what they measured through the ``figures`` fixture. At the end of the run
the figures are printed under "reliability figures" and written to ``runs/reliability.json``.
Registered by the repository's root conftest.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kubetrain import atomic

FIGURES_FILE = Path("runs") / "reliability.json"
#: Node-id prefixes of each group; faults also counts the fault tests that live beside the
#: code they exercise (checkpoint writes, collect, the cluster wait).
GROUPS = {
    "faults injected": (
        "tests/reliability/test_faults.py::",
        "tests/reliability/test_api_faults.py::",
        "tests/test_checkpoint.py::test_killed_save_is_never_returned_as_latest",
        "tests/test_checkpoint.py::test_flipped_byte_in_model_file_is_caught_and_named",
        "components/collect_checkpoint/tests/test_collect_checkpoint.py::test_a_flipped_byte",
        "tests/test_streaming_copy.py::test_copy_killed_midway_resumes",
        "tests/test_streaming_copy.py::test_disk_full_is_a_clear_error_and_leaves_nothing",
        "tests/test_kubernetes_backend.py::test_sigterm_to_wait_deletes_the_trainjob",
        "tests/test_kubernetes_backend.py::test_a_410_mid_wait_does_not_lose_the_completion",
        "tests/test_kubernetes_backend.py::test_transient_failures_are_retried",
        "tests/test_kubernetes_backend.py::test_concurrent_waits_all_end_right",
        "tests/test_local_backend.py::test_a_dead_supervisor_is_reported_not_waited_on_forever",
    ),
    "bad inputs": ("tests/reliability/test_bad_input.py::test_bad_input_is_one_line",),
    "security checks": ("tests/reliability/test_security.py::",),
}


class Figures:
    def __init__(self) -> None:
        self.measured: dict[str, Any] = {}
        self.outcomes: dict[str, Counter[str]] = {group: Counter() for group in GROUPS}

    def record(self, name: str, value: Any) -> None:
        self.measured[name] = value

    def count(self, nodeid: str, outcome: str) -> None:
        for group, prefixes in GROUPS.items():
            if nodeid.startswith(prefixes):
                self.outcomes[group][outcome] += 1


FIGURES = Figures()


@pytest.fixture(scope="session")
def figures() -> Figures:
    return FIGURES


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        FIGURES.count(report.nodeid, report.outcome)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if not any(FIGURES.outcomes.values()):
        return
    summary = {
        "outcomes": {group: dict(counts) for group, counts in FIGURES.outcomes.items() if counts},
        "measured": FIGURES.measured,
    }
    terminalreporter.section("reliability figures")
    for group, counts in summary["outcomes"].items():
        terminalreporter.line(f"{group}: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    for name, value in sorted(FIGURES.measured.items()):
        terminalreporter.line(f"{name}: {value}")
    target = Path(config.rootpath) / FIGURES_FILE
    atomic.write_text(target, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    terminalreporter.line(f"written to {target}")
