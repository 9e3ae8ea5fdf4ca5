"""The typed spec of a distributed training job, rendered by every backend.

One spec, many renderers: the local backend runs it as processes on this machine, the
Kubernetes backend renders it into a Kubeflow Trainer ``TrainJob``. Validation happens here,
once, before any backend creates anything.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubetrain import rules
from kubetrain.errors import InvalidInput
from kubetrain.images import TRAINER_IMAGE

RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
#: The torchrun variables the Trainer's torch plugin sets on every node and refuses in a
#: TrainJob's env (kubeflow/trainer v2.3.0 ``pkg/constants/constants.go`` ~300
#: ``TorchRunReservedEnvNames``, checked by ``pkg/runtime/framework/plugins/torch/torch.go``
#: ``Validate``); every backend sets these five. Other ``PET_*`` variables are torchrun
#: options a user may set (``PET_MAX_RESTARTS``, ``PET_RDZV_BACKEND``...).
RESERVED_ENV_NAMES = (
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
)
TOLERATION_OPERATORS = ("Equal", "Exists")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
MAX_SCRIPT_BYTES = 1024 * 1024  # a ConfigMap holds at most 1 MiB
MAX_RESTARTS = 100
#: What the renderers add to every pod that ships a script (a ConfigMap volume mounted here),
#: so the user's volumes can be checked against them before anything is rendered.
SCRIPT_VOLUME = "kubetrain-script"
SCRIPT_MOUNT_PATH = "/workspace"
#: A storage URI: an RFC 3986 scheme, "://", then no whitespace.
STORAGE_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
#: The replicated jobs (and containers) of a Trainer runtime that run the nodes and the
#: initializers (trainer v2.3.0 ``pkg/constants/constants.go``: Node, DatasetInitializer,
#: ModelInitializer).
NODE_JOB = "node"
DATASET_INITIALIZER_JOB = "dataset-initializer"
MODEL_INITIALIZER_JOB = "model-initializer"


def validate_labels(labels: dict[str, str], field_name: str) -> None:
    """Keys are qualified names, values label values: what the API server checks on labels
    and on a node selector."""
    for key, value in labels.items():
        rules.qualified_name(key, field_name)
        rules.label_value(value, field_name)


def _refuse_nul(values: Iterable[str], field_name: str) -> None:
    """A NUL byte cannot reach a process's argv or environment: the node would fail to start."""
    for value in values:
        if "\0" in value:
            raise InvalidInput(
                field_name, f"{rules.shown(value)} holds a NUL byte", "remove the NUL byte"
            )


