"""`kubetrain launch`: start a distributed job (our trainer, or any command after `--`)."""

from __future__ import annotations

import argparse

from kubetrain.errors import InvalidInput


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the job itself, shared by every kind of launch."""
    parser.add_argument(
        "--backend",
        default="local",
        help="where the job runs: 'local' (processes on this machine, default)",
    )
    parser.add_argument(
        "--name",
        default="",
        help="job name (RFC 1035, at most 63 characters); default: derived from "
        "--run-name, else random",
    )
    parser.add_argument(
        "--run-name",
        default="",
        help="pipeline run this job belongs to; the job name is derived from it, so "
        "a retried step finds the same job",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=2,
        help="number of nodes (pods on a cluster, process groups locally); default 2",
    )
    parser.add_argument(
        "--procs-per-node",
        type=int,
        default=1,
        help="processes torchrun starts on each node (PET_NPROC_PER_NODE); default 1",
    )
    parser.add_argument(
        "--image",
        default=None,
        help="container image of the nodes (cluster backends; recorded locally); "
        "default $KUBETRAIN_TRAINER_IMAGE or ours",
    )
    parser.add_argument(
        "--runtime",
        default="torch-distributed",
        help="Kubeflow Trainer ClusterTrainingRuntime to use; default torch-distributed",
    )
    parser.add_argument(
        "--cpu", default="", help="CPU per node as a Kubernetes quantity, e.g. 2 or 500m"
    )
    parser.add_argument(
        "--memory", default="", help="memory per node as a Kubernetes quantity, e.g. 4Gi"
    )
    parser.add_argument("--gpu", type=int, default=0, help="GPUs per node; default 0")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment variable for every node; repeatable",
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
    add_job_arguments(parser)
    training = parser.add_argument_group("our trainer (used when no command is given)")
    training.add_argument("--data", default="", help="dataset folder written by `kubetrain prep`")
    training.add_argument(
        "--checkpoint-dir",
        default="",
        help="where rank 0 writes checkpoints; default: the backend's job folder",
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
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="-- CMD [ARGS...]: the program every node runs instead of our trainer",
    )
    parser.set_defaults(handler=run)


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInput(
                "--env", f"{pair!r} is not KEY=VALUE", "write it like --env NAME=value"
            )
        env[key] = value
    return env


def run(args: argparse.Namespace) -> int:
    from kubetrain.components.launch_trainjob.launch import (
        TrainingOptions,
        launch_job,
        launch_training,
        resolve_job_name,
    )
    from kubetrain.images import TRAINER_IMAGE
    from kubetrain.jobspec import Resources, RuntimeRef, TrainJobSpec

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    resources = Resources(cpu=args.cpu, memory=args.memory, gpu=args.gpu)
    env = parse_env(args.env)
    image = args.image or TRAINER_IMAGE
    if command:
        spec = TrainJobSpec(
            name=resolve_job_name(args.name, args.run_name),
            command=tuple(command[:1]),
            args=tuple(command[1:]),
            image=image,
            env=env,
            num_nodes=args.nodes,
            procs_per_node=args.procs_per_node,
            resources_per_node=resources,
            runtime=RuntimeRef(name=args.runtime),
        )
        name = launch_job(spec, backend=args.backend)
    else:
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
        result = launch_training(
            options,
            backend=args.backend,
            job_name=args.name,
            run_name=args.run_name,
            nodes=args.nodes,
            procs_per_node=args.procs_per_node,
            image=image,
            runtime=args.runtime,
            resources=resources,
            env=env,
        )
        print(f"checkpoints: {result.checkpoint_dir}")
        name = result.job_name
    print(name)
    return 0
