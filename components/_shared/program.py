"""A user's program on a step's command line: after ``--`` (a person typing it) or as a JSON
list in ``--command-json`` (what one Argo parameter can carry), never both."""

from __future__ import annotations

import argparse
import json
import os

from kubetrain.errors import InvalidInput

FIX = 'give it after -- or as a JSON list of texts, e.g. --command-json \'["python", "x.py"]\''


def add_program_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """``--command-json`` and the ``-- CMD...`` remainder; ``what`` says what the program
    replaces, for the help."""
    parser.add_argument(
        "--command-json",
        default="",
        metavar="JSON",
        help=f'{what}, as a JSON list, e.g. \'["torchrun", "train.py"]\' (what an Argo '
        "parameter can carry); the same as giving it after --",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help=f"-- CMD [ARGS...]: {what}")


def program_from_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The program the arguments name; empty: none."""
    typed = tuple(args.command[1:] if args.command[:1] == ["--"] else args.command)
    from_json = parse_command(args.command_json, "--command-json")
    if typed and from_json:
        raise InvalidInput(
            "--command-json", "is given with a command after --", "give the program one way"
        )
    return typed or from_json


def parse_command(text: str, option: str) -> tuple[str, ...]:
    """A JSON list of texts; empty text or ``[]``: none."""
    if not text.strip():
        return ()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(option, f"{text!r} is not JSON ({exc.msg})", FIX) from None
    if not isinstance(value, list) or not all(isinstance(part, str) and part for part in value):
        raise InvalidInput(option, f"{text!r} is not a list of texts", FIX)
    return tuple(value)


def absolute_location(location: str) -> str:
    """A local path made absolute against this process's folder, the caller's: a program
    runs elsewhere (a node in its checkpoint folder) and may change folder. A URL (s3://,
    file://) and an empty text stay as they are."""
    from kubetrain import storage

    if not location or not storage.is_local(location) or location.startswith("file:"):
        return location
    return os.path.abspath(location)
