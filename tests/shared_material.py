"""The upstream material vendored in ../shared (Kubeflow Trainer CRDs, the Argo schema) that
conformance tests check our documents against.

A checkout without ../shared skips those tests; under ``CI=true`` it fails them instead, so a CI
run never reports as passed a conformance it did not check.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"


def shared_file(path: Path, checks: str) -> Path:
    """``path`` (under ../shared) if it is there; else skip the test, or fail it under CI=true.
    ``checks`` says what goes unchecked without it."""
    if path.is_file():
        return path
    problem = f"{path} is not present: {checks} not checked"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{problem}; CI=true needs ../shared checked out beside the repo")
    pytest.skip(problem)
