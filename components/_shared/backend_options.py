"""`--backend` / `--namespace` (and, for launch, `--trainer-version`): where a job runs, declared
once for every verb that names a job (launch, wait, logs, delete, render)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not imported for `kubetrain --help`
    from kubetrain.backends.base import BackendOptions

BACKEND_HELP = (
    "where the job runs: local (processes on this machine, default), trainer (a Kubeflow "
    "Trainer TrainJob), pytorchjob (a Training Operator v1 PyTorchJob), job (Indexed Job + "
    "headless Service, no Trainer needed) or rayjob (a KubeRay RayJob: the command is a Ray "
    "job's entrypoint)"
)


def add_backend_arguments(parser: argparse.ArgumentParser, *, creates: bool = False) -> None:
    """``creates``: the verb makes the job, so it also chooses the TrainJob form."""
    parser.add_argument("--backend", default="local", help=BACKEND_HELP)
    parser.add_argument(
        "--namespace",
        default="",
        help="Kubernetes namespace of the job (cluster backends); default: the one we run in "
        "(a pod's own, else the kubeconfig context's, else default)",
    )
    if creates:
        parser.add_argument(
            "--trainer-version",
            default="auto",
            help="TrainJob form: 2.2/2.3 use runtimePatches, 2.1 podTemplateOverrides; "
            "default auto (read from the CRD on the cluster)",
        )


def backend_options(args: argparse.Namespace) -> BackendOptions:
    """The options the arguments name; a verb without ``--trainer-version`` / ``--on-cancel``
    gets the defaults."""
    from kubetrain.backends.base import BackendOptions

    return BackendOptions(
        namespace=args.namespace,
        trainer_version=getattr(args, "trainer_version", "auto"),
        on_cancel=getattr(args, "on_cancel", "delete"),
    ).validate()
