"""A missing ../shared skips the schema-conformance tests on a laptop but fails them in CI, so
CI never counts an unchecked conformance as passed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import argo_schema
import k8s_schemas
import pytest
from shared_material import shared_file


def outcome(check: Callable[[], object]) -> tuple[type[BaseException], str]:
    """What ``check`` made of the test, Failed or Skipped, and its message: caught here, so a
    skip where a failure is due shows as this test failing, not as one more skip."""
    with pytest.raises((pytest.fail.Exception, pytest.skip.Exception)) as raised:
        check()
    return raised.type, str(raised.value)


def test_a_missing_file_fails_the_test_under_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    kind, message = outcome(lambda: shared_file(tmp_path / "schema.json", "conformance"))
    assert kind is pytest.fail.Exception, message
    assert "schema.json is not present: conformance not checked" in message


@pytest.mark.parametrize("ci", [None, "false", ""])
def test_a_missing_file_skips_the_test_outside_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    kind, message = outcome(lambda: shared_file(tmp_path / "schema.json", "conformance"))
    assert kind is pytest.skip.Exception, message


def test_a_present_file_is_returned_under_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    (tmp_path / "schema.json").write_text("{}")
    assert shared_file(tmp_path / "schema.json", "conformance") == tmp_path / "schema.json"


def test_both_schema_checks_fail_under_ci_without_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CRD and the Argo schema checks go through the helper."""
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(k8s_schemas, "TRAINER_SCHEMAS", tmp_path / "kubeflow-trainer")
    monkeypatch.setattr(argo_schema, "ARGO_SCHEMA", tmp_path / "argo" / "schema.json")
    for check, what in [
        (lambda: k8s_schemas.crd_schema(k8s_schemas.TRAINJOB_CRD), "Kubeflow Trainer CRD"),
        (lambda: argo_schema.argo_schema_errors({"kind": "Workflow"}), "Argo Workflows schema"),
    ]:
        kind, message = outcome(check)
        assert kind is pytest.fail.Exception, message
        assert f"{what} not checked" in message
