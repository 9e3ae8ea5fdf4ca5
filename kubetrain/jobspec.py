"""The typed spec of a distributed training job, rendered by every backend.

One spec, many renderers: the local backend runs it as processes on this machine, the
Kubernetes backend renders it into a Kubeflow Trainer ``TrainJob``. Validation happens here,
once, before any backend creates anything.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubetrain.errors import InvalidInput
from kubetrain.images import TRAINER_IMAGE

NAME_PATTERN = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME_LENGTH = 63
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Kubernetes resource quantity: a number with an optional binary/decimal suffix or exponent.
QUANTITY_PATTERN = re.compile(
    r"^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"
)
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
RESERVED_ENV_PREFIX = "PET_"
# Label keys: optional DNS-subdomain prefix + "/" + name; values: at most 63 characters.
LABEL_NAME_PATTERN = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
DNS_SUBDOMAIN_PATTERN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
TOLERATION_OPERATORS = ("Equal", "Exists")
TOLERATION_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
MAX_SCRIPT_BYTES = 1024 * 1024  # a ConfigMap holds at most 1 MiB
MAX_RESTARTS = 100


def validate_name(name: str, field_name: str = "name") -> str:
    if not name:
        raise InvalidInput(field_name, "is empty", "give a name like 'mnist-ddp'")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidInput(
            field_name,
            f"{name!r} is {len(name)} characters, more than {MAX_NAME_LENGTH}",
            "use a shorter name",
        )
    if not NAME_PATTERN.match(name):
        raise InvalidInput(
            field_name,
            f"{name!r} is not an RFC 1035 label",
            "use lowercase letters, digits and '-', starting with a letter and not ending in '-'",
        )
    return name


def validate_labels(labels: dict[str, str], field_name: str) -> None:
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        valid_key = (
            bool(name)
            and len(name) <= 63
            and LABEL_NAME_PATTERN.match(name)
            and (not prefix or (len(prefix) <= 253 and DNS_SUBDOMAIN_PATTERN.match(prefix)))
        )
        if not valid_key:
            raise InvalidInput(
                field_name, f"{key!r} is not a valid label key", "use e.g. team or example.com/team"
            )
        if len(value) > 63 or not LABEL_NAME_PATTERN.match(value):
            raise InvalidInput(
                field_name,
                f"value {value!r} of {key} is not a valid label value",
                "use at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric",
            )


@dataclass(frozen=True)
class Toleration:
    """A pod toleration, so nodes can run on tainted (e.g. GPU) machines."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def validate(self) -> None:
        if self.operator not in TOLERATION_OPERATORS:
            raise InvalidInput(
                "tolerations.operator", f"{self.operator!r} is unknown", "use Equal or Exists"
            )
        if self.effect not in TOLERATION_EFFECTS:
            raise InvalidInput(
                "tolerations.effect",
                f"{self.effect!r} is unknown",
                "use NoSchedule, PreferNoSchedule, NoExecute or leave it empty",
            )
        if self.operator == "Exists" and self.value:
            raise InvalidInput(
                "tolerations.value", "must be empty with operator Exists", "drop the value"
            )


@dataclass(frozen=True)
class Initializer:
    """Data the Trainer's initializer fetches before training (dataset or model).

    Credentials are referenced by Secret name only, never carried as values.
    """

    storage_uri: str
    secret_name: str = ""

    def validate(self, field_name: str) -> None:
        scheme, sep, rest = self.storage_uri.partition("://")
        if not sep or not scheme or not rest:
            raise InvalidInput(
                f"{field_name}.storage_uri",
                f"{self.storage_uri!r} is not a URI",
                "use e.g. hf://org/dataset or s3://bucket/path",
            )
        if self.secret_name and not DNS_SUBDOMAIN_PATTERN.match(self.secret_name):
            raise InvalidInput(
                f"{field_name}.secret_name",
                f"{self.secret_name!r} is not a Secret name",
                "name an existing Secret (lowercase, digits, '-', '.')",
            )


@dataclass(frozen=True)
class Resources:
    """Resources each node (pod) requests; quantities use Kubernetes syntax ('2', '500m', '4Gi')."""

    cpu: str = ""
    memory: str = ""
    gpu: int = 0

    def validate(self, field_name: str = "resources") -> None:
        for key, value in (("cpu", self.cpu), ("memory", self.memory)):
            if value and not QUANTITY_PATTERN.match(value):
                raise InvalidInput(
                    f"{field_name}.{key}",
                    f"{value!r} is not a Kubernetes quantity",
                    "write it like '2', '500m' or '4Gi'",
                )
        if self.gpu < 0:
            raise InvalidInput(f"{field_name}.gpu", f"{self.gpu} is negative", "use 0 or more")


