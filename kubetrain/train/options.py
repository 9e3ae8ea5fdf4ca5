"""Command line of ``python -m kubetrain.train``, checked before any process group starts."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

from kubetrain import rules, storage
from kubetrain.artifacts.checkpoint_manifest import refuse_object_storage_for_deepspeed
from kubetrain.errors import InvalidInput, terminal_text
from kubetrain.rules import DEFAULT_ZERO_STAGE, MODEL_FIX, STRATEGIES, ZERO_STAGES, is_model_spec
from kubetrain.train import deepspeed_config

PROG = "kubetrain.train"
#: What runs our trainer on a node; torchrun reads PET_NNODES/PET_NPROC_PER_NODE/PET_NODE_RANK/
#: PET_MASTER_ADDR/PET_MASTER_PORT from the environment the Trainer injects.
TRAINER_COMMAND = ("torchrun", "-m", PROG)
#: One rank of our trainer under ``--launcher mpi``: mpirun starts it once per slot and it
#: reads its rank from OpenMPI's OMPI_COMM_WORLD_* env.
MPI_TRAINER_COMMAND = ("python", "-m", PROG)
#: Our trainer as a Ray job's entrypoint (``--launcher ray``, ``--backend rayjob``): the driver
#: runs once and Ray Train's TorchTrainer starts ``--num-workers`` workers on the Ray cluster.
RAY_TRAINER_COMMAND = ("python", "-m", f"{PROG}.ray")
#: The event files' default folder under the checkpoint folder.
TENSORBOARD_FOLDER = "tensorboard"


@dataclass(frozen=True)
class TrainOptions:
    """Validated options; every rank derives the same ones from the same command line."""

    data: str | None
    dataset: str
    model: str
    strategy: str
    epochs: int
    batch_size: int
    lr: float
    optimizer: str
    grad_accum_steps: int
    clip_grad_norm: float
    checkpoint_dir: str
    checkpoint_every: int
    keep_checkpoints: int
    resume: str
    seed: int
    device: str
    tensorboard_dir: str | None  # None: no event files
    #: deepspeed: the user's config filled with our options (batch_size and grad_accum_steps
    #: above are its micro batch and accumulation steps); None for ddp and fsdp.
    deepspeed_config: dict[str, Any] | None = None


class _OneLineParser(argparse.ArgumentParser):
    """Report usage errors as one line, like every other kubetrain error (rank logs interleave)."""

    def error(self, message: str) -> NoReturn:
        print(terminal_text(f"{self.prog}: error: {message}; see --help"), file=sys.stderr)
        sys.exit(2)


def ray_worker_args(num_workers: int, gpus_per_node: int) -> tuple[str, ...]:
    """The options of ``RAY_TRAINER_COMMAND`` beyond ours: Ray Train's workers (``ScalingConfig
    num_workers``), on GPUs when the nodes have them."""
    return ("--num-workers", str(num_workers), *(("--use-gpu",) if gpus_per_node else ()))


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog=prog,
        description=(
            "Train a classifier with DDP, FSDP2 or DeepSpeed ZeRO. Run it under torchrun for "
            "several processes (topology from the PET_*/torchrun environment), as each rank of "
            "mpirun (from OpenMPI's OMPI_COMM_WORLD_* environment) or directly for one process."
        ),
    )
    add = parser.add_argument
    add(
        "--data",
        metavar="DIR",
        help="prepared dataset folder (written by `kubetrain prep`): a path or an fsspec URL "
        "such as s3://bucket/prefix",
    )
    add(
        "--dataset",
        default="prepared",
        help="prepared (read --data) or package.module:callable returning (x, y) tensors for "
        "(data_dir, split); default: prepared",
    )
    add("--model", default="mlp", help="mlp, cnn or package.module:callable; default: mlp")
    add(
        "--strategy",
        default="ddp",
        choices=STRATEGIES,
        help="ddp (DistributedDataParallel), fsdp (FSDP2 fully_shard) or deepspeed (ZeRO); "
        "default: ddp",
    )
    add(
        "--zero-stage",
        type=int,
        default=None,
        choices=ZERO_STAGES,
        help=f"deepspeed: the ZeRO stage (1 optimizer state, 2 and gradients, 3 and parameters "
        f"sharded), unless --deepspeed-config sets one; default: {DEFAULT_ZERO_STAGE}",
    )
    add(
        "--deepspeed-config",
        default=None,
        metavar="FILE|JSON",
        help="deepspeed: a DeepSpeed JSON config, a file or its text; its settings win, the "
        "options here fill what it leaves out (batch sizes, accumulation, optimizer, clipping, "
        "ZeRO stage; bf16 on a GPU that has it)",
    )
    add(
        "--epochs",
        type=int,
        default=10,
        help="total epochs to reach, counting resumed ones; default: 10",
    )
    add(
        "--batch-size", type=int, default=32, help="samples per process per micro-step; default: 32"
    )
    add("--lr", type=float, default=1e-3, help="learning rate; default: 1e-3")
    add(
        "--optimizer",
        default="adamw",
        choices=("adamw", "sgd"),
        help="adamw, or sgd with momentum 0.9; default: adamw",
    )
    add(
        "--grad-accum-steps",
        type=int,
        default=1,
        help="micro-batches whose gradients are summed before each optimizer step; default: 1",
    )
    add(
        "--clip-grad-norm",
        type=float,
        default=1.0,
        help="clip the global gradient norm to this value, 0 disables; default: 1.0",
    )
    add(
        "--checkpoint-dir",
        required=True,
        metavar="DIR",
        help="folder for checkpoints: a path or an fsspec URL such as s3://bucket/prefix; "
        "with several nodes, storage they all share",
    )
    add(
        "--checkpoint-every",
        type=int,
        default=1,
        metavar="N",
        help="checkpoint every N epochs; the final epoch is always checkpointed; default: 1",
    )
    add(
        "--keep-checkpoints",
        type=int,
        default=3,
        metavar="N",
        help="after each checkpoint, delete the epoch checkpoints beyond the newest N (never the "
        "one LATEST names, nor one a reader may have just resolved); 0 keeps all; default: 3",
    )
    add(
        "--resume",
        default="auto",
        choices=("auto", "never"),
        help="auto: continue from the newest complete checkpoint in --checkpoint-dir; "
        "never: start from scratch; default: auto",
    )
    add(
        "--seed",
        type=int,
        default=0,
        help="model init and shuffling seed (same on all ranks); per-rank randomness uses "
        "seed + rank; default: 0",
    )
    add(
        "--device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="auto picks cuda when available; default: auto",
    )
    add(
        "--tensorboard-dir",
        default=None,
        metavar="DIR",
        help="local folder for rank 0's TensorBoard event files (per-step loss and samples/s, "
        "per-epoch accuracy and loss), written when the tensorboard package is installed; "
        "'' disables; default: CHECKPOINT_DIR/tensorboard for a local --checkpoint-dir, none "
        "for object storage",
    )
    return parser


def _tensorboard_dir(option: str | None, checkpoint_dir: str) -> str | None:
    """Where event files go: the option, else beside the checkpoints when they are local
    (SummaryWriter writes local files; on object storage there is no default)."""
    if option is None:
        if storage.is_local(checkpoint_dir):
            return str(storage.join(checkpoint_dir, TENSORBOARD_FOLDER))
        return None
    if not option:
        return None
    if not storage.is_local(option):
        raise InvalidInput(
            "--tensorboard-dir",
            f"{option} is not a local folder",
            "pass a local path (a volume TensorBoard reads), or '' to write no event files",
        )
    if storage.is_file(option, "--tensorboard-dir"):
        raise InvalidInput("--tensorboard-dir", f"{option} is a file", "pass a folder path")
    return str(storage.local_path(option, "--tensorboard-dir"))


def _at_least(option: str, value: float, minimum: float, fix: str) -> None:
    if not value >= minimum:  # also refuses NaN
        raise InvalidInput(option, f"{value} is below {minimum}", fix)


def validate(args: argparse.Namespace, world_size: int | None = None) -> TrainOptions:
    """Turn parsed arguments into options, refusing values that would fail later or silently.
    ``world_size``: the job's process count when the environment does not say it (a Ray
    job's driver, which starts the workers itself)."""
    _at_least("--epochs", args.epochs, 1, "pass --epochs 1 or more")
    _at_least("--batch-size", args.batch_size, 1, "pass --batch-size 1 or more")
    _at_least("--grad-accum-steps", args.grad_accum_steps, 1, "pass --grad-accum-steps 1 or more")
    _at_least("--checkpoint-every", args.checkpoint_every, 1, "pass --checkpoint-every 1 or more")
    _at_least("--keep-checkpoints", args.keep_checkpoints, 0, "pass 0 to keep all, or N")
    _at_least("--clip-grad-norm", args.clip_grad_norm, 0, "pass a positive norm, or 0 to disable")
    rules.positive_number(args.lr, "--lr", "pass a finite learning rate such as 1e-3")
    if args.dataset == "prepared":
        if args.data is None:
            raise InvalidInput("--data", "is required with --dataset prepared", "pass --data DIR")
        if not storage.is_dir(args.data, "--data"):
            raise InvalidInput(
                "--data",
                f"{args.data} is not a folder",
                "pass a folder written by `kubetrain prep`",
            )
    elif ":" not in args.dataset:
        raise InvalidInput(
            "--dataset",
            f"unknown dataset {args.dataset!r}",
            "use prepared or package.module:callable",
        )
    if not is_model_spec(args.model):
        raise InvalidInput("--model", f"unknown model {args.model!r}", MODEL_FIX)
    if storage.is_file(args.checkpoint_dir, "--checkpoint-dir"):
        raise InvalidInput(
            "--checkpoint-dir", f"{args.checkpoint_dir} is a file", "pass a folder path"
        )
    ds_config = _deepspeed_config(args, world_size)
    batch_size, grad_accum_steps = args.batch_size, args.grad_accum_steps
    if ds_config is not None:
        batch_size = ds_config[deepspeed_config.MICRO_BATCH]
        grad_accum_steps = ds_config[deepspeed_config.ACCUMULATION]
    return TrainOptions(
        data=args.data,
        dataset=args.dataset,
        model=args.model,
        strategy=args.strategy,
        epochs=args.epochs,
        batch_size=batch_size,
        lr=args.lr,
        optimizer=args.optimizer,
        grad_accum_steps=grad_accum_steps,
        clip_grad_norm=args.clip_grad_norm,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        resume=args.resume,
        seed=args.seed,
        device=args.device,
        tensorboard_dir=_tensorboard_dir(args.tensorboard_dir, args.checkpoint_dir),
        deepspeed_config=ds_config,
    )


