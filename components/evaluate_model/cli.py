"""`kubetrain evaluate`: score a collected model on the held-out split."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kubetrain.components._shared.program import add_program_arguments, program_from_args
from kubetrain.components._shared.step_outputs import (
    add_output_parameters_argument,
    check_folder_can_be_made,
    check_output_parameters,
    write_output_parameters,
)
from kubetrain.errors import IntegrityError, InvalidInput, problem_of, terminal_text

#: What ``--output-parameters DIR`` holds once the step is done, one file each.
OUTPUT_NAMES = ("accuracy", "loss", "passed")
METRICS_OUTPUT = "--metrics-output"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="score a collected model on the test split and check an accuracy threshold",
        description=(
            "Load MODEL/model.safetensors (verified against its sha256), score the dataset's test "
            "split (accuracy, loss, per-class precision and recall, confusion matrix) and exit 0 "
            "if accuracy >= --threshold, 3 if it is below. With your own evaluation program "
            "after '--', run it instead with KUBETRAIN_MODEL_DIR, KUBETRAIN_DATA_DIR and "
            "KUBETRAIN_METRICS_FILE (where it writes a JSON object of metric -> number) and gate "
            "on --metric, e.g. `--metric loss --below 0.2 -- python eval.py`; it runs with your "
            "PATH, so `python` is your shell's."
        ),
    )
    parser.add_argument("--model", required=True, help="folder written by `kubetrain collect`")
    parser.add_argument(
        "--data",
        default="",
        help="dataset folder written by `kubetrain prep`; optional with your own program, "
        "which then gets no KUBETRAIN_DATA_DIR and brings its own data",
    )
    parser.add_argument(
        "--threshold",
        type=_optional_number,
        default=None,
        help="pass when --metric is at least this (accuracy: a fraction); default 0.95 for "
        "accuracy, none for another metric, which needs --threshold or --below",
    )
    parser.add_argument(
        "--metric",
        default="accuracy",
        help="the metric the gate reads (your program's, or ours: accuracy, loss); default "
        "accuracy",
    )
    parser.add_argument(
        "--below",
        type=_optional_number,
        default=None,
        help="pass when --metric is below this (e.g. a loss) instead of at least --threshold",
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
        METRICS_OUTPUT,
        default="",
        metavar="FILE",
        help="also write all metrics as JSON to FILE (an Argo output artifact)",
    )
    parser.add_argument(
        "--report",
        default="",
        metavar="DIR",
        help="also publish an HTML report (verdict, run and hyperparameters, training curves, "
        "confusion matrix, model card) as the folder DIR: report.html and its PNG charts",
    )
    parser.add_argument(
        "--fail-below-threshold",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="exit 3 when accuracy is below --threshold (default); with "
        "--no-fail-below-threshold exit 0 and let a workflow branch on the `passed` output",
    )
    add_output_parameters_argument(parser)
    add_program_arguments(parser, "your evaluation program instead of ours")
    parser.set_defaults(handler=run)


def _optional_number(text: str) -> float | None:
    """A number, or none for an empty text (what an Argo parameter's default can carry)."""
    if not text.strip():
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None


def run(args: argparse.Namespace) -> int:
    check_output_parameters(args.output_parameters, OUTPUT_NAMES)
    check_metrics_output(args.metrics_output)
    command = program_from_args(args)
    if command:
        return run_program(args, command)
    from kubetrain.components.evaluate_model.evaluate import Gate, evaluate_model, evaluation_report
    from kubetrain.components.evaluate_model.report import check_report_dir, write_report
    from kubetrain.storage.atomic import write_json

    if not args.data:
        raise InvalidInput(
            "--data",
            "is not given",
            "give the dataset folder written by `kubetrain prep` (only your own program after "
            "-- may go without)",
        )
    report_inputs = {"model": args.model, "data": args.data}
    if args.report:  # the output rule, before the evaluation and the metrics file
        check_report_dir(args.report, report_inputs)
    gate = Gate.of(args.metric, args.threshold, args.below, ours=True)
    result = evaluate_model(
        args.model, args.data, threshold=gate.threshold, model_factory=args.model_factory
    )
    metrics = result.as_dict()
    passed = gate.passes({"accuracy": result.accuracy, "loss": result.loss})
    metrics["passed"] = passed
    if args.json:
        print("\n".join(terminal_text(line) for line in json.dumps(metrics, indent=2).split("\n")))
    if args.metrics_output:
        write_json(args.metrics_output, metrics)
    if args.report:
        report = write_report(
            evaluation_report(args.model, args.data, result, gate), args.report, report_inputs
        )
    write_output_parameters(
        args.output_parameters,
        {"accuracy": result.accuracy, "loss": result.loss, "passed": passed},
    )
    print(
        f"accuracy {result.accuracy:.3f} loss {result.loss:.4f} on {result.samples:d} test "
        f"samples: {'passed' if passed else 'below threshold'} "
        f"({terminal_text(gate.describe())})"
    )
    if args.report:
        print(f"report {terminal_text(str(report))}")
    return 0 if passed or not args.fail_below_threshold else 3


def check_metrics_output(location: str) -> None:
    """Refuse a ``--metrics-output`` file that could not be written, before the evaluation
    (ours, or your program, which may run for hours): found only when the metrics are
    written, it fails a step whose work is done. Nothing is created here; empty: none."""
    if not location:
        return
    fix = "give a file path in a folder you may write in, e.g. /tmp/outputs/metrics.json"
    if "\0" in location:
        raise InvalidInput(METRICS_OUTPUT, "holds a NUL byte", fix)
    target = Path(location)
    if target.is_dir():
        raise InvalidInput(
            METRICS_OUTPUT, f"{target} is a folder, where the metrics are written as a file", fix
        )
    check_folder_can_be_made(target.parent, METRICS_OUTPUT, fix)


def run_program(args: argparse.Namespace, command: tuple[str, ...]) -> int:
    """Your evaluation program scores the model; its metrics are published and gated."""
    from kubetrain.components.evaluate_model.evaluate import (
        Gate,
        evaluate_with_program,
        folder_name,
    )
    from kubetrain.components.evaluate_model.report import (
        Verdict,
        check_report_dir,
        metrics_report,
        write_report,
    )
    from kubetrain.storage.atomic import write_json

    report_inputs = {"model": args.model, **({"data": args.data} if args.data else {})}
    if args.report:
        check_report_dir(args.report, report_inputs)
    gate = Gate.of(args.metric, args.threshold, args.below)
    card = program_inputs_checked(args.model, args.data)
    result = evaluate_with_program(command, args.model, args.data, gate)
    metrics = {**result.metrics, "passed": result.passed}
    if args.json:
        print("\n".join(terminal_text(line) for line in json.dumps(metrics, indent=2).split("\n")))
    if args.metrics_output:
        write_json(args.metrics_output, metrics)
    if args.report:
        verdict = Verdict.of(gate, result.metrics)
        report = metrics_report(card, result.metrics, verdict, name=folder_name(args.model))
        written = write_report(report, args.report, report_inputs)
        print(f"report {terminal_text(str(written))}")
    write_output_parameters(
        args.output_parameters,
        {
            "accuracy": result.metrics.get("accuracy", ""),
            "loss": result.metrics.get("loss", ""),
            "passed": result.passed,
        },
    )
    shown = " ".join(f"{name} {value:g}" for name, value in sorted(result.metrics.items()))
    print(
        f"{terminal_text(shown)}: {'passed' if result.passed else 'not passed'} "
        f"({terminal_text(gate.describe())})"
    )
    return 0 if result.passed or not args.fail_below_threshold else 3


def program_inputs_checked(model: str, data: str) -> dict:
    """The model's card, read before your program runs: a missing or foreign --model (or a
    --data that is no dataset) is refused in one line, not found by the program after it ran."""
    from kubetrain.artifacts.datasets import read_manifest
    from kubetrain.artifacts.model_card import read_model_card

    try:
        card = read_model_card(model)
    except IntegrityError as exc:
        fix = "give a folder `kubetrain collect` wrote"
        raise InvalidInput("--model", problem_of(exc), fix) from None
    if data:
        try:
            read_manifest(data)
        except IntegrityError as exc:
            fix = "give a folder `kubetrain prep` wrote, or leave --data out"
            raise InvalidInput("--data", problem_of(exc), fix) from None
    return card
