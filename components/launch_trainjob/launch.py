"""Launch step: one road from every face (CLI, KFP component, Argo template, `kubetrain run`,
`kubetrain render`) to the job.

A ``LaunchRequest`` holds everything a launch can ask for; ``plan_launch`` turns it into the
``TrainJobSpec`` (and says what to stage first), ``launch`` creates it on a backend and returns
at once, ``render_launch`` prints what ``launch`` would create, without a cluster.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kubetrain import bounded_json, rules, storage
from kubetrain.artifacts.checkpoint_manifest import refuse_object_storage_for_deepspeed
from kubetrain.backends import BackendOptions, get_backend
from kubetrain.backends.base import Backend
from kubetrain.components._shared.program import (
    absolute_location,
    check_program_text,
    with_program_file_from,
)
from kubetrain.errors import (
    IntegrityError,
    InvalidInput,
    KubetrainError,
    problem_of,
    refusal_reason,
    terminal_text,
)
from kubetrain.images import TRAINER_IMAGE
from kubetrain.jobspec import (
    AUTO_PROCS,
    DEFAULT_RUNTIME,
    MPI_RUNTIME,
    Initializer,
    Resources,
    RuntimeRef,
    Toleration,
    TrainJobSpec,
    Volume,
    check_elastic,
    elastic_restarts,
    procs_gpu_mismatch,
    resolve_nodes,
    resolve_procs_per_node,
)
from kubetrain.names import derive_job_name, label_value, random_job_name
from kubetrain.rules import (
    BUILTIN_MODELS,
    DEFAULT_ZERO_STAGE,
    MODEL_FIX,
    STRATEGIES,
    STRATEGY_FIX,
    ZERO_STAGES,
)
from kubetrain.train import deepspeed_config
from kubetrain.train.options import (
    MPI_TRAINER_COMMAND,
    RAY_TRAINER_COMMAND,
    TRAINER_COMMAND,
    ray_worker_args,
)

RUN_NAME_LABEL = "kubetrain.io/run-name"
#: Where every node finds the prepared dataset and where rank 0 should save (a user's program
#: reads them; our trainer gets the same as options).
DATA_DIR_ENV = "KUBETRAIN_DATA_DIR"
CHECKPOINT_DIR_ENV = "KUBETRAIN_CHECKPOINT_DIR"
#: The file in a checkpoint folder whose ``flock`` the folder's one writer holds
#: (``kubetrain.artifacts.checkpoint.LOCK_FILE``, not imported: that module imports torch).
CHECKPOINT_LOCK_FILE = ".lock"


@dataclass(frozen=True)
class TrainingOptions:
    """Options of `python -m kubetrain.train` that the launch step sets."""

    data_dir: str = ""
    checkpoint_dir: str = ""
    strategy: str = "ddp"
    model: str = "mlp"
    epochs: int = 10
    batch_size: int = 32
    lr: float = 1e-3
    checkpoint_every: int = 1
    keep_checkpoints: int = 3
    #: DeepSpeed only: the ZeRO stage, and a user's DeepSpeed config (a file here, or its JSON
    #: text; the nodes get the text) whose settings win over ours.
    zero_stage: int = DEFAULT_ZERO_STAGE
    deepspeed_config: str = ""

    def validate(self, world_size: int | None = None) -> None:
        """The rules `submit` applies to the same parameters (``param_option.VALUE_RULES``);
        with the job's ``world_size`` (nodes x processes per node), a DeepSpeed config's batch
        sizes are checked against it too, as the trainer checks them on each node."""
        if not self.data_dir:
            raise InvalidInput(
                "data", "is empty", "give the dataset folder written by the prep step"
            )
        rules.one_of(self.strategy, "strategy", STRATEGIES, STRATEGY_FIX)
        rules.one_of(self.zero_stage, "zero_stage", ZERO_STAGES, "use 1, 2 or 3")
        if self.strategy == "deepspeed":
            self.validate_deepspeed(world_size)
        # Checked here, not first in every node of a job that was already created.
        rules.model_spec(self.model, "model")
        self.validate_locations()
        for field_name, value in (
            ("epochs", self.epochs),
            ("batch_size", self.batch_size),
            ("checkpoint_every", self.checkpoint_every),
        ):
            rules.whole_number(value, field_name, 1)
        rules.whole_number(
            self.keep_checkpoints, "keep_checkpoints", 0, fix="pass 0 to keep all, or N"
        )
        rules.positive_number(self.lr, "lr")

    def validate_deepspeed(self, world_size: int | None) -> None:
        """A config that is no DeepSpeed config for our trainer, or batch sizes that do not
        multiply up to its train_batch_size on ``world_size`` processes; a checkpoint folder
        DeepSpeed cannot write (object storage)."""
        if self.checkpoint_dir:
            refuse_object_storage_for_deepspeed(self.checkpoint_dir, "checkpoint_dir")
        if not self.deepspeed_config:
            return
        config = deepspeed_config.load_config(self.deepspeed_config, "deepspeed_config")
        deepspeed_config.check_with_deepspeed(config, "deepspeed_config")
        if world_size is not None:
            deepspeed_config.batch_settings(
                config,
                batch_size=self.batch_size,
                grad_accum_steps=1,  # the trainer's default: the launch step does not set it
                world_size=world_size,
                field="deepspeed_config",
            )

    def validate_locations(self) -> None:
        """What a user's program is given (``KUBETRAIN_DATA_DIR``, ``KUBETRAIN_CHECKPOINT_DIR``):
        folders or URLs of a filesystem fsspec knows, each optional."""
        for field_name, location in (
            ("data", self.data_dir),
            ("checkpoint_dir", self.checkpoint_dir),
        ):
            if location:
                storage.check_protocol(location, field_name)

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
            "--keep-checkpoints",
            str(self.keep_checkpoints),
            "--resume",
            "auto",
            *self.deepspeed_args(),
        )

    def deepspeed_args(self) -> tuple[str, ...]:
        if self.strategy != "deepspeed":
            return ()
        config = ("--deepspeed-config", self.deepspeed_config) if self.deepspeed_config else ()
        return ("--zero-stage", str(self.zero_stage), *config)


@dataclass(frozen=True)
class LaunchRequest:
    """Everything a launch can ask for, whichever face it comes from.

    ``command`` empty runs our trainer with ``training``. ``shared_volume`` is a claim this step
    has mounted at its ``mount_path``, as the nodes will (cluster backends only): a local
    dataset outside it is copied onto it, and checkpoints default to it. ``storage_url`` (an
    object-storage URL) puts checkpoints under ``<storage_url>/checkpoints/<run or job>``.
    ``procs_per_node`` is a number or ``auto`` (``jobspec.resolve_procs_per_node``).
    """

    training: TrainingOptions = field(default_factory=TrainingOptions)
    command: tuple[str, ...] = ()
    name: str = ""
    run_name: str = ""
    #: A whole number, or ``MIN:MAX`` for an elastic job (``jobspec.resolve_nodes``).
    nodes: int | str = 2
    procs_per_node: int | str = AUTO_PROCS
    image: str = ""
    runtime: str = DEFAULT_RUNTIME
    runtime_kind: str = "ClusterTrainingRuntime"
    resources: Resources = field(default_factory=Resources)
    env: Mapping[str, str] = field(default_factory=dict)
    volumes: tuple[Volume, ...] = ()
    shared_volume: Volume | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    service_account: str = ""
    storage_url: str = ""
    storage_secret: str = ""
    suspend: bool = False
    max_restarts: int = 0
    active_deadline_seconds: int | None = None
    dataset_initializer: Initializer | None = None
    model_initializer: Initializer | None = None
    script: str = ""
    #: torchrun, or mpi: mpirun started from a launcher (``TrainJobSpec.launcher``).
    launcher: str = "torchrun"

    @property
    def runs_our_trainer(self) -> bool:
        return not self.command


@dataclass(frozen=True)
class LaunchPlan:
    """What a launch creates: the spec, where our trainer's checkpoints go (empty for the
    user's own program) and the local dataset folder to copy to the nodes' data folder first."""

    spec: TrainJobSpec
    checkpoint_dir: str
    stage_from: str = ""
    stage_to: str = ""
    #: What the user should know of a launch that succeeds (said once it has): a runtime taken
    #: for the one asked for.
    note: str = ""

    def say_note(self) -> None:
        if self.note:
            print(f"kubetrain: note: {terminal_text(self.note)}", file=sys.stderr)


@dataclass(frozen=True)
class LaunchResult:
    job_name: str
    checkpoint_dir: str


def resolve_job_name(job_name: str = "", run_name: str = "") -> str:
    """An explicit name wins; else one derived from the pipeline run; else a random one."""
    if job_name:
        return job_name
    return derive_job_name(run_name) if run_name else random_job_name()


def plan_launch(request: LaunchRequest, backend: str, backend_impl: Backend) -> LaunchPlan:
    """The job ``request`` describes on ``backend``: validated, nothing created."""
    from kubetrain.render import launcher_for, refuse_elastic, refuse_launcher

    rules.one_of(request.launcher, "launcher", rules.LAUNCHERS, rules.LAUNCHER_FIX)
    refuse_launcher(request, backend)  # before a cluster is read or a dataset staged
    request = replace(request, launcher=launcher_for(request.launcher, backend))
    refuse_elastic(request.nodes, backend)
    min_nodes, max_nodes = resolve_nodes(request.nodes)
    strategy = request.training.strategy if request.runs_our_trainer else ""
    check_elastic(request.nodes, request.launcher, strategy)
    name = resolve_job_name(request.name, request.run_name)
    shared = request.shared_volume if backend != "local" else None
    volumes = (*request.volumes, shared) if shared is not None else request.volumes
    # The renderers add app.kubernetes.io/managed-by and the job-name label themselves.
    labels = {RUN_NAME_LABEL: label_value(request.run_name)} if request.run_name else {}
    # A user's program splits as `torchrun train.py ...` -> command torchrun; ours keeps
    # `torchrun -m kubetrain.train` as the command and its options as the args.
    check_program_text(request.command, "command")
    command, args = request.command[:1], request.command[1:]
    training = request.training
    request.resources.validate("resources_per_node")  # auto reads its GPUs
    procs_per_node = resolve_procs_per_node(request.procs_per_node, request.resources.gpu)
    if request.launcher == "mpi" and request.procs_per_node == AUTO_PROCS:
        if not request.resources.gpu:
            raise InvalidInput(
                "procs_per_node",
                "is auto with --launcher mpi and no GPU: the hostfile needs the slots per node",
                "give the processes per node, e.g. --procs-per-node 2",
            )
    if mismatch := procs_gpu_mismatch(procs_per_node, request.resources.gpu):
        print(f"kubetrain: warning: {terminal_text(mismatch)}", file=sys.stderr)
    if request.runs_our_trainer:
        training.validate(world_size=max_nodes * procs_per_node)
    else:
        training.validate_locations()
    data_dir, stage_from, stage_to = "", "", ""
    if training.data_dir:
        source = str(storage.dereference(training.data_dir))
        if shared is not None and storage.is_local(source) and not _inside(source, shared):
            stage_from = absolute_location(source)  # read here
            data_dir = stage_to = str(Path(shared.mount_path) / "datasets" / name)
        else:
            data_dir = _location_for_nodes(source, "data", backend)
    if training.checkpoint_dir:
        checkpoint_dir = training.checkpoint_dir
    elif request.storage_url:
        checkpoint_dir = str(
            storage.join(request.storage_url, "checkpoints", request.run_name or name)
        )
    elif shared is not None:
        checkpoint_dir = str(Path(shared.mount_path) / "checkpoints" / name)
    else:
        checkpoint_dir = backend_impl.default_checkpoint_dir(name)
    checkpoint_dir = _location_for_nodes(checkpoint_dir, "checkpoint_dir", backend)
    if request.runs_our_trainer:
        command = _TRAINER_COMMANDS[request.launcher]
        if training.strategy == "deepspeed":
            # where the checkpoints go unless given (storage_url) is known only now
            refuse_object_storage_for_deepspeed(checkpoint_dir, "checkpoint_dir")
            # a file here is not in the nodes: they get its text
            ds_config = deepspeed_config.config_for_nodes(
                training.deepspeed_config, "deepspeed_config"
            )
            training = replace(training, deepspeed_config=ds_config)
        args = replace(training, data_dir=data_dir).trainer_args(checkpoint_dir)
        if request.launcher == "ray":  # Ray Train's workers: every node's processes
            args += ray_worker_args(max_nodes * procs_per_node, request.resources.gpu)
    # A user's program runs in its checkpoint folder, so one that saves into its working
    # directory saves where collect reads (an object-storage URL is no folder to run in).
    working_dir = ""
    if not request.runs_our_trainer and storage.is_local(checkpoint_dir):
        working_dir = str(storage.local_path(checkpoint_dir, "checkpoint_dir"))
        if backend == "local":
            # The program file named in this folder (`torchrun train.py`) is still found
            # there; the program's own arguments reach it exactly as given.
            program = with_program_file_from(os.getcwd(), request.command)
            command, args = program[:1], program[1:]
    env = {CHECKPOINT_DIR_ENV: checkpoint_dir, **({DATA_DIR_ENV: data_dir} if data_dir else {})}
    spec = TrainJobSpec(
        name=name,
        command=tuple(command),
        args=tuple(args),
        image=request.image or TRAINER_IMAGE,
        env={**env, **request.env},
        num_nodes=max_nodes,
        min_nodes=min_nodes,
        procs_per_node=procs_per_node,
        resources_per_node=request.resources,
        runtime=RuntimeRef(name=_runtime_for(request), kind=request.runtime_kind),
        volumes=tuple(volumes),
        labels={**request.labels, **labels},
        pod_labels={**request.pod_labels, **labels},
        node_selector=dict(request.node_selector),
        tolerations=request.tolerations,
        service_account=request.service_account,
        storage_secret=request.storage_secret,
        suspend=request.suspend,
        max_restarts=elastic_restarts(request.max_restarts, min_nodes),
        active_deadline_seconds=request.active_deadline_seconds,
        dataset_initializer=request.dataset_initializer,
        model_initializer=request.model_initializer,
        script=request.script,
        working_dir=working_dir,
        launcher=request.launcher,
    ).validate()
    note = ""
    if spec.max_restarts != request.max_restarts:
        note = (
            f"--nodes {spec.nodes_text} is elastic: --max-restarts {spec.max_restarts} (each "
            "lost or rejoining node takes one); give --max-restarts N for another number"
        )
    if backend == "trainer" and spec.runtime.name != request.runtime:
        note = (
            f"--launcher mpi runs on runtime {spec.runtime.name}, not the default "
            f"{request.runtime} (a torch runtime); name another MPI runtime with --runtime"
        )
    return LaunchPlan(spec, checkpoint_dir, stage_from, stage_to, note)


#: Our trainer as each launcher starts it.
_TRAINER_COMMANDS = {
    "torchrun": TRAINER_COMMAND,
    "mpi": MPI_TRAINER_COMMAND,
    "ray": RAY_TRAINER_COMMAND,
}


def _runtime_for(request: LaunchRequest) -> str:
    """The runtime asked for; the default one means the launcher's own default (every face
    gives the default's name when none is asked for; ``plan_launch`` says so on stderr)."""
    if request.launcher == "mpi" and request.runtime == DEFAULT_RUNTIME:
        return MPI_RUNTIME
    return request.runtime


