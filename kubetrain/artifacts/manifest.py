"""Reading the records that say what a folder holds (a dataset's or checkpoint's
``manifest.json``, a model's ``model.json``, ``export.json``), and the one rule for the files
such a record names.

The manifest rule: a record names a file by a relative POSIX path of plain names (not empty,
not absolute, no ``..``, ``.`` or empty part, no backslash or control character), and in a
local folder that path resolves, symbolic links followed, to a regular file inside the folder:
never a file elsewhere (``/etc/hostname``), a device (``/dev/zero``, read forever), a FIFO (whose
open waits forever) or a folder. On object storage, which has no links or devices, the name
alone is checked. Whoever can write a folder can write its record, digests included, so names
are checked before anything they name is opened, and a matching sha256 is no excuse.

The same goes for code: a record's model spec (``package.module:callable``) is imported only
when the user names that code too (:func:`check_model_code`); built-in models need nothing.

Every way a record can be unusable (missing, unreadable, not JSON, not an object, another
format, a field of the wrong type, a name against the rule) becomes one ``IntegrityError``
that names the folder and says what to do.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from kubetrain import bounded_json, storage
from kubetrain.errors import IntegrityError, InvalidInput
from kubetrain.rules import BUILTIN_MODELS
from kubetrain.user_files import file_kind

MANIFEST = "manifest.json"
#: What to do about a record that breaks the rule or its format: it cannot be repaired in place.
REWRITE = "re-create the folder with kubetrain rather than use it"
#: The largest record (manifest, card) read: far above what a checkpoint of thousands of
#: shards lists, far below what would exhaust memory.
MAX_RECORD_BYTES = 64 << 20
_RULE = "a record names regular files inside its folder by relative paths without '..'"
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: Longest rendering of a value from a record in a message (a planted name may be megabytes).
_SHOWN_CHARS = 120


def shown(value: object) -> str:
    """``value`` quoted and escaped (a name may hold a newline), bounded for a one-line message."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"


def is_sha256(value: object) -> bool:
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


# --- the manifest rule -----------------------------------------------------------------------


def name_problem(entry: object) -> str | None:
    """Why ``entry`` is no relative file name (the part of the rule that needs no filesystem),
    or None."""
    if not isinstance(entry, str):
        return f"is of type {type(entry).__name__}, not a file name"
    if not entry:
        return "is empty, not a file name"
    if any(char == "\\" or ord(char) < 32 or char == "\x7f" for char in entry):
        return "holds a backslash or a control character"
    if entry.startswith("/"):
        return "is an absolute path"
    parts = entry.split("/")
    if ".." in parts:
        return "climbs out of the folder with '..'"
    if "" in parts or "." in parts:
        return "has an empty or '.' part"
    return None


def local_entry_problem(folder: Path, entry: str, allow_dir: bool = False) -> str | None:
    """Why ``folder/entry`` is not a regular file (or, with ``allow_dir``, a folder) inside
    ``folder`` once links are followed. A missing file is no problem here: the reader reports
    it in its own words."""
    root = Path(os.path.realpath(folder))
    target = Path(os.path.realpath(folder / entry))
    if not target.is_relative_to(root):
        return f"resolves to {target}, outside {folder}"
    try:
        mode = os.stat(target).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return f"cannot be examined ({exc.strerror})"
    if stat.S_ISREG(mode) or (allow_dir and stat.S_ISDIR(mode)):
        return None
    return f"is {file_kind(mode)}, not a regular file"


def check_entry(folder: storage.Location, entry: object, what: str, source: str) -> str:
    """``entry`` if the manifest rule allows ``folder`` to name it, else an IntegrityError.

    ``what`` names the folder ("checkpoint DIR"); ``source`` says who names the entry
    ("manifest.json lists"), completed in the message by the entry and its problem.
    """
    problem = name_problem(entry)
    if problem is None and storage.is_local(folder):
        problem = local_entry_problem(storage.local_path(folder), str(entry))
    if problem is not None:
        raise IntegrityError(
            f"{what}: {source} {shown(entry)}, which {problem}; {_RULE}: {REWRITE}"
        )
    return str(entry)


def check_digests(
    folder: storage.Location, files: object, what: str, listed_in: str = MANIFEST
) -> dict[str, str]:
    """``files`` ({relative name: sha256}, as a record lists them) if every name passes the
    manifest rule and every digest is a sha256, else an IntegrityError naming the first that
    does not. Nothing is read: a reader calls this before it opens any of the files."""
    if not isinstance(files, dict):
        raise IntegrityError(
            f"{what}: the files {listed_in} lists are {shown(files)}, not an object of names "
            f"and sha256s; {REWRITE}"
        )
    for name, digest in files.items():
        check_entry(folder, name, what, f"{listed_in} lists")
        if not is_sha256(digest):
            raise IntegrityError(
                f"{what}: {listed_in} gives {shown(name)} the sha256 {shown(digest)}, not 64 "
                f"lowercase hex digits; {REWRITE}"
            )
    return files


def verify_digests(root: storage.Location, expected: dict[str, str], what: str) -> None:
    """Raise naming the first file under ``root`` that is missing or differs from its digest;
    every name is held to the manifest rule before any file is opened."""
    check_digests(root, expected, what)
    for relative, digest in sorted(expected.items()):
        location = storage.join(root, relative)
        try:
            actual = storage.sha256(location)
        except FileNotFoundError:
            raise IntegrityError(
                f"{what}: file {location} listed in its manifest is missing; re-create it "
                "rather than use it"
            ) from None
        if actual != digest:
            raise IntegrityError(
                f"{what}: file {location} is corrupt (sha256 {actual[:12]}…, manifest says "
                f"{digest[:12]}…); re-create it rather than use it"
            )


