"""`kubetrain render trainjob|pytorchjob|rayjob|runtimes|rbac`: print, as YAML, the objects
`kubetrain launch` would create, or the manifests a cluster needs first (our
ClusterTrainingRuntimes; the ServiceAccount and RBAC the steps run with), from the package's
data: pipe them to `kubectl apply -f -`.

`render trainjob` takes exactly launch's options (the same argument functions, and the same road:
``request_from_args`` then ``render_launch``, which plans the job as ``launch`` does), with
defaults that make sense without a cluster: ``--backend trainer``, ``--trainer-version auto``
renders the newest form (2.3; render never contacts a cluster) and ``--data`` points into the
shared volume our runtimes mount. `render pytorchjob` is the same with ``--backend pytorchjob``
(a Training Operator v1 PyTorchJob), `render rayjob` with ``--backend rayjob`` (a KubeRay
RayJob). Heavy imports happen in the handler so ``kubetrain --help``
stays fast.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kubetrain.components._shared.backend_options import add_backend_arguments, backend_options
from kubetrain.components.launch_trainjob.cli import (
    add_command_argument,
    add_job_arguments,
    add_training_arguments,
)
from kubetrain.errors import terminal_text

# Mirrors kubetrain.render.pod.DEFAULT_DATA_DIR; kept literal so --help imports nothing heavy.
DEFAULT_DATA_DIR = "/mnt/shared/data"


def register(subparsers: argparse._SubParsersAction) -> None:
    render = subparsers.add_parser(
        "render",
        help="print, as YAML, the objects a launch would create, our runtimes or our RBAC",
        description=(
            "Print, as multi-document YAML, the objects `kubetrain launch` would create on a "
            "cluster, or the runtimes and RBAC the steps need there, without contacting one; "
            "pipe it to `kubectl apply -f -`."
        ),
    )
    kinds = render.add_subparsers(
        dest="kind",
        metavar="KIND",
        required=True,
        help="what to render: trainjob, pytorchjob, rayjob, runtimes, rbac",
    )
    trainjob = kinds.add_parser(
        "trainjob",
        help="a TrainJob (or, with --backend job, an Indexed Job + headless Service)",
        description=(
            "Print the TrainJob `kubetrain launch --backend trainer` would submit, with the same "
            "options: valid against the Kubeflow Trainer v2.3 CRD, or the v2.1 form "
            "(podTemplateOverrides) with --trainer-version 2.1. With --backend job, print the "
            "headless Service and Indexed Job used on clusters without the Trainer. With "
            "--script, the script's ConfigMap comes first and the command's mention of the "
            "script is rewritten to /workspace/<file>, where it is mounted."
        ),
    )
    add_backend_arguments(trainjob, creates=True)
    add_job_arguments(trainjob)
    add_training_arguments(trainjob)
    add_command_argument(trainjob)
    _set_default(
        trainjob,
        "backend",
        "trainer",
        "what to render: trainer (a Kubeflow Trainer TrainJob, default), job (Indexed Job + "
        "headless Service, for clusters without the Trainer) or pytorchjob (a Training "
        "Operator v1 PyTorchJob)",
    )
    _set_default(
        trainjob,
        "trainer_version",
        "auto",
        "TrainJob form: 2.2/2.3 use runtimePatches, 2.1 podTemplateOverrides; default auto, "
        "which renders 2.3 (render never contacts a cluster)",
    )
    _set_default(
        trainjob,
        "data",
        DEFAULT_DATA_DIR,
        f"dataset folder inside the pods; default {DEFAULT_DATA_DIR} (the shared volume our "
        "runtimes mount)",
    )
    _set_default(
        trainjob,
        "checkpoint_dir",
        "",
        "where rank 0 writes checkpoints inside the pods; default "
        "/mnt/shared/checkpoints/<job name>",
    )
    trainjob.set_defaults(handler=run)
    _register_pytorchjob(kinds)
    _register_manifests(kinds)


def _register_pytorchjob(kinds: argparse._SubParsersAction) -> None:
    pytorchjob = kinds.add_parser(
        "pytorchjob",
        help="a Training Operator v1 PyTorchJob (kubeflow.org/v1)",
        description=(
            "Print the PyTorchJob `kubetrain launch --backend pytorchjob` would submit to a "
            "cluster running Kubeflow Training Operator 1.8/1.9, with the same options: a "
            "Master and nodes - 1 Workers running container pytorch (--nodes MIN:MAX: MAX "
            "Workers and an elasticPolicy), valid against the operator's v1.9 CRD. With "
            "--script, the script's ConfigMap comes first."
        ),
    )
    add_backend_arguments(pytorchjob, creates=True)
    add_job_arguments(pytorchjob)
    add_training_arguments(pytorchjob)
    add_command_argument(pytorchjob)
    _set_default(pytorchjob, "backend", "pytorchjob", "pytorchjob (the only one here)")
    _set_default(
        pytorchjob,
        "data",
        DEFAULT_DATA_DIR,
        f"dataset folder inside the pods; default {DEFAULT_DATA_DIR} (mount the shared volume "
        "there with --volume)",
    )
    _set_default(
        pytorchjob,
        "checkpoint_dir",
        "",
        "where rank 0 writes checkpoints inside the pods; default "
        "/mnt/shared/checkpoints/<job name>",
    )
    pytorchjob.set_defaults(handler=run_pytorchjob)
    _register_rayjob(kinds)


def _register_rayjob(kinds: argparse._SubParsersAction) -> None:
    rayjob = kinds.add_parser(
        "rayjob",
        help="a KubeRay RayJob (ray.io/v1): a Ray Train program on a RayCluster",
        description=(
            "Print the RayJob `kubetrain launch --backend rayjob` would submit to a cluster "
            "running KubeRay 1.7, with the same options: the command is the Ray job's "
            "entrypoint (its driver, run once on the head, by KubeRay's submitter Job), on a "
            "RayCluster of a head (no training work) and one worker group of --nodes pods, "
            "each offering --procs-per-node CPUs (and its GPUs) to Ray Train; valid against "
            "KubeRay's v1.7.0 CRD. With --script, the script's ConfigMap comes first."
        ),
    )
    add_backend_arguments(rayjob, creates=True)
    add_job_arguments(rayjob)
    add_training_arguments(rayjob)
    add_command_argument(rayjob)
    _set_default(rayjob, "backend", "rayjob", "rayjob (the only one here)")
    _set_default(
        rayjob,
        "data",
        DEFAULT_DATA_DIR,
        f"dataset folder inside the pods; default {DEFAULT_DATA_DIR} (mount the shared volume "
        "there with --volume)",
    )
    _set_default(
        rayjob,
        "checkpoint_dir",
        "",
        "where rank 0 writes checkpoints inside the pods; default "
        "/mnt/shared/checkpoints/<job name>",
    )
    rayjob.set_defaults(handler=run_rayjob)


def _register_manifests(kinds: argparse._SubParsersAction) -> None:
    runtimes = kinds.add_parser(
        "runtimes",
        help="our Kubeflow Trainer ClusterTrainingRuntimes",
        description=(
            "Print our ClusterTrainingRuntimes (torch-ddp-cpu, torch-ddp-gpu, torch-fsdp-gpu, "
            "torch-ddp-gpu-gang; Kubeflow Trainer v2.3) for "
            "`kubetrain render runtimes | kubectl apply -f -`. They mount the PVC "
            "kubetrain-shared at /mnt/shared: create it in the namespace the jobs run in."
        ),
    )
    runtimes.set_defaults(handler=run_runtimes)
    rbac = kinds.add_parser(
        "rbac",
        help="the ServiceAccount and least-privilege RBAC the steps run with",
        description=(
            "Print ServiceAccount kubetrain, the Role and ClusterRole with exactly the rights the "
            "steps use, and their bindings in --namespace, for "
            "`kubetrain render rbac --namespace NS | kubectl apply -f -`. They bind kubetrain "
            "(the Argo workflow's account) "
            "and the accounts KFP runs steps as when a run names none: pipeline-runner "
            "(standalone KFP, namespace kubeflow) and default-editor (multi-user KFP, the "
            "profile's namespace)."
        ),
    )
    rbac.add_argument(
        "--namespace",
        default="default",
        help="namespace the steps and their jobs run in (default: default; standalone KFP: "
        "kubeflow; multi-user KFP: the profile's namespace)",
    )
    rbac.add_argument(
        "--service-account",
        action="append",
        default=[],
        metavar="NAME",
        help="also bind this ServiceAccount of --namespace (repeatable)",
    )
    rbac.add_argument(
        "--no-kfp-accounts",
        action="store_true",
        help="bind kubetrain (and --service-account) only, not KFP's pipeline-runner and "
        "default-editor",
    )
    rbac.set_defaults(handler=run_rbac)


def _set_default(parser: argparse.ArgumentParser, dest: str, default: Any, help_text: str) -> None:
    """Give a shared launch option render's default, with help that says so."""
    (action,) = [a for a in parser._actions if a.dest == dest]
    action.default = default
    action.help = help_text
    parser.set_defaults(**{dest: default})


