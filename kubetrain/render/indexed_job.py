"""Render a TrainJobSpec for clusters without Kubeflow Trainer: an Indexed Job + headless
Service that give each node the PET_* environment the Trainer would inject.

How it mirrors the Trainer:

* one pod per node: ``completionMode: Indexed``, ``completions = parallelism = nodes``;
* a headless Service named like the job (``clusterIP: None``, ``publishNotReadyAddresses``,
  so names resolve before pods are ready) and pod ``subdomain`` = that Service, so pod
  ``<job>-<index>`` is reachable as ``<job>-<index>.<job>``;
* ``PET_NODE_RANK`` is the completion index (downward API on the
  ``batch.kubernetes.io/job-completion-index`` annotation), ``PET_MASTER_ADDR`` is
  ``<job>-0.<job>``, ``PET_MASTER_PORT`` 29500, ``PET_NNODES``/``PET_NPROC_PER_NODE`` fixed;
* no Istio sidecar (``pod.pod_annotations``), as the Trainer's pods get from our runtimes and
  the TrainJob's patch;
* ``backoffLimit: 0``: one failed node fails the Job and its other pods are stopped, as a
  torchrun group cannot continue without a rank; ``podReplacementPolicy: Failed`` keeps two
  pods of one index (one still terminating) from ever holding the same hostname.

Finding rank 0's pod: the Job controller labels pods ``batch.kubernetes.io/job-name=<job>``
and ``batch.kubernetes.io/job-completion-index=<index>`` (Kubernetes 1.28+); we also label
them ``kubetrain.io/job-name=<job>`` (as on the trainer backend), which the Service selects on.
"""

from __future__ import annotations

from typing import Any

from kubetrain.errors import InvalidInput
from kubetrain.jobspec import TrainJobSpec
from kubetrain.render import pod, refuse_launcher
from kubetrain.render.metadata import (
    JOB_NAME_LABEL,
    object_labels,
    object_metadata,
    pod_labels,
    spec_annotations,
    validate_namespace,
)
from kubetrain.render.script import node_program, script_sha256

#: Labels the Job controller puts on its pods (completion index: Kubernetes 1.28+).
JOB_NAME_POD_LABEL = "batch.kubernetes.io/job-name"
COMPLETION_INDEX_POD_LABEL = "batch.kubernetes.io/job-completion-index"
#: The annotation the downward API reads the completion index from (every version).
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
MAX_HOSTNAME_LENGTH = 63


def render_indexed_job(
    spec: TrainJobSpec, *, namespace: str = "default", owner: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """``[headless Service, Indexed Job]`` for ``spec``; create them in this order. A shipped
    script's ConfigMap comes from ``render_script_configmap`` and must exist first."""
    spec = spec.validate()
    validate_namespace(namespace)
    refuse_launcher(spec, "job")
    pod.refuse_initializers(spec, "the job backend")
    _check_hostname_length(spec)
    return [_service(spec, namespace, owner), _job(spec, namespace, owner)]


def master_address(job_name: str) -> str:
    """Rank 0's DNS name: pod hostname ``<job>-0`` under the Service ``<job>``."""
    return f"{job_name}-0.{job_name}"


def _check_hostname_length(spec: TrainJobSpec) -> None:
    """Pod hostnames are ``<job>-<index>`` and must stay a DNS label."""
    longest = len(spec.name) + 1 + len(str(spec.num_nodes - 1))
    if longest > MAX_HOSTNAME_LENGTH:
        limit = MAX_HOSTNAME_LENGTH - 1 - len(str(spec.num_nodes - 1))
        raise InvalidInput(
            "name",
            f"{spec.name!r} makes pod hostnames of {longest} characters, more than 63",
            f"use a name of at most {limit} characters",
        )


def _service(spec: TrainJobSpec, namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_metadata(spec.name, namespace, object_labels(spec), owner),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {JOB_NAME_LABEL: spec.name},
            "ports": [
                {
                    "name": "torch",
                    "port": pod.MASTER_PORT,
                    "targetPort": pod.MASTER_PORT,
                    "protocol": "TCP",
                }
            ],
        },
    }


def _job(spec: TrainJobSpec, namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": spec.num_nodes,
        "parallelism": spec.num_nodes,
        "backoffLimit": 0,
        "podReplacementPolicy": "Failed",
        "template": {
            "metadata": {"labels": pod_labels(spec), "annotations": pod.pod_annotations()},
            "spec": _pod_spec(spec),
        },
    }
    if spec.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = spec.active_deadline_seconds
    if spec.suspend:
        job_spec["suspend"] = True
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": object_metadata(
            spec.name,
            namespace,
            object_labels(spec),
            owner,
            spec_annotations(spec, script_sha256(spec)),
        ),
        "spec": job_spec,
    }


def _pod_spec(spec: TrainJobSpec) -> dict[str, Any]:
    command, args = node_program(spec)
    container: dict[str, Any] = {
        "name": pod.NODE,
        "image": spec.image,
        "command": command,
        "env": _env(spec),
        "ports": [{"name": "torch", "containerPort": pod.MASTER_PORT, "protocol": "TCP"}],
        "securityContext": pod.container_security_context(),
    }
    if args:
        container["args"] = args
    resources = pod.resource_requirements(spec.resources_per_node)
    if resources:
        container["resources"] = resources
    mounts = pod.volume_mounts(spec, shared_memory=True)
    if mounts:
        container["volumeMounts"] = mounts
    env_from = pod.storage_env_from(spec)
    if env_from:
        container["envFrom"] = env_from
    pod_spec: dict[str, Any] = {
        "subdomain": spec.name,
        "restartPolicy": "Never",
        "securityContext": pod.pod_security_context(),
        "containers": [container],
    }
    pod_spec.update(pod.placement_and_volumes(spec))
    return pod_spec


def _env(spec: TrainJobSpec) -> list[dict[str, Any]]:
    """The user's env, then what the Trainer's torch plugin would inject."""
    return [
        *pod.named_env(spec),
        {"name": "PET_NNODES", "value": str(spec.num_nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(spec.procs_per_node)},
        {
            "name": "PET_NODE_RANK",
            "valueFrom": {
                "fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}
            },
        },
        {"name": "PET_MASTER_ADDR", "value": master_address(spec.name)},
        {"name": "PET_MASTER_PORT", "value": str(pod.MASTER_PORT)},
    ]