def _location_for_nodes(location: str, field: str, backend: str) -> str:
    """A folder as the nodes and a user's program get it, whichever face gave it: locally, a
    path absolute against this folder (the caller's), as the program runs in its checkpoint
    folder; on a cluster, a path in the nodes, which must be absolute (this folder is not
    theirs, and their working directory is unknown here). A URL stays as it is."""
    if backend == "local":
        return absolute_location(location)
    if storage.is_local(location) and not storage.local_path(location, field).is_absolute():
        raise InvalidInput(
            field,
            f"{rules.shown(location)} is relative, and the nodes do not run in this folder",
            f"give an absolute path in the nodes, e.g. {_IN_NODES_EXAMPLES[field]}, or an "
            "object-storage URL",
        )
    return location


_IN_NODES_EXAMPLES = {
    "data": "/mnt/shared/datasets/digits",
    "checkpoint_dir": "/mnt/shared/checkpoints/<job>",
}


def _inside(location: str, volume: Volume) -> bool:
    """Whether a local folder already lies on the shared volume (the Argo workflow's prep
    step writes there), so it needs no copy."""
    return Path(storage.local_path(location, "data")).is_relative_to(volume.mount_path)


def launch(
    request: LaunchRequest, backend: str = "local", options: BackendOptions | None = None
) -> LaunchResult:
    """Create the job ``request`` describes on ``backend`` and return at once, without
    waiting for it to run; checked first, so nothing is created for a request that can only
    fail."""
    backend_impl = get_backend(backend, options)
    plan = plan_launch(request, backend, backend_impl)
    if backend == "local":
        # The nodes run here: what would fail each of them, or let two jobs write one
        # checkpoint folder, is refused now.
        if request.runs_our_trainer:
            check_local_trainer(
                request.training.data_dir, plan.checkpoint_dir, request.training.model
            )
        else:
            check_local_program(request.training.data_dir, plan.checkpoint_dir)
        backend_impl.check_launch(plan.spec)  # before the lock makes the jobs' root
        with one_local_launch_at_a_time(backend_impl.root):
            check_checkpoint_folder_free(plan.checkpoint_dir, backend_impl.root)
            if storage.is_local(plan.checkpoint_dir):
                check_checkpoint_lock(plan.checkpoint_dir)
            name = backend_impl.launch(plan.spec)
        return LaunchResult(job_name=name, checkpoint_dir=plan.checkpoint_dir)
    shared = request.shared_volume
    if (
        shared is not None
        and storage.is_local(plan.checkpoint_dir)
        and _inside(plan.checkpoint_dir, shared)
    ):  # seen here: the claim this step mounts as the nodes do
        check_checkpoint_lock(plan.checkpoint_dir)
    if plan.stage_from:
        from kubetrain.components.launch_trainjob.staging import stage_dataset

        stage_dataset(plan.stage_from, plan.stage_to)
    name = backend_impl.launch(plan.spec)
    plan.say_note()
    return LaunchResult(job_name=name, checkpoint_dir=plan.checkpoint_dir)


