"""Errors a user can act on: each one names what is wrong and how to fix it."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import sys
import traceback
from collections.abc import Iterator


class KubetrainError(Exception):
    """A failure reported to the user as one line; ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    def context_lines(self) -> list[str]:
        """Lines printed before the one line (none here), so output ends with the cause."""
        return []

    def report(self) -> str:
        """The context lines, then the one line's message: what a face prints."""
        return "\n".join([*self.context_lines(), str(self)])


class InvalidInput(KubetrainError):
    """Bad input, refused before anything is created."""

    exit_code = 2

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        super().__init__(f"{field}: {problem}; {fix}")


class JobNotFound(KubetrainError):
    """No job of that name on the backend (``kubetrain delete --ignore-not-found`` accepts it)."""


class JobStalled(KubetrainError):
    """A running job made no progress (no log line, no checkpoint) for ``--stall-timeout``
    seconds: a stopped or hung rank, reported instead of waiting out torch's 30-minute
    collective timeout. The job was stopped as a cancelled wait stops it."""

    exit_code = 3


class IntegrityError(KubetrainError):
    """Stored data (a dataset or a checkpoint) is missing, incomplete or corrupt."""


def problem_of(exc: KubetrainError) -> str:
    """The problem an error line states, without its fix (the text before the first "; "):
    for restating it as bad input of a field, with that field's own fix."""
    return str(exc).partition("; ")[0]


def refusal_reason(exc: BaseException) -> str:
    """One short line of why a load failed: for ``torch.load(weights_only=True)`` the line that
    names what it refused (its message is otherwise a page of advice, including to turn the
    check off), else the error's own text on one line."""
    text = str(exc)
    refused = re.search(r"WeightsUnpickler error:\s*(.+?)\.?(?: was not|$)", text, re.M)
    return refused[1] if refused else " ".join(text.split())[:200] or type(exc).__name__


# --- the error boundary ----------------------------------------------------------------------
#: Set to 1 to see the traceback of an error the boundary otherwise reports as one line.
DEBUG_ENV = "KUBETRAIN_DEBUG"

#: What to do about an OSError, by errno (the problem is the error's own strerror).
OS_ERROR_FIXES = {
    errno.ENOSPC: "free space on that filesystem or give a path on a larger one",
    errno.EDQUOT: "free space within your quota or give a path on another filesystem",
    errno.EROFS: "the filesystem is read-only: give a path in a writable folder",
    errno.EACCES: "give a path you may use, or fix its permissions",
    errno.EPERM: "give a path you may use, or fix its permissions",
    errno.ENOENT: "check the path (a missing file, or a folder that does not exist)",
    errno.ENOTDIR: "a part of the path is a file, not a folder: give another path",
    errno.EISDIR: "that is a folder where a file is expected: give a file's path",
    errno.EEXIST: "remove it or give another path",
    errno.ENOTEMPTY: "remove what is in it or give another path",
    errno.ENAMETOOLONG: "give a shorter path",
    errno.ELOOP: "the path has a symbolic link loop: give a real path",
    errno.EMFILE: "too many open files: raise the limit (`ulimit -n`)",
    errno.ENFILE: "the system has too many open files: close some and try again",
    errno.EXDEV: "give a path on the same filesystem",
    errno.EIO: "the device reported an I/O error: check the disk or volume",
    errno.ENOMEM: "give the step more memory (--memory) or use less data per step",
}
#: errnos that only writing causes: when such an error names no file, it was the output.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
#: What reading well-formed but foreign content (valid JSON of another shape) raises.
FOREIGN_CONTENT_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError)
#: Free space under which a write error without an errno is taken for a full disk.
NEARLY_FULL_BYTES = 1 << 20
#: Libraries written in Rust/C++ (safetensors) report an OS error only in their message.
_OS_ERROR_IN_TEXT = re.compile(r"\(os error (\d+)\)")
#: Packages of an optional extra, by the top-level module a ``ModuleNotFoundError`` names:
#: (the package pip installs, the extra that brings it). The base install (compile, render,
#: submit, the cluster backends) needs none of them.
EXTRA_MODULES = {
    "torch": ("torch", "train"),
    "numpy": ("numpy", "train"),
    "sklearn": ("scikit-learn", "train"),
    "safetensors": ("safetensors", "train"),
    "matplotlib": ("matplotlib", "train"),
    "torchvision": ("torchvision", "vision"),
    "s3fs": ("s3fs", "s3"),
    "ray": ("ray", "ray"),
}


