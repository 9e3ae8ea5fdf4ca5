"""`kubetrain` command line: one subcommand per pipeline step, plus run/compile/logs/delete.

Each step registers its own subcommand from ``components/<step>/cli.py``; heavy imports
(torch, kfp) happen inside the handlers so that ``kubetrain --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from kubetrain import __version__
from kubetrain.errors import KubetrainError

SUBCOMMAND_MODULES = (
    "kubetrain.components.dataset_prep.cli",
    "kubetrain.components.launch_trainjob.cli",
    "kubetrain.components.wait_trainjob.cli",
    "kubetrain.components.collect_checkpoint.cli",
    "kubetrain.components.evaluate_model.cli",
    "kubetrain.components.promote_model.cli",
    "kubetrain.jobs_cli",
    "kubetrain.run_cli",
    "kubetrain.compile_cli",
    "kubetrain.render_cli",
    "kubetrain.submit_cli",
    "kubetrain.doctor_cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args) or 0
    except KubetrainError as exc:
        print(f"kubetrain {args.subcommand}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
