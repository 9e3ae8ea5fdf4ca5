"""A user's ``package.module:callable`` (a model factory, a dataset loader), resolved without
torch: `kubetrain run` and launch check that it imports in a second, before anything starts;
only a module that imports torch itself pays for it."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from kubetrain.errors import InvalidInput


def import_callable(spec: str, option: str, fix: str) -> Callable[..., Any]:
    """Resolve ``package.module:callable``, reporting any failure against ``option``."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise InvalidInput(option, f"{spec!r} is not of the form package.module:callable", fix)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInput(option, f"cannot import module {module_name!r} ({exc})", fix) from exc
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