@dataclass(frozen=True)
class Toleration:
    """A pod toleration, so nodes can run on tainted (e.g. GPU) machines."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def validate(self) -> None:
        """The API server's rules (validateTolerations): an empty key tolerates every taint
        and needs Exists; Exists takes no value."""
        rules.one_of(self.operator, "tolerations.operator", TOLERATION_OPERATORS)
        if self.key:
            rules.qualified_name(self.key, "tolerations.key")
        elif self.operator != "Exists":
            raise InvalidInput(
                "tolerations.key",
                "is empty with operator Equal",
                "give the taint's key, or no value to tolerate every taint (operator Exists)",
            )
        if self.operator == "Exists" and self.value:
            raise InvalidInput(
                "tolerations.value", "must be empty with operator Exists", "drop the value"
            )
        rules.label_value(self.value, "tolerations.value")
        if self.effect:
            rules.one_of(
                self.effect,
                "tolerations.effect",
                TAINT_EFFECTS,
                "use NoSchedule, PreferNoSchedule, NoExecute or leave it empty",
            )


@dataclass(frozen=True)
class Initializer:
    """Data the Trainer's initializer fetches before training (dataset or model).

    Credentials are referenced by Secret name only, never carried as values.
    """

    storage_uri: str
    secret_name: str = ""

    def validate(self, field_name: str) -> None:
        if not isinstance(self.storage_uri, str) or not STORAGE_URI.fullmatch(self.storage_uri):
            raise InvalidInput(
                f"{field_name}.storage_uri",
                f"{rules.shown(self.storage_uri)} is not a URI",
                "use e.g. hf://org/dataset or s3://bucket/path",
            )
        if self.secret_name:
            rules.dns1123_subdomain(self.secret_name, f"{field_name}.secret_name")


@dataclass(frozen=True)
class Resources:
    """Resources each node (pod) requests; quantities use Kubernetes syntax ('2', '500m', '4Gi')."""

    cpu: str = ""
    memory: str = ""
    gpu: int = 0

    def validate(self, field_name: str = "resources") -> None:
        for key, value in (("cpu", self.cpu), ("memory", self.memory)):
            if value:
                rules.quantity(value, f"{field_name}.{key}")
        rules.whole_number(self.gpu, f"{field_name}.gpu", 0)


@dataclass(frozen=True)
class Volume:
    """A PersistentVolumeClaim mounted into every node, for shared data and checkpoints."""

    name: str
    claim_name: str
    mount_path: str
    read_only: bool = False

    def validate(self) -> None:
        rules.dns1123_label(self.name, "volumes.name")
        rules.dns1123_subdomain(
            self.claim_name, "volumes.claim_name", "give the name of an existing PVC, e.g. my-pvc"
        )
        path = self.mount_path
        if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
            raise InvalidInput(
                "volumes.mount_path",
                f"{rules.shown(path)} is not an absolute path",
                "use e.g. /mnt/shared",
            )
        if ".." in path.split("/"):
            raise InvalidInput(
                "volumes.mount_path",
                f"{rules.shown(path)} has a '..' part, which Kubernetes refuses",
                "use the path without '..', e.g. /mnt/shared",
            )

    @property
    def mount_point(self) -> str:
        """The mount path as the node sees it: "/mnt/x/" and "/mnt//x" are both "/mnt/x"."""
        return posixpath.normpath(self.mount_path)


#: ``procs_per_node`` that follows the GPUs: every face's default.
#: Programs that start ranks themselves: under ``--launcher mpi`` the launcher runs mpirun.
MPI_LAUNCHER_PROGRAMS = ("mpirun", "mpiexec", "orterun", "prterun", "torchrun", "deepspeed")
#: The same launchers run as Python modules (``python -m torch.distributed.run``).
LAUNCHER_MODULES = (
    "torch.distributed.run",
    "torch.distributed.launch",
    "deepspeed.launcher.runner",
)


#: (what, fix) of a program that starts ranks itself under a launcher that starts them too.
_STARTER_REFUSALS = {
    "mpi": lambda starter: (
        f"runs {starter}, which starts ranks itself, and --launcher mpi runs mpirun",
        "give one rank's program, e.g. python train.py",
    ),
    "ray": lambda starter: (
        f"runs {starter}, which starts ranks itself, and under Ray, Ray Train starts the "
        "workers (TorchTrainer's ScalingConfig)",
        "give the Ray job's entrypoint, e.g. python train.py",
    ),
}


def refuse_rank_starter(program: list[str], launcher: str, field: str = "command") -> None:
    """A program that starts ranks itself, refused under a launcher that starts them too (mpi:
    mpirun; ray: Ray Train), in one line naming ``field`` as the face calls it."""
    if launcher in _STARTER_REFUSALS and (starter := rank_starter(program)):
        raise InvalidInput(field, *_STARTER_REFUSALS[launcher](starter))


def rank_starter(program: list[str]) -> str:
    """The launcher ``program`` runs, when it is one that starts ranks itself (directly, as a
    Python module, or behind ``env [VAR=value...]``); empty when it is one rank's program."""
    words = list(program)
    while words and Path(words[0]).name == "env":
        words = words[1:]
        while words and ("=" in words[0] or words[0].startswith("-")):
            words = words[1:]
    if not words:
        return ""
    name = Path(words[0]).name
    if name in MPI_LAUNCHER_PROGRAMS:
        return name
    if name.startswith("python"):  # its options up to the script or -m MODULE
        for option, following in zip(words[1:], [*words[2:], ""], strict=True):
            module = following if option == "-m" else option[2:] if option[:2] == "-m" else ""
            if module:  # `-m MODULE`, or glued as Python takes it too: `-mMODULE`
                return f"python -m {module}" if module in LAUNCHER_MODULES else ""
            if not option.startswith("-"):
                break
    return ""


