"""`kubetrain render trainjob`: print, as YAML, the objects `kubetrain launch` would create.

It takes exactly launch's options (the same argument functions, and the same road:
``request_from_args`` then ``render_launch``, which plans the job as ``launch`` does), with
defaults that make sense without a cluster: ``--backend trainer``, ``--trainer-version auto``
renders the newest form (2.3; render never contacts a cluster) and ``--data`` points into the
shared volume our runtimes mount. Heavy imports happen in the handler so ``kubetrain --help``
stays fast.
"""

from __future__ import annotations

import argparse
from typing import Any

from kubetrain.components._shared.backend_options import add_backend_arguments, backend_options
from kubetrain.components.launch_trainjob.cli import (
    add_command_argument,
    add_job_arguments,
    add_training_arguments,
)

# Mirrors kubetrain.render.pod.DEFAULT_DATA_DIR; kept literal so --help imports nothing heavy.
DEFAULT_DATA_DIR = "/mnt/shared/data"


def register(subparsers: argparse._SubParsersAction) -> None:
    render = subparsers.add_parser(
        "render",
        help="print the Kubernetes objects a launch would create, as YAML",
        description=(
            "Print, as multi-document YAML, the objects `kubetrain launch` would create on a "
            "cluster, without contacting one; pipe it to `kubectl apply -f -`."
        ),
    )
    kinds = render.add_subparsers(
        dest="kind", metavar="KIND", required=True, help="what to render: trainjob"
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
        "what to render: trainer (a Kubeflow Trainer TrainJob, default) or job (Indexed Job + "
        "headless Service, for clusters without the Trainer)",
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


def _set_default(parser: argparse.ArgumentParser, dest: str, default: Any, help_text: str) -> None:
    """Give a shared launch option render's default, with help that says so."""
    (action,) = [a for a in parser._actions if a.dest == dest]
    action.default = default
    action.help = help_text
    parser.set_defaults(**{dest: default})


def run(args: argparse.Namespace) -> int:
    import yaml

    print(yaml.dump_all(render_documents(args), Dumper=_block_dumper(), sort_keys=False), end="")
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
