"""What differs between the two cluster backends: the object a job is (a Kubeflow Trainer
``TrainJob``, or a batch ``Job``), how its conditions read, and how its node pods are labelled.

Both objects are read and written as plain dicts through ``CustomObjectsApi``, which serves
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
#: Labels (and annotation) the Job controller puts on the pods of a Job.
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


@dataclass(frozen=True)
class JobKind:
    """How one backend's job object is addressed, read and found again through its pods."""

    backend: str
    kind: str
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def pod_selector(self, job: str) -> str:
        if self.backend == "trainer":
            return f"{JOBSET_NAME_LABEL}={job},{REPLICATED_JOB_LABEL}={NODE}"
        return f"{JOB_NAME_LABEL}={job}"

    def state(self, obj: dict[str, Any]) -> tuple[str, str, str]:
        """(state, reason, message) from the object's conditions; CREATED while undecided
        (the caller tells Running from the pods: neither object has a Running condition)."""
        conditions = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}
        for condition_type, state in (("Failed", FAILED), ("Complete", COMPLETE)):
            condition = conditions.get(condition_type)
            if condition is not None and condition.get("status") == "True":
                return state, condition.get("reason", ""), condition.get("message", "")
        suspended = conditions.get("Suspended")
        if (suspended is not None and suspended.get("status") == "True") or (
            obj.get("spec") or {}
        ).get("suspend"):
            return CREATED, "Suspended", f"the {self.kind} is suspended"
        return CREATED, "", ""


TRAINJOB = JobKind("trainer", "TrainJob", TRAINER_GROUP, TRAINER_API_VERSION, "trainjobs")
BATCH_JOB = JobKind("job", "Job", "batch", "v1", "jobs")
KINDS = {"trainer": TRAINJOB, "job": BATCH_JOB}
