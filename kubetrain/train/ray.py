"""``python -m kubetrain.train.ray``: our trainer as a Ray job's driver (``--launcher ray``).

The driver runs once, on the Ray cluster's head (``ray job submit`` sets ``RAY_ADDRESS``; without
it the program refuses rather than start or guess a cluster), checks the options as
``python -m kubetrain.train`` does, and runs Ray Train's ``TorchTrainer`` with
``--num-workers`` workers. Each worker runs our trainer (:func:`kubetrain.train.trainer.run`,
strategies ddp, fsdp and deepspeed) on the process group Ray Train started (gloo on CPU, nccl
with ``--use-gpu``).

Checkpoints are written in our manifest/LATEST layout in ``--checkpoint-dir`` as under torchrun
(collect, resume and retention unchanged) and reported through ``ray.train.report``: Ray
Train's run folder is ``CHECKPOINT_DIR/ray-train`` (RunConfig ``storage_path`` and ``name``),
its record ``checkpoint_manager_snapshot.json`` names one ``checkpoint_epoch-N_<time>``
folder per checkpoint there, made of hard links to our epoch folder's files (our files are
never rewritten in place, so the second name costs no disk; where links are impossible, and
on object storage, it is a copy), and ``CheckpointConfig(num_to_keep)`` is our
``--keep-checkpoints``. Ray Train resumes its record from that folder; our trainer resumes
from LATEST. Ray's record cannot name our epoch folders themselves: our retention deletes
them, and Ray refuses to reload a record naming a folder that is gone
(ray/train/v2/_internal/execution/checkpoint/checkpoint_manager.py
``_assert_checkpoints_exist``).

The driver's stdout is the job's log: rank 0's lines (epoch lines, progress records, the
final lines) come through a Ray queue and are printed unprefixed, in the format of
``python -m kubetrain.train``; the workers' own output stays in Ray's log files
(``log_to_driver=False``). A failed worker ends the driver with one line and its exit code.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import threading
from datetime import datetime
from typing import Any

from kubetrain import storage
from kubetrain.errors import DEBUG_ENV, InvalidInput, KubetrainError, failure_line, report_failure
from kubetrain.process_exit import skip_exit_collection
from kubetrain.train import options as train_options
from kubetrain.train.options import TrainOptions
from kubetrain.train.progress import PlainReporter, Reporter, SilentReporter

PROG = train_options.RAY_TRAINER_COMMAND[-1]
#: Ray Train's run folder (``RunConfig(name)``) inside ``--checkpoint-dir``.
RAY_RUN = "ray-train"
#: The fix of a failure Ray reports itself (a worker's process died, a node was lost): its
#: cause is in the logs Ray keeps on the cluster's nodes, not in the driver's output.
SEE_RAY_LOGS = "see the Ray cluster's logs for the cause (`ray logs cluster` lists them)"
#: Ray Train v2 (``ray/train/v2``; the default since Ray 2.51) is what this program is written
#: against: ``CheckpointUploadMode.NO_UPLOAD`` and ``WorkerGroupError`` are v2's.
RAY_TRAIN_V2 = "RAY_TRAIN_V2_ENABLED"


def build_parser() -> argparse.ArgumentParser:
    parser = train_options.build_parser(PROG)
    parser.description = (
        "Train a classifier as a Ray job's driver: Ray Train's TorchTrainer runs "
        "--num-workers workers, each one process of python -m kubetrain.train's training "
        "(same options, strategies and checkpoint folder). Submit it with `ray job submit`, "
        "which sets RAY_ADDRESS."
    )
    parser.add_argument(
        "--num-workers",
        type=int,
        required=True,
        metavar="N",
        help="Ray Train workers (ScalingConfig num_workers): nodes x processes per node",
    )
    parser.add_argument(
        "--use-gpu",
        action="store_true",
        help="one GPU per worker (ScalingConfig use_gpu), nccl; default: CPU workers, gloo",
    )
    return parser


def _absolute(location: str | None) -> str | None:
    """A local path made absolute against the driver's folder: Ray Train runs each worker in
    a folder of its own. A URL (s3://, file://) stays as it is."""
    if not location or not storage.is_local(location) or location.startswith("file:"):
        return location
    return os.path.abspath(location)


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, TrainOptions]:
    """The driver's options and the workers' training options, checked before Ray is reached:
    DeepSpeed's batch settings against ``--num-workers`` processes."""
    args = build_parser().parse_args(argv)
    if args.num_workers < 1:
        raise InvalidInput("--num-workers", f"{args.num_workers} is below 1", "pass 1 or more")
    if args.use_gpu and args.device == "cpu":
        raise InvalidInput(
            "--device",
            "cpu trains on the CPU, but --use-gpu gives each worker a GPU and nccl",
            "leave --use-gpu out, or pass --device cuda or auto",
        )
    if not args.use_gpu and args.device == "cuda":
        raise InvalidInput(
            "--device",
            "cuda needs a GPU, and Ray gives the workers none without --use-gpu",
            "pass --use-gpu, or --device cpu or auto",
        )
    for name in ("data", "checkpoint_dir", "tensorboard_dir"):
        setattr(args, name, _absolute(getattr(args, name)))
    return args, train_options.validate(args, world_size=args.num_workers)