@contextlib.contextmanager
def reading(path: object) -> Iterator[None]:
    """Name ``path`` in any error raised while reading it (a JSON or YAML parser's error does
    not know which file it parsed), for the one-line report of ``describe``."""
    try:
        yield
    except Exception as exc:
        if getattr(exc, "kubetrain_path", None) is None:
            exc.kubetrain_path = str(path)  # type: ignore[attr-defined]
        raise


def full_filesystem(output: str) -> OSError | None:
    """ENOSPC when the local filesystem of ``output`` has (almost) no space left: torch's C++
    writer reports a full disk as "iostream error" or "unexpected pos", with no errno."""
    folder = output
    while folder and not os.path.isdir(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent
    try:
        free = shutil.disk_usage(folder or ".").free
    except OSError:
        return None
    if free >= NEARLY_FULL_BYTES:
        return None
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), output)


def os_error_of(exc: BaseException) -> OSError | None:
    """The OSError behind ``exc``: itself, its cause or context, or one a library only wrote
    into its message ("... (os error 28)", as safetensors does)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno is not None:
            return current
        found = _OS_ERROR_IN_TEXT.search(str(current))
        if found:
            code = int(found[1])
            return OSError(code, os.strerror(code))
        suppressed = current.__suppress_context__
        current = current.__cause__ or (None if suppressed else current.__context__)
    return None


def missing_extra(exc: BaseException) -> str | None:
    """``PACKAGE is not installed; install kubetrain[EXTRA] (...)`` when ``exc``, or what it
    was explicitly raised from (``raise ... from``), is the ModuleNotFoundError of a package of
    an optional extra: a command that trains, preps, collects or evaluates on a base install
    (no torch). None otherwise (a ModuleNotFoundError merely being handled when ``exc`` was
    raised is not its cause)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ModuleNotFoundError) and current.name:
            found = EXTRA_MODULES.get(current.name.partition(".")[0])
            if found is not None:
                package, extra = found
                return (
                    f"{package} is not installed; install kubetrain[{extra}] "
                    f"(pip install 'kubetrain[{extra}]')"
                )
        current = current.__cause__
    return None


def _path_in_traceback(exc: BaseException) -> str | None:
    """Best effort for a parser error that names no file: the innermost file object or path
    held by a frame of the traceback (``json.load(handle)``, ``json.loads(path.read_text())``)."""
    import io
    import pathlib

    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            if isinstance(value, io.IOBase) and isinstance(getattr(value, "name", None), str):
                return value.name
            if isinstance(value, pathlib.PurePath):
                return str(value)
    return None


def describe(exc: BaseException, output: str | None = None) -> str | None:
    """``PATH: PROBLEM; FIX`` for an error of the environment or of a file's content (OSError,
    MemoryError, JSON, YAML, text decoding, schema), None for anything else (a bug).
    ``output`` is the folder a write error that names no file was writing (the trainer's
    checkpoint folder)."""
    import json

    path = getattr(exc, "kubetrain_path", None)
    if isinstance(exc, MemoryError):
        return (
            f"{path or 'memory'}: out of memory; give the step more memory (--memory) or use "
            "less data per step (a smaller --batch-size)"
        )
    os_error = os_error_of(exc)
    if os_error is None and output is not None and isinstance(exc, RuntimeError):
        os_error = full_filesystem(output)
    if os_error is not None:
        named = [n for n in (os_error.filename, os_error.filename2) if n is not None]
        if not named and path is None and output is not None and os_error.errno in WRITE_ERRNOS:
            named = [output]
        where = " -> ".join(str(n) for n in named) or path or _path_in_traceback(exc) or "a file"
        problem = os_error.strerror or str(os_error)
        fix = OS_ERROR_FIXES.get(os_error.errno or 0, "check the path and try again")
        return f"{where}: {problem}; {fix}"
    if isinstance(exc, json.JSONDecodeError):
        where = path or _path_in_traceback(exc) or "JSON"
        return (
            f"{where}: not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg}); "
            "restore the file, or give the file the step expects"
        )
    if isinstance(exc, UnicodeDecodeError):
        where = path or _path_in_traceback(exc) or "text"
        return (
            f"{where}: not UTF-8 text (byte {exc.object[exc.start : exc.start + 1]!r} at offset "
            f"{exc.start}); give the text file the step expects, not a binary one"
        )
    yaml_error = _yaml_problem(exc)
    if yaml_error is not None:
        mark_name, problem = yaml_error
        where = path or mark_name or _path_in_traceback(exc) or "YAML"
        return f"{where}: not valid YAML ({problem}); give a YAML file the step can read"
    schema_error = _schema_problem(exc)
    if schema_error is not None:
        where = path or _path_in_traceback(exc) or "document"
        return f"{where}: {schema_error}; fix that field of the file"
    if path is not None and isinstance(exc, FOREIGN_CONTENT_ERRORS):
        return (
            f"{path}: not the content kubetrain expects ({type(exc).__name__}: "
            f"{refusal_reason(exc)}); restore the file, or give the file the step expects"
        )
    return None


