"""`kubetrain render trainjob`: print, as YAML, the objects `kubetrain launch` would create.

It takes exactly launch's options (the same argument functions), with defaults that make
sense without a cluster: ``--backend trainer``, ``--trainer-version auto`` renders the newest
form (2.3; render never contacts a cluster) and ``--data`` points into the shared volume our
runtimes mount. Heavy imports happen in the handler so ``kubetrain --help`` stays fast.
"""

from __future__ import annotations

import argparse
from typing import Any

from kubetrain.components.launch_trainjob.cli import (
    add_backend_arguments,
    add_command_argument,
    add_job_arguments,
    add_training_arguments,
)
from kubetrain.errors import InvalidInput

RENDERED_BACKENDS = ("trainer", "job")
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
    add_backend_arguments(trainjob)
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
    """The objects to print, in the order to create them (a script's ConfigMap first)."""
    from kubetrain.backends import BackendOptions
    from kubetrain.components.launch_trainjob.cli import spec_from_args
    from kubetrain.components.launch_trainjob.launch import resolve_job_name
    from kubetrain.render import render_indexed_job, render_script_configmap, render_trainjob
    from kubetrain.render.pod import default_checkpoint_dir
    from kubetrain.render.trainjob import LATEST_VERSION

    job_args = argparse.Namespace(**vars(args))
    if args.backend not in RENDERED_BACKENDS:
        raise InvalidInput(
            "backend",
            f"{args.backend!r} has nothing to render",
            "use --backend trainer (a TrainJob) or job (Indexed Job + headless Service)",
        )
    options = BackendOptions(namespace=args.namespace, trainer_version=args.trainer_version)
    options.validate()
    version = LATEST_VERSION if options.trainer_version == "auto" else options.trainer_version
    # Resolve the name first, so the default checkpoint folder and the job agree on it.
    job_args.name = resolve_job_name(args.name, args.run_name)
    job_args.checkpoint_dir = args.checkpoint_dir or default_checkpoint_dir(job_args.name)
    spec, _ = spec_from_args(job_args)

    documents = []
    if spec.script:
        documents.append(render_script_configmap(spec, options.namespace))
    if args.backend == "trainer":
        documents.append(
            render_trainjob(spec, namespace=options.namespace, trainer_version=version)
        )
    else:
        documents.extend(render_indexed_job(spec, namespace=options.namespace))
    return documents


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