# --- on each worker -------------------------------------------------------------------------


class RelayReporter(PlainReporter):
    """Rank 0's lines and progress records as :class:`PlainReporter` writes them, sent to the
    driver through ``lines`` (a ``ray.util.queue.Queue``) instead of this worker's stdout,
    which Ray keeps in a log file of the worker's node."""

    def __init__(self, lines: Any, world_size: int) -> None:
        super().__init__(world_size)
        self._lines = lines

    def write(self, text: str) -> None:
        self._lines.put(text)


def _link_or_copy(source: str, target: str) -> None:
    """A second name for a checkpoint file, or a copy where the filesystem has no hard links
    (or they would cross filesystems)."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def ray_checkpoint_name(checkpoint: str) -> str:
    """Ray's folder for our checkpoint folder ``epoch-N``: ``checkpoint_epoch-N_<time>`` (Ray's
    own names are ``checkpoint_<time>``), unique so that a run started over (``--resume
    never``) never reuses the name of a folder Ray's record still holds."""
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S.%f")
    return f"checkpoint_{storage.name_of(checkpoint)}_{stamp}"


def publish_for_ray(checkpoint: str, checkpoint_dir: str) -> str:
    """Our checkpoint folder ``checkpoint`` as a folder of Ray Train's run, which it must be in
    to be reported without an upload (``CheckpointUploadMode.NO_UPLOAD``,
    ray/train/v2/_internal/execution/context.py ``report``: ``is_managed_checkpoint``);
    return its name."""
    name = ray_checkpoint_name(checkpoint)
    target = storage.join(checkpoint_dir, RAY_RUN, name)
    if storage.is_local(checkpoint):
        shutil.copytree(storage.local_path(checkpoint), target, copy_function=_link_or_copy)
    else:
        filesystem, source = storage.resolve(checkpoint, "--checkpoint-dir")
        _, destination = storage.resolve(target, "--checkpoint-dir")
        filesystem.copy(source, destination, recursive=True)
    return name


