"""What the faces tests (one option on every face: CLI, KFP, Argo, `run`, `submit`) share: the
one line a command is refused with, whether a check accepts, and the parameters `kubetrain
run` hands its pipeline."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
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


def refused_run(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    options: list[str],
) -> str:
    """The one line `kubetrain run OPTIONS` is refused with, run in ``tmp_path``: before any
    step, so neither its output folder nor a local job was made."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(tmp_path / "jobs"))
    line = refused(capsys, ["run", "--output", "runs", *options])
    assert line.startswith("kubetrain run"), line
    assert not (tmp_path / "runs").exists() and not (tmp_path / "jobs").exists()
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


def component_requests(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *inputs: dict[str, Any]
) -> list[Any]:
    """The ``LaunchRequest`` the launch step's KFP component builds from each of ``inputs``
    (its launch stubbed: nothing is created)."""
    from kfp import dsl

    from kubetrain.components.launch_trainjob import launch as launch_module
    from kubetrain.components.launch_trainjob.component import launch_trainjob
    from kubetrain.components.launch_trainjob.launch import LaunchResult

    requests: list[Any] = []

    def recorded(request: Any, backend: str, options: object) -> LaunchResult:
        requests.append(request)
        return LaunchResult("demo", "/checkpoints")

    monkeypatch.setattr(launch_module, "launch", recorded)
    dataset = dsl.Dataset(name="dataset", uri=str(tmp_path), metadata={})
    for given in inputs:
        launch_trainjob.python_func(dataset=dataset, **given)
    return requests
