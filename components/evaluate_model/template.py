"""The evaluate step as an Argo Workflows container template (Hera)."""

from __future__ import annotations

from hera.workflows import Artifact, Container, NoneArchiveStrategy

from kubetrain.components._shared.argo_steps import (
    INPUTS_DIR,
    OUTPUTS_DIR,
    SHARED_VOLUME,
    SharedVolume,
    file_artifact,
    input_parameter,
    inputs,
    output_parameter,
    step_template,
)
from kubetrain.images import COMPONENT_IMAGE

MODEL_PATH = f"{INPUTS_DIR}/model"
METRICS_PATH = f"{OUTPUTS_DIR}/metrics.json"
REPORT_PATH = f"{OUTPUTS_DIR}/report"


def evaluate_model_template(
    name: str = "evaluate-model",
    volume: SharedVolume = SHARED_VOLUME,
    image: str = COMPONENT_IMAGE,
) -> Container:
    """`kubetrain evaluate` of the ``model`` artifact on the dataset's test split. It succeeds
    either way; ``passed`` (``true``/``false``) is the output a workflow's ``when`` branches on."""
    return step_template(
        name,
        ["evaluate"],
        [
            "--model",
            MODEL_PATH,
            "--data",
            inputs("data"),
            "--threshold",
            inputs("threshold"),
            "--model-factory",
            inputs("model_factory"),
            "--no-fail-below-threshold",
            "--metrics-output",
            METRICS_PATH,
            "--report",
            REPORT_PATH,
            "--metric",
            inputs("metric"),
            "--below",
            inputs("below"),
            "--command-json",
            inputs("command"),
        ],  # fmt: skip
        [
            input_parameter(
                "data",
                "dataset folder written by the prep step; empty: none, for your own program "
                "that brings its own data",
                "",
            ),
            input_parameter(
                "threshold",
                "pass when the metric is at least this; empty: 0.95 for accuracy, none for "
                "another metric (give threshold or below)",
                "",
            ),
            input_parameter(
                "model_factory",
                "package.module:callable building a model of custom code; empty: built-in",
                "",
            ),
            input_parameter(
                "metric", "the metric the gate reads (ours: accuracy, loss)", "accuracy"
            ),
            input_parameter(
                "below", "pass when the metric is below this instead; empty: at least threshold", ""
            ),
            input_parameter(
                "command",
                'your evaluation program, a JSON list, e.g. ["python", '
                '"eval.py"]: run with KUBETRAIN_MODEL_DIR/DATA_DIR/METRICS_FILE; [] = '
                "ours",
                "[]",
            ),
        ],
        [
            output_parameter("accuracy", "test accuracy"),
            output_parameter("loss", "mean cross-entropy on the test split"),
            output_parameter("passed", "true when the gate passes (accuracy >= threshold)"),
            file_artifact("metrics", METRICS_PATH),
            # a folder stored unarchived, so Argo's UI lists it and opens report.html
            Artifact(name="report", path=REPORT_PATH, archive=NoneArchiveStrategy()),
        ],
        input_artifacts=[Artifact(name="model", path=MODEL_PATH)],
        volume=volume,
        image=image,
    )