class RayReports:
    """The trainer's ``after_epoch`` hook: every rank reports each epoch's record to Ray Train
    (``ray.train.report`` is a barrier every worker must reach as often), rank 0 with the
    checkpoint the epoch wrote, published into Ray's run folder first."""

    def __init__(self, checkpoint_dir: str, is_main: bool) -> None:
        self.checkpoint_dir, self.is_main = checkpoint_dir, is_main

    def __call__(self, record: dict[str, Any], checkpoint: str | None) -> None:
        import ray.train
        from ray.train import Checkpoint, CheckpointUploadMode

        reported = None
        if checkpoint is not None and self.is_main:
            name = publish_for_ray(checkpoint, self.checkpoint_dir)
            # The run folder's path and filesystem as Ray Train names them (TrainContext's
            # get_storage, a DeveloperAPI): a checkpoint on any other filesystem object is
            # not taken for one of the run's.
            run = ray.train.get_context().get_storage()
            reported = Checkpoint(
                path=f"{run.experiment_fs_path}/{name}", filesystem=run.storage_filesystem
            )
        metrics = {
            **record,
            "checkpoint": None if checkpoint is None else storage.name_of(checkpoint),
        }
        ray.train.report(
            metrics, checkpoint=reported, checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD
        )


class WorkerFailure(KubetrainError):
    """A worker's failure as its one line, which is what crosses to the driver: the exception
    itself may not survive Ray's pickling (InvalidInput's signature), and its traceback would
    be a wall in the job's log. ``lost_peer``: it failed because another worker died first."""

    def __init__(self, message: str, exit_code: int, rank: int, lost_peer: bool) -> None:
        super().__init__(message, exit_code)
        self.rank, self.lost_peer = rank, lost_peer

    def __reduce__(self) -> tuple[Any, ...]:
        return (WorkerFailure, (str(self), self.exit_code, self.rank, self.lost_peer))


def worker_failure(exc: Exception, rank: int, checkpoint_dir: str) -> WorkerFailure:
    """``exc`` of worker ``rank`` as its one line (``failure_line``) and exit code; whether it
    failed because another worker died (a collective's lost peer, which the trainer reports
    as raised from it)."""
    from kubetrain.train.distributed import lost_peer

    line, code = failure_line(exc, output=checkpoint_dir)
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return WorkerFailure(f"rank {rank}: {line}", code, rank, lost_peer(cause) is not None)


def train_worker(config: dict[str, Any]) -> None:
    """One Ray Train worker: our trainer on the process group Ray Train started (it sets RANK,
    WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/PORT too, ray/train/torch/config.py
    ``_set_torch_distributed_env_vars``)."""
    import ray.train
    import ray.train.torch

    from kubetrain.train import distributed
    from kubetrain.train.trainer import run

    options: TrainOptions = config["options"]
    # `python -m` puts the driver's folder first on sys.path: so here, for module:callable.
    if config["import_folder"] not in sys.path:
        sys.path.insert(0, config["import_folder"])
    rank = ray.train.get_context().get_world_rank()
    try:
        device = ray.train.torch.get_device()
        gpu_index = device.index if device.type == "cuda" else None
        runtime = distributed.init_runtime(options.device, gpu_index)
        reporter: Reporter = (
            RelayReporter(config["lines"], runtime.world_size)
            if runtime.is_main
            else SilentReporter()
        )
        run(options, runtime, reporter, RayReports(options.checkpoint_dir, runtime.is_main))
    except Exception as exc:
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            import traceback

            traceback.print_exception(exc)  # into this worker's log file
        raise worker_failure(exc, rank, options.checkpoint_dir) from None


# --- the driver -----------------------------------------------------------------------------


class Relay:
    """Prints the lines rank 0 sends, as they come (a thread), then those left once the
    training ended."""

    POLL_SECONDS = 0.5

    def __init__(self, lines: Any) -> None:
        self._lines = lines
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="kubetrain-relay", daemon=True)

    def __enter__(self) -> Relay:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        left = self._lines.qsize()
        for line in self._lines.get_nowait_batch(left) if left else []:
            _print(line)

    def _follow(self) -> None:
        from ray.util.queue import Empty

        while not self._stop.is_set():
            try:
                _print(self._lines.get(timeout=self.POLL_SECONDS))
            except Empty:
                continue


def _print(line: str) -> None:
    from kubetrain.errors import terminal_text

    print(terminal_text(line), flush=True)


