"""Evaluate step: score a collected model on the held-out split and decide whether it passes."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from kubetrain.errors import InvalidInput

if TYPE_CHECKING:
    import numpy as np

    from kubetrain.components.evaluate_model.report import Report

EVAL_BATCH_SIZE = 1024
#: The bar accuracy must reach when none is given. No other metric has one: whether it passes
#: above a bound (an F1) or below one (a loss) is for the user to say.
DEFAULT_ACCURACY_THRESHOLD = 0.95


@dataclass(frozen=True)
class Evaluation:
    accuracy: float
    loss: float
    classes: list[str]
    precision: list[float]
    recall: list[float]
    confusion_matrix: list[list[int]]
    samples: int
    threshold: float

    @property
    def passed(self) -> bool:
        return self.accuracy >= self.threshold

    def as_dict(self) -> dict[str, Any]:
        """Every field plus ``passed``: the metrics JSON the CLI writes and the report shows."""
        return {**asdict(self), "passed": self.passed}


def validate_threshold(threshold: float) -> float:
    if not 0.0 <= threshold <= 1.0:
        raise InvalidInput(
            "threshold", f"{threshold} is outside [0, 1]", "give accuracy as a fraction, e.g. 0.95"
        )
    return threshold


def per_class_counts(
    truth: np.ndarray, predicted: np.ndarray, num_classes: int
) -> tuple[list[list[int]], list[float], list[float]]:
    """Confusion matrix (row: true class, column: predicted, as sklearn lays it out), then
    per-class precision and recall (0 where a class is never predicted or never present).

    One bincount: importing sklearn.metrics (scipy.stats with it) took 0.9 s of a step
    that needs nothing else from it.
    """
    import numpy as np

    pairs = truth.astype(np.int64) * num_classes + predicted.astype(np.int64)
    matrix = np.bincount(pairs, minlength=num_classes**2).reshape(num_classes, num_classes)
    hits = np.diag(matrix).astype(np.float64)
    predicted_as, present = matrix.sum(axis=0), matrix.sum(axis=1)
    precision = np.divide(hits, predicted_as, out=np.zeros_like(hits), where=predicted_as > 0)
    recall = np.divide(hits, present, out=np.zeros_like(hits), where=present > 0)
    return matrix.tolist(), precision.tolist(), recall.tolist()


def evaluate_model(
    model_dir: str,
    data_dir: str,
    threshold: float = DEFAULT_ACCURACY_THRESHOLD,
    model_factory: str = "",
) -> Evaluation:
    """Score the model in ``model_dir`` on the test split of ``data_dir``.

    ``model_factory`` (``package.module:callable``) builds the model when its card records
    custom code: the card is covered by no digest, so the code it names is never imported on
    its word alone (built-in models need nothing).
    """
    import torch

    from kubetrain.artifacts.datasets import load_split, read_manifest
    from kubetrain.artifacts.model_card import load_model, read_model_card

    validate_threshold(threshold)
    card = read_model_card(model_dir)
    dataset = read_manifest(data_dir)
    spec = card["model"]
    if "sample_shape" not in spec or "num_classes" not in spec:
        # a script's checkpoint records neither: the model is built for the dataset it is
        # scored on (by --model-factory, which load_model requires)
        shape = {"sample_shape": dataset["sample_shape"], "num_classes": dataset["num_classes"]}
        spec = {**shape, **spec}
        card = {**card, "model": spec}
    if list(spec["sample_shape"]) != list(dataset["sample_shape"]):
        raise InvalidInput(
            "dataset",
            f"samples are shaped {dataset['sample_shape']}, the model was trained on "
            f"{spec['sample_shape']}",
            "evaluate on the dataset the model was trained with",
        )
    if spec["num_classes"] != dataset["num_classes"]:
        raise InvalidInput(
            "dataset",
            f"has {dataset['num_classes']} classes, the model predicts {spec['num_classes']}",
            "evaluate on the dataset the model was trained with",
        )
    model, _ = load_model(model_dir, card, model_factory=model_factory or None)

    x, y = load_split(data_dir, "test")
    total_loss, predictions = 0.0, []
    with torch.inference_mode():
        for start in range(0, len(x), EVAL_BATCH_SIZE):
            logits = model(x[start : start + EVAL_BATCH_SIZE])
            target = y[start : start + EVAL_BATCH_SIZE]
            total_loss += torch.nn.functional.cross_entropy(logits, target, reduction="sum").item()
            predictions.append(logits.argmax(dim=1))
    predicted = torch.cat(predictions).numpy()
    truth = y.numpy()
    matrix, precision, recall = per_class_counts(truth, predicted, spec["num_classes"])
    return Evaluation(
        accuracy=float((predicted == truth).mean()),
        loss=total_loss / len(truth),
        classes=list(dataset["classes"]),
        precision=precision,
        recall=recall,
        confusion_matrix=matrix,
        samples=len(truth),
        threshold=threshold,
    )


def evaluation_report(
    model_dir: str, data_dir: str, result: Evaluation, gate: Gate | None = None
) -> Report:
    """The HTML report of ``result`` and the verdict of ``gate`` (default: accuracy against the
    result's threshold), with the run and its training history from the model's card."""
    from kubetrain.artifacts.datasets import read_manifest
    from kubetrain.artifacts.model_card import read_model_card
    from kubetrain.components.evaluate_model.report import Verdict, build_report

    gate = gate or Gate("accuracy", result.threshold)
    verdict = Verdict.of(gate, {"accuracy": result.accuracy, "loss": result.loss})
    return build_report(
        read_model_card(model_dir),
        result.as_dict(),
        read_manifest(data_dir),
        verdict,
        name=folder_name(model_dir),
    )


def folder_name(location: str) -> str:
    """The last part of a model folder's path or URL: the report's run name when its card
    records none."""
    return str(location).rstrip("/").rsplit("/", 1)[-1]


# ------------------------------------------------------------------ your own evaluation
#: What your evaluation program is told: the collected model, the dataset, where to write
#: its metrics (a JSON object of name -> number).
MODEL_DIR_ENV = "KUBETRAIN_MODEL_DIR"
DATA_DIR_ENV = "KUBETRAIN_DATA_DIR"
METRICS_FILE_ENV = "KUBETRAIN_METRICS_FILE"
#: A metrics file larger than this is no metrics file.
MAX_METRICS_BYTES = 1024 * 1024
OUR_METRICS = ("accuracy", "loss")


@dataclass(frozen=True)
class Gate:
    """When a model passes: ``metric`` at least ``threshold``, or (with ``below``) under it."""

    metric: str = "accuracy"
    threshold: float = DEFAULT_ACCURACY_THRESHOLD
    below: float | None = None

    @classmethod
    def of(
        cls, metric: str, threshold: float | None, below: float | None, ours: bool = False
    ) -> Gate:
        """The gate a step's options ask for, validated (every face builds it here):
        ``threshold`` none is the default for accuracy, and refused for any other metric
        without ``below``, which would pass at ``>= 0.95`` whatever it measures. ``ours``:
        our evaluation scores, which measures accuracy and loss only."""
        if ours and metric not in OUR_METRICS:
            raise InvalidInput(
                "metric",
                f"{metric!r} is not one of ours",
                "use accuracy or loss, or give your evaluation program",
            )
        if threshold is not None and below is not None:
            raise InvalidInput(
                "below",
                f"is given with threshold ({below:g} and {threshold:g}): a gate has one bound",
                f"give --threshold X (pass when {metric} >= X) or --below X (pass when "
                f"{metric} < X), not both",
            )
        gate = cls(metric, DEFAULT_ACCURACY_THRESHOLD if threshold is None else threshold, below)
        gate.validate()
        if threshold is None and below is None and metric != "accuracy":
            raise InvalidInput(
                "metric",
                f"{metric!r} is gated on no bound, so passing is ambiguous",
                f"give --threshold X (pass when {metric} >= X) or --below X (pass when "
                f"{metric} < X) with --metric {metric}",
            )
        return gate

    def validate(self) -> Gate:
        if not isinstance(self.metric, str) or not self.metric:
            raise InvalidInput("metric", "is empty", "give the metric to gate on, e.g. accuracy")
        for field_name, value in (("threshold", self.threshold), ("below", self.below)):
            if value is not None and not math.isfinite(value):
                raise InvalidInput(field_name, f"{value} is not a finite number", "give a number")
        if self.metric == "accuracy" and self.below is None:
            validate_threshold(self.threshold)
        return self

    def passes(self, metrics: dict[str, float]) -> bool:
        if self.metric not in metrics:
            names = ", ".join(sorted(metrics)) or "none"
            raise InvalidInput(
                "metric",
                f"{self.metric!r} is not among the metrics written ({names})",
                "give --metric one of them, or write it from your program",
            )
        value = metrics[self.metric]
        return value < self.below if self.below is not None else value >= self.threshold

    def describe(self) -> str:
        if self.below is not None:
            return f"{self.metric} < {self.below:g}"
        return f"{self.metric} >= {self.threshold:g}"


@dataclass(frozen=True)
class ProgramEvaluation:
    """The metrics your evaluation program wrote, and whether they pass the gate."""

    metrics: dict[str, float]
    gate: Gate
    passed: bool


def evaluate_with_program(
    command: tuple[str, ...] | list[str], model_dir: str, data_dir: str, gate: Gate
) -> ProgramEvaluation:
    """Run your evaluation program (no shell: ``command`` is the program and its arguments)
    with the model and dataset folders and a metrics file in its environment, then read the
    metrics it wrote and apply ``gate``. Its output goes to this step's log.

    The folders are absolute (a program may change folder); ``data_dir`` empty: a program
    that brings its own data, which gets no ``KUBETRAIN_DATA_DIR``. It runs with the caller's
    PATH first, so ``python`` is the one the caller's shell would run. It is owned
    (``owned_processes.run``): nothing it starts outlives it, and SIGTERM or SIGINT to this
    step stops it and all it started before the step ends (128+N)."""
    import os
    import shutil
    import signal
    import tempfile

    from kubetrain import storage
    from kubetrain.backends.local.supervisor import program_path
    from kubetrain.backends.owned_processes import run
    from kubetrain.components._shared.program import absolute_location
    from kubetrain.errors import KubetrainError

    gate.validate()
    # the program's name must be a text that is not empty; an argument may be empty, as
    # after `--` (`--prefix ""`)
    if not command or not command[0] or not all(isinstance(part, str) for part in command):
        raise InvalidInput(
            "command", f"{command!r} is no program", 'give it as texts, e.g. ["python", "eval.py"]'
        )
    with tempfile.TemporaryDirectory(prefix="kubetrain-evaluate-") as scratch:
        metrics_file = os.path.join(scratch, "metrics.json")
        env = {
            **{name: value for name, value in os.environ.items() if name != DATA_DIR_ENV},
            "PATH": program_path(),
            MODEL_DIR_ENV: absolute_location(str(storage.dereference(model_dir))),
            **(
                {DATA_DIR_ENV: absolute_location(str(storage.dereference(data_dir)))}
                if data_dir
                else {}
            ),
            METRICS_FILE_ENV: metrics_file,
        }
        if shutil.which(command[0], path=env["PATH"]) is None:
            raise InvalidInput(
                "command",
                f"cannot start {command[0]}: no such program on PATH, or not executable",
                "check the program",
            )
        code, stopped_by = run(list(command), env=env)
        if stopped_by is not None:
            raise KubetrainError(
                f"stopped by {signal.Signals(stopped_by).name}: stopped your evaluation program "
                f"{command[0]} and every process it started",
                exit_code=128 + stopped_by,
            )
        if code != 0:
            raise KubetrainError(
                f"your evaluation program {command[0]} exited with code {code}; its output is "
                "above: fix what it names in your program, then run the step again"
            )
        metrics = read_metrics_file(metrics_file, command[0])
    return ProgramEvaluation(metrics, gate, gate.passes(metrics))


def read_metrics_file(path: str, program: str) -> dict[str, float]:
    """The JSON object of metric name -> finite number the program wrote at ``path``."""
    import os

    from kubetrain import bounded_json
    from kubetrain.user_files import read_user_file

    fix = 'write {"accuracy": 0.97, ...} to $' + METRICS_FILE_ENV
    if not os.path.lexists(path):
        raise InvalidInput("metrics", f"{program} wrote no metrics file", fix)
    text = read_user_file(path, "metrics", MAX_METRICS_BYTES, fix)
    try:
        data = bounded_json.loads(text)
    except ValueError as exc:  # JSONDecodeError, BoundedJSONError (1e400, 5000 digits, NaN)
        raise InvalidInput("metrics", f"{program} wrote no readable JSON ({exc})", fix) from None
    if not isinstance(data, dict) or not data:
        raise InvalidInput("metrics", "is not a non-empty JSON object", fix)
    metrics = {}
    for name, value in data.items():
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise InvalidInput("metrics", f"{name}: {value!r} is not a finite number", fix)
        metrics[name] = float(value)
    return metrics
