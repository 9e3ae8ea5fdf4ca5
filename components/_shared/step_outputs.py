"""A step's outputs as one file per value, for Argo's ``outputs.parameters[].valueFrom.path``.

Every step CLI takes ``--output-parameters DIR``; the Hera templates point each output
parameter at ``DIR/<name>``. Values are written the way Argo compares them in ``when``
expressions: booleans as ``true``/``false``, numbers in plain decimal.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from kubetrain.errors import InvalidInput

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


def check_output_parameters(directory: str, names: Iterable[str] = ()) -> None:
    """Refuse ``directory`` before the step does any work (creates a job, writes a model,
    publishes): found only when the outputs are written, a bad folder fails a step whose work
    is done. Nothing is created here. ``directory`` empty: no outputs are written. ``names``:
    the files the step writes there, none of which may be a folder."""
    if not directory:
        return
    fix = "give a folder path that is new or a folder you may write in, e.g. /tmp/outputs"
    if "\0" in directory:
        raise InvalidInput(OPTION, "holds a NUL byte", fix)
    if "://" in directory:
        raise InvalidInput(
            OPTION,
            f"{directory} is a URL, and the outputs are files of this step's own filesystem "
            "(Argo reads them from the step's container)",
            fix,
        )
    folder = Path(directory)
    check_folder_can_be_made(folder, OPTION, fix)
    for name in names:
        if (folder / name).is_dir():
            raise InvalidInput(
                OPTION,
                f"{folder / name} is a folder, where the output {name} is written as a file",
                "give a folder without it, or remove it",
            )


def check_folder_can_be_made(folder: Path, field: str, fix: str) -> None:
    """Refuse a local ``folder`` (the option ``field``) that a step could not write into
    later: an existing file, a broken link, a path under a file, or one whose nearest existing
    folder is not writable. Nothing is created."""
    if folder.is_symlink() and not folder.exists():
        raise InvalidInput(field, f"{folder} is a broken symbolic link", fix)
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        made = "" if existing == folder else f", so {folder} cannot be made"
        raise InvalidInput(field, f"{existing} is a file, not a folder{made}", fix)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InvalidInput(field, f"{existing} is not writable", fix)


def write_output_parameters(directory: str, values: Mapping[str, object]) -> None:
    """Write ``values`` under ``directory`` (nothing when it is empty), each file atomically."""
    if not directory:
        return
    # Here, not at the top: every step CLI imports this module for `kubetrain --help`, and the
    # storage package brings fsspec.
    from kubetrain.storage.atomic import write_text

    for name, value in values.items():
        write_text(Path(directory) / name, format_value(value))
