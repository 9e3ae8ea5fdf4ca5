"""The training run: set up, resume, train epoch by epoch, checkpoint, report."""

from __future__ import annotations

from collections.abc import Iterable
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
    read_manifest,
    restore_checkpoint,
    save_checkpoint,
)
from kubetrain.artifacts.models import build_model
from kubetrain.errors import InvalidInput, KubetrainError
from kubetrain.train.data import load_data, on_device_if_it_fits, train_loader
from kubetrain.train.distributed import Runtime, wrap_model
from kubetrain.train.loop import evaluate, train_epoch
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


def _check_compatible(ckpt: str, model_info: dict[str, Any]) -> None:
    """Refuse to resume weights into a different model, which would fail or mislead."""
    stored = read_manifest(ckpt)["model"]
    if stored != model_info:
        raise InvalidInput(
            "--resume",
            f"checkpoint {ckpt} holds model {stored}, this run builds {model_info}",
            "pass the same --model and data, or --resume never with another --checkpoint-dir",
        )


def epoch_line(record: dict[str, Any], epochs: int) -> str:
    """The one line per epoch that people read and log scrapers parse; keep its shape stable."""
    return (
        f"epoch {record['epoch']}/{epochs} step {record['step']} loss {record['train_loss']:.4f} "
        f"train_accuracy {record['train_accuracy']:.4f} "
        f"test_accuracy {record['test_accuracy']:.4f} "
        f"samples/s {record['samples_per_second']:.1f}"
    )


def run(options: TrainOptions, runtime: Runtime, reporter: Reporter) -> str | None:
    """Train to ``options.epochs``, as the only job writing ``options.checkpoint_dir``; return
    the last checkpoint written or resumed from."""
    lock = _hold_checkpoint_dir(options.checkpoint_dir, runtime)
    try:
        return _train(options, runtime, reporter)
    finally:
        if lock is not None:
            lock.release()


def _train(options: TrainOptions, runtime: Runtime, reporter: Reporter) -> str | None:
    data = load_data(options.dataset, options.data)
    model_info = {
        "spec": options.model,
        "sample_shape": data.sample_shape,
        "num_classes": data.num_classes,
    }
    torch.manual_seed(options.seed)  # identical initial weights on every rank
    module = build_model(options.model, data.sample_shape, data.num_classes)
    torch.manual_seed(options.seed + runtime.rank)
    model = wrap_model(module, options.strategy, runtime)
    optimizer = make_optimizer(options.optimizer, model.parameters(), options.lr)

    first_epoch, step, metrics, last = 1, 0, [], None
    if options.resume == "auto":
        last = _agreed_checkpoint(options.checkpoint_dir)
        if last is not None:
            _check_compatible(last, model_info)
            manifest = restore_checkpoint(last, model, optimizer)
            first_epoch, step = manifest["epoch"] + 1, manifest["step"]
            metrics = list(manifest["metrics"])
            reporter.line(f"resumed from {last}: epoch {manifest['epoch']} step {step}")

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
    for epoch in range(first_epoch, options.epochs + 1):
        sampler.set_epoch(epoch)
        reporter.start_epoch(epoch, options.epochs, len(loader))
        stats = train_epoch(
            model,
            optimizer,
            loader,
            num_batches=len(loader),
            runtime=runtime,
            grad_accum_steps=options.grad_accum_steps,
            clip_grad_norm=options.clip_grad_norm,
            reporter=reporter,
        )
        step += stats.steps
        test_loss, test_accuracy = evaluate(
            model, data.test_x, data.test_y, batch_size=options.batch_size, runtime=runtime
        )
        record = {
            "epoch": epoch,
            "step": step,
            "train_loss": stats.loss,
            "train_accuracy": stats.accuracy,
            "test_loss": test_loss,
            "test_accuracy": test_accuracy,
            "samples_per_second": stats.samples / max(stats.seconds, 1e-9),
        }
        metrics.append(record)
        reporter.line(epoch_line(record, options.epochs))
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
                )
            )
            reporter.line(f"checkpoint saved: {last}")
            if runtime.rank == 0:
                prune_checkpoints(options.checkpoint_dir, options.keep_checkpoints, latest_before)
    final_epoch = max(options.epochs, first_epoch - 1)
    reporter.line(f"training complete: epoch {final_epoch} step {step} checkpoint {last}")
    return last
