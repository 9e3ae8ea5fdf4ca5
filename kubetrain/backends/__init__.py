"""Backends that run a TrainJobSpec: ``local`` (processes on this machine), ``trainer``
(a Kubeflow Trainer TrainJob) and ``job`` (an Indexed Job + headless Service, for clusters
without the Trainer)."""

from __future__ import annotations

from dataclasses import dataclass

from kubetrain.backends.base import Backend
from kubetrain.errors import InvalidInput

BACKENDS = ("local", "trainer", "job")
TRAINER_VERSIONS = ("auto", "2.1", "2.2", "2.3")
CANCEL_ACTIONS = ("delete", "suspend")


@dataclass(frozen=True)
class BackendOptions:
    """How to reach the cluster; ignored by the local backend."""

    namespace: str = "default"
    #: Which TrainJob form to render: "auto" reads the CRD installed on the cluster.
    trainer_version: str = "auto"
    #: What `wait` does to the job when it is cancelled (SIGTERM).
    on_cancel: str = "delete"

    def validate(self) -> BackendOptions:
        if self.trainer_version not in TRAINER_VERSIONS:
            raise InvalidInput(
                "trainer_version",
                f"{self.trainer_version!r} is unknown",
                f"use one of {', '.join(TRAINER_VERSIONS)}",
            )
        if self.on_cancel not in CANCEL_ACTIONS:
            raise InvalidInput(
                "on_cancel", f"{self.on_cancel!r} is unknown", "use delete or suspend"
            )
        return self


def get_backend(name: str, options: BackendOptions | None = None) -> Backend:
    options = (options or BackendOptions()).validate()
    if name == "local":
        from kubetrain.backends.local.backend import LocalBackend

        return LocalBackend()
    if name in ("trainer", "job"):
        from kubetrain.backends.kubernetes.backend import KubernetesBackend

        return KubernetesBackend(kind=name, options=options)
    raise InvalidInput("backend", f"{name!r} is unknown", f"use one of {', '.join(BACKENDS)}")
