"""`kubetrain` command line: one subcommand per pipeline step, plus run/compile/logs/delete.

Each step registers its own subcommand from ``components/<step>/cli.py``; heavy imports
(torch, kfp) happen inside the handlers so that ``kubetrain --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from typing import NoReturn

from kubetrain import __version__
from kubetrain.errors import report_failure, terminal_text
from kubetrain.process_exit import skip_exit_collection

SUBCOMMAND_MODULES = (
    "kubetrain.components.dataset_prep.cli",
    "kubetrain.components.launch_trainjob.cli",
    "kubetrain.components.wait_trainjob.cli",
    "kubetrain.components.collect_checkpoint.cli",
    "kubetrain.components.evaluate_model.cli",
    "kubetrain.components.promote_model.cli",
    "kubetrain.cli.jobs",
    "kubetrain.cli.run",
    "kubetrain.cli.compile",
    "kubetrain.cli.render",
    "kubetrain.cli.submit",
    "kubetrain.cli.doctor",
)


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line ``PROG: error: OPTION: PROBLEM; FIX``, like every other kubetrain
    error: a step's log then ends with the line that matters, not a usage block. Subcommand
    parsers are made of the same class (argparse's default ``parser_class``). The line quotes
    what the user typed, so it is printed escaped (``terminal_text``)."""

    def error(self, message: str) -> NoReturn:
        line = f"{self.prog}: error: {one_line_usage_error(message, self.prog)}"
        print(terminal_text(line), file=sys.stderr)
        sys.exit(2)


def one_line_usage_error(message: str, prog: str) -> str:
    """argparse's ``message`` as ``OPTION: PROBLEM; FIX`` on one line."""
    message = " ".join(message.removeprefix("argument ").split())
    choices = re.fullmatch(r"(.*) \(choose from (.*)\)", message)
    if choices:
        return f"{choices[1]}; use one of {choices[2]}"
    bad_type = re.search(r"invalid (\w+) value", message)
    fixes = {"int": "give a whole number", "float": "give a number"}
    fix = fixes.get(bad_type[1] if bad_type else "", f"see `{prog} --help`")
    return f"{message}; {fix}"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="kubetrain",
        description=(
            "Reusable pipeline steps for distributed PyTorch training on Kubernetes "
            "(Kubeflow Trainer v2), runnable on one machine with the local backend."
        ),
    )
    parser.add_argument("--version", action="version", version=f"kubetrain {__version__}")
    subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    for module in SUBCOMMAND_MODULES:
        importlib.import_module(module).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand behind the error boundary: whatever it raises ends as ONE line
    ``kubetrain CMD: error: ...`` (``kubetrain.errors.report_failure``: a disk full, a
    read-only or missing path, corrupt JSON/YAML, out of memory each name the path and the
    fix; a bug says "internal error"); KUBETRAIN_DEBUG=1 prints the traceback too."""
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args) or 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return report_failure(f"kubetrain {args.subcommand}", exc)


def entrypoint() -> None:
    """The `kubetrain` console script: ``main``, then exit without the slow final collection."""
    code = main()
    skip_exit_collection()
    sys.exit(code)


if __name__ == "__main__":
    entrypoint()
