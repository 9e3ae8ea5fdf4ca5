"""`kubetrain launch`: start a distributed job (our trainer, or any command after `--`).

The options are shared with `kubetrain render` and turned into a ``LaunchRequest`` by one
function (``request_from_args``), so what is rendered is exactly what would be launched.
"""

from __future__ import annotations

import argparse
import sys

from kubetrain.components._shared.backend_options import add_backend_arguments, backend_options
from kubetrain.components._shared.flags import add_flag
from kubetrain.components._shared.program import add_program_arguments, program_from_args
from kubetrain.components._shared.step_outputs import (
    add_output_parameters_argument,
    check_output_parameters,
    write_output_parameters,
)
from kubetrain.errors import terminal_text
from kubetrain.jobspec import AUTO_PROCS, DEFAULT_RUNTIME
from kubetrain.rules import DEFAULT_ZERO_STAGE

#: The files ``--output-parameters`` receives (the Argo template's output parameters).
OUTPUT_PARAMETERS = ("job_name", "checkpoint_dir")


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
        "--nodes",
        default="2",
        metavar="N|MIN:MAX",
        help="number of nodes (pods on a cluster); MIN:MAX runs an elastic job that goes on "
        "while at least MIN nodes remain (backends local and pytorchjob; needs --max-restarts); "
        "default 2",
    )
    job.add_argument(
        "--procs-per-node",
        default=AUTO_PROCS,
        metavar="N|auto",
        help="processes started on each node (torchrun's PET_NPROC_PER_NODE, mpirun's slots); "
        "default auto: one per GPU with --gpu, else 1 (--launcher mpi without --gpu needs a "
        "number)",
    )
    job.add_argument(
        "--launcher",
        default="torchrun",
        metavar="torchrun|mpi|ray",
        help="what starts the processes: torchrun on every node (default); mpi: mpirun, "
        "from a launcher, starts --procs-per-node ranks of the program on every node from a "
        "hostfile, as Kubeflow Trainer's MPI runtime does (backends trainer and local; the "
        "default --runtime becomes kubetrain-deepspeed-mpi), a command is then one rank's "
        "program, e.g. `-- python train.py`; ray: a Ray cluster of a head and --nodes worker "
        "nodes runs the command once as a Ray job (your Ray Train script; ours: "
        "--nodes x --procs-per-node TorchTrainer workers), as a KubeRay RayJob does (backend "
        "rayjob, which always runs ray, and local)",
    )
    job.add_argument(
        "--image",
        default=None,
        help="container image of the nodes; default $KUBETRAIN_TRAINER_IMAGE or ours",
    )
    job.add_argument(
        "--runtime",
        default=DEFAULT_RUNTIME,
        help=f"Kubeflow Trainer runtime the TrainJob refers to; default {DEFAULT_RUNTIME}",
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
        help="environment variable for every node; repeatable, or a JSON object",
    )
    job.add_argument(
        "--volume",
        action="append",
        default=[],
        metavar="NAME=CLAIM:/PATH[:ro]",
        help="mount PVC CLAIM at /PATH in every node (shared data, checkpoints); repeatable, or "
        "a JSON list",
    )
    job.add_argument(
        "--node-selector",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="schedule nodes only where this node label matches; repeatable, or a JSON object",
    )
    job.add_argument(
        "--toleration",
        action="append",
        default=[],
        metavar="KEY[=VALUE][:EFFECT]",
        help="tolerate a taint (no VALUE: operator Exists), e.g. nvidia.com/gpu:NoSchedule; "
        "repeatable, or a JSON list",
    )
    job.add_argument(
        "--shared-pvc",
        default="",
        metavar="CLAIM",
        help="PersistentVolumeClaim this step has mounted at --shared-mount, as the nodes will "
        "(cluster backends): a local --data outside it is copied onto it, and checkpoints "
        "default to <mount>/checkpoints/<job>",
    )
    job.add_argument(
        "--shared-mount",
        default="/mnt/shared",
        metavar="PATH",
        help="where --shared-pvc is mounted, here and in the nodes; default /mnt/shared",
    )
    job.add_argument(
        "--storage",
        default="",
        metavar="URL",
        help="object storage (e.g. s3://bucket/prefix): checkpoints default to "
        "URL/checkpoints/<run name or job>",
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
        help="label on the job object; repeatable, or a JSON object",
    )
    job.add_argument(
        "--pod-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="label on every node pod; repeatable, or a JSON object",
    )
    add_flag(job, "--suspend", "create the job suspended (resume it later)")
    job.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="after a node fails, restart every node up to N times (our trainer resumes from "
        "the newest checkpoint); on a cluster the runtime's JobSet failurePolicy.maxRestarts "
        "does this and must be at least N. With --nodes MIN:MAX: torchrun's --max-restarts "
        "(each lost or joining node restarts the others at the new size); default 0",
    )
    job.add_argument(
        "--active-deadline-seconds",
        type=_optional_seconds,
        default=None,
        help="fail the job after this many seconds running; default (or empty): no deadline",
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
        help="dataset folder written by `kubetrain prep`: a path or an s3:// (fsspec) URL; "
        "locally a relative path is taken from this folder (the nodes get it absolute), on a "
        "cluster it must be absolute in the nodes",
    )
    training.add_argument(
        "--checkpoint-dir",
        default="",
        help="where rank 0 writes checkpoints, a path or an s3:// (fsspec) URL, relative as "
        "--data; default: the backend's job folder",
    )
    training.add_argument(
        "--strategy", default="ddp", help="ddp, fsdp (FSDP2) or deepspeed; default ddp"
    )
    training.add_argument(
        "--zero-stage",
        type=int,
        default=DEFAULT_ZERO_STAGE,
        metavar="1|2|3",
        help="with --strategy deepspeed: the ZeRO stage, what the ranks shard (1: optimizer "
        "state, 2: and gradients, 3: and parameters); default 2",
    )
    training.add_argument(
        "--deepspeed-config",
        default="",
        metavar="FILE|JSON",
        help="with --strategy deepspeed: your DeepSpeed config, a JSON file or its JSON text; "
        "its settings win, ours (--zero-stage, --batch-size, --lr...) fill what it leaves out. "
        "A file here reaches the nodes as its text; in a pipeline step, a path in the step's "
        "pod",
    )
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
    training.add_argument(
        "--keep-checkpoints",
        type=int,
        default=3,
        metavar="N",
        help="keep the newest N epoch checkpoints (and the one LATEST names), deleting older "
        "ones as training goes; 0 keeps all; default 3",
    )