def render_launch(
    request: LaunchRequest, backend: str = "trainer", options: BackendOptions | None = None
) -> list[dict[str, Any]]:
    """The objects ``launch`` with the same request would create on a cluster, in creation
    order, without contacting one (``trainer_version`` auto renders the newest form; an empty
    namespace is the kubeconfig context's, as launch finds it outside a pod)."""
    from kubetrain.render import RENDERED_BACKENDS, render_job
    from kubetrain.render.trainjob import LATEST_VERSION

    if backend not in RENDERED_BACKENDS:
        raise InvalidInput(
            "backend",
            f"{backend!r} has nothing to render",
            "use --backend trainer (a TrainJob), pytorchjob (a PyTorchJob) or job (Indexed "
            "Job + headless Service)",
        )
    from kubetrain.backends.kubernetes.client import resolve_namespace

    options = (options or BackendOptions()).validate()
    plan = plan_launch(request, backend, get_backend(backend, options))
    version = LATEST_VERSION if options.trainer_version == "auto" else options.trainer_version
    rendered = render_job(plan.spec, backend, resolve_namespace(options.namespace), version)
    plan.say_note()
    return rendered


# ------------------------------------------------------------------ text to spec pieces
def parse_pairs(values: list[str] | tuple[str, ...], option: str) -> dict[str, str]:
    """``KEY=VALUE`` texts (the value may hold ``=``), or JSON objects of texts (what an Argo
    parameter carries), as one mapping."""
    parsed: dict[str, str] = {}
    for value in values:
        if value.lstrip().startswith("{"):
            parsed.update(text_mapping(_json(value, option), option))
            continue
        key, sep, item = value.partition("=")
        if not sep or not key:
            raise InvalidInput(
                option, f"{value!r} is not KEY=VALUE", f"write it like {option} NAME=value"
            )
        parsed[key] = item
    return parsed


