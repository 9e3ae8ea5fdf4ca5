"""A user's ``package.module:callable`` (a model factory, a dataset loader), resolved without
torch: `kubetrain run` and launch check that it imports in a second, before anything starts;
only a module that imports torch itself pays for it."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from kubetrain.errors import InvalidInput


def import_callable(spec: str, option: str, fix: str) -> Callable[..., Any]:
    """Resolve ``package.module:callable``, reporting any failure against ``option``."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise InvalidInput(option, f"{spec!r} is not of the form package.module:callable", fix)
    try:
        module = import_from_here(module_name)
    except ImportError as exc:
        raise InvalidInput(option, f"cannot import module {module_name!r} ({exc})", fix) from exc
    except SystemExit as exc:  # argparse or sys.exit() at import: not kubetrain's exit
        raise InvalidInput(
            option,
            f"module {module_name!r} exited while imported (SystemExit {exc.code!r})",
            "a module kubetrain imports must not parse the command line or exit at import; "
            "keep that under `if __name__ == '__main__':`",
        ) from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise InvalidInput(
                option, f"module {module_name!r} has no attribute {attribute!r}", fix
            )
        target = getattr(target, part)
    if not callable(target):
        raise InvalidInput(option, f"{spec!r} is not callable", fix)
    return target


def import_from_here(module_name: str) -> ModuleType:
    """Import ``module_name`` as `python -m` would in this folder: the current folder first.
    A console script (`kubetrain ...`) does not put it on ``sys.path``, so without this a
    factory beside the user's script would import under `python -m kubetrain` only. What the
    module writes to stderr is held back if it exits (argparse's usage of kubetrain's own
    arguments would read as kubetrain's), written out otherwise."""
    here = os.getcwd()
    added = here not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, here)
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            module = importlib.import_module(module_name)
    except SystemExit:
        raise
    except BaseException:
        sys.stderr.write(held.getvalue())
        raise
    finally:
        if added:
            sys.path.remove(here)
    sys.stderr.write(held.getvalue())
    return module
