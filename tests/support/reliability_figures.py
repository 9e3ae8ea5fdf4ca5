"""A pytest plugin: the reliability figures the README quotes, as a test run produced them.

Tests are counted by their marks (``pyproject.toml``): ``fault`` (a fault injected into a real
run), ``bad_input`` (one bad input refused in one line, nothing created) and ``security`` (a
rule of the product, not a self-test of a test's own scanner). A ``fault`` test gets an
``injected`` record and must call ``injected.struck(...)`` once it has seen its fault take
effect (a process killed, a request failed): one that passes without it fails, as a fault that
never struck proves nothing. Where the fault could cost data, the test checks the newest
checkpoint or the published model with ``injected.data_intact(...)``; "data lost" is counted
from those checks, not asserted. Fault tests record what they measured through ``figures``.
At the end the figures are printed under "reliability figures" and written to
``runs/reliability.json``. Registered by the repository's root conftest.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kubetrain.storage import atomic

FIGURES_FILE = Path("runs") / "reliability.json"
#: The marks counted, and the name of each figure.
MARKS = {"fault": "faults injected", "bad_input": "bad inputs", "security": "security checks"}
#: Set to a path: `pytest --collect-only` writes there the node ids of the tests of each mark
#: (what the README test compares the README's figures with).
COLLECTED_MARKS_ENV = "KUBETRAIN_COLLECTED_MARKS"


@dataclass
class Injected:
    """What one fault test saw: whether its fault struck, and its data checks."""

    struck_by: str = ""
    data_checks: list[tuple[str, bool]] = field(default_factory=list)

    def struck(self, what: str) -> None:
        """The fault took effect (e.g. "rank 1's worker died of SIGKILL")."""
        self.struck_by = what

    def data_intact(self, what: str, check: Callable[[], Any]) -> Any:
        """Run ``check`` (verify and load the newest checkpoint or the published model); a
        failure is counted as data lost, then raised."""
        try:
            result = check()
        except BaseException:
            self.data_checks.append((what, False))
            raise
        self.data_checks.append((what, True))
        return result


class Figures:
    def __init__(self) -> None:
        self.measured: dict[str, Any] = {}
        self.outcomes: dict[str, Counter[str]] = {name: Counter() for name in MARKS.values()}
        self.injected: dict[str, Injected] = {}
        #: Measured by the running test, not yet carried by a report.
        self.unreported: dict[str, Any] = {}

    def record(self, name: str, value: Any) -> None:
        self.measured[name] = value
        self.unreported[name] = value

    def summary(self) -> dict[str, Any]:
        struck = [i for i in self.injected.values() if i.struck_by]
        checks = [ok for i in self.injected.values() for _, ok in i.data_checks]
        return {
            "outcomes": {name: dict(counts) for name, counts in self.outcomes.items() if counts},
            "faults struck": len(struck),
            "data checks": len(checks),
            "data lost": checks.count(False),
            "measured": self.measured,
        }


FIGURES = Figures()


@pytest.fixture(scope="session")
def figures() -> Figures:
    return FIGURES


@pytest.fixture
def injected(request: pytest.FixtureRequest) -> Iterator[Injected]:
    record = FIGURES.injected.setdefault(request.node.nodeid, Injected())
    yield record


@pytest.fixture(autouse=True)
def _fault_tests_must_strike(request: pytest.FixtureRequest) -> Iterator[None]:
    """A ``fault`` test has its ``injected`` record and, when it passed, must have struck."""
    if request.node.get_closest_marker("fault") is None:
        yield
        return
    record = request.getfixturevalue("injected")
    yield
    if not record.struck_by and _passed(request.node):
        pytest.fail("a fault test must confirm its fault struck: call injected.struck(...)")


def _passed(item: pytest.Item) -> bool:
    """Whether the test body ran to its end (not failed, not skipped where it stood)."""
    report = getattr(item, "call_report", None)
    return report is not None and report.passed


#: Keys of the teardown report's ``user_properties`` that carry a test's records: under
#: pytest-xdist (``make test``) tests run in workers and only reports reach the process that
#: prints the figures.
INJECTED_PROPERTY, MEASURED_PROPERTY = "kubetrain-injected", "kubetrain-measured"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if call.when == "call":
        item.call_report = report  # type: ignore[attr-defined]
    if call.when != "teardown":
        return
    if (record := FIGURES.injected.get(item.nodeid)) is not None:
        report.user_properties.append((INJECTED_PROPERTY, asdict(record)))
    if FIGURES.unreported:
        report.user_properties.append((MEASURED_PROPERTY, dict(FIGURES.unreported)))
        FIGURES.unreported.clear()


#: Each test's outcome so far (setup, call, teardown), counted once its teardown is reported.
_OUTCOMES: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Count each test once: failed if any phase failed, else skipped if a phase skipped."""
    outcome = _OUTCOMES.get(report.nodeid, "passed")
    if report.outcome == "failed" or (report.outcome == "skipped" and outcome == "passed"):
        outcome = report.outcome
    if report.when != "teardown":
        _OUTCOMES[report.nodeid] = outcome
        return
    _OUTCOMES.pop(report.nodeid, None)
    for key, value in report.user_properties:
        if key == INJECTED_PROPERTY:
            checks = [(what, ok) for what, ok in value["data_checks"]]
            FIGURES.injected[report.nodeid] = Injected(value["struck_by"], checks)
        elif key == MEASURED_PROPERTY:
            FIGURES.measured.update(value)
    for mark, name in MARKS.items():
        if mark in report.keywords:
            FIGURES.outcomes[name][outcome] += 1


#: Whether this session dropped collected tests (``-k``, ``-m``, ``--deselect``).
_deselected = False
#: The node ids of each mark's tests, where this session collected the whole suite.
_whole_suite_marks: dict[str, list[str]] | None = None


def pytest_deselected(items: list[pytest.Item]) -> None:
    global _deselected
    _deselected = True


def pytest_collection_finish(session: pytest.Session) -> None:
    global _whole_suite_marks
    collected = {
        mark: [item.nodeid for item in session.items if item.get_closest_marker(mark)]
        for mark in MARKS
    }
    config = session.config
    whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS and not (
        _deselected or config.getoption("ignore") or config.getoption("ignore_glob")
    )
    _whole_suite_marks = collected if whole else None
    if target := os.environ.get(COLLECTED_MARKS_ENV):
        atomic.write_text(Path(target), json.dumps(collected, indent=2) + "\n")


def whole_suite_marks() -> dict[str, list[str]] | None:
    """The node ids of the tests of each mark, where this session collected the whole suite
    as `make test` does (no paths given, nothing deselected or ignored: under pytest-xdist
    every worker collects it all); else None. The README test takes them from here rather
    than collecting the suite a second time (~12 s)."""
    return _whole_suite_marks


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if not any(FIGURES.outcomes.values()):
        return
    summary = FIGURES.summary()
    terminalreporter.section("reliability figures")
    for name, counts in summary["outcomes"].items():
        terminalreporter.line(f"{name}: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    terminalreporter.line(
        f"faults seen to strike: {summary['faults struck']}; data checked after faults: "
        f"{summary['data checks']} time(s), data lost: {summary['data lost'] or 'none'}"
    )
    for name, value in sorted(summary["measured"].items()):
        terminalreporter.line(f"{name}: {value}")
    target = Path(config.rootpath) / FIGURES_FILE
    atomic.write_text(target, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    terminalreporter.line(f"written to {target}")