#: The backends that run ``--nodes MIN:MAX``: Training Operator v1.9's PyTorchJob
#: ``elasticPolicy`` and the local backend, which plays it. Kubeflow Trainer v2.3 has no elastic
#: training (its never-implemented elasticPolicy was removed in v2.2, kubeflow/trainer#3235).
ELASTIC_BACKENDS = ("local", "pytorchjob")
#: torchrun's rendezvous for an elastic job: the Training Operator's default ``rdzvBackend``.
ELASTIC_RDZV_BACKEND = "c10d"
#: Set on every node of an elastic job (PyTorchJob pods and local nodes alike): torch 2.13's
#: torchrun shares its rendezvous TCPStore with the workers, and a node that joins a running
#: job then waits for the store address the rank-0 node published only in its first round,
#: until rank 0 fails with ``DistStoreError: wait timeout after 60000ms`` (measured here;
#: ``torch/distributed/elastic/rendezvous/dynamic_rendezvous.py``
#: ``DynamicRendezvousHandler.next_rendezvous``, ~line 1205: the cached
#: ``_bootstrap_store_info`` is not rebuilt on a new round; pytorch/pytorch#147064). torch's own
#: opt-out builds the store info afresh in every round.
ELASTIC_NODE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
_NODES_FIX = "give a whole number of nodes, e.g. 2, or MIN:MAX for an elastic job, e.g. 1:2"


def resolve_nodes(value: int | str, field_name: str = "nodes") -> tuple[int | None, int]:
    """``(min_nodes, max_nodes)`` of ``value``: a whole number N (a number's text too, as an Argo
    parameter carries it) is a fixed-size job, ``(None, N)``; ``MIN:MAX`` an elastic one, which
    goes on with any number of nodes from MIN to MAX (torchrun's ``--nnodes MIN:MAX``)."""
    if isinstance(value, str):
        text = value.strip()
        low, colon, high = text.partition(":")
        try:
            numbers = [int(part) for part in ((low, high) if colon else (text,))]
        except ValueError:
            raise InvalidInput(
                field_name, f"{rules.shown(value)} is not N nor MIN:MAX", _NODES_FIX
            ) from None
        if not colon:
            return None, rules.whole_number(numbers[0], field_name, 1, fix=_NODES_FIX)
        min_nodes, max_nodes = numbers
        return check_node_range(min_nodes, max_nodes, field_name), max_nodes
    return None, rules.whole_number(value, field_name, 1, fix=_NODES_FIX)


def check_node_range(min_nodes: int, max_nodes: int, field_name: str = "nodes") -> int:
    """``min_nodes`` of an elastic job of at most ``max_nodes``: 1 or more, and no more than
    MAX (torchrun refuses ``--nnodes 3:2`` only once every node has started)."""
    fix = "give MIN:MAX with 1 <= MIN <= MAX, e.g. 1:2"
    shown = f"{rules.shown(min_nodes)}:{rules.shown(max_nodes)}"
    for bound, number in (("MIN", min_nodes), ("MAX", max_nodes)):
        if not isinstance(number, int) or isinstance(number, bool) or number < 1:
            raise InvalidInput(
                field_name, f"{bound} {rules.shown(number)} in {shown} is below 1", fix
            )
    rules.whole_number(max_nodes, field_name, 1, fix=fix)  # int32, as a replica count
    if min_nodes > max_nodes:
        raise InvalidInput(
            field_name, f"MIN {min_nodes} is more than MAX {max_nodes} in {shown}", fix
        )
    return min_nodes


