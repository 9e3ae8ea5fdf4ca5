"""Backends that run a TrainJobSpec: ``local`` (processes on this machine)."""

from __future__ import annotations

from kubetrain.backends.base import Backend
from kubetrain.errors import InvalidInput

BACKENDS = ("local",)


def get_backend(name: str) -> Backend:
    if name == "local":
        from kubetrain.backends.local import LocalBackend

        return LocalBackend()
    raise InvalidInput("backend", f"{name!r} is unknown", f"use one of {', '.join(BACKENDS)}")
