"""Launch step: validate a training job spec and hand it to a backend, returning at once."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from kubetrain import rules, storage
from kubetrain.backends import BackendOptions, get_backend
from kubetrain.components.launch_trainjob.staging import stage_dataset
from kubetrain.errors import IntegrityError, InvalidInput, refusal_reason
from kubetrain.images import TRAINER_IMAGE
from kubetrain.jobspec import Resources, RuntimeRef, TrainJobSpec, Volume
from kubetrain.names import derive_job_name, label_value, random_job_name
from kubetrain.training_choices import BUILTIN_MODELS, MODEL_FIX, STRATEGIES

# What the trainer image runs; torchrun reads PET_NNODES/PET_NPROC_PER_NODE/PET_NODE_RANK/
# PET_MASTER_ADDR/PET_MASTER_PORT from the environment the Trainer injects.
TRAINER_COMMAND = ("torchrun", "-m", "kubetrain.train")


@dataclass(frozen=True)
class TrainingOptions:
    """Options of `python -m kubetrain.train` that the launch step sets."""

    data_dir: str
    checkpoint_dir: str = ""
    strategy: str = "ddp"
    model: str = "mlp"
    epochs: int = 10
    batch_size: int = 32
    lr: float = 1e-3
    checkpoint_every: int = 1

    def validate(self) -> None:
        """The rules `submit` applies to the same parameters (``param_option.VALUE_RULES``)."""
        if not self.data_dir:
            raise InvalidInput(
                "data", "is empty", "give the dataset folder written by the prep step"
            )
        rules.one_of(self.strategy, "strategy", STRATEGIES, "use ddp or fsdp")
        # Checked here, not first in every node of a job that was already created.
        rules.model_spec(self.model, "model")
        for field_name, location in (
            ("data", self.data_dir),
            ("checkpoint_dir", self.checkpoint_dir),
        ):
            if location:
                storage.check_protocol(location, field_name)
        for field_name, value in (
            ("epochs", self.epochs),
            ("batch_size", self.batch_size),
            ("checkpoint_every", self.checkpoint_every),
        ):
            rules.whole_number(value, field_name, 1)
        rules.positive_number(self.lr, "lr")

    def trainer_args(self, checkpoint_dir: str) -> tuple[str, ...]:
        return (
            "--data",
            self.data_dir,
            "--checkpoint-dir",
            checkpoint_dir,
            "--strategy",
            self.strategy,
            "--model",
            self.model,
            "--epochs",
            str(self.epochs),
            "--batch-size",
            str(self.batch_size),
            "--lr",
            repr(self.lr),
            "--checkpoint-every",
            str(self.checkpoint_every),
            "--resume",
            "auto",
        )


@dataclass(frozen=True)
class LaunchResult:
    job_name: str
    checkpoint_dir: str


def resolve_job_name(job_name: str = "", run_name: str = "") -> str:
    """An explicit name wins; else one derived from the pipeline run; else a random one."""
    if job_name:
        return job_name
    return derive_job_name(run_name) if run_name else random_job_name()


def check_local_trainer(data_dir: str, checkpoint_dir: str, model: str) -> None:
    """Refuse now what would fail every node of our trainer on this machine (the local
    backend), before a job is created that can only fail: a model that does not import, a
    folder that is no readable dataset, a checkpoint folder that is a file. A URL is left to
    the nodes, which have its filesystem's credentials."""
    from kubetrain.artifacts.datasets import read_manifest

    if model not in BUILTIN_MODELS:
        _check_model_imports(model)
    if storage.is_local(storage.dereference(data_dir)):
        try:
            read_manifest(data_dir)
        except IntegrityError as exc:
            problem = str(exc).partition("; ")[0]
            fix = "point --data at a folder written by `kubetrain prep`"
            raise InvalidInput("data", problem, fix) from None
    if storage.is_local(checkpoint_dir):
        _check_checkpoint_folder(storage.local_path(checkpoint_dir, "checkpoint_dir"))


