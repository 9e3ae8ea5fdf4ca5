"""Your own evaluation program: `kubetrain evaluate … -- CMD` (and the KFP component's
``command``) runs it with the model, the dataset and a metrics file in its environment, publishes
what it writes and gates on any metric. The program here scores the model itself with torch,
so its accuracy must equal ours on the same model: a real program, not a canned number."""

from __future__ import annotations

import json
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from kubetrain.cli import main as kubetrain_main
from kubetrain.components.collect_checkpoint.collect import collect_checkpoint
from kubetrain.components.evaluate_model.evaluate import evaluate_model

NETDEF = """
from torch import nn


def build(sample_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, num_classes))
"""
#: Scores the model as a team's own evaluation code would, and writes its metrics.
EVAL = """
import json, os, sys

import torch
from safetensors.torch import load_file

from netdef import build

model = build([1, 8, 8], 10)
weights = os.path.join(os.environ["KUBETRAIN_MODEL_DIR"], "model.safetensors")
model.load_state_dict(load_file(weights))
test = load_file(os.path.join(os.environ["KUBETRAIN_DATA_DIR"], "test.safetensors"))
with torch.no_grad():
    logits = model(test["x"])
metrics = {
    "accuracy": (logits.argmax(1) == test["y"]).float().mean().item(),
    "loss": torch.nn.functional.cross_entropy(logits, test["y"]).item(),
}
print("my evaluation:", metrics, flush=True)
with open(os.environ["KUBETRAIN_METRICS_FILE"], "w") as out:
    json.dump(metrics, out)
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("project")
    (folder / "netdef.py").write_text(textwrap.dedent(NETDEF))
    (folder / "eval.py").write_text(textwrap.dedent(EVAL))
    return folder


@pytest.fixture(scope="module")
def model_dir(project, tmp_path_factory) -> Path:
    """A user's model, saved as a plain state dict and collected."""
    sys.path.insert(0, str(project))
    try:
        from netdef import build
    finally:
        sys.path.remove(str(project))
    torch.manual_seed(0)
    checkpoints = tmp_path_factory.mktemp("checkpoints")
    torch.save(build([1, 8, 8], 10).state_dict(), checkpoints / "model.pt")
    output = tmp_path_factory.mktemp("collected") / "model"
    collect_checkpoint(str(checkpoints), str(output))
    return output


def evaluate_cli(capfd, project, monkeypatch, *options: str) -> tuple[int, str, str]:
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    capfd.readouterr()
    try:
        code = kubetrain_main(["evaluate", *options])
    except SystemExit as exited:
        code = exited.code
    out, err = capfd.readouterr()
    return code, out, err


def test_your_program_scores_the_model_as_ours_does(
    model_dir, digits_dir, project, tmp_path, capfd, monkeypatch
):
    metrics_file = tmp_path / "metrics.json"
    code, out, _ = evaluate_cli(
        capfd, project, monkeypatch,
        "--model", str(model_dir), "--data", str(digits_dir), "--threshold", "0.0",
        "--metrics-output", str(metrics_file), "--report", str(tmp_path / "report"),
        "--", sys.executable, "eval.py",
    )  # fmt: skip
    assert code == 0, out
    written = json.loads(metrics_file.read_text())
    monkeypatch.syspath_prepend(str(project))
    ours = evaluate_model(str(model_dir), str(digits_dir), 0.0, model_factory="netdef:build")
    assert written["accuracy"] == pytest.approx(ours.accuracy, abs=1e-6)
    assert written["loss"] == pytest.approx(ours.loss, rel=1e-5)
    assert written["passed"] is True
    assert "my evaluation:" in out  # its output is the step's log
    report = (tmp_path / "report" / "report.html").read_text()
    assert "your evaluation program" in report and "accuracy" in report


@pytest.mark.parametrize(
    ("gate", "passed"),
    [
        (["--metric", "loss", "--below", "100"], True),
        (["--metric", "loss", "--below", "0.01"], False),  # an untrained model's loss is ~2.3
        (["--metric", "accuracy", "--threshold", "0.99"], False),
    ],
)
def test_the_gate_reads_any_metric(
    gate, passed, model_dir, digits_dir, project, capfd, monkeypatch
):
    base = ["--model", str(model_dir), "--data", str(digits_dir), *gate]
    code, out, _ = evaluate_cli(capfd, project, monkeypatch, *base, "--", sys.executable, "eval.py")
    assert code == (0 if passed else 3), out
    code, _, _ = evaluate_cli(
        capfd, project, monkeypatch, *base, "--no-fail-below-threshold",
        "--command-json", json.dumps([sys.executable, "eval.py"]),
    )  # fmt: skip
    assert code == 0