def run(args: argparse.Namespace) -> int:
    documents = render_documents(args)
    if args.trainer_version in ("2.1", "2.2") and (args.cpu or args.memory or args.gpu):
        # Trainer <= 2.2 replaces the runtime's resources with the TrainJob's (kubeflow/trainer
        # v2.2.0 pkg/runtime/core/trainingruntime.go); launch merges the runtime's in first,
        # render cannot read it.
        print(
            f"kubetrain render: warning: Trainer {terminal_text(args.trainer_version)} replaces "
            "the runtime's resources with these; `kubetrain launch` merges the runtime's in "
            "first (it reads the runtime), this offline render does not",
            file=sys.stderr,
        )
    return _print_documents(documents)


def run_pytorchjob(args: argparse.Namespace) -> int:
    return _run_one_kind(args, "pytorchjob", "a PyTorchJob")


def run_rayjob(args: argparse.Namespace) -> int:
    return _run_one_kind(args, "rayjob", "a RayJob")


def _run_one_kind(args: argparse.Namespace, backend: str, kind: str) -> int:
    """`render pytorchjob|rayjob`: only the backend that renders that kind."""
    from kubetrain.errors import InvalidInput

    if args.backend != backend:
        raise InvalidInput(
            "--backend",
            f"{args.backend!r} is not {kind}",
            f"drop --backend, or use `kubetrain render trainjob --backend {args.backend}`",
        )
    return _print_documents(render_documents(args))


