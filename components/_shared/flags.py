"""A boolean option every face can carry: ``--flag`` alone on a command line, or
``--flag true|false`` as an Argo parameter gives it."""

from __future__ import annotations

import argparse


def true_or_false(text: str) -> bool:
    """``true``/``false`` (any case), as an Argo parameter gives a boolean."""
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"invalid true|false value: {text!r}")
    return text.lower() == "true"


def add_flag(parser: argparse._ActionsContainer, name: str, help_text: str) -> None:
    """``name`` as ``--name``, ``--name true`` or ``--name false`` (default false)."""
    parser.add_argument(
        name,
        nargs="?",
        const=True,
        default=False,
        type=true_or_false,
        metavar="true|false",
        help=help_text,
    )
