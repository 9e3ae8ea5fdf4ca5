"""KFP component of the evaluate step."""

from typing import NamedTuple, Optional

from kfp import dsl

from kubetrain.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def evaluate_model(
    model: dsl.Input[dsl.Model],
    metrics: dsl.Output[dsl.Metrics],
    classification_metrics: dsl.Output[dsl.ClassificationMetrics],
    report: dsl.Output[dsl.HTML],
    dataset: Optional[dsl.Input[dsl.Dataset]] = None,  # noqa: UP045
    threshold: Optional[float] = None,  # noqa: UP045
    model_factory: str = "",
    command: Optional[list] = None,  # noqa: UP045 (KFP reads the annotation)
    metric: str = "accuracy",
    below: Optional[float] = None,  # noqa: UP045
) -> NamedTuple(  # noqa: UP014
    "EvaluateOutputs", [("passed", bool), ("accuracy", float), ("metric_value", float)]
):
    """Score the model on the held-out split; ``passed`` (``metric`` >= ``threshold``, or <
    ``below``) is for dsl.If. ``threshold`` none: 0.95 for accuracy; another metric needs
    ``threshold`` or ``below``. ``report`` is one self-contained HTML page (images embedded)
    that the KFP UI renders. ``model_factory``: package.module:callable building a model of
    custom code, which the model card's spec alone never imports.

    ``command`` (a list) runs your own evaluation program instead, with KUBETRAIN_MODEL_DIR,
    KUBETRAIN_DATA_DIR and KUBETRAIN_METRICS_FILE (where it writes a JSON object of metric ->
    number); ``dataset`` is optional then (no KUBETRAIN_DATA_DIR: the program brings its own
    data). Every metric it writes is logged to ``metrics``, accuracy and loss first.
    ``accuracy`` is 0.0 when it writes none; ``metric_value`` is the gated metric's value.
    Our evaluation logs accuracy, loss and test_samples to ``metrics``; per-class figures go to
    ``classification_metrics`` (the confusion matrix) and the report."""
    from collections import namedtuple

    from kubetrain.components.evaluate_model.evaluate import (
        Gate,
        evaluate_with_program,
        evaluation_report,
        folder_name,
    )
    from kubetrain.components.evaluate_model.evaluate import evaluate_model as evaluate
    from kubetrain.errors import InvalidInput, terminal_text
    from kubetrain.process_exit import skip_exit_collection
    from kubetrain.storage.atomic import write_text

    outputs = namedtuple("EvaluateOutputs", ["passed", "accuracy", "metric_value"])
    gate = Gate.of(metric, threshold, below, ours=not command)
    data_dir = dataset.path if dataset is not None else ""
    if command:
        from kubetrain.artifacts.model_card import read_model_card
        from kubetrain.components.evaluate_model.report import Verdict, metrics_report

        done = evaluate_with_program(command, model.path, data_dir, gate)
        leading = [name for name in ("accuracy", "loss") if name in done.metrics]
        for name in [*leading, *sorted(set(done.metrics) - set(leading))]:
            metrics.log_metric(name, done.metrics[name])
        card = read_model_card(model.path)
        verdict = Verdict.of(gate, done.metrics)
        page = metrics_report(card, done.metrics, verdict, name=folder_name(model.path))
        write_text(report.path, page.html)
        print(f"{terminal_text(gate.describe())}: {'passed' if done.passed else 'not passed'}")
        return outputs(done.passed, done.metrics.get("accuracy", 0.0), done.metrics[gate.metric])
    if not data_dir:
        raise InvalidInput(
            "dataset",
            "is not given",
            "give the dataset written by the prep step (only your "
            "own evaluation program in command may go without)",
        )
    result = evaluate(model.path, data_dir, threshold=gate.threshold, model_factory=model_factory)
    passed = gate.passes({"accuracy": result.accuracy, "loss": result.loss})
    # Accuracy and loss lead: kfp keeps the order they are logged in (Metrics.log_metric sets
    # a dict key, kfp 2.17 kfp/dsl/types/artifact_types.py), but the KFP UI lists an artifact's
    # scalars by name (ScalarMetricsSection in kubeflow/pipelines 2.17.0
    # frontend/src/components/viewers/MetricsVisualizations.tsx reads getEntryList(), which
    # google-protobuf's jspb.Map sorts): these three names sort in this order too, and the
    # per-class figures, dozens of rows that buried them, go to the confusion matrix and report.
    metrics.log_metric("accuracy", result.accuracy)
    metrics.log_metric("loss", result.loss)
    metrics.log_metric("test_samples", result.samples)
    classification_metrics.log_confusion_matrix(result.classes, result.confusion_matrix)
    write_text(report.path, evaluation_report(model.path, data_dir, result, gate).html)
    print(
        f"accuracy {result.accuracy:.3f} ({terminal_text(gate.describe())}): "
        f"{'passed' if passed else 'below threshold'}"
    )
    skip_exit_collection()  # the step's process ends here: skip the exit scan of torch's objects
    value = result.accuracy if gate.metric == "accuracy" else result.loss
    return outputs(passed, result.accuracy, value)
