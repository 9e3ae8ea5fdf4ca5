"""The training run: set up, resume, train epoch by epoch, checkpoint, report."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from kubetrain.artifacts.checkpoint import (
    CheckpointLock,
    latest_checkpoint,
    latest_name,
    lock_checkpoint_dir,
    prune_checkpoints,
    restore_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from kubetrain.artifacts.models import build_classifier
from kubetrain.errors import InvalidInput, KubetrainError
from kubetrain.names import JOB_NAME_ENV
from kubetrain.train.data import load_data, on_device_if_it_fits, train_loader
from kubetrain.train.distributed import Runtime, lost_peer, wrap_model
from kubetrain.train.events import open_event_files
from kubetrain.train.loop import EpochStats, TorchUpdates, Updates, evaluate, train_epoch
from kubetrain.train.options import TrainOptions
from kubetrain.train.progress import Reporter


def make_optimizer(name: str, params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """AdamW, or SGD with momentum 0.9 (plain SGD is too slow to be a useful choice).

    Fused kernels: one pass over all parameters instead of a chain of foreach ops, which
    halves the optimizer's share of a small model's step (bench B3).
    """
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, fused=True)
    return torch.optim.AdamW(params, lr=lr, fused=True)


def _agreed_checkpoint(checkpoint_dir: str) -> str | None:
    """Rank 0's view of the newest checkpoint, so that all ranks resume from the same one."""
    found = latest_checkpoint(checkpoint_dir)
    choice: list[Any] = [None if found is None else str(found)]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(choice, src=0)
    return choice[0]


def _hold_checkpoint_dir(checkpoint_dir: str, runtime: Runtime) -> CheckpointLock | None:
    """Rank 0 locks the checkpoint folder for the run; every rank learns whether it could, so
    a folder another job writes stops all ranks at once with rank 0's one line."""
    lock, refusal = None, None
    if runtime.is_main:
        try:
            lock = lock_checkpoint_dir(checkpoint_dir)
        except KubetrainError as exc:
            refusal = exc
    outcome: list[Any] = [None if refusal is None else str(refusal)]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(outcome, src=0)
    if refusal is not None:
        raise refusal
    if outcome[0] is not None:
        raise KubetrainError(f"rank 0 refused the checkpoint folder: {outcome[0]}", exit_code=2)
    return lock


_FRESH_START = "or --resume never with another --checkpoint-dir"


def _check_compatible(
    ckpt: str, model_info: dict[str, Any], options: TrainOptions, world_size: int
) -> None:
    """Refuse, before the model is wrapped, a checkpoint whose files fail their manifest's
    sha256, weights of a different model, or a checkpoint a strategy cannot continue: ddp and
    fsdp read each other's, a DeepSpeed engine only its own, written with the same ZeRO stage
    on as many processes (its partitions)."""
    manifest = verify_checkpoint(ckpt)
    stored = manifest["model"]
    if stored != model_info:
        raise InvalidInput(
            "--resume",
            f"checkpoint {ckpt} holds model {stored}, this run builds {model_info}",
            f"pass the same --model and data, {_FRESH_START}",
        )
    written_by = manifest["strategy"]
    if (written_by == "deepspeed") != (options.strategy == "deepspeed"):
        raise InvalidInput(
            "--strategy",
            f"checkpoint {ckpt} was written by strategy {written_by}, which {options.strategy} "
            "cannot continue",
            f"pass --strategy {written_by}, {_FRESH_START}",
        )
    if options.deepspeed_config is not None:
        stage = options.deepspeed_config["zero_optimization"]["stage"]
        written = (manifest["zero_stage"], manifest["world_size"])
        if written != (stage, world_size):
            raise InvalidInput(
                "--resume",
                f"checkpoint {ckpt} was written by ZeRO stage {written[0]} on {written[1]} "
                f"processes, this run is stage {stage} on {world_size}",
                f"resume with that stage and process count, {_FRESH_START}",
            )


