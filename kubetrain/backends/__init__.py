"""Backends that run a TrainJobSpec: ``local`` (processes on this machine), ``trainer``
(a Kubeflow Trainer TrainJob), ``pytorchjob`` (a Training Operator v1 PyTorchJob, for clusters
still on Training Operator 1.8/1.9), ``job`` (an Indexed Job + headless Service, for
clusters without either) and ``rayjob`` (a KubeRay RayJob: the command is the Ray job's
entrypoint, its Ray Train workers run on the RayCluster's worker pods)."""

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
    if name in ("trainer", "job", "pytorchjob", "rayjob"):
        from kubetrain.backends.kubernetes.backend import KubernetesBackend

        return KubernetesBackend(kind=name, options=options)
    raise InvalidInput("backend", f"{name!r} is unknown", f"use one of {', '.join(BACKENDS)}")