def write_program(project: Path, name: str, body: str) -> str:
    (project / name).write_text(textwrap.dedent(body))
    return name


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("program", "options", "field"),
    [
        ("import sys", [], "metrics"),  # writes no metrics file
        ("import os; open(os.environ['KUBETRAIN_METRICS_FILE'], 'w').write('[1]')", [], "metrics"),
        (
            "import os; open(os.environ['KUBETRAIN_METRICS_FILE'], 'w').write("
            '\'{"accuracy": "high"}\')',
            [],
            "metrics",
        ),
        (
            "import os; open(os.environ['KUBETRAIN_METRICS_FILE'], 'w').write("
            "'{\"accuracy\": NaN}')",
            [],
            "metrics",
        ),
        *(  # past the bounded reader's bounds: 1e400 and 5000 digits were tracebacks
            (
                "import os; open(os.environ['KUBETRAIN_METRICS_FILE'], 'w').write("
                f"'{{\"accuracy\": {number}}}')",
                [],
                "metrics",
            )
            for number in ("1e400", "9" * 5000)
        ),
        (None, ["--metric", "f1"], "metric"),  # eval.py writes accuracy and loss only
        (None, ["--command-json", '["python3", "eval.py"]'], "--command-json"),  # and after --
    ],
)
def test_a_bad_program_or_gate_is_one_line_and_publishes_nothing(
    program, options, field, model_dir, digits_dir, project, tmp_path, capfd, monkeypatch
):
    from tests.reliability.test_bad_input import assert_one_line_error

    name = write_program(project, "bad_eval.py", program) if program else "eval.py"
    metrics_file = tmp_path / "metrics.json"
    code, _, err = evaluate_cli(
        capfd, project, monkeypatch, "--model", str(model_dir), "--data", str(digits_dir),
        "--metrics-output", str(metrics_file), *options, "--", sys.executable, name,
    )  # fmt: skip
    assert code == 2
    assert_one_line_error(err, "kubetrain evaluate", field)
    assert not metrics_file.exists()


def test_a_program_that_fails_fails_the_step_in_one_line(
    model_dir, digits_dir, project, capfd, monkeypatch
):
    name = write_program(project, "crash.py", "raise SystemExit(7)")
    code, _, err = evaluate_cli(
        capfd, project, monkeypatch, "--model", str(model_dir), "--data", str(digits_dir),
        "--", sys.executable, name,
    )  # fmt: skip
    assert code == 1
    assert (
        err.strip()
        .splitlines()[-1]
        .endswith(
            "exited with code 7; its output is above: fix what it names in your program, then run "
            "the step again"
        )
    )


@pytest.mark.bad_input
def test_our_evaluation_gates_only_on_its_own_metrics(
    model_dir, digits_dir, project, capfd, monkeypatch
):
    from tests.reliability.test_bad_input import assert_one_line_error

    code, _, err = evaluate_cli(
        capfd, project, monkeypatch, "--model", str(model_dir), "--data", str(digits_dir),
        "--model-factory", "netdef:build", "--metric", "f1",
    )  # fmt: skip
    assert code == 2
    assert_one_line_error(err, "kubetrain evaluate", "metric")


def test_the_kfp_component_logs_every_metric_your_program_writes(
    model_dir, digits_dir, project, tmp_path, monkeypatch
):
    from kfp import dsl

    from kubetrain.components.evaluate_model.component import evaluate_model as component

    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    metrics = dsl.Metrics(name="metrics", uri=str(tmp_path / "metrics"))
    report = dsl.HTML(name="report", uri=str(tmp_path / "report.html"))
    outputs = component.python_func(
        model=types.SimpleNamespace(path=str(model_dir)),
        dataset=types.SimpleNamespace(path=str(digits_dir)),
        metrics=metrics,
        classification_metrics=dsl.ClassificationMetrics(name="cm", uri=str(tmp_path / "cm")),
        report=report,
        command=[sys.executable, "eval.py"],
        metric="loss",
        below=100.0,
    )
    assert outputs.passed is True
    assert set(metrics.metadata) == {"accuracy", "loss"}
    assert outputs.metric_value == metrics.metadata["loss"]
    assert outputs.accuracy == metrics.metadata["accuracy"]
    assert "your evaluation program" in Path(report.path).read_text()
