"""What the faces tests (one option on every face: CLI, KFP, Argo, `run`, `submit`) share: the
one line a command is refused with, whether a check accepts, and the parameters `kubetrain
run` hands its pipeline."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kubetrain.cli import build_parser
from kubetrain.cli import main as kubetrain_main
from kubetrain.errors import InvalidInput


def refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one line `kubetrain ARGV` is refused with (exit 2)."""
    capsys.readouterr()
    try:
        code = kubetrain_main(argv)
    except SystemExit as exc:  # argparse's refusal
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    (line,) = err.strip().splitlines()
    return line


def accepted(check: Callable[[], object]) -> bool:
    try:
        check()
    except InvalidInput:
        return False
    return True


class _Started(Exception):
    """The pipeline was called: the run stops here."""


def pipeline_parameters_of_run(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> dict[str, Any]:
    """The parameters `kubetrain ARGV` (a `run`) calls the pipeline with; it stops there.
    Run in a folder of the test's (``monkeypatch.chdir``) with KUBETRAIN_LOCAL_ROOT set."""
    import kubetrain.pipelines.training_pipeline as pipeline_module
    from kubetrain.cli import run as run_cli

    given: dict[str, Any] = {}

    def pipeline(**parameters: Any) -> None:
        given.update(parameters)
        raise _Started

    monkeypatch.setattr(pipeline_module, "build_training_pipeline", lambda secret: pipeline)
    with pytest.raises(_Started):
        run_cli.run(build_parser().parse_args(argv))
    return given
