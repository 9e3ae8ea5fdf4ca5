"""Objects a cluster with Kubeflow Trainer holds, built for the emulator: the Trainer's CRDs
(abridged schemas that keep what tells versions apart), a ``torch-distributed`` runtime, node
pods labelled as JobSet and the Job controller label them, their statuses, and events."""

from __future__ import annotations

import secrets
from typing import Any

from kubetrain.jobspec import DEFAULT_RUNTIME
from tests.support.kube_api import now_iso

TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_VERSION = "v1alpha1"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOB_NAME = "batch.kubernetes.io/job-name"
NODE_CONTAINER = "node"
DEFAULT_IMAGE = "ghcr.io/kubetrain/kubetrain-trainer:0.1.0"


def crd(
    group: str,
    kind: str,
    plural: str,
    *,
    version: str = TRAINER_VERSION,
    namespaced: bool = True,
    spec_properties: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
            },
            "scope": "Namespaced" if namespaced else "Cluster",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {"type": "object", "properties": spec_properties or {}},
                                "status": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


def trainjob_crd(trainer_version: str = "2.3") -> dict[str, Any]:
    """The TrainJob CRD; 2.2+ has ``runtimePatches`` in its schema, 2.1 ``podTemplateOverrides``."""
    properties: dict[str, Any] = {
        "runtimeRef": {"type": "object"},
        "trainer": {"type": "object"},
        "initializer": {"type": "object"},
        "labels": {"type": "object"},
        "annotations": {"type": "object"},
        "suspend": {"type": "boolean"},
        "managedBy": {"type": "string"},
    }
    if trainer_version == "2.1":
        properties["podTemplateOverrides"] = {"type": "array", "items": {"type": "object"}}
    else:
        properties["runtimePatches"] = {"type": "array", "items": {"type": "object"}}
    return crd(TRAINER_GROUP, "TrainJob", "trainjobs", spec_properties=properties)


def runtime_crds() -> list[dict[str, Any]]:
    template = {"mlPolicy": {"type": "object"}, "template": {"type": "object"}}
    return [
        crd(
            TRAINER_GROUP,
            "ClusterTrainingRuntime",
            "clustertrainingruntimes",
            namespaced=False,
            spec_properties=template,
        ),
        crd(TRAINER_GROUP, "TrainingRuntime", "trainingruntimes", spec_properties=template),
    ]


def workflow_crd() -> dict[str, Any]:
    """Argo's Workflow CRD, for launches from a pipeline step that own their TrainJob."""
    return crd("argoproj.io", "Workflow", "workflows", spec_properties={})


def torch_runtime(name: str = DEFAULT_RUNTIME, namespace: str | None = None) -> dict[str, Any]:
    """A runtime shaped like the Trainer's ``torch-distributed``: one ``node`` ReplicatedJob."""
    metadata: dict[str, Any] = {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": "TrainingRuntime" if namespace else "ClusterTrainingRuntime",
        "metadata": metadata,
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "replicas": 1,
                            "template": {
                                "spec": {
                                    "template": {
                                        "spec": {
                                            "containers": [
                                                {"name": NODE_CONTAINER, "image": DEFAULT_IMAGE}
                                            ]
                                        }
                                    }
                                }
                            },
                        }
                    ]
                }
            },
        },
    }


def owner_reference(obj: dict[str, Any], controller: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def node_pod(
    job: str,
    index: int,
    *,
    namespace: str = "default",
    kind: str = "trainer",
    image: str = DEFAULT_IMAGE,
    owner: dict[str, Any] | None = None,
    name: str = "",
) -> dict[str, Any]:
    """Node ``index`` of a job as its controller creates it: a Pending pod with the labels
    JobSet (``kind="trainer"``) or the Job controller (``kind="job"``) put on it."""
    suffix = secrets.token_hex(3)[:5]
    if kind == "trainer":
        labels = {
            JOBSET_NAME: job,
            REPLICATED_JOB: "node",
            JOB_INDEX: "0",
            COMPLETION_INDEX: str(index),
            JOB_NAME: f"{job}-node-0",
            "trainer.kubeflow.org/trainjob-ancestor-step": "trainer",
        }
        pod_name = name or f"{job}-node-0-{index}-{suffix}"
        hostname, subdomain = f"{job}-node-0-{index}", job
    else:
        labels = {JOB_NAME: job, "job-name": job, COMPLETION_INDEX: str(index)}
        pod_name = name or f"{job}-{index}-{suffix}"
        hostname, subdomain = f"{job}-{index}", job
    metadata: dict[str, Any] = {
        "name": pod_name,
        "namespace": namespace,
        "labels": labels,
        "annotations": {COMPLETION_INDEX: str(index)},
    }
    if owner is not None:
        metadata["ownerReferences"] = [owner_reference(owner)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "containers": [{"name": NODE_CONTAINER, "image": image}],
            "restartPolicy": "OnFailure",
            "hostname": hostname,
            "subdomain": subdomain,
        },
        "status": pod_status("Pending", [container_status(image, waiting("ContainerCreating"))]),
    }


def condition(
    type_: str, status: str = "True", reason: str = "", message: str = ""
) -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason or type_,
        "message": message,
        "lastTransitionTime": now_iso(),
    }


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    return {"waiting": {"reason": reason, "message": message}}


def running() -> dict[str, Any]:
    return {"running": {"startedAt": now_iso()}}


def terminated(exit_code: int, reason: str = "") -> dict[str, Any]:
    return {
        "terminated": {
            "exitCode": exit_code,
            "reason": reason or ("Completed" if exit_code == 0 else "Error"),
            "startedAt": now_iso(),
            "finishedAt": now_iso(),
        }
    }


def container_status(
    image: str,
    state: dict[str, Any],
    *,
    restart_count: int = 0,
    last_state: dict[str, Any] | None = None,
    name: str = NODE_CONTAINER,
) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "imageID": "" if "waiting" in state else f"{image}@sha256:{'0' * 64}",
        "ready": "running" in state,
        "started": "running" in state,
        "restartCount": restart_count,
        "state": state,
        "lastState": last_state or {},
    }


def pod_status(
    phase: str,
    containers: list[dict[str, Any]],
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "phase": phase,
        "conditions": conditions
        if conditions is not None
        else [condition("PodScheduled", "True", reason="Scheduled")],
        "containerStatuses": containers,
        "startTime": now_iso(),
    }


def unschedulable(message: str = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.") -> dict:
    """The status of a pod the scheduler cannot place."""
    return {
        "phase": "Pending",
        "conditions": [condition("PodScheduled", "False", "Unschedulable", message)],
    }


def event(
    involved: dict[str, Any], reason: str, message: str, type_: str = "Warning"
) -> dict[str, Any]:
    meta = involved["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta['name']}.{secrets.token_hex(8)}",
            "namespace": meta.get("namespace", "default"),
        },
        "involvedObject": {
            "apiVersion": involved.get("apiVersion", "v1"),
            "kind": involved.get("kind", "Pod"),
            "name": meta["name"],
            "namespace": meta.get("namespace", "default"),
            "uid": meta.get("uid", ""),
        },
        "reason": reason,
        "message": message,
        "type": type_,
        "count": 1,
        "firstTimestamp": now_iso(),
        "lastTimestamp": now_iso(),
        "source": {"component": "kubelet"},
    }