def parse_items(values: list[str] | tuple[str, ...], option: str) -> list[str]:
    """Texts, each given alone or as a JSON list of texts (what an Argo parameter carries)."""
    items: list[str] = []
    for value in values:
        items.extend(text_list(_json(value, option), option) if value.startswith("[") else [value])
    return items


def _json(text: str, option: str) -> Any:
    try:
        return bounded_json.loads(text)
    except json.JSONDecodeError as exc:
        problem = f"{rules.shown(text)} is not JSON ({exc.msg})"
        raise InvalidInput(option, problem, _JSON_FIX) from None


_JSON_FIX = 'write a JSON list like ["torchrun", "train.py"] or an object like {"KEY": "value"}'


def text_mapping(value: Any, option: str) -> dict[str, str]:
    """A mapping of text to text, as a KFP ``dict`` parameter or a JSON object gives it (a
    number is not text: an env value or label value is a string in Kubernetes)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInput(option, f"{rules.shown(value)} is not a mapping", _JSON_FIX)
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise InvalidInput(
                option,
                f"{rules.shown(key)}: {rules.shown(item)} is not text",
                "write the value in quotes",
            )
    return dict(value)


def text_list(value: Any, option: str) -> list[str]:
    """A list of texts, as a KFP ``list`` parameter or a JSON list gives it."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InvalidInput(option, f"{rules.shown(value)} is not a list of texts", _JSON_FIX)
    return value


