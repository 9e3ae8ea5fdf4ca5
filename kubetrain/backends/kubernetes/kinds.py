"""What differs between the cluster backends: the object a job is (a Kubeflow Trainer
``TrainJob``, a Training Operator v1 ``PyTorchJob``, a KubeRay ``RayJob``, or a batch ``Job``),
how its status reads, how it is suspended, and how its node pods are labelled and named.

The objects are read and written as plain dicts through ``CustomObjectsApi``, which serves
any API group (``batch/v1`` included), so the rest of the backend handles them alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kubetrain.backends.base import COMPLETE, CREATED, FAILED, RUNNING
from kubetrain.render.rayjob import HEAD_CONTAINER, WORKER_CONTAINER

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
#: KubeRay's group, and the labels it puts on a RayJob's submitter pods (ray-project/kuberay
#: v1.7.0 ``ray-operator/controllers/ray/rayjob_controller.go`` ``getSubmitterTemplate``;
#: ``utils/constant.go``): the RayCluster's head and worker pods carry neither (``common/pod.go``
#: ``labelPod``), so they find the submitter Job's pods only. The submitter Job is named like
#: the RayJob (``createNewK8sJob``), its container ``ray-job-submitter`` (SubmitterContainerName),
#: and its log is the driver's output (``common/job.go`` ``BuildJobSubmitCommand``: ``ray job
#: logs --follow``).
KUBERAY_GROUP = "ray.io"
RAYJOB_CRD = f"rayjobs.{KUBERAY_GROUP}"
ORIGINATED_FROM_CR_NAME_LABEL = "ray.io/originated-from-cr-name"
ORIGINATED_FROM_CRD_LABEL = "ray.io/originated-from-crd"
RAYJOB_CRD_LABEL_VALUE = "RayJob"
#: On every Ray head and worker pod KubeRay makes (``labelPod``), with the RayCluster's name
#: (the RayJob's ``status.rayClusterName``) and the node's type, ``head`` or ``worker``
#: (``RayNodeLabelKey``, ``RayClusterLabelKey``, ``RayNodeTypeLabelKey``); the pod template's
#: own labels (ours among them) are kept.
RAY_NODE_LABEL = "ray.io/is-ray-node"
RAY_CLUSTER_LABEL = "ray.io/cluster"
RAY_NODE_TYPE_LABEL = "ray.io/node-type"
SUBMITTER = "ray-job-submitter"
#: The containers that run a node, whichever backend made the pod (a RayJob's one "node" is
#: its submitter, which streams the driver's output), and a RayCluster's Ray containers (the
#: rendered RayJob's head and workers: what the wait reads of their pods).
NODE_CONTAINERS = (NODE, PYTORCH, SUBMITTER, HEAD_CONTAINER, WORKER_CONTAINER)


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
        if self.backend == "rayjob":
            return (
                f"{ORIGINATED_FROM_CRD_LABEL}={RAYJOB_CRD_LABEL_VALUE},"
                f"{ORIGINATED_FROM_CR_NAME_LABEL}={job}"
            )
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
        if self.backend == "rayjob":
            return rayjob_state(obj)
        conditions = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}
        for condition_type, state in (("Failed", FAILED), (self.complete_condition, COMPLETE)):
            condition = conditions.get(condition_type)
            if condition is not None and condition.get("status") == "True":
                return state, condition.get("reason", ""), condition.get("message", "")
        suspended = conditions.get("Suspended") or {}
        if suspended.get("status") == "True" or self.suspended_in_spec(obj):
            return CREATED, "Suspended", f"the {self.kind} is suspended"
        return CREATED, "", ""


#: A RayJob's ``status.jobDeploymentStatus`` values (ray-project/kuberay v1.7.0
#: ``ray-operator/apis/ray/v1/rayjob_types.go`` JobDeploymentStatus) and its Ray job's
#: ``status.jobStatus`` (JobStatus, Ray's own).
DEPLOYMENT_COMPLETE, DEPLOYMENT_FAILED = "Complete", "Failed"
DEPLOYMENT_VALIDATION_FAILED = "ValidationFailed"
DEPLOYMENT_SUSPENDED = ("Suspending", "Suspended")
JOB_SUCCEEDED, JOB_STOPPED, JOB_RUNNING = "SUCCEEDED", "STOPPED", "RUNNING"


def rayjob_state(obj: dict[str, Any]) -> tuple[str, str, str]:
    """(state, reason, message) of a RayJob, as KubeRay v1.7.0 ``rayjob_controller.go``
    ``Reconcile`` decides it. Terminal: ``Complete`` (the Ray job reached a terminal
    ``jobStatus`` and the submitter finished; only SUCCEEDED is a success: STOPPED, a ``ray job
    stop``, is not), ``Failed`` (``reason``: AppFailed, SubmissionFailed, DeadlineExceeded,
    PreRunningDeadlineExceeded, JobDeploymentStatusTransitionGracePeriodExceeded,
    JobStatusCheckTimeoutExceeded; a Failed one with retries left goes to ``Retrying`` in the
    same reconcile, ``checkBackoffLimitAndUpdateStatusIfNeeded``, so it is final), and
    ``ValidationFailed`` (set before the state machine and never left: ``validateRayJob`` fails
    every reconcile the same). Suspending/Suspended is Created, Suspended; a ``jobStatus``
    RUNNING is Running; the rest (New, Initializing, Waiting, Running before the Ray job runs,
    Retrying) is undecided. The message is its first line: Ray's for a failed driver goes on
    with the log tail (ray 2.60 ``dashboard/modules/job/job_supervisor.py``), which the
    submitter's log already holds."""
    status = obj.get("status") or {}
    deployment = status.get("jobDeploymentStatus") or ""
    job_status = status.get("jobStatus") or ""
    reason = status.get("reason") or ""
    message = (status.get("message") or "").strip().split("\n", 1)[0]
    if deployment == DEPLOYMENT_COMPLETE and job_status == JOB_SUCCEEDED:
        return COMPLETE, reason or JOB_SUCCEEDED, message
    if deployment == DEPLOYMENT_COMPLETE:
        stopped = job_status == JOB_STOPPED
        why = "the Ray job was stopped (ray job stop) before it finished" if stopped else ""
        return FAILED, reason or job_status or "NotSucceeded", message or why
    if deployment in (DEPLOYMENT_FAILED, DEPLOYMENT_VALIDATION_FAILED):
        return FAILED, reason or deployment, message
    if deployment in DEPLOYMENT_SUSPENDED or (obj.get("spec") or {}).get("suspend"):
        return CREATED, "Suspended", "the RayJob is suspended"
    if job_status == JOB_RUNNING:
        return RUNNING, "", ""
    return CREATED, "", ""


#: How Ray words a driver that exited non-zero (ray 2.60 ``job_supervisor.py`` ``run``).
_DRIVER_EXIT = re.compile(r"Job entrypoint command failed with exit code (\d+)")


def driver_failure(obj: dict[str, Any]) -> tuple[int, int] | None:
    """(0, exit code) of a RayJob whose driver exited non-zero, read from its message (the
    submitter pod, its one node, ends by itself either way); None when it does not say."""
    found = _DRIVER_EXIT.search((obj.get("status") or {}).get("message") or "")
    return (0, int(found.group(1))) if found else None


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
#: A RayJob (KubeRay ``ray.io/v1``): its one node is the submitter, whose log is the driver's.
RAYJOB = JobKind("rayjob", "RayJob", KUBERAY_GROUP, "v1", "rayjobs", container=SUBMITTER)
KINDS = {"trainer": TRAINJOB, "job": BATCH_JOB, "pytorchjob": PYTORCHJOB, "rayjob": RAYJOB}