#: The most per-step entries a manifest's ``history`` holds (see :func:`thin_history`).
MAX_HISTORY = 2000


def epoch_line(record: dict[str, Any], epochs: int) -> str:
    """The one line per epoch that people read and log scrapers parse; keep its shape stable.
    The split scored is named: ``validation_accuracy``, or ``test_accuracy`` for a dataset
    without a validation split."""
    split = "validation" if "validation_accuracy" in record else "test"
    return (
        f"epoch {record['epoch']}/{epochs} step {record['step']} loss {record['train_loss']:.4f} "
        f"train_accuracy {record['train_accuracy']:.4f} "
        f"{split}_accuracy {record[f'{split}_accuracy']:.4f} "
        f"samples/s {record['samples_per_second']:.1f}"
    )


def thin_history(history: Sequence[Mapping[str, Any]], limit: int = MAX_HISTORY) -> list[Any]:
    """At most ``limit`` per-step entries spanning the whole run: those whose step is a
    multiple of the smallest power of two that leaves no more. The stride only grows as the
    run does, so thinning again keeps a subset of what was kept, evenly spaced."""
    last = history[-1]["step"] if history else 0
    stride = 1
    while last // stride > limit:
        stride *= 2
    return [entry for entry in history if entry["step"] % stride == 0]


def step_history(stats: EpochStats, epoch: int, first_step: int, world_size: int) -> list[Any]:
    """The manifest's ``history`` entries of one epoch: rank 0's mean loss over each step's
    micro-batches and the job's samples/s (rank 0's rate times the world size)."""
    return [
        {
            "step": first_step + number,
            "epoch": epoch,
            "loss": step.loss,
            "samples_per_second": step.samples / max(step.seconds, 1e-9) * world_size,
        }
        for number, step in enumerate(stats.per_step, start=1)
    ]


def _env_count(name: str) -> int | None:
    """A whole number from the environment, or None (absent, or not a whole number)."""
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def resume_line(checkpoint: str, manifest: Mapping[str, Any], world_size: int) -> str:
    """The one line rank 0 prints on resuming: the epoch and step it continues after, the
    world size it continues at and, when it differs (an elastic job that lost or gained a
    node), the one the checkpoint was written at."""
    written_at = manifest["world_size"]
    was = f" (was {written_at})" if written_at != world_size else ""
    return (
        f"resumed epoch {manifest['epoch']} at world size {world_size}{was}: "
        f"step {manifest['step']} from {checkpoint}"
    )


def _deepspeed_hyperparameters(config: dict[str, Any]) -> dict[str, Any]:
    """What a DeepSpeed config (the user's settings winning over ours) trained with."""
    chosen = config["optimizer"] if isinstance(config.get("optimizer"), dict) else {}
    params = chosen.get("params") if isinstance(chosen.get("params"), dict) else {}
    return {
        "zero_stage": config["zero_optimization"]["stage"],
        **({"optimizer": str(chosen["type"]).lower()} if "type" in chosen else {}),
        **({"lr": params["lr"]} if "lr" in params else {}),
        "clip_grad_norm": config.get("gradient_clipping", 0.0),
    }