def parse_volume(text: str) -> Volume:
    """``NAME=CLAIM:/PATH[:ro]``."""
    name, sep, rest = text.partition("=")
    claim, colon, path = rest.partition(":")
    read_only = path.endswith(":ro")
    path = path.removesuffix(":ro")
    if not sep or not colon or not name or not claim or not path:
        raise InvalidInput(
            "--volume", f"{text!r} is not NAME=CLAIM:/PATH", "write it like shared=my-pvc:/mnt"
        )
    return Volume(name=name, claim_name=claim, mount_path=path, read_only=read_only)


def parse_toleration(text: Any) -> Toleration:
    """``KEY[=VALUE][:EFFECT]``; no value tolerates the taint whatever its value (Exists)."""
    if not isinstance(text, str):
        raise InvalidInput(
            "tolerations",
            f"{rules.shown(text)} is not text",
            "write each like nvidia.com/gpu:NoSchedule or key=value:NoSchedule",
        )
    taint, _, effect = text.partition(":")
    key, sep, value = taint.partition("=")
    return Toleration(key=key, operator="Equal" if sep else "Exists", value=value, effect=effect)


def shared_volume(claim: str, mount_path: str) -> Volume | None:
    """The claim this step and the nodes share, or None without one."""
    return Volume(name="shared", claim_name=claim, mount_path=mount_path) if claim else None


