"""A step's outputs as one file per value, for Argo's ``outputs.parameters[].valueFrom.path``.

Every step CLI takes ``--output-parameters DIR``; the Hera templates point each output
parameter at ``DIR/<name>``. Values are written the way Argo compares them in ``when``
expressions: booleans as ``true``/``false``, numbers in plain decimal.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

OPTION = "--output-parameters"


def add_output_parameters_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        OPTION,
        dest="output_parameters",
        default="",
        metavar="DIR",
        help="also write each output as a file DIR/<name> (for Argo's valueFrom.path)",
    )


def format_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def write_output_parameters(directory: str, values: Mapping[str, object]) -> None:
    """Write ``values`` under ``directory`` (nothing when it is empty), each file atomically."""
    if not directory:
        return
    # Here, not at the top: every step CLI imports this module for `kubetrain --help`, and the
    # storage package brings fsspec.
    from kubetrain.storage.atomic import write_text

    for name, value in values.items():
        write_text(Path(directory) / name, format_value(value))