def _yaml_problem(exc: BaseException) -> tuple[str | None, str] | None:
    yaml = sys.modules.get("yaml")
    if yaml is None or not isinstance(exc, yaml.YAMLError):
        return None
    mark = getattr(exc, "problem_mark", None)
    name = getattr(mark, "name", None)
    if name and name.startswith("<"):  # "<unicode string>": parsed from text, not a file
        name = None
    problem = getattr(exc, "problem", None) or type(exc).__name__
    line = f" at line {mark.line + 1}" if mark is not None else ""
    return name, f"{problem}{line}"


def _schema_problem(exc: BaseException) -> str | None:
    jsonschema = sys.modules.get("jsonschema")
    if jsonschema is None or not isinstance(exc, jsonschema.ValidationError):
        return None
    field = "/".join(str(part) for part in exc.absolute_path) or "(top level)"
    return f"field {field}: {exc.message}"


def failure_line(exc: BaseException, output: str | None = None) -> tuple[str, int]:
    """The one line (without the program's name) and the exit code that report ``exc``:

    * a KubetrainError: its own line and exit code;
    * a package of an optional extra that is not installed (``missing_extra``: torch on a base
      install): the package and the extra to install, exit 1;
    * an error of the environment or of a file's content (``describe``): the path, the problem
      and the fix, exit 1;
    * anything else is a bug of ours: "internal error (TYPE: message)", exit 1, never silent.
    """
    if isinstance(exc, KubetrainError):
        return _one_line(str(exc)), exc.exit_code
    missing = missing_extra(exc)
    if missing is not None:
        return missing, 1
    line = describe(exc, output) or (
        f"internal error ({type(exc).__name__}: {refusal_reason(exc)}); this is a bug in "
        "kubetrain: please report it with the traceback"
    )
    return _one_line(f"{line} (set {DEBUG_ENV}=1 for the traceback)"), 1


#: The characters that can drive a terminal: C0 (but the tab, which only moves the cursor to
#: the next stop), DEL and C1 (U+0080-U+009F: U+009B is an 8-bit CSI, as ESC [ is a 7-bit one).
#: A newline is one of them: a caller printing lines splits them first, then escapes each.
TERMINAL_CONTROLS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def terminal_text(text: str) -> str:
    """``text`` safe to print on a terminal: each control character (``TERMINAL_CONTROLS``)
    written as visible ``\\xNN``, so an escape sequence in a user's value, file name, log line
    or a server's message shows as text instead of driving the terminal. Escaping twice
    changes nothing. Every user-supplied string printed goes through it
    (tests/test_terminal_guard.py)."""
    return TERMINAL_CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _one_line(text: str) -> str:
    """``text`` on one line (whitespace folded), its control characters escaped."""
    return terminal_text(" ".join(text.split()))


def report_failure(prog: str, exc: BaseException, output: str | None = None) -> int:
    """The boundary of a command (``kubetrain CMD``, ``python -m kubetrain.train``): print
    ``PROG: error: LINE`` (``failure_line``) as ONE line on stderr, after a KubetrainError's
    ``context_lines`` (a failed job's last log lines), and return the exit code.
    The traceback is printed (before the line, so a step's log still ends with the line that
    matters) only with KUBETRAIN_DEBUG=1, which every line but a KubetrainError's mentions."""
    line, code = failure_line(exc, output)
    if isinstance(exc, KubetrainError) and (context := exc.context_lines()):
        print("\n".join(terminal_text(line) for line in context), file=sys.stderr)
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        traceback.print_exception(exc, file=sys.stderr)
    print(terminal_text(f"{prog}: error: {line}"), file=sys.stderr, flush=True)
    return code