def check_model_code(recorded_spec: object, model_factory: str | None, what: str) -> None:
    """Refuse to rebuild a model of custom code that only a record names, before anything is
    imported.

    A record (a checkpoint's manifest, a model card) is covered by no digest and may name any
    importable module, whose top-level code an import runs. So a spec other than a built-in
    one is used only when the caller names the code too (``model_factory``, which then wins
    over the record); the record's spec is otherwise only shown.
    """
    if model_factory or recorded_spec in BUILTIN_MODELS:
        return
    raise InvalidInput(
        "model_factory",
        f"{what} records the model {shown(recorded_spec)}, custom code that kubetrain imports "
        "only when you name it yourself",
        f"if you trust that code, pass --model-factory {shown(recorded_spec)} (model_factory "
        "in a pipeline step)",
    )


# --- fields ----------------------------------------------------------------------------------


class Rule(NamedTuple):
    """What a record's field must hold: ``accepts(value)``, said as ``expected``."""

    accepts: Callable[[Any], bool]
    expected: str


def _is_count(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


WHOLE = Rule(lambda value: _is_count(value, 0), "a whole number")
POSITIVE = Rule(lambda value: _is_count(value, 1), "a whole number >= 1")
TEXT = Rule(lambda value: isinstance(value, str) and bool(value), "a non-empty string")
SHA256 = Rule(is_sha256, "a sha256 (64 lowercase hex digits)")
OBJECT = Rule(lambda value: isinstance(value, dict), "an object")
SHAPE = Rule(
    lambda value: isinstance(value, list) and bool(value) and all(_is_count(d, 1) for d in value),
    "a list of whole numbers >= 1",
)
RECORDS = Rule(
    lambda value: isinstance(value, list) and all(isinstance(item, dict) for item in value),
    "a list of objects",
)
#: How a model is recorded, in a checkpoint's manifest and a model card: what rebuilds it.
MODEL_FIELDS = {"spec": TEXT, "sample_shape": SHAPE, "num_classes": POSITIVE}


def check_fields(
    record: Mapping[str, Any],
    rules: Mapping[str, Rule],
    what: str,
    listed_in: str,
    within: str = "",
) -> None:
    """Every field ``rules`` names is in ``record`` and holds what its rule accepts, else one
    IntegrityError naming the field; ``within`` prefixes nested fields' names ("model.")."""
    missing = [f"{within}{key}" for key in rules if key not in record]
    if missing:
        raise IntegrityError(f"{what}: {listed_in} lacks {', '.join(missing)}; {REWRITE}")
    for key, rule in rules.items():
        if not rule.accepts(record[key]):
            raise IntegrityError(
                f"{what}: {listed_in} field {within}{key} is {shown(record[key])}, not "
                f"{rule.expected}; {REWRITE}"
            )


def check_file_records(
    folder: storage.Location,
    records: Mapping[str, Any],
    rules: Mapping[str, Rule],
    what: str,
    listed_in: str,
    kind: str,
    field: str,
) -> None:
    """Each of ``records`` (a ``field``'s mapping of ``kind`` → object, e.g. a dataset's
    splits) is an object whose ``file`` keeps the manifest rule and whose fields keep
    ``rules``; anything else is one IntegrityError."""
    for key, record in records.items():
        if not isinstance(record, dict):
            raise IntegrityError(
                f"{what}: {listed_in} {kind} {shown(key)} is {shown(record)}, not an object; "
                f"{REWRITE}"
            )
        if "file" in record:  # the rule's own words for a name it refuses, e.g. a non-string
            check_entry(folder, record["file"], what, f"{listed_in} {kind} {key} names")
        check_fields(record, rules, what, listed_in, within=f"{field}.{key}.")


# --- reading ---------------------------------------------------------------------------------


def read_format_manifest(
    folder: storage.Location,
    expected_format: str,
    *,
    what: str,
    if_missing: str,
    if_foreign: str,
    name: str = MANIFEST,
) -> dict[str, Any]:
    """The JSON object in ``folder/name`` whose ``format`` is ``expected_format``.

    ``what`` names the folder in errors ("dataset DIR"); ``if_missing`` follows "no
    manifest.json" and ``if_foreign`` follows a wrong format, each saying what to do. The
    record itself is held to the manifest rule first: a FIFO or ``/dev/zero`` is not read.
    """
    check_entry(folder, name, what, "kubetrain reads")
    try:
        with storage.open_file(storage.join(folder, name)) as record:
            data = record.read(MAX_RECORD_BYTES + 1)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise IntegrityError(f"{what}: no {name}{if_missing}") from None
    except OSError as exc:
        raise IntegrityError(
            f"{what}: {name} is unreadable ({exc}); check its permissions, or {REWRITE}"
        ) from exc
    if len(data) > MAX_RECORD_BYTES:
        raise IntegrityError(
            f"{what}: {name} is over {MAX_RECORD_BYTES >> 20} MiB, more than any record "
            f"kubetrain writes; {REWRITE}"
        )
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise IntegrityError(f"{what}: {name} is not UTF-8 text ({exc}); {REWRITE}") from exc
    try:
        manifest = bounded_json.loads(text)
    except json.JSONDecodeError as exc:
        raise IntegrityError(f"{what}: {name} is not valid JSON ({exc}); {REWRITE}") from exc
    except RecursionError:  # nested deeper than the parser's stack: no record of ours is
        raise IntegrityError(
            f"{what}: {name} is nested too deep to be a record; {REWRITE}"
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != expected_format:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise IntegrityError(
            f"{what}: format {shown(found)} is not {expected_format!r}; {if_foreign}"
        )
    return manifest