def _deepspeed_config(args: argparse.Namespace, world_size: int | None) -> dict[str, Any] | None:
    """The DeepSpeed config this job trains with (strategy deepspeed), its batch settings
    checked against the job's world size before any process group starts; the DeepSpeed
    options are refused with another strategy, which would ignore them."""
    if args.strategy != "deepspeed":
        for option, value in (
            ("--zero-stage", args.zero_stage),
            ("--deepspeed-config", args.deepspeed_config),
        ):
            if value is not None:
                raise InvalidInput(
                    option, f"is for --strategy deepspeed, not {args.strategy}",
                    f"pass --strategy deepspeed, or leave {option} out",
                )  # fmt: skip
        return None
    refuse_object_storage_for_deepspeed(args.checkpoint_dir, "--checkpoint-dir")
    field = "--deepspeed-config"
    user = (
        deepspeed_config.load_config(args.deepspeed_config, field) if args.deepspeed_config else {}
    )
    deepspeed_config.check_with_deepspeed(user, field)
    return deepspeed_config.fill_config(
        user,
        batch_size=args.batch_size,
        grad_accum_steps=args.grad_accum_steps,
        world_size=deepspeed_config.world_size_from_env() if world_size is None else world_size,
        optimizer=args.optimizer,
        lr=args.lr,
        clip_grad_norm=args.clip_grad_norm,
        zero_stage=DEFAULT_ZERO_STAGE if args.zero_stage is None else args.zero_stage,
        field=field,
    )


def parse_options(argv: list[str] | None = None) -> TrainOptions:
    return validate(build_parser().parse_args(argv))
