"""Evaluate step: score a collected model on the held-out split and decide whether it passes."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from kubetrain.errors import InvalidInput

if TYPE_CHECKING:
    import numpy as np

    from kubetrain.components.evaluate_model.report import Report

EVAL_BATCH_SIZE = 1024


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
    model_dir: str, data_dir: str, threshold: float = 0.95, model_factory: str = ""
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


def evaluation_report(model_dir: str, data_dir: str, result: Evaluation) -> Report:
    """The HTML report of ``result``, with the training history from the model's card."""
    from kubetrain.artifacts.datasets import read_manifest
    from kubetrain.artifacts.model_card import read_model_card
    from kubetrain.components.evaluate_model.report import build_report

    return build_report(read_model_card(model_dir), result.as_dict(), read_manifest(data_dir))