def hyperparameters(options: TrainOptions, runtime: Runtime) -> dict[str, Any]:
    """What the report shows of how the model was trained, by this attempt: nodes and
    processes per node as they are now, from what torchrun's agent sets for each worker
    (torch/distributed/elastic/agent/server/local_elastic_agent.py ``_start_workers``):
    ``GROUP_WORLD_SIZE``, the nodes in this rendezvous round, and ``LOCAL_WORLD_SIZE``. Not
    ``PET_NNODES``: an elastic job's is the range ``MIN:MAX``, not the nodes it got. Without
    them (one process; mpirun sets LOCAL_WORLD_SIZE), from the world size."""
    procs = _env_count("LOCAL_WORLD_SIZE") or runtime.world_size
    nodes = _env_count("GROUP_WORLD_SIZE") or max(runtime.world_size // procs, 1)
    return {
        "model": options.model,
        "dataset": options.dataset if options.dataset != "prepared" else options.data,
        "strategy": options.strategy,
        "optimizer": options.optimizer,
        "lr": options.lr,
        "batch_size": options.batch_size,
        "grad_accum_steps": options.grad_accum_steps,
        "clip_grad_norm": options.clip_grad_norm,
        "epochs": options.epochs,
        "seed": options.seed,
        "nodes": nodes,
        "procs_per_node": procs,
        "world_size": runtime.world_size,
        **(
            {}
            if options.deepspeed_config is None
            else _deepspeed_hyperparameters(options.deepspeed_config)
        ),
    }


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class RunClock:
    """The manifest's ``run``: the job's name (``KUBETRAIN_JOB_NAME``, which the backends set,
    else the checkpoint folder's name), when its first attempt started and the wall seconds
    spent training, summed over the attempts a resume continues."""

    def __init__(self, checkpoint_dir: str) -> None:
        folder = os.path.basename(str(checkpoint_dir).rstrip("/"))
        self.job = os.environ.get(JOB_NAME_ENV) or folder
        self.started_at = _now()
        self._seconds_before = 0.0
        self._attempt_started = time.monotonic()

    def resume(self, run: Mapping[str, Any] | None) -> None:
        """Continue the clock of the run a checkpoint recorded (one written before ``run``
        existed has none: this attempt is then the first)."""
        if run:
            self.started_at = str(run.get("started_at") or self.started_at)
            self._seconds_before = float(run.get("seconds") or 0.0)

    def record(self) -> dict[str, Any]:
        seconds = self._seconds_before + time.monotonic() - self._attempt_started
        return {
            "job": self.job,
            "started_at": self.started_at,
            "updated_at": _now(),
            "seconds": round(seconds, 3),
        }


#: Called on every rank after each epoch with the epoch's record and the checkpoint that epoch
#: wrote (None if it wrote none): how a launcher that keeps its own record hears of them.
EpochHook = Callable[[dict[str, Any], str | None], None]


def run(
    options: TrainOptions,
    runtime: Runtime,
    reporter: Reporter,
    after_epoch: EpochHook | None = None,
) -> str | None:
    """Train to ``options.epochs``, as the only job writing ``options.checkpoint_dir``; return
    the last checkpoint written or resumed from. A collective that fails because another
    process of the job died is said so in one line, not as a bug of ours: in an elastic job
    it is how every surviving rank learns that a node was lost."""
    try:
        lock = _hold_checkpoint_dir(options.checkpoint_dir, runtime)
        try:
            return _train(options, runtime, reporter, after_epoch)
        finally:
            if lock is not None:
                lock.release()
    except RuntimeError as exc:
        reason = lost_peer(exc) if runtime.world_size > 1 else None
        if reason is None:
            raise
        raise KubetrainError(
            f"another process of this job was lost ({reason}); read its node's log for why "
            "(torchrun restarts the job from the newest checkpoint while --max-restarts allows, "
            "an elastic job, --nodes MIN:MAX, with the nodes left)"
        ) from exc


def _prepare(
    module: nn.Module, options: TrainOptions, runtime: Runtime
) -> tuple[nn.Module, torch.optim.Optimizer | None, Updates]:
    """The model as trained (DDP, FSDP2 or a DeepSpeed engine, which holds its optimizer: None
    then), its optimizer and how micro-batches become steps."""
    if options.deepspeed_config is not None:
        from kubetrain.train import deepspeed_strategy

        engine = deepspeed_strategy.initialize(module, options.deepspeed_config, runtime)
        return engine, None, deepspeed_strategy.DeepSpeedUpdates(engine)
    model = wrap_model(module, options.strategy, runtime)
    optimizer = make_optimizer(options.optimizer, model.parameters(), options.lr)
    return model, optimizer, TorchUpdates(model, optimizer, options.clip_grad_norm)


def _train(
    options: TrainOptions, runtime: Runtime, reporter: Reporter, after_epoch: EpochHook | None
) -> str | None:
    clock = RunClock(options.checkpoint_dir)
    data = load_data(options.dataset, options.data)
    model_info = {
        "spec": options.model,
        "sample_shape": data.sample_shape,
        "num_classes": data.num_classes,
    }
    last = _agreed_checkpoint(options.checkpoint_dir) if options.resume == "auto" else None
    if last is not None:
        _check_compatible(last, model_info, options, runtime.world_size)
    torch.manual_seed(options.seed)  # identical initial weights on every rank
    module = build_classifier(options.model, data.sample_shape, data.num_classes)
    torch.manual_seed(options.seed + runtime.rank)
    model, optimizer, updates = _prepare(module, options, runtime)

    first_epoch, step, metrics, history = 1, 0, [], []
    if last is not None:
        manifest = restore_checkpoint(last, model, optimizer, verify=False)  # verified above
        first_epoch, step = manifest["epoch"] + 1, manifest["step"]
        metrics = list(manifest["metrics"])
        history = list(manifest.get("history", []))
        clock.resume(manifest.get("run"))
        reporter.line(resume_line(last, manifest, runtime.world_size))
    trained = hyperparameters(options, runtime)

    train_x, train_y = on_device_if_it_fits(data.train_x, data.train_y, runtime.device)
    loader, sampler = train_loader(
        train_x,
        train_y,
        batch_size=options.batch_size,
        rank=runtime.rank,
        world_size=runtime.world_size,
        seed=options.seed,
        device=runtime.device,
    )
    events = open_event_files(options.tensorboard_dir if runtime.is_main else None, step)
    try:
        for epoch in range(first_epoch, options.epochs + 1):
            sampler.set_epoch(epoch)
            reporter.start_epoch(epoch, options.epochs, len(loader))
            stats = train_epoch(
                updates,
                loader,
                num_batches=len(loader),
                runtime=runtime,
                grad_accum_steps=options.grad_accum_steps,
                reporter=reporter,
                first_step=step,
            )
            steps = step_history(stats, epoch, step, runtime.world_size)
            history = thin_history([*history, *steps])
            step += stats.steps
            eval_loss, eval_accuracy = evaluate(
                model, data.eval_x, data.eval_y, batch_size=options.batch_size, runtime=runtime
            )
            split = data.eval_split
            record = {
                "epoch": epoch,
                "step": step,
                "train_loss": stats.loss,
                "train_accuracy": stats.accuracy,
                f"{split}_loss": eval_loss,
                f"{split}_accuracy": eval_accuracy,
                "samples_per_second": stats.samples / max(stats.seconds, 1e-9),
                "world_size": runtime.world_size,  # an elastic job's may change on a resume
            }
            metrics.append(record)
            reporter.line(epoch_line(record, options.epochs))
            if events is not None:
                events.steps(steps)
                events.epoch(record, split)
            saved = None
            if epoch % options.checkpoint_every == 0 or epoch == options.epochs:
                latest_before = latest_name(options.checkpoint_dir) if runtime.rank == 0 else None
                last = str(
                    save_checkpoint(
                        options.checkpoint_dir,
                        model,
                        optimizer,
                        epoch=epoch,
                        step=step,
                        strategy=options.strategy,
                        model_info=model_info,
                        metrics=metrics,
                        history=history,
                        hyperparameters=trained,
                        run=clock.record(),
                    )
                )
                saved = last
                reporter.line(f"checkpoint saved: {last}")
                if runtime.rank == 0:
                    prune_checkpoints(
                        options.checkpoint_dir, options.keep_checkpoints, latest_before
                    )
            if after_epoch is not None:
                after_epoch(record, saved)
    finally:
        if events is not None:
            events.close()
    final_epoch = max(options.epochs, first_epoch - 1)
    reporter.line(f"training complete: epoch {final_epoch} step {step} checkpoint {last}")
    return last
