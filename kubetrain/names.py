"""Job names derived deterministically from a pipeline run, so a retried step finds its job."""

from __future__ import annotations

import hashlib
import re
import secrets

from kubetrain.rules import longest_jobset_name

#: JobSet names a TrainJob's pods "<job>-<replicated job>-<i>-<j>-<suffix>" and refuses a
#: JobSet whose pod names could pass 63 characters (``rules.jobset_pod_names``). A derived
#: name fits whatever the launch asks for: the longest replicated job of a Trainer runtime
#: (``dataset-initializer``) and up to 10000 nodes. The same name whatever the launch's
#: options, so `kubetrain delete --run-name` finds it.
#: The job's name in a node's environment (the local, job and pytorchjob backends set it, our
#: runtimes from the JobSet's label): the trainer records it as the run's name and in its
#: checkpoint lock. Without it (someone else's runtime) the checkpoint folder's name stands
#: in (a cluster job's default folder is named after the job).
JOB_NAME_ENV = "KUBETRAIN_JOB_NAME"

MAX_DERIVED_LENGTH = longest_jobset_name([("dataset-initializer", 1, 1), ("node", 1, 10_000)])


def derive_job_name(run: str, step: str = "train") -> str:
    """RFC 1035 name from a run name and step: readable prefix plus a hash of both."""
    digest = hashlib.sha256(f"{run}\0{step}".encode()).hexdigest()[:8]
    slug = re.sub(r"[^a-z0-9]+", "-", f"{run}-{step}".lower()).strip("-")
    if not slug or not slug[0].isalpha():
        slug = f"kt-{slug}".rstrip("-")
    slug = slug[: MAX_DERIVED_LENGTH - len(digest) - 1].rstrip("-")
    return f"{slug}-{digest}"


def random_job_name(prefix: str = "kubetrain") -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


def label_value(text: str) -> str:
    """``text`` made into a valid Kubernetes label value (≤ 63 chars, alphanumeric ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", cleaned)