def initializer(uri: str, secret: str) -> Initializer | None:
    return Initializer(uri, secret) if uri else None


# ------------------------------------------------------------------ local pre-flight
def check_local_trainer(data_dir: str, checkpoint_dir: str, model: str) -> None:
    """Refuse now what would fail every node of our trainer on this machine (the local
    backend), before a job is created that can only fail: a model that does not import, a
    folder that is no readable dataset, a checkpoint folder that is a file. A URL is left to
    the nodes, which have its filesystem's credentials."""
    from kubetrain.artifacts.datasets import read_manifest

    if model not in BUILTIN_MODELS:
        check_model_imports(model)
    if storage.is_local(storage.dereference(data_dir)):
        try:
            read_manifest(data_dir)
        except IntegrityError as exc:
            fix = "point --data at a folder written by `kubetrain prep`"
            raise InvalidInput("data", problem_of(exc), fix) from None
    if storage.is_local(checkpoint_dir):
        _check_checkpoint_folder(storage.local_path(checkpoint_dir, "checkpoint_dir"))


def check_local_program(data_dir: str, checkpoint_dir: str) -> None:
    """Refuse now what a user's program would meet on this machine: a ``--data`` that does
    not exist (the program is told it in KUBETRAIN_DATA_DIR), a checkpoint folder that is a
    file (its nodes run in it). A URL is left to the program."""
    data = storage.dereference(data_dir) if data_dir else ""
    if data and storage.is_local(data) and not storage.local_path(data, "data").exists():
        raise InvalidInput(
            "data",
            f"{data} does not exist",
            "point --data at the dataset folder your program reads, or leave it out",
        )
    if storage.is_local(checkpoint_dir):
        _check_checkpoint_folder(storage.local_path(checkpoint_dir, "checkpoint_dir"))


#: How long a local launch waits for another one's check and creation (well under a second
#: each); a launch holding the lock longer is stopped or hung.
LAUNCH_LOCK_SECONDS = 60.0
LAUNCH_LOCK_POLL_SECONDS = 0.02
#: flock's answers on a filesystem that has no locks (NFS without lockd, some FUSE mounts).
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EBADF, errno.EINVAL)
#: What reading a job folder's records raises when they are missing, damaged or of the wrong
#: shape (a status.json holding a list).
UNREADABLE_RECORD = (
    KubetrainError,
    OSError,
    ValueError,
    RecursionError,
    LookupError,
    TypeError,
    AttributeError,
)


