"""Backends that run a TrainJobSpec: ``local`` (processes on this machine), ``trainer``
(a Kubeflow Trainer TrainJob) and ``job`` (an Indexed Job + headless Service, for clusters
without the Trainer)."""

from __future__ import annotations

from kubetrain.backends.base import (
    BACKENDS,
    CANCEL_ACTIONS,
    TRAINER_VERSIONS,
    Backend,
    BackendOptions,
)
from kubetrain.errors import InvalidInput

__all__ = [
    "BACKENDS",
    "CANCEL_ACTIONS",
    "TRAINER_VERSIONS",
    "Backend",
    "BackendOptions",
    "get_backend",
]


def get_backend(name: str, options: BackendOptions | None = None) -> Backend:
    options = (options or BackendOptions()).validate()
    if name == "local":
        from kubetrain.backends.local.backend import LocalBackend

        return LocalBackend()
    if name in ("trainer", "job"):
        from kubetrain.backends.kubernetes.backend import KubernetesBackend

        return KubernetesBackend(kind=name, options=options)
    raise InvalidInput("backend", f"{name!r} is unknown", f"use one of {', '.join(BACKENDS)}")