def add_command_argument(parser: argparse.ArgumentParser) -> None:
    add_program_arguments(parser, "the program every node runs instead of our trainer")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "launch",
        help="start a distributed training job and print its name",
        description=(
            "Start a distributed training job and return at once; the job name is the last line "
            "printed. Without a command, runs our trainer (torchrun -m kubetrain.train) on --data. "
            "After '--', runs any command once per node with the PET_* environment Kubeflow "
            "Trainer injects, e.g. "
            "`kubetrain launch --nodes 2 --procs-per-node 2 -- torchrun train.py`; locally with "
            "your PATH first, so `torchrun` is your activated venv's. With --launcher mpi, "
            "mpirun starts the command once per process instead, e.g. "
            "`kubetrain launch --launcher mpi --procs-per-node 2 -- python train.py`. With "
            "--launcher ray (or --backend rayjob) the command is a Ray job's entrypoint, run "
            "once on the Ray cluster's head, e.g. "
            "`kubetrain launch --launcher ray --nodes 2 -- python ray_train.py`."
        ),
    )
    add_backend_arguments(parser, creates=True)
    add_job_arguments(parser)
    add_training_arguments(parser)
    add_output_parameters_argument(parser)
    add_command_argument(parser)
    parser.set_defaults(handler=run)


def _optional_seconds(text: str) -> int | None:
    """Seconds, or none for an empty text (what an Argo parameter's default can carry)."""
    if not text.strip():
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None


def request_from_args(args: argparse.Namespace):
    """The ``LaunchRequest`` the options describe: what `launch` creates and `render` prints."""
    from kubetrain.components.launch_trainjob.launch import (
        LaunchRequest,
        TrainingOptions,
        initializer,
        parse_items,
        parse_pairs,
        parse_toleration,
        parse_volume,
        shared_volume,
    )
    from kubetrain.jobspec import Resources

    return LaunchRequest(
        training=TrainingOptions(
            data_dir=args.data,
            checkpoint_dir=args.checkpoint_dir,
            strategy=args.strategy,
            model=args.model,
            epochs=args.epochs,
            batch_size=args.batch_size,
            lr=args.lr,
            checkpoint_every=args.checkpoint_every,
            keep_checkpoints=args.keep_checkpoints,
            zero_stage=args.zero_stage,
            deepspeed_config=args.deepspeed_config,
        ),
        command=program_from_args(args),
        name=args.name,
        run_name=args.run_name,
        nodes=args.nodes,
        procs_per_node=args.procs_per_node,
        image=args.image or "",
        runtime=args.runtime,
        runtime_kind=args.runtime_kind,
        resources=Resources(cpu=args.cpu, memory=args.memory, gpu=args.gpu),
        env=parse_pairs(args.env, "--env"),
        volumes=tuple(parse_volume(v) for v in parse_items(args.volume, "--volume")),
        shared_volume=shared_volume(args.shared_pvc, args.shared_mount),
        labels=parse_pairs(args.label, "--label"),
        pod_labels=parse_pairs(args.pod_label, "--pod-label"),
        node_selector=parse_pairs(args.node_selector, "--node-selector"),
        tolerations=tuple(
            parse_toleration(t) for t in parse_items(args.toleration, "--toleration")
        ),
        service_account=args.service_account,
        storage_url=args.storage,
        storage_secret=args.storage_secret,
        suspend=args.suspend,
        max_restarts=args.max_restarts,
        active_deadline_seconds=args.active_deadline_seconds,
        dataset_initializer=initializer(args.dataset_uri, args.dataset_secret),
        model_initializer=initializer(args.model_uri, args.model_secret),
        script=args.script,
        launcher=args.launcher,
    )


def run(args: argparse.Namespace) -> int:
    from kubetrain.components.launch_trainjob.launch import launch

    # Checked before the job is created: found only when the outputs are written, a bad
    # folder would fail a step whose job already runs.
    check_output_parameters(args.output_parameters, OUTPUT_PARAMETERS)
    result = launch(request_from_args(args), backend=args.backend, options=backend_options(args))
    if result.checkpoint_dir:  # stdout is the job name alone: JOB=$(kubetrain launch ...)
        print(f"checkpoints: {terminal_text(result.checkpoint_dir)}", file=sys.stderr)
    write_output_parameters(
        args.output_parameters,
        {"job_name": result.job_name, "checkpoint_dir": result.checkpoint_dir},
    )
    print(terminal_text(result.job_name))
    return 0