#: Launchers that start a fixed world, and why.
_FIXED_WORLD_LAUNCHERS = {
    "mpi": "mpirun starts a fixed world of ranks",
    "ray": "kubetrain runs a Ray job on a fixed worker group (ScalingConfig num_workers = "
    "nodes x procs per node)",
}


def check_elastic(
    nodes: int | str,
    launcher: str,
    strategy: str = "",
    option: Callable[[str], str] = str,
) -> None:
    """An elastic ``nodes`` (``MIN:MAX``) needs torchrun (mpirun starts a fixed world of
    ranks) and a strategy whose checkpoint resumes at another world size (a ZeRO checkpoint
    does not). ``option(name)`` is how the face names a field; a fixed ``nodes`` passes."""
    min_nodes, max_nodes = resolve_nodes(nodes, option("nodes"))
    if min_nodes is None:
        return
    given = f"{min_nodes}:{max_nodes}"
    if launcher in _FIXED_WORLD_LAUNCHERS:
        raise InvalidInput(
            option("nodes"),
            f"{given} is elastic, and {_FIXED_WORLD_LAUNCHERS[launcher]}",
            f"use launcher torchrun for an elastic job, or a fixed {max_nodes} nodes with "
            f"{launcher}",
        )
    if strategy == "deepspeed":
        raise InvalidInput(
            option("strategy"),
            f"deepspeed with elastic nodes {given}: a ZeRO checkpoint resumes only at the world "
            "size that wrote it",
            f"use ddp or fsdp for an elastic job, or a fixed {max_nodes} nodes with deepspeed",
        )


#: The restarts an elastic job gets when none are asked for (0, every face's default): each
#: lost or rejoining node makes torchrun restart the others at the new size, one restart each
#: time, and with none the first lost node would end the job.
DEFAULT_ELASTIC_RESTARTS = 3


def elastic_restarts(max_restarts: int, min_nodes: int | None) -> int:
    """``max_restarts`` as asked, or ``DEFAULT_ELASTIC_RESTARTS`` for an elastic job that asks
    for none."""
    return DEFAULT_ELASTIC_RESTARTS if min_nodes is not None and max_restarts == 0 else max_restarts


def nodes_text(min_nodes: int | None, max_nodes: int) -> str:
    """``--nodes`` as given: ``N`` or ``MIN:MAX``."""
    return str(max_nodes) if min_nodes is None else f"{min_nodes}:{max_nodes}"


AUTO_PROCS = "auto"
_PROCS_FIX = "give auto (one process per GPU, else 1) or a whole number from 1, e.g. 2"


def resolve_procs_per_node(value: int | str, gpu: int, field_name: str = "procs_per_node") -> int:
    """The processes per node ``value`` asks for: a whole number from 1 (a number's text too, as
    an Argo parameter carries it), or ``auto``: the GPUs per node (``gpu``), else 1. Resolved
    before rendering, so every renderer and the local backend start the same number. Kubeflow
    Trainer's own auto, PET_NPROC_PER_NODE=auto (torchrun's GPU count), falls back to the CPU
    count without GPUs (trainer v2.3.0 pkg/runtime/framework/plugins/torch/torch.go
    EnforceMLPolicy), too many ranks for a CPU job asking for no cores."""
    if value == AUTO_PROCS:
        return gpu or 1
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise InvalidInput(
                field_name, f"{rules.shown(value)} is not a whole number or auto", _PROCS_FIX
            ) from None
    return rules.whole_number(value, field_name, 1, fix=_PROCS_FIX)


def procs_gpu_mismatch(procs_per_node: int, gpu: int) -> str:
    """What an explicit process count that differs from the GPUs per node does (a warning, not
    a refusal: a model may want two GPUs a process); empty when they agree or there are none."""
    if not gpu or procs_per_node == gpu:
        return ""
    asked = f"--procs-per-node {procs_per_node} with --gpu {gpu}"
    if procs_per_node < gpu:
        return f"{asked} leaves {gpu - procs_per_node} GPU(s) per node idle"
    return f"{asked} starts more processes than GPUs per node"


