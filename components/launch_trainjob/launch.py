"""Launch step: validate a training job spec and hand it to a backend, returning at once."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from kubetrain import storage
from kubetrain.backends import BackendOptions, get_backend
from kubetrain.errors import InvalidInput
from kubetrain.images import TRAINER_IMAGE
from kubetrain.jobspec import Resources, RuntimeRef, TrainJobSpec, Volume
from kubetrain.names import derive_job_name, label_value, random_job_name
from kubetrain.staging import stage_dataset
from kubetrain.training_choices import MODEL_FIX, STRATEGIES, is_model_spec

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
        if not self.data_dir:
            raise InvalidInput(
                "data", "is empty", "give the dataset folder written by the prep step"
            )
        if self.strategy not in STRATEGIES:
            raise InvalidInput("strategy", f"{self.strategy!r} is unknown", "use ddp or fsdp")
        # Checked here, not first in every node of a job that was already created.
        if not is_model_spec(self.model):
            raise InvalidInput("model", f"{self.model!r} is unknown", MODEL_FIX)
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
            if value < 1:
                raise InvalidInput(field_name, f"{value} is below 1", "use 1 or more")
        if not self.lr > 0:
            raise InvalidInput("lr", f"{self.lr} is not positive", "use a learning rate like 0.001")

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
    if copy_dataset:
        stage_dataset(source, data_dir)
    backend_impl.launch(spec)
    return LaunchResult(job_name=name, checkpoint_dir=checkpoint_dir)
