"""The typed spec of a distributed training job, rendered by every backend.

One spec, many renderers: the local backend runs it as processes on this machine, the
Kubernetes backend renders it into a Kubeflow Trainer ``TrainJob``. Validation happens here,
once, before any backend creates anything.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
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
        return self

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
        )
