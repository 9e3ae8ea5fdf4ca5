"""KFP component of the evaluate step."""

from typing import NamedTuple, Optional

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
    command: Optional[list] = None,  # noqa: UP045 (KFP reads the annotation)
    metric: str = "accuracy",
    below: Optional[float] = None,  # noqa: UP045
) -> NamedTuple(  # noqa: UP014
    "EvaluateOutputs", [("passed", bool), ("accuracy", float), ("metric_value", float)]
):
    """Score the model on the held-out split; ``passed`` (``metric`` >= ``threshold``, or <
    ``below``) is for dsl.If. ``report`` is one self-contained HTML page (images embedded)
    that the KFP UI renders. ``model_factory``: package.module:callable building a model of
    custom code, which the model card's spec alone never imports.

    ``command`` (a list) runs your own evaluation program instead, with KUBETRAIN_MODEL_DIR,
    KUBETRAIN_DATA_DIR and KUBETRAIN_METRICS_FILE (where it writes a JSON object of metric ->
    number); every metric it writes is logged to ``metrics``. ``accuracy`` is 0.0 when it
    writes none; ``metric_value`` is the gated metric's value."""
    from collections import namedtuple

    from kubetrain.components.evaluate_model.evaluate import (
        Gate,
        evaluate_with_program,
        evaluation_report,
    )
    from kubetrain.components.evaluate_model.evaluate import evaluate_model as evaluate
    from kubetrain.process_exit import skip_exit_collection
    from kubetrain.storage.atomic import write_text

    outputs = namedtuple("EvaluateOutputs", ["passed", "accuracy", "metric_value"])
    gate = Gate(metric, threshold, below).validate()
    if command:
        from kubetrain.artifacts.model_card import read_model_card
        from kubetrain.components.evaluate_model.report import metrics_report

        done = evaluate_with_program(command, model.path, dataset.path, gate)
        for name, value in sorted(done.metrics.items()):
            metrics.log_metric(name, value)
        card = read_model_card(model.path)
        write_text(
            report.path, metrics_report(card, done.metrics, gate.describe(), done.passed).html
        )
        print(f"{gate.describe()}: {'passed' if done.passed else 'not passed'}")
        return outputs(done.passed, done.metrics.get("accuracy", 0.0), done.metrics[gate.metric])
    gate.check_ours()
    result = evaluate(model.path, dataset.path, threshold=threshold, model_factory=model_factory)
    passed = gate.passes({"accuracy": result.accuracy, "loss": result.loss})
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
        f"accuracy {result.accuracy:.3f} ({gate.describe()}): "
        f"{'passed' if passed else 'below threshold'}"
    )
    skip_exit_collection()  # the step's process ends here: skip the exit scan of torch's objects
    value = result.accuracy if gate.metric == "accuracy" else result.loss
    return outputs(passed, result.accuracy, value)