def run_config(options: TrainOptions) -> Any:
    """Ray Train's run folder, ``CHECKPOINT_DIR/ray-train``, keeping as many checkpoints as we
    do; on object storage through our fsspec filesystem (its endpoint and keys as ours)."""
    from ray.train import CheckpointConfig, RunConfig

    keep = CheckpointConfig(num_to_keep=options.keep_checkpoints or None)
    if storage.is_local(options.checkpoint_dir):
        path = str(storage.local_path(options.checkpoint_dir, "--checkpoint-dir"))
        return RunConfig(name=RAY_RUN, storage_path=path, checkpoint_config=keep)
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    filesystem, path = storage.resolve(options.checkpoint_dir, "--checkpoint-dir")
    return RunConfig(
        name=RAY_RUN,
        storage_path=path,
        storage_filesystem=PyFileSystem(FSSpecHandler(filesystem)),
        checkpoint_config=keep,
    )


def job_failure(exc: Exception) -> KubetrainError:
    """The one line for a failed ``fit``: the worker that failed first of its own accord
    (others fail because it died), lowest rank first; Ray's own failure's first line."""
    failures = getattr(exc, "worker_failures", None) or {}
    ours = [failure for failure in failures.values() if isinstance(failure, WorkerFailure)]
    if ours:
        return min(ours, key=lambda failure: (failure.lost_peer, failure.rank))
    if failures:
        rank, failure = min(failures.items(), key=lambda item: item[0])
        first = (str(failure).strip().splitlines() or [""])[0].rstrip(".")
        return KubetrainError(
            f"Ray Train worker {rank} failed: {type(failure).__name__}: {first}; {SEE_RAY_LOGS}"
        )
    first = (str(exc).strip().splitlines() or [""])[0].rstrip(".")
    return KubetrainError(f"Ray Train failed: {type(exc).__name__}: {first}; {SEE_RAY_LOGS}")


def run_job(args: argparse.Namespace, options: TrainOptions) -> None:
    """Connect to the job's cluster and train; raise the failure's one line."""
    address = os.environ.get("RAY_ADDRESS", "")
    if not address:
        raise InvalidInput(
            "RAY_ADDRESS",
            "is not set, and this program is a Ray job's driver",
            "submit it with `ray job submit -- python -m kubetrain.train.ray ...` (or kubetrain "
            "launch --launcher ray), or set RAY_ADDRESS to a running Ray cluster's address",
        )
    os.environ[RAY_TRAIN_V2] = "1"
    import ray
    from ray.train import ScalingConfig, TrainingFailedError
    from ray.train.torch import TorchTrainer
    from ray.util.queue import Queue

    try:
        ray.init(log_to_driver=False, logging_level=logging.WARNING)
    except ConnectionError as exc:
        raise KubetrainError(
            f"cannot reach the Ray cluster at RAY_ADDRESS {address}: {exc}; check that the "
            f"cluster is up and RAY_ADDRESS is its address (`ray status --address {address}`)"
        ) from exc
    try:
        lines = Queue(actor_options={"num_cpus": 0})
        trainer = TorchTrainer(
            train_worker,
            train_loop_config={"options": options, "lines": lines, "import_folder": os.getcwd()},
            scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=args.use_gpu),
            run_config=run_config(options),
        )
        with Relay(lines):
            trainer.fit()
    except TrainingFailedError as exc:
        raise job_failure(exc) from None
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Every error ends as one line (``kubetrain.errors.report_failure``); Ray and torch are
    imported after the options are checked."""
    checkpoint_dir = None
    try:
        args, options = parse(argv)
        checkpoint_dir = options.checkpoint_dir
        run_job(args, options)
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return report_failure(PROG, exc, output=checkpoint_dir)


if __name__ == "__main__":
    exit_code = main()
    skip_exit_collection()
    sys.exit(exit_code)