def _check_model_imports(model: str) -> None:
    """Import the user's ``package.module:callable`` as the nodes will: from the folder they
    run in (this one), which ``python -m`` puts first on their path."""
    from kubetrain.artifacts.models import import_callable

    added = os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        import_callable(model, "model", MODEL_FIX)
    except InvalidInput:
        raise
    except Exception as exc:  # the user's module raised while importing (SyntaxError, ...)
        problem = f"importing {model} failed ({type(exc).__name__}: {refusal_reason(exc)})"
        raise InvalidInput("model", problem, MODEL_FIX) from None
    finally:
        if added:
            sys.path.remove(os.getcwd())


def _check_checkpoint_folder(folder: Path) -> None:
    """The folder, or the nearest part of its path that exists, must be a folder rank 0 can
    write in."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        problem = f"{existing} is a file, not a folder" + (
            "" if existing == folder else f", so {folder} cannot be made"
        )
        raise InvalidInput("checkpoint_dir", problem, "give a folder path for --checkpoint-dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InvalidInput(
            "checkpoint_dir",
            f"{existing} is not writable",
            "give a folder you may write in for --checkpoint-dir",
        )


def launch_job(
    spec: TrainJobSpec, backend: str = "local", options: BackendOptions | None = None
) -> str:
    """Create the job on ``backend`` and return its name without waiting for it to run."""
    return get_backend(backend, options).launch(spec.validate())


def launch_training(
    options: TrainingOptions,
    backend: str = "local",
    job_name: str = "",
    run_name: str = "",
    nodes: int = 2,
    procs_per_node: int = 1,
    image: str = TRAINER_IMAGE,
    runtime: str = "torch-distributed",
    resources: Resources | None = None,
    env: dict[str, str] | None = None,
    backend_options: BackendOptions | None = None,
    shared_volume: Volume | None = None,
    service_account: str = "",
    storage_url: str = "",
    storage_secret: str = "",
    max_restarts: int = 0,
) -> LaunchResult:
    """Launch our DDP/FSDP trainer as a distributed job.

    A dataset in object storage (a URL, or a KFP artifact pointing at one) is read there by
    the nodes, with the keys of Secret ``storage_secret``; checkpoints go under
    ``storage_url/checkpoints/<run_name or job>`` when ``storage_url`` is given. Otherwise, with
    ``shared_volume`` (a PVC this step has mounted at its ``mount_path``, as the nodes will),
    the dataset is first copied onto it and checkpoints default to it; else the checkpoint
    folder defaults to the backend's per-job folder.
    """
    options.validate()
    name = resolve_job_name(job_name, run_name)
    backend_impl = get_backend(backend, backend_options)
    source = str(storage.dereference(options.data_dir))
    data_dir, volumes = source, ()
    copy_dataset = shared_volume is not None and storage.is_local(source)
    if shared_volume is not None:
        volumes = (shared_volume,)
    if copy_dataset:
        data_dir = str(Path(shared_volume.mount_path) / "datasets" / name)
    if options.checkpoint_dir:
        checkpoint_dir = options.checkpoint_dir
    elif storage_url:
        checkpoint_dir = str(storage.join(storage_url, "checkpoints", run_name or name))
    elif shared_volume is not None:
        checkpoint_dir = str(Path(shared_volume.mount_path) / "checkpoints" / name)
    else:
        checkpoint_dir = backend_impl.default_checkpoint_dir(name)
    labels = {"app.kubernetes.io/managed-by": "kubetrain"}
    if run_name:
        labels["kubetrain.io/run-name"] = label_value(run_name)
    spec = TrainJobSpec(
        name=name,
        command=TRAINER_COMMAND,
        args=replace(options, data_dir=data_dir).trainer_args(checkpoint_dir),
        image=image,
        env=dict(env or {}),
        num_nodes=nodes,
        procs_per_node=procs_per_node,
        resources_per_node=resources or Resources(),
        runtime=RuntimeRef(name=runtime),
        volumes=volumes,
        labels=labels,
        pod_labels=labels,
        service_account=service_account,
        storage_secret=storage_secret,
        max_restarts=max_restarts,
    ).validate()
    if backend == "local":
        check_local_trainer(source, checkpoint_dir, options.model)
    if copy_dataset:
        stage_dataset(source, data_dir)
    backend_impl.launch(spec)
    return LaunchResult(job_name=name, checkpoint_dir=checkpoint_dir)
