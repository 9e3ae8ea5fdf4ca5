"""Evaluate scores a collected model on the held-out split and gates on a threshold."""

from __future__ import annotations

import base64
import json
import re

import pytest

from kubetrain.components.collect_checkpoint.collect import collect_checkpoint
from kubetrain.components.evaluate_model.evaluate import evaluate_model, per_class_counts
from kubetrain.errors import IntegrityError, InvalidInput


@pytest.fixture(scope="module")
def model_dir(trained_checkpoints, tmp_path_factory):
    out = tmp_path_factory.mktemp("model") / "model"
    collect_checkpoint(str(trained_checkpoints["ddp"]), str(out))
    return out


def test_scores_the_test_split(model_dir, digits_dir):
    result = evaluate_model(str(model_dir), str(digits_dir), threshold=0.5)
    assert result.samples == 360
    assert 0.5 < result.accuracy <= 1.0 and result.passed
    matrix = result.confusion_matrix
    assert len(matrix) == 10 and sum(map(sum, matrix)) == 360
    assert sum(matrix[i][i] for i in range(10)) / 360 == pytest.approx(result.accuracy)
    assert len(result.precision) == len(result.recall) == 10
    assert result.loss > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_per_class_counts_agree_with_sklearn(seed):
    """Including classes never predicted and never present (precision/recall 0, not NaN)."""
    import numpy as np
    from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 5, size=200)  # classes 5 and 6: never present, never predicted
    predicted = np.where(rng.random(200) < 0.7, truth, rng.integers(0, 4, size=200))
    labels = list(range(7))
    matrix, precision, recall = per_class_counts(truth, predicted, 7)
    assert matrix == confusion_matrix(truth, predicted, labels=labels).tolist()
    want_p, want_r, _, _ = precision_recall_fscore_support(
        truth, predicted, labels=labels, zero_division=0
    )
    assert precision == pytest.approx(want_p.tolist()) and recall == pytest.approx(want_r.tolist())
    assert precision[5:] == recall[5:] == [0.0, 0.0]


def test_threshold_above_accuracy_does_not_pass(model_dir, digits_dir):
    reached = evaluate_model(str(model_dir), str(digits_dir), threshold=0.0).accuracy
    assert reached < 1.0, "two epochs do not fit the test split perfectly"
    assert evaluate_model(str(model_dir), str(digits_dir), threshold=reached).passed
    assert not evaluate_model(str(model_dir), str(digits_dir), threshold=reached + 0.001).passed


@pytest.mark.parametrize("threshold", [-0.1, 1.5, 95])
def test_threshold_outside_zero_one_is_refused(model_dir, digits_dir, threshold):
    with pytest.raises(InvalidInput, match="threshold"):
        evaluate_model(str(model_dir), str(digits_dir), threshold=threshold)


def test_a_tampered_model_is_refused(model_dir, digits_dir, tmp_path):
    import shutil

    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (copy / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="sha256"):
        evaluate_model(str(copy), str(digits_dir))


def evaluate_cli(run_python, model_dir, digits_dir, *extra: str):
    command = ["-m", "kubetrain", "evaluate", "--model", str(model_dir), "--data", str(digits_dir)]
    return run_python([*command, *extra])


def test_evaluate_cli_exit_codes(model_dir, digits_dir, run_python):
    ok = evaluate_cli(run_python, model_dir, digits_dir, "--threshold", "0.5", "--json")
    assert ok.returncode == 0, ok.stderr
    payload = json.loads(ok.stdout[: ok.stdout.rindex("}") + 1])
    assert payload["passed"] is True
    gate = evaluate_cli(run_python, model_dir, digits_dir, "--threshold", "1.0")
    assert gate.returncode == 3, gate.stderr
    assert "below threshold" in gate.stdout


def embedded_png_count(page: str) -> int:
    """How many embedded images decode to a PNG."""
    payloads = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    return sum(base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n") for data in payloads)


def test_evaluate_cli_publishes_the_report(model_dir, digits_dir, run_python, tmp_path):
    out = tmp_path / "report"
    result = evaluate_cli(run_python, model_dir, digits_dir, "--threshold", "0.5", "--report", out)
    assert result.returncode == 0, result.stderr
    assert f"report {out / 'report.html'}" in result.stdout
    card = json.loads((model_dir / "model.json").read_text())
    charts = ["confusion_matrix.png", "training_curves.png"]
    if "history" in card:  # recorded by the trainer since issue 18
        charts.append("training_steps.png")
    assert sorted(p.name for p in out.iterdir()) == sorted([*charts, "report.html", "report.json"])
    page = (out / "report.html").read_text()
    assert embedded_png_count(page) == len(charts)
    assert card["sha256"] in page and "sklearn:digits" in page
    assert f"<td>{card.get('run', {}).get('job', 'model')}</td>" in page, "the run's name"


def test_kfp_component_writes_the_html_artifact(model_dir, digits_dir, tmp_path):
    from kfp import dsl

    from kubetrain.components.evaluate_model.component import evaluate_model as component

    report = dsl.HTML(uri=str(tmp_path / "report"))
    outputs = component.python_func(
        model=dsl.Model(uri=str(model_dir)),
        dataset=dsl.Dataset(uri=str(digits_dir)),
        metrics=dsl.Metrics(uri=str(tmp_path / "metrics")),
        classification_metrics=dsl.ClassificationMetrics(uri=str(tmp_path / "classification")),
        report=report,
        threshold=0.5,
    )
    assert outputs.passed
    page = (tmp_path / "report").read_text()
    charts = 3 if "history" in json.loads((model_dir / "model.json").read_text()) else 2
    assert page.startswith("<!DOCTYPE html>") and embedded_png_count(page) == charts
    assert '<p class="verdict passed">passed: accuracy' in page


def test_kfp_metrics_lead_with_accuracy_and_loss(model_dir, digits_dir, tmp_path):
    """Scalars: accuracy, loss, test_samples, in that order (kfp keeps the logging order, the
    KFP UI sorts by name: the same); the per-class figures are the confusion matrix and the
    report's, not dozens of precision_<class> scalars."""
    from kfp import dsl

    from kubetrain.components.evaluate_model.component import evaluate_model as component

    metrics = dsl.Metrics(uri=str(tmp_path / "metrics"))
    classification = dsl.ClassificationMetrics(uri=str(tmp_path / "classification"))
    component.python_func(
        model=dsl.Model(uri=str(model_dir)),
        dataset=dsl.Dataset(uri=str(digits_dir)),
        metrics=metrics,
        classification_metrics=classification,
        report=dsl.HTML(uri=str(tmp_path / "report")),
        threshold=0.5,
    )
    assert list(metrics.metadata) == ["accuracy", "loss", "test_samples"]
    assert sorted(metrics.metadata) == list(metrics.metadata)
    matrix = classification.metadata["confusionMatrix"]
    assert [c["displayName"] for c in matrix["annotationSpecs"]] == [str(i) for i in range(10)]
    assert sum(map(sum, (row["row"] for row in matrix["rows"]))) == metrics.metadata["test_samples"]