@contextlib.contextmanager
def one_local_launch_at_a_time(root: Path) -> Iterator[None]:
    """Hold an ``flock`` on the local jobs' root folder from the check that no live job uses
    the checkpoint folder until the new job's record exists: two launches at once each found
    the folder free and both started. The root's own lock, so no file is added among the
    jobs; it ends with this process whatever happens, and the job's supervisor does not
    inherit it (``O_CLOEXEC``, and ``Popen`` closes the rest). Without locks on the root's
    filesystem the launch goes on unlocked, as before."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        deadline = time.monotonic() + LAUNCH_LOCK_SECONDS
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise KubetrainError(
                        f"another `kubetrain launch` has held the lock on {root} for "
                        f"{LAUNCH_LOCK_SECONDS:g}s (it checks and creates a job in under a "
                        "second); stop that launch if it hangs, then launch again"
                    ) from None
                time.sleep(LAUNCH_LOCK_POLL_SECONDS)
            except OSError as exc:
                if exc.errno not in NO_LOCKS:
                    raise
                break
        yield
    finally:
        os.close(fd)


def check_checkpoint_folder_free(checkpoint_dir: str, root: Path) -> None:
    """Refuse a local checkpoint folder that is, lies in or holds the checkpoint folder of a
    live job of this machine (Created or Running, as `kubetrain list` finds them): our
    trainer locks its folder only once its nodes run, and a user's program takes no lock, so
    two jobs would overwrite each other's files (``model.pt``, epochs, ``LATEST``). A finished
    job costs one read of its ``status.json``: a root keeps many (``--keep-job``)."""
    from kubetrain.backends.base import CREATED, RUNNING
    from kubetrain.backends.local.backend import LocalBackend
    from kubetrain.backends.local.files import read_record, read_status

    if not storage.is_local(checkpoint_dir) or not root.is_dir():
        return
    folder = storage.local_path(checkpoint_dir, "checkpoint_dir").resolve()
    backend = LocalBackend(root)
    for job_dir in sorted(root.iterdir()):
        try:
            if read_status(job_dir).finished:
                continue
            # A job whose supervisor died is Failed here, as in `kubetrain list`.
            state = backend.status(job_dir.name).state
            theirs = read_record(job_dir / "job.json")["spec"]["env"][CHECKPOINT_DIR_ENV]
        except UNREADABLE_RECORD:
            continue  # no job, or records that do not say: `list` shows it Unknown
        if state not in (CREATED, RUNNING):
            continue
        if not isinstance(theirs, str) or not storage.is_local(theirs):
            continue
        other = storage.local_path(theirs, "checkpoint_dir").resolve()
        if folder == other:
            relation = "is the checkpoint folder"
        elif folder.is_relative_to(other):
            relation = f"lies inside {other}, the checkpoint folder"
        elif other.is_relative_to(folder):
            relation = f"holds {other}, the checkpoint folder"
        else:
            continue
        raise InvalidInput(
            "checkpoint_dir",
            f"{folder} {relation} of live job {job_dir.name} ({state})",
            "give this job a --checkpoint-dir of its own, apart from that job's, or wait until "
            f"that job ends (or `kubetrain delete {job_dir.name}`)",
        )


def check_checkpoint_lock(checkpoint_dir: str) -> None:
    """Refuse a checkpoint folder whose lock file a running writer holds: our trainer's rank 0
    holds its ``flock`` for the whole run, whichever machine or root launched it (on a shared
    volume NFS v4 shows it to every client). Nothing is created: the lock file, if there, is
    opened for reading and a shared lock only tried."""
    path = storage.local_path(checkpoint_dir, "checkpoint_dir") / CHECKPOINT_LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return  # no lock file: no writer has come yet
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 300, 0).decode(errors="replace").strip() or "not yet said"
            raise InvalidInput(
                "checkpoint_dir",
                f"{path.parent} is being written by another job (its lock {path} is held by: "
                f"{holder})",
                "give this job a --checkpoint-dir of its own, or wait until that job ends",
            ) from None
        except OSError:
            return  # a filesystem without locks: there is nothing to see
    finally:
        os.close(fd)


def check_model_imports(model: str) -> None:
    """Import the user's ``package.module:callable`` as the nodes will: from the folder they
    run in (this one; ``kubetrain.callables``). torch is imported only when the module
    imports it, so a typo is refused in a second."""
    from kubetrain.callables import import_callable

    try:
        import_callable(model, "model", MODEL_FIX)
    except InvalidInput:
        raise
    except Exception as exc:  # the user's module raised while importing (SyntaxError, ...)
        problem = f"importing {model} failed ({type(exc).__name__}: {refusal_reason(exc)})"
        raise InvalidInput("model", problem, MODEL_FIX) from None


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
