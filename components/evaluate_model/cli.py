"""`kubetrain evaluate`: score a collected model on the held-out split."""

from __future__ import annotations

import argparse
import json

from kubetrain.components._shared.step_outputs import (
    add_output_parameters_argument,
    write_output_parameters,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="score a collected model on the test split and check an accuracy threshold",
        description=(
            "Load MODEL/model.safetensors (verified against its sha256), score the dataset's test "
            "split (accuracy, loss, per-class precision and recall, confusion matrix) and exit 0 "
            "if accuracy >= --threshold, 3 if it is below."
        ),
    )
    parser.add_argument("--model", required=True, help="folder written by `kubetrain collect`")
    parser.add_argument("--data", required=True, help="dataset folder written by `kubetrain prep`")
    parser.add_argument(
        "--threshold",
        type=float,
        default=0.95,
        help="accuracy (a fraction) the model must reach; default 0.95",
    )
    parser.add_argument(
        "--model-factory",
        default="",
        metavar="SPEC",
        help=(
            "package.module:callable that builds the model, for a model of custom code: the "
            "code its model.json names is imported only when given here (mlp and cnn need none)"
        ),
    )
    parser.add_argument("--json", action="store_true", help="print all metrics as JSON")
    parser.add_argument(
        "--metrics-output",
        default="",
        metavar="FILE",
        help="also write all metrics as JSON to FILE (an Argo output artifact)",
    )
    parser.add_argument(
        "--report",
        default="",
        metavar="DIR",
        help="also publish an HTML report (training curves, confusion matrix, model card) as "
        "the folder DIR: report.html, training_curves.png, confusion_matrix.png",
    )
    parser.add_argument(
        "--fail-below-threshold",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="exit 3 when accuracy is below --threshold (default); with "
        "--no-fail-below-threshold exit 0 and let a workflow branch on the `passed` output",
    )
    add_output_parameters_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kubetrain.components.evaluate_model.evaluate import evaluate_model, evaluation_report
    from kubetrain.components.evaluate_model.report import check_report_dir, write_report
    from kubetrain.storage.atomic import write_json

    report_inputs = {"model": args.model, "data": args.data}
    if args.report:  # the output rule, before the evaluation and the metrics file
        check_report_dir(args.report, report_inputs)
    result = evaluate_model(
        args.model, args.data, threshold=args.threshold, model_factory=args.model_factory
    )
    metrics = result.as_dict()
    if args.json:
        print(json.dumps(metrics, indent=2))
    if args.metrics_output:
        write_json(args.metrics_output, metrics)
    if args.report:
        report = write_report(
            evaluation_report(args.model, args.data, result), args.report, report_inputs
        )
    write_output_parameters(
        args.output_parameters,
        {"accuracy": result.accuracy, "loss": result.loss, "passed": result.passed},
    )
    verdict = "passed" if result.passed else "below threshold"
    print(
        f"accuracy {result.accuracy:.3f} loss {result.loss:.4f} on {result.samples} test samples: "
        f"{verdict} ({result.threshold:g})"
    )
    if args.report:
        print(f"report {report}")
    return 0 if result.passed or not args.fail_below_threshold else 3