#: The runtime every face defaults to: ours for CPU (`kubetrain render runtimes` installs it),
#: not the Trainer's `torch-distributed`, which the README's install does not create.
DEFAULT_RUNTIME = "torch-ddp-cpu"
#: The runtime ``--launcher mpi`` takes when the default one is asked for: ours, an MPI policy
#: with a launcher job and sshd nodes (runtimes/kubetrain-deepspeed-mpi.yaml).
MPI_RUNTIME = "kubetrain-deepspeed-mpi"


@dataclass(frozen=True)
class RuntimeRef:
    """The Kubeflow Trainer runtime a TrainJob refers to."""

    name: str = DEFAULT_RUNTIME
    kind: str = "ClusterTrainingRuntime"

    def validate(self) -> None:
        rules.dns1123_subdomain(self.name, "runtime")
        rules.one_of(self.kind, "runtime.kind", RUNTIME_KINDS)


@dataclass(frozen=True)
class TrainJobSpec:
    """A distributed training job: ``num_nodes`` nodes each running ``command + args``.

    The command is started once per node with the Trainer's PET_* environment, so a
    ``torchrun`` command takes its topology (nodes, processes per node, rank, master) from it.
    """

    name: str
    command: tuple[str, ...]
    args: tuple[str, ...] = ()
    image: str = TRAINER_IMAGE
    env: dict[str, str] = field(default_factory=dict)
    num_nodes: int = 1
    #: None: a fixed-size job of ``num_nodes``. A number: an elastic job, which starts with up
    #: to ``num_nodes`` and goes on while at least ``min_nodes`` remain (``--nodes MIN:MAX``).
    min_nodes: int | None = None
    procs_per_node: int = 1
    resources_per_node: Resources = field(default_factory=Resources)
    runtime: RuntimeRef = field(default_factory=RuntimeRef)
    volumes: tuple[Volume, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    pod_labels: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    service_account: str = ""
    #: A Secret (e.g. S3 credentials and endpoint) whose keys the nodes get as environment
    #: variables; only its name is rendered, never its values. The local backend ignores it.
    storage_secret: str = ""
    suspend: bool = False
    #: After a node fails, restart every node up to this many times (JobSet's
    #: failurePolicy.maxRestarts: a torch job cannot go on with one node replaced).
    max_restarts: int = 0
    active_deadline_seconds: int | None = None
    dataset_initializer: Initializer | None = None
    model_initializer: Initializer | None = None
    #: A local training script shipped with the job (as a ConfigMap mounted at /workspace on a
    #: cluster); empty when the script is baked into the image or lies on a mounted volume.
    script: str = ""
    #: The folder every node's program runs in (made if missing); empty: the image's (on a
    #: cluster) or the launching process's (locally). A user's script that saves into its
    #: working directory then saves where collect reads.
    working_dir: str = ""
    #: ``torchrun``: ``command`` runs once per node with the PET_* env. ``mpi``: ``command`` is
    #: one rank's program, which mpirun starts ``procs_per_node`` times on every node from a
    #: hostfile (Kubeflow Trainer's MPI policy; ``rules.LAUNCHERS``). ``ray``: ``command`` is
    #: the Ray job's entrypoint (its driver), run once; its Ray Train workers run on
    #: ``num_nodes`` Ray worker nodes with ``procs_per_node`` workers each.
    launcher: str = "torchrun"

    def validate(self) -> TrainJobSpec:
        rules.dns1035_label(self.name, "name")
        if not self.command or not all(isinstance(part, str) and part for part in self.command):
            raise InvalidInput(
                "command", "is empty", "give the program to run, e.g. torchrun train.py"
            )
        _refuse_nul(self.command, "command")
        _refuse_nul(self.args, "command")
        rules.one_of(self.launcher, "launcher", rules.LAUNCHERS, rules.LAUNCHER_FIX)
        refuse_rank_starter([*self.command, *self.args], self.launcher)
        rules.image_reference(self.image, "image")
        rules.whole_number(self.num_nodes, "nodes", 1)
        rules.whole_number(self.procs_per_node, "procs_per_node", 1)
        for key in self.env:
            rules.env_var_name(key, "env")
            if key in RESERVED_ENV_NAMES:
                raise InvalidInput(
                    "env",
                    f"{key} is set by the Trainer itself",
                    f"use --nodes/--procs-per-node instead of {', '.join(RESERVED_ENV_NAMES)}",
                )
        _refuse_nul(self.env.values(), "env")
        self.resources_per_node.validate("resources_per_node")
        self.runtime.validate()
        self._validate_volumes()
        validate_labels(self.labels, "labels")
        validate_labels(self.pod_labels, "pod_labels")
        validate_labels(self.node_selector, "node_selector")
        for toleration in self.tolerations:
            toleration.validate()
        if self.service_account:
            rules.dns1123_subdomain(self.service_account, "service_account")
        if self.storage_secret:
            rules.dns1123_subdomain(self.storage_secret, "storage_secret")
        rules.whole_number(
            self.max_restarts,
            "max_restarts",
            0,
            MAX_RESTARTS,
            "use 0 (fail on the first node failure) or a small number like 3",
        )
        if self.min_nodes is not None:
            self._validate_elastic()
        if self.active_deadline_seconds is not None:
            # An int64 in the Job and the TrainJob.
            rules.whole_number(
                self.active_deadline_seconds, "active_deadline_seconds", 1, rules.INT64_MAX
            )
        if self.dataset_initializer is not None:
            self.dataset_initializer.validate("dataset_initializer")
        if self.model_initializer is not None:
            self.model_initializer.validate("model_initializer")
        if self.script:
            self._validate_script()
        if self.working_dir:
            _refuse_nul([self.working_dir], "working_dir")
            if not posixpath.isabs(self.working_dir):
                raise InvalidInput(
                    "working_dir",
                    f"{rules.shown(self.working_dir)} is not an absolute path",
                    "give the folder as an absolute path, e.g. /mnt/shared/checkpoints/job",
                )
        return self

    @property
    def elastic(self) -> bool:
        return self.min_nodes is not None

    @property
    def nodes_text(self) -> str:
        return nodes_text(self.min_nodes, self.num_nodes)

    def _validate_elastic(self) -> None:
        """A node range, torchrun, restarts to go on with (launch gives
        ``DEFAULT_ELASTIC_RESTARTS`` when none are asked for), and torch's opt-out of the shared
        rendezvous store left as ``ELASTIC_NODE_ENV`` sets it: a rejoining node needs it."""
        check_node_range(self.min_nodes, self.num_nodes)  # type: ignore[arg-type]
        check_elastic(self.nodes_text, self.launcher)
        if self.max_restarts < 1:
            raise InvalidInput(
                "max_restarts",
                f"is 0 with elastic nodes {self.nodes_text}: the first lost node would end the job",
                f"give 1 or more (launch gives {DEFAULT_ELASTIC_RESTARTS} when none is asked for)",
            )
        for key, value in ELASTIC_NODE_ENV.items():
            if self.env.get(key, value) != value:
                raise InvalidInput(
                    "env",
                    f"{key}={rules.shown(self.env[key])} in an elastic job: a node that rejoins "
                    "it would fail with DistStoreError (pytorch/pytorch#147064)",
                    f"drop {key}: kubetrain sets it to {value} on every node of an elastic job",
                )

    @property
    def ray_entrypoint(self) -> str:
        """The Ray job's entrypoint (``launcher`` ray): Ray runs it with a shell (ray 2.60
        ``dashboard/modules/job/job_supervisor.py`` ``_exec_entrypoint``: ``Popen(entrypoint,
        shell=True)``; a RayJob's ``entrypoint`` is a string too), so every word is quoted, and
        a ``working_dir`` is made (as the kubelet makes a container's ``workingDir``) and entered
        first: the driver then runs where a user's program saves."""
        program = shlex.join([*self.command, *self.args])
        if not self.working_dir:
            return program
        folder = shlex.quote(self.working_dir)
        return f"mkdir -p -- {folder} && cd -- {folder} && {program}"

    def replicated_jobs(self) -> list[tuple[str, int, int]]:
        """(name, replicas, completions) of the JobSet replicated jobs a Trainer runtime runs
        for this spec: the nodes, and the initializers it asks for. What the pod names JobSet
        gives them must fit (``rules.jobset_pod_names``)."""
        jobs = [(NODE_JOB, 1, self.num_nodes)]
        for initializer, job in (
            (self.dataset_initializer, DATASET_INITIALIZER_JOB),
            (self.model_initializer, MODEL_INITIALIZER_JOB),
        ):
            if initializer is not None:
                jobs.append((job, 1, 1))
        return jobs

    def _validate_volumes(self) -> None:
        """Each volume valid, with a name and a mount point of its own: the API server refuses
        a pod with two volumes of one name or two mounts at one path, counting the script's
        volume the renderers add."""
        names, points = ({SCRIPT_VOLUME}, {SCRIPT_MOUNT_PATH}) if self.script else (set(), set())
        for volume in self.volumes:
            volume.validate()
            if volume.name in names:
                used = "by the shipped script" if volume.name == SCRIPT_VOLUME else "twice"
                raise InvalidInput(
                    "volumes.name", f"{volume.name} is used {used}", "give each volume its own name"
                )
            if volume.mount_point in points:
                where = (
                    "is where the shipped script is mounted"
                    if volume.mount_point == SCRIPT_MOUNT_PATH and self.script
                    else "is mounted twice"
                )
                raise InvalidInput(
                    "volumes.mount_path",
                    f"{volume.mount_point} {where}",
                    "use a path of its own for each volume, e.g. /mnt/shared",
                )
            names.add(volume.name)
            points.add(volume.mount_point)

    def _validate_script(self) -> None:
        path = Path(self.script)
        if not path.is_file():
            raise InvalidInput("script", f"{self.script} is not a file", "give a local .py file")
        size = path.stat().st_size
        if size > MAX_SCRIPT_BYTES:
            raise InvalidInput(
                "script",
                f"{self.script} is {size} bytes, more than a ConfigMap's {MAX_SCRIPT_BYTES}",
                "bake the script into the image or put it on a mounted volume",
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainJobSpec:
        return cls(
            name=data["name"],
            command=tuple(data["command"]),
            args=tuple(data.get("args", ())),
            image=data.get("image", TRAINER_IMAGE),
            env=dict(data.get("env", {})),
            num_nodes=data.get("num_nodes", 1),
            min_nodes=data.get("min_nodes"),
            procs_per_node=data.get("procs_per_node", 1),
            resources_per_node=Resources(**data.get("resources_per_node", {})),
            runtime=RuntimeRef(**data.get("runtime", {})),
            volumes=tuple(Volume(**v) for v in data.get("volumes", ())),
            labels=dict(data.get("labels", {})),
            pod_labels=dict(data.get("pod_labels", {})),
            node_selector=dict(data.get("node_selector", {})),
            tolerations=tuple(Toleration(**t) for t in data.get("tolerations", ())),
            service_account=data.get("service_account", ""),
            storage_secret=data.get("storage_secret", ""),
            suspend=data.get("suspend", False),
            max_restarts=data.get("max_restarts", 0),
            active_deadline_seconds=data.get("active_deadline_seconds"),
            dataset_initializer=_optional(Initializer, data.get("dataset_initializer")),
            model_initializer=_optional(Initializer, data.get("model_initializer")),
            working_dir=data.get("working_dir", ""),
            script=data.get("script", ""),
            launcher=data.get("launcher", "torchrun"),
        )


def _optional(kind: type, data: dict[str, Any] | None) -> Any:
    return None if data is None else kind(**data)