def run_runtimes(args: argparse.Namespace) -> int:
    from kubetrain.render.manifests import runtime_manifests

    return _print_documents(runtime_manifests())


def run_rbac(args: argparse.Namespace) -> int:
    from kubetrain.render.manifests import (
        KFP_SERVICE_ACCOUNTS,
        STEPS_SERVICE_ACCOUNT,
        rbac_manifests,
    )

    kfp = () if args.no_kfp_accounts else KFP_SERVICE_ACCOUNTS
    accounts = (STEPS_SERVICE_ACCOUNT, *kfp, *args.service_account)
    return _print_documents(rbac_manifests(args.namespace, accounts))


def _print_documents(documents: list[dict[str, Any]]) -> int:
    import yaml

    text = yaml.dump_all(documents, Dumper=_block_dumper(), sort_keys=False)
    # each line escaped: a user's value (an env value, a label) may hold a control character
    print("\n".join(terminal_text(line) for line in text.split("\n")), end="")
    return 0


def render_documents(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The objects `kubetrain launch` with these options would create, in creation order: the
    launch step's own request and plan (``render_launch``), not a copy of them."""
    from kubetrain.components.launch_trainjob.cli import request_from_args
    from kubetrain.components.launch_trainjob.launch import render_launch

    return render_launch(request_from_args(args), args.backend, backend_options(args))


def _represent_str(dumper: Any, text: str) -> Any:
    """Multi-line strings (a shipped script) as literal blocks, readable in the YAML."""
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


def _block_dumper() -> type:
    import yaml

    class BlockDumper(yaml.SafeDumper):
        pass

    BlockDumper.add_representer(str, _represent_str)
    return BlockDumper
