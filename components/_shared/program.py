"""A user's program on a step's command line: after ``--`` (a person typing it) or as a JSON
list in ``--command-json`` (what one Argo parameter can carry), never both."""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from kubetrain import bounded_json
from kubetrain.errors import InvalidInput
from kubetrain.rules import shown

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
    """A JSON list of texts; empty text or ``[]``: none. Only its first text, the program,
    must not be empty: an argument may be (``--prefix ""``), as after ``--``."""
    if not text.strip():
        return ()
    try:
        value = bounded_json.loads(text)
    except json.JSONDecodeError as exc:  # the bounded reader's refusals are ones too
        raise InvalidInput(option, f"{shown(text)} is not JSON ({exc.msg})", FIX) from None
    if not isinstance(value, list) or not all(isinstance(part, str) for part in value):
        raise InvalidInput(option, f"{shown(text)} is not a list of texts", FIX)
    if value and not value[0]:
        raise InvalidInput(
            option,
            f"{shown(text)} is not a list that names a program (its first text is empty)",
            FIX,
        )
    check_program_text(value, option)
    return tuple(value)


def check_program_text(command: Sequence[str], field: str) -> None:
    """Every part of a program's command line can reach a process's argv: no NUL byte (it
    ends an argv entry) and no lone surrogate (``"\\ud800"`` in JSON), which no filesystem
    encoding writes, so the node could not even be started."""
    for part in command:
        if "\0" in part:
            raise InvalidInput(
                field, f"{shown(part)} holds a NUL byte", "write the argument without it"
            )
        try:
            os.fsencode(part)
        except UnicodeEncodeError:
            raise InvalidInput(
                field,
                f"{shown(part)} is not text a program can be given (a lone surrogate)",
                "write the argument in UTF-8",
            ) from None


#: Programs that run a file named among their arguments: an interpreter or a launcher.
RUNS_A_FILE = re.compile(r"(python[0-9.]*|torchrun|bash|sh|accelerate|deepspeed)")
#: What names a program file among a launcher's arguments: a script or a path (an option's
#: value, ``2`` of ``--nproc-per-node 2``, is neither).
PROGRAM_FILE = re.compile(r".*/.*|.*\.(py|sh)")
#: ``python -m MODULE`` modules that run a file named after them, as torchrun does.
LAUNCHER_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})


def with_program_file_from(folder: str, command: Sequence[str]) -> tuple[str, ...]:
    """``command`` with its program file given by its path in ``folder`` (the one launch ran
    in), for a program that runs in another folder: the command itself when it is a relative
    path (``./train.sh``), or the file an interpreter or launcher runs (``train.py`` of
    ``torchrun train.py`` or ``python -u train.py``: the first argument that is a script or a
    path, when it names a file of ``folder``; none after ``-c CODE`` or ``-m MODULE``). Every
    other argument, the program's own above all (``--out model.pt``), stays exactly as given:
    made to point into ``folder``, an output the program writes would overwrite the user's
    own file there."""
    if not command:
        return ()
    program, *rest = command
    if "/" in program:  # a path, not a name looked up on PATH
        program = _found_in(folder, program) or program
    if not RUNS_A_FILE.fullmatch(os.path.basename(program)):
        return (program, *rest)
    for index, part in enumerate(rest):
        if part == "-c":
            break  # the program is the code given: no file
        if part == "-m" and not set(rest[index + 1 : index + 2]) & LAUNCHER_MODULES:
            break  # the program is the module: no file
        if part.startswith("-") or not PROGRAM_FILE.fullmatch(part):
            continue
        found = _found_in(folder, part)
        return (program, *rest[:index], found or part, *rest[index + 1 :])
    return (program, *rest)


def _found_in(folder: str, part: str) -> str:
    """The absolute path of ``part`` when it names a file of ``folder``; else empty."""
    if os.path.isabs(part):
        return ""
    candidate = Path(folder) / part
    try:
        return str(candidate) if candidate.is_file() else ""
    except OSError:  # e.g. a `bash -c SCRIPT` over NAME_MAX: text, not a file name
        return ""


def absolute_location(location: str) -> str:
    """A local path made absolute against this process's folder, the caller's: a program
    runs elsewhere (a node in its checkpoint folder) and may change folder. A URL (s3://,
    file://) and an empty text stay as they are."""
    from kubetrain import storage

    if not location or not storage.is_local(location) or location.startswith("file:"):
        return location
    return os.path.abspath(location)
