"""What differs between the cluster backends: the object a job is (a Kubeflow Trainer
``TrainJob``, a Training Operator v1 ``PyTorchJob``, or a batch ``Job``), how its conditions
read, how it is suspended, and how its node pods are labelled and named.

The objects are read and written as plain dicts through ``CustomObjectsApi``, which serves
any API group (``batch/v1`` included), so the rest of the backend handles them alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubetrain.backends.base import COMPLETE, CREATED, FAILED

TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_API_VERSION = "v1alpha1"
TRAINJOB_CRD = f"trainjobs.{TRAINER_GROUP}"
#: Labels JobSet puts on the pods of a TrainJob (the JobSet is named like the TrainJob).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
#: The replicated job (and container) of our runtimes that runs the nodes.
NODE = "node"
#: The replicated job of an MPI runtime whose pod runs mpirun (trainer v2.3.0
#: ``pkg/constants/constants.go`` Launcher): an MPI TrainJob's one node as wait, logs and
#: status follow it (its ``node`` pods run sshd).
LAUNCHER = "launcher"


def launcher_pod_selector(job: str) -> str:
    return f"{JOBSET_NAME_LABEL}={job},{REPLICATED_JOB_LABEL}={LAUNCHER}"


#: Labels (and annotation) the Job controller puts on the pods of a Job.
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
#: The Training Operator's group, and the labels it puts on a PyTorchJob's pods and Services
#: (kubeflow/training-operator v1.9.0 ``pkg/apis/kubeflow.org/v1/common_types.go``;
#: ``pkg/controller.v1/common/job_controller.go`` ``GenLabels``, ``pod.go`` ``createNewPod``):
#: the replica type lowercased (``master``, ``worker``), its index, and the controller's name
#: (``pkg/controller.v1/pytorch/pytorchjob_controller.go`` ``controllerName``).
TRAINING_OPERATOR_GROUP = "kubeflow.org"
PYTORCHJOB_CRD = f"pytorchjobs.{TRAINING_OPERATOR_GROUP}"
OPERATOR_JOB_NAME_LABEL = "training.kubeflow.org/job-name"
OPERATOR_NAME_LABEL = "training.kubeflow.org/operator-name"
PYTORCHJOB_CONTROLLER = "pytorchjob-controller"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
#: The container a PyTorchJob's pods run the node in (pytorch_types.go).
PYTORCH = "pytorch"
#: The containers that run a node, whichever backend made the pod.
NODE_CONTAINERS = (NODE, PYTORCH)


@dataclass(frozen=True)
class JobKind:
    """How one backend's job object is addressed, read and found again through its pods."""

    backend: str
    kind: str
    group: str
    version: str
    plural: str
    #: The condition that says the job succeeded, and the container whose log is a node's.
    complete_condition: str = "Complete"
    container: str = NODE

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def pod_selector(self, job: str) -> str:
        if self.backend == "trainer":
            return f"{JOBSET_NAME_LABEL}={job},{REPLICATED_JOB_LABEL}={NODE}"
        if self.backend == "pytorchjob":
            return f"{OPERATOR_NAME_LABEL}={PYTORCHJOB_CONTROLLER},{OPERATOR_JOB_NAME_LABEL}={job}"
        return f"{JOB_NAME_LABEL}={job}"

    def suspend_patch(self) -> dict[str, Any]:
        """The merge patch that suspends the job (a PyTorchJob's flag is in its runPolicy)."""
        if self.backend == "pytorchjob":
            return {"spec": {"runPolicy": {"suspend": True}}}
        return {"spec": {"suspend": True}}

    def suspended_in_spec(self, obj: dict[str, Any]) -> bool:
        spec = obj.get("spec") or {}
        if self.backend == "pytorchjob":
            spec = spec.get("runPolicy") or {}
        return bool(spec.get("suspend"))

    def elastic_nodes(self, obj: dict[str, Any]) -> tuple[int, int] | None:
        """(MIN, MAX) nodes of an elastic PyTorchJob, from its ``elasticPolicy`` as the
        operator defaults it (a missing bound is the other, both the Worker replicas when
        neither is set: kubeflow/training-operator v1.9.0 ``pkg/apis/kubeflow.org/v1/
        pytorch_defaults.go`` ``setElasticPolicy``); None for any other job."""
        spec = obj.get("spec") or {}
        policy = spec.get("elasticPolicy") if self.backend == "pytorchjob" else None
        if policy is None:
            return None
        workers = ((spec.get("pytorchReplicaSpecs") or {}).get("Worker") or {}).get("replicas", 1)
        low, high = policy.get("minReplicas"), policy.get("maxReplicas")
        low = low if low is not None else high if high is not None else workers
        return int(low), int(high if high is not None else low)

    def state(self, obj: dict[str, Any]) -> tuple[str, str, str]:
        """(state, reason, message) from the object's conditions; CREATED while undecided
        (the caller tells Running from the pods, as a TrainJob and a Job have no Running
        condition; a PyTorchJob's Created, Running and Restarting are undecided too)."""
        conditions = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}
        for condition_type, state in (("Failed", FAILED), (self.complete_condition, COMPLETE)):
            condition = conditions.get(condition_type)
            if condition is not None and condition.get("status") == "True":
                return state, condition.get("reason", ""), condition.get("message", "")
        suspended = conditions.get("Suspended") or {}
        if suspended.get("status") == "True" or self.suspended_in_spec(obj):
            return CREATED, "Suspended", f"the {self.kind} is suspended"
        return CREATED, "", ""


TRAINJOB = JobKind("trainer", "TrainJob", TRAINER_GROUP, TRAINER_API_VERSION, "trainjobs")
BATCH_JOB = JobKind("job", "Job", "batch", "v1", "jobs")
#: A PyTorchJob ends with a Succeeded or Failed condition (kubeflow/training-operator v1.9.0
#: ``pkg/apis/kubeflow.org/v1/common_types.go`` JobConditionType; ``pkg/util/status.go``).
PYTORCHJOB = JobKind(
    "pytorchjob",
    "PyTorchJob",
    TRAINING_OPERATOR_GROUP,
    "v1",
    "pytorchjobs",
    complete_condition="Succeeded",
    container=PYTORCH,
)
KINDS = {"trainer": TRAINJOB, "job": BATCH_JOB, "pytorchjob": PYTORCHJOB}
