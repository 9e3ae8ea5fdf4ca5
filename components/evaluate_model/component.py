"""KFP component of the evaluate step."""

from typing import NamedTuple

from kfp import dsl

from kubetrain.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def evaluate_model(
    model: dsl.Input[dsl.Model],
    dataset: dsl.Input[dsl.Dataset],
    metrics: dsl.Output[dsl.Metrics],
    classification_metrics: dsl.Output[dsl.ClassificationMetrics],
    report: dsl.Output[dsl.HTML],
    threshold: float = 0.95,
    model_factory: str = "",
) -> NamedTuple("EvaluateOutputs", [("passed", bool), ("accuracy", float)]):  # noqa: UP014
    """Score the model on the held-out split; ``passed`` (accuracy >= threshold) is for dsl.If.
    ``report`` is one self-contained HTML page (images embedded) that the KFP UI renders.
    ``model_factory``: package.module:callable building a model of custom code, which the
    model card's spec alone never imports."""
    from collections import namedtuple

    from kubetrain.components.evaluate_model.evaluate import evaluate_model as evaluate
    from kubetrain.components.evaluate_model.evaluate import evaluation_report
    from kubetrain.process_exit import skip_exit_collection
    from kubetrain.storage.atomic import write_text

    result = evaluate(model.path, dataset.path, threshold=threshold, model_factory=model_factory)
    metrics.log_metric("accuracy", result.accuracy)
    metrics.log_metric("loss", result.loss)
    metrics.log_metric("test_samples", result.samples)
    for name, precision, recall in zip(
        result.classes, result.precision, result.recall, strict=True
    ):
        metrics.log_metric(f"precision_{name}", precision)
        metrics.log_metric(f"recall_{name}", recall)
    classification_metrics.log_confusion_matrix(result.classes, result.confusion_matrix)
    write_text(report.path, evaluation_report(model.path, dataset.path, result).html)
    print(
        f"accuracy {result.accuracy:.3f} (threshold {threshold:g}): "
        f"{'passed' if result.passed else 'below threshold'}"
    )
    skip_exit_collection()  # the step's process ends here: skip the exit scan of torch's objects
    return namedtuple("EvaluateOutputs", ["passed", "accuracy"])(result.passed, result.accuracy)
