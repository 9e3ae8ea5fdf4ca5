"""`kubetrain launch`: start a distributed job (our trainer, or any command after `--`).

The job options defined here are shared with `kubetrain render`, so what is rendered is
exactly what would be launched.
"""

from __future__ import annotations

import argparse

from kubetrain.components._shared.step_outputs import (
    add_output_parameters_argument,
    write_output_parameters,
)
from kubetrain.errors import InvalidInput


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        default="local",
        help="where the job runs: local (processes on this machine, default), trainer (a "
        "Kubeflow Trainer TrainJob) or job (Indexed Job + headless Service, no Trainer needed)",
    )
    parser.add_argument(
        "--namespace", default="default", help="Kubernetes namespace (cluster backends)"
    )
    parser.add_argument(
        "--trainer-version",
        default="auto",
        help="TrainJob form: 2.2/2.3 use runtimePatches, 2.1 podTemplateOverrides; "
        "default auto (read from the CRD on the cluster)",
    )


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the job itself, shared by every kind of launch and by render."""
    job = parser.add_argument_group("the job")
    job.add_argument(
        "--name",
        default="",
        help="job name (RFC 1035, at most 63 characters); default: derived from --run-name, "
        "else random",
    )
    job.add_argument(
        "--run-name",
        default="",
        help="pipeline run this job belongs to; the job name is derived from it, so a retried "
        "step finds the same job",
    )
    job.add_argument(
        "--nodes", type=int, default=2, help="number of nodes (pods on a cluster); default 2"
    )
    job.add_argument(
        "--procs-per-node",
        type=int,
        default=1,
        help="processes torchrun starts on each node (PET_NPROC_PER_NODE); default 1",
    )
    job.add_argument(
        "--image",
        default=None,
        help="container image of the nodes; default $KUBETRAIN_TRAINER_IMAGE or ours",
    )
    job.add_argument(
        "--runtime",
        default="torch-distributed",
        help="Kubeflow Trainer runtime the TrainJob refers to; default torch-distributed",
    )
    job.add_argument(
        "--runtime-kind",
        default="ClusterTrainingRuntime",
        help="ClusterTrainingRuntime (default) or TrainingRuntime (namespaced)",
    )
    job.add_argument("--cpu", default="", help="CPU per node as a Kubernetes quantity, e.g. 2")
    job.add_argument("--memory", default="", help="memory per node, e.g. 4Gi")
    job.add_argument("--gpu", type=int, default=0, help="GPUs per node; default 0")
    job.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment variable for every node; repeatable",
    )
    job.add_argument(
        "--volume",
        action="append",
        default=[],
        metavar="NAME=CLAIM:/PATH[:ro]",
        help="mount PVC CLAIM at /PATH in every node (shared data, checkpoints); repeatable",
    )
    job.add_argument(
        "--node-selector",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="schedule nodes only where this node label matches; repeatable",
    )
    job.add_argument(
        "--toleration",
        action="append",
        default=[],
        metavar="KEY[=VALUE][:EFFECT]",
        help="tolerate a taint (no VALUE: operator Exists), e.g. nvidia.com/gpu:NoSchedule; "
        "repeatable",
    )
    job.add_argument("--service-account", default="", help="ServiceAccount the nodes run as")
    job.add_argument(
        "--storage-secret",
        default="",
        metavar="NAME",
        help="Secret holding the object-storage endpoint and keys (AWS_ENDPOINT_URL, "
        "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION) for s3:// --data and "
        "--checkpoint-dir; the nodes get its keys as environment variables, by reference only. "
        "Ignored by the local backend, whose nodes inherit this environment",
    )
    job.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="label on the job object; repeatable",
    )
    job.add_argument(
        "--pod-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="label on every node pod; repeatable",
    )
    job.add_argument(
        "--suspend", action="store_true", help="create the job suspended (resume it later)"
    )
    job.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="after a node fails, restart every node up to N times (our trainer resumes from "
        "the newest checkpoint); on a cluster the runtime's JobSet failurePolicy.maxRestarts "
        "does this and must be at least N; default 0",
    )
    job.add_argument(
        "--active-deadline-seconds",
        type=int,
        default=None,
        help="fail the job after this many seconds running",
    )
    job.add_argument(
        "--dataset-uri",
        default="",
        help="dataset for the Trainer's initializer to fetch, e.g. hf://org/name or s3://b/p",
    )
    job.add_argument(
        "--dataset-secret", default="", help="Secret holding the dataset's credentials"
    )
    job.add_argument("--model-uri", default="", help="model for the Trainer's initializer")
    job.add_argument("--model-secret", default="", help="Secret holding the model's credentials")
    job.add_argument(
        "--script",
        default="",
        help="local training script to ship with the job (a ConfigMap mounted at /workspace "
        "on a cluster; at most 1 MiB); on a cluster, command arguments naming it, e.g. "
        "`-- torchrun train.py`, run /workspace/<file>",
    )


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    training = parser.add_argument_group("our trainer (used when no command is given)")
    training.add_argument(
        "--data",
        default="",
        help="dataset folder written by `kubetrain prep`: a path or an s3:// (fsspec) URL",
    )
    training.add_argument(
        "--checkpoint-dir",
        default="",
        help="where rank 0 writes checkpoints, a path or an s3:// (fsspec) URL; default: the "
        "backend's job folder",
    )
    training.add_argument("--strategy", default="ddp", help="ddp or fsdp (FSDP2); default ddp")
    training.add_argument("--model", default="mlp", help="mlp, cnn or package.module:callable")
    training.add_argument("--epochs", type=int, default=10, help="training epochs; default 10")
    training.add_argument(
        "--batch-size", type=int, default=32, help="batch size per process; default 32"
    )
    training.add_argument("--lr", type=float, default=1e-3, help="learning rate; default 0.001")
    training.add_argument(
        "--checkpoint-every",
        type=int,
        default=1,
        help="checkpoint every N epochs (the last one always); default 1",
    )


def add_command_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="-- CMD [ARGS...]: the program every node runs instead of our trainer",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "launch",
        help="start a distributed training job and print its name",
        description=(
            "Start a distributed training job and return at once; the job name is the last line "
            "printed. Without a command, runs our trainer (torchrun -m kubetrain.train) on --data. "
            "After '--', runs any command once per node with the PET_* environment Kubeflow "
            "Trainer injects, e.g. "
            "`kubetrain launch --nodes 2 --procs-per-node 2 -- torchrun train.py`."
        ),
    )
    add_backend_arguments(parser)
    add_job_arguments(parser)
    add_training_arguments(parser)
    add_output_parameters_argument(parser)
    add_command_argument(parser)
    parser.set_defaults(handler=run)


def parse_pairs(pairs: list[str], option: str) -> dict[str, str]:
    parsed = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInput(
                option, f"{pair!r} is not KEY=VALUE", f"write it like {option} NAME=value"
            )
        parsed[key] = value
    return parsed


def parse_volume(text: str):
    from kubetrain.jobspec import Volume

    name, sep, rest = text.partition("=")
    claim, colon, path = rest.partition(":")
    read_only = path.endswith(":ro")
    path = path.removesuffix(":ro")
    if not sep or not colon or not name or not claim or not path:
        raise InvalidInput(
            "--volume", f"{text!r} is not NAME=CLAIM:/PATH", "write it like shared=my-pvc:/mnt"
        )
    return Volume(name=name, claim_name=claim, mount_path=path, read_only=read_only)


def parse_toleration(text: str):
    from kubetrain.jobspec import Toleration

    taint, _, effect = text.partition(":")
    key, sep, value = taint.partition("=")
    return Toleration(key=key, operator="Equal" if sep else "Exists", value=value, effect=effect)


def job_spec_from_args(args: argparse.Namespace, name: str, command: list[str]):
    """The TrainJobSpec the job options describe, running ``command``."""
    from kubetrain.images import TRAINER_IMAGE
    from kubetrain.jobspec import Initializer, Resources, RuntimeRef, TrainJobSpec

    return TrainJobSpec(
        name=name,
        command=tuple(command[:1]),
        args=tuple(command[1:]),
        image=args.image or TRAINER_IMAGE,
        env=parse_pairs(args.env, "--env"),
        num_nodes=args.nodes,
        procs_per_node=args.procs_per_node,
        resources_per_node=Resources(cpu=args.cpu, memory=args.memory, gpu=args.gpu),
        runtime=RuntimeRef(name=args.runtime, kind=args.runtime_kind),
        volumes=tuple(parse_volume(v) for v in args.volume),
        labels=parse_pairs(args.label, "--label"),
        pod_labels=parse_pairs(args.pod_label, "--pod-label"),
        node_selector=parse_pairs(args.node_selector, "--node-selector"),
        tolerations=tuple(parse_toleration(t) for t in args.toleration),
        service_account=args.service_account,
        storage_secret=args.storage_secret,
        suspend=args.suspend,
        max_restarts=args.max_restarts,
        active_deadline_seconds=args.active_deadline_seconds,
        dataset_initializer=Initializer(args.dataset_uri, args.dataset_secret)
        if args.dataset_uri
        else None,
        model_initializer=Initializer(args.model_uri, args.model_secret)
        if args.model_uri
        else None,
        script=args.script,
    )


def spec_from_args(args: argparse.Namespace):
    """The spec `launch` would submit for these arguments, and the trainer's checkpoint
    folder (empty when a user command runs instead of our trainer)."""
    from kubetrain.backends import get_backend
    from kubetrain.components.launch_trainjob.launch import (
        TRAINER_COMMAND,
        TrainingOptions,
        resolve_job_name,
    )

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    name = resolve_job_name(args.name, args.run_name)
    if command:
        return job_spec_from_args(args, name, command).validate(), ""
    options = TrainingOptions(
        data_dir=args.data,
        checkpoint_dir=args.checkpoint_dir,
        strategy=args.strategy,
        model=args.model,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        checkpoint_every=args.checkpoint_every,
    )
    options.validate()
    # Ask the backend only when needed: render passes a folder and must not need a cluster.
    checkpoint_dir = options.checkpoint_dir or get_backend(
        args.backend, backend_options(args)
    ).default_checkpoint_dir(name)
    command = [*TRAINER_COMMAND, *options.trainer_args(checkpoint_dir)]
    return job_spec_from_args(args, name, command).validate(), checkpoint_dir


def backend_options(args: argparse.Namespace):
    from kubetrain.backends import BackendOptions

    return BackendOptions(namespace=args.namespace, trainer_version=args.trainer_version)


def run(args: argparse.Namespace) -> int:
    from kubetrain.components.launch_trainjob.launch import check_local_trainer, launch_job

    spec, checkpoint_dir = spec_from_args(args)
    if args.backend == "local" and checkpoint_dir:
        # Our trainer's nodes run here: what would fail each of them is refused now.
        check_local_trainer(args.data, checkpoint_dir, args.model)
    name = launch_job(spec, backend=args.backend, options=backend_options(args))
    if checkpoint_dir:
        print(f"checkpoints: {checkpoint_dir}")
    write_output_parameters(
        args.output_parameters, {"job_name": name, "checkpoint_dir": checkpoint_dir}
    )
    print(name)
    return 0
