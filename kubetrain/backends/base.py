"""What every backend offers (launch a job spec, follow it, read its logs, delete it) and the
options that say how to reach a cluster."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from kubetrain.errors import InvalidInput
from kubetrain.jobspec import TrainJobSpec
from kubetrain.progress import membership

BACKENDS = ("local", "trainer", "job", "pytorchjob", "rayjob")
TRAINER_VERSIONS = ("auto", "2.1", "2.2", "2.3")
CANCEL_ACTIONS = ("delete", "suspend")
#: How long a node pod may stay Unschedulable by default (not for gang runtimes).
UNSCHEDULABLE_GRACE_SECONDS = 300.0

# The states a TrainJob goes through; Kubeflow Trainer reports Complete/Failed conditions.
CREATED, RUNNING, COMPLETE, FAILED = "Created", "Running", "Complete", "Failed"
TERMINAL_STATES = (COMPLETE, FAILED)


@dataclass
class NodeStatus:
    rank: int
    pid: int | None = None
    exit_code: int | None = None
    log: str = ""


@dataclass
class JobStatus:
    name: str
    state: str
    reason: str = ""
    message: str = ""
    nodes: list[NodeStatus] = field(default_factory=list)
    failed_rank: int | None = None
    created_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    #: How many times every node was restarted after a node failed (``spec.max_restarts``);
    #: for an elastic job, how many times a lost node was started again.
    restarts: int = 0
    #: An elastic job's node range, e.g. "1..2" (``progress.node_range``); "" for a fixed size.
    node_range: str = ""
    #: An elastic job's nodes training now (lost ones and ones still rejoining left out).
    live_nodes: int | None = None
    #: The failing node's last log lines, when the backend read them before releasing the job
    #: (its pods, and their logs, may be gone by the time anyone asks).
    log_tail: list[str] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def membership(self) -> str:
        """An elastic job's nodes now, e.g. "1 of 1..2 nodes"; "" for a fixed-size job."""
        if not self.node_range or self.live_nodes is None:
            return ""
        return membership(self.live_nodes, self.node_range)

    @property
    def failed_node(self) -> NodeStatus | None:
        """The node whose failure failed the job (not the ones stopped because of it)."""
        if self.failed_rank is None:
            return None
        return next((n for n in self.nodes if n.rank == self.failed_rank), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobStatus:
        nodes = [NodeStatus(**n) for n in data.get("nodes", [])]
        return cls(**{**data, "nodes": nodes})


@dataclass(frozen=True)
class JobRow:
    """One line of `kubetrain list`, the same for local and cluster jobs. ``nodes``: a count,
    an elastic job's range ("1..2") or its live count in it ("1 of 1..2"); None when the job's
    record does not say."""

    name: str
    state: str
    age_seconds: float
    nodes: int | str | None


#: ``stall_timeout`` as a backend takes it: seconds, or a callable asked at each check (wait's,
#: which derives them from rank 0's heartbeat records); None, or a callable's None: no check.
StallTimeout = float | Callable[[], float | None] | None


def stall_seconds(stall_timeout: StallTimeout) -> float | None:
    """The stall limit now."""
    return stall_timeout() if callable(stall_timeout) else stall_timeout


class Backend(Protocol):
    def launch(self, spec: TrainJobSpec) -> str:
        """Create the job and return its name at once, without waiting for it to run."""

    def status(self, name: str) -> JobStatus: ...

    def wait(
        self,
        name: str,
        timeout: float | None,
        on_log_line: Callable[[str], None] | None,
        stall_timeout: StallTimeout = None,
    ) -> JobStatus:
        """Follow the job to Complete or Failed, passing rank-0 log lines as they come; raise
        ``JobStalled`` (after stopping the job as a cancel would) when a running job shows no
        progress for ``stall_timeout`` seconds (None: never; a callable: asked at each check,
        after the lines read so far were passed on)."""

    def logs(self, name: str, node: int | None, follow: bool) -> Iterator[str]: ...

    def delete(self, name: str) -> None:
        """Stop everything the job runs and remove it."""

    def default_checkpoint_dir(self, name: str) -> str: ...


@dataclass(frozen=True)
class BackendOptions:
    """How to reach the cluster; ignored by the local backend."""

    #: Empty: the namespace we run in (a step's pod's own, else the kubeconfig context's, else
    #: default; ``client.resolve_namespace``).
    namespace: str = ""
    #: Which TrainJob form to render: "auto" reads the CRD installed on the cluster.
    trainer_version: str = "auto"
    #: What `wait` does to the job when it is cancelled (SIGTERM).
    on_cancel: str = "delete"
    #: How long `wait` lets a node pod stay Unschedulable before it fails the job: None is
    #: UNSCHEDULABLE_GRACE_SECONDS, or no limit for a gang runtime or a pod in a pod group (its
    #: pods wait for the whole group); 0 is no limit (a cluster autoscaler, a queue).
    unschedulable_grace: float | None = None

    def validate(self) -> BackendOptions:
        if self.trainer_version not in TRAINER_VERSIONS:
            raise InvalidInput(
                "trainer_version",
                f"{self.trainer_version!r} is unknown",
                f"use one of {', '.join(TRAINER_VERSIONS)}",
            )
        if self.on_cancel not in CANCEL_ACTIONS:
            raise InvalidInput(
                "on_cancel", f"{self.on_cancel!r} is unknown", "use delete or suspend"
            )
        grace = self.unschedulable_grace
        if grace is not None and not 0 <= grace < math.inf:  # NaN too
            raise InvalidInput(
                "unschedulable_grace_seconds",
                f"{grace} is not a finite 0 or more",
                "use 0 (no limit) or more seconds, or leave it out (auto)",
            )
        return self