@dataclass(frozen=True)
class Volume:
    """A PersistentVolumeClaim mounted into every node, for shared data and checkpoints."""

    name: str
    claim_name: str
    mount_path: str
    read_only: bool = False

    def validate(self) -> None:
        validate_name(self.name, "volumes.name")
        if not self.claim_name:
            raise InvalidInput("volumes.claim_name", "is empty", "name an existing PVC")
        if not self.mount_path.startswith("/"):
            raise InvalidInput(
                "volumes.mount_path", f"{self.mount_path!r} is not absolute", "use e.g. /mnt/shared"
            )


@dataclass(frozen=True)
class RuntimeRef:
    """The Kubeflow Trainer runtime a TrainJob refers to."""

    name: str = "torch-distributed"
    kind: str = "ClusterTrainingRuntime"

    def validate(self) -> None:
        validate_name(self.name, "runtime")
        if self.kind not in RUNTIME_KINDS:
            raise InvalidInput(
                "runtime.kind",
                f"{self.kind!r} is unknown",
                f"use one of {', '.join(RUNTIME_KINDS)}",
            )


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

    def validate(self) -> TrainJobSpec:
        validate_name(self.name)
        if not self.command or not all(isinstance(part, str) and part for part in self.command):
            raise InvalidInput(
                "command", "is empty", "give the program to run, e.g. torchrun train.py"
            )
        if not self.image or any(ch.isspace() for ch in self.image):
            raise InvalidInput(
                "image",
                f"{self.image!r} is not an image reference",
                "use e.g. ghcr.io/org/trainer:1.0",
            )
        for count_field, value in (
            ("nodes", self.num_nodes),
            ("procs_per_node", self.procs_per_node),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidInput(
                    count_field, f"{value!r} is not a whole number >= 1", "use 1 or more"
                )
        for key in self.env:
            if not ENV_NAME_PATTERN.match(key):
                raise InvalidInput(
                    "env",
                    f"{key!r} is not a valid variable name",
                    "use letters, digits and '_', not starting with a digit",
                )
            if key.startswith(RESERVED_ENV_PREFIX):
                raise InvalidInput(
                    "env",
                    f"{key} is set by the Trainer itself",
                    "use --nodes/--procs-per-node instead of PET_* variables",
                )
        self.resources_per_node.validate("resources_per_node")
        self.runtime.validate()
        for volume in self.volumes:
            volume.validate()
        validate_labels(self.labels, "labels")
        validate_labels(self.pod_labels, "pod_labels")
        validate_labels(self.node_selector, "node_selector")
        for toleration in self.tolerations:
            toleration.validate()
        if self.service_account and not DNS_SUBDOMAIN_PATTERN.match(self.service_account):
            raise InvalidInput(
                "service_account",
                f"{self.service_account!r} is not a ServiceAccount name",
                "use lowercase letters, digits, '-' and '.'",
            )
        if self.storage_secret and not DNS_SUBDOMAIN_PATTERN.match(self.storage_secret):
            raise InvalidInput(
                "storage_secret",
                f"{self.storage_secret!r} is not a Secret name",
                "use lowercase letters, digits, '-' and '.'",
            )
        if not 0 <= self.max_restarts <= MAX_RESTARTS:
            raise InvalidInput(
                "max_restarts",
                f"{self.max_restarts} is outside 0..{MAX_RESTARTS}",
                "use 0 (fail on the first node failure) or a small number like 3",
            )
        if self.active_deadline_seconds is not None and self.active_deadline_seconds < 1:
            raise InvalidInput(
                "active_deadline_seconds",
                f"{self.active_deadline_seconds} is below 1",
                "use a positive number of seconds, or none",
            )
        if self.dataset_initializer is not None:
            self.dataset_initializer.validate("dataset_initializer")
        if self.model_initializer is not None:
            self.model_initializer.validate("model_initializer")
        if self.script:
            self._validate_script()
        return self

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
            script=data.get("script", ""),
        )


def _optional(kind: type, data: dict[str, Any] | None) -> Any:
    return None if data is None else kind(**data)
