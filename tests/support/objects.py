"""Objects a cluster with Kubeflow Trainer holds, built for the emulator: the Trainer's CRDs
(the real v2.3 ones from ../shared, whose schemas and CEL rules the emulator enforces; abridged
ones that keep what tells older versions apart), a runtime shaped like the Trainer's
``torch-distributed``, node pods labelled as JobSet and the Job controller label them, their
statuses, and events."""

from __future__ import annotations

import copy
import secrets
from importlib import resources
from typing import Any

import yaml

from kubetrain.jobspec import DEFAULT_RUNTIME
from tests.shared_material import SHARED
from tests.support.kube_api import now_iso

TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_VERSION = "v1alpha1"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOB_NAME = "batch.kubernetes.io/job-name"
NODE_CONTAINER = "node"
DEFAULT_IMAGE = "ghcr.io/kubetrain/kubetrain-trainer:0.1.0"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
#: kubeflow/trainer v2.3.0 manifests/base/crds, vendored verbatim (see its SOURCE.txt).
TRAINER_CRDS = SHARED / "schemas" / "kubeflow-trainer"
_REAL_CRDS: dict[str, dict[str, Any]] = {}


def real_trainer_crd(plural: str) -> dict[str, Any] | None:
    """The Trainer v2.3 CRD of ``plural`` from ../shared (parsed once per process), or None
    when ../shared is not checked out (the abridged CRD stands in then)."""
    path = TRAINER_CRDS / f"{TRAINER_GROUP}_{plural}.yaml"
    if plural not in _REAL_CRDS:
        if not path.is_file():
            return None
        with open(path) as file:
            _REAL_CRDS[plural] = yaml.load(
                file, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
            )
    return _REAL_CRDS[plural]


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
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        name: _open(schema)
                                        for name, schema in (spec_properties or {}).items()
                                    },
                                    "x-kubernetes-preserve-unknown-fields": not spec_properties,
                                },
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


def _open(schema: dict[str, Any]) -> dict[str, Any]:
    """An abridged schema keeps whatever its objects hold (the emulator prunes by the schema)."""
    if schema.get("type") == "object":
        return {**schema, "x-kubernetes-preserve-unknown-fields": True}
    if schema.get("type") == "array" and "items" in schema:
        return {**schema, "items": _open(schema["items"])}
    return schema


def trainjob_crd(trainer_version: str = "2.3") -> dict[str, Any]:
    """The TrainJob CRD: the real one at 2.3; abridged for older shapes (2.2 has
    ``runtimePatches`` in its schema, 2.1 ``podTemplateOverrides``)."""
    real = real_trainer_crd("trainjobs") if trainer_version == "2.3" else None
    if real is not None:
        return real
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
        patch: dict[str, Any] = {"type": "object"}
        if trainer_version != "2.2":
            # what tells 2.3 from 2.2 (kubeflow/trainer v2.3.0 trainer.kubeflow.org_trainjobs.yaml:
            # runtimePatches can set terminationGracePeriodSeconds; v2.2.0's cannot)
            patch["properties"] = {"terminationGracePeriodSeconds": {"type": "integer"}}
        properties["runtimePatches"] = {"type": "array", "items": patch}
    return crd(TRAINER_GROUP, "TrainJob", "trainjobs", spec_properties=properties)


def runtime_crds() -> list[dict[str, Any]]:
    """Both runtime CRDs: the real v2.3 ones, else abridged."""
    real = [real_trainer_crd(p) for p in ("clustertrainingruntimes", "trainingruntimes")]
    if all(crd is not None for crd in real):
        return [crd for crd in real if crd is not None]
    template = {
        "mlPolicy": {"type": "object"},
        "podGroupPolicy": {"type": "object"},
        "template": {"type": "object"},
    }
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


def torch_runtime(
    name: str = DEFAULT_RUNTIME,
    namespace: str | None = None,
    *,
    command: list[str] | None = None,
    args: list[str] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    initializers: bool = False,
) -> dict[str, Any]:
    """A runtime shaped like the Trainer's ``torch-distributed`` (kubeflow/trainer v2.3.0
    ``manifests/base/runtimes/torch_distributed.yaml``): one ``node`` ReplicatedJob labelled as
    the trainer's ancestor, a ``node`` container; ``command``, ``args``, ``volumes`` and
    ``mounts`` give the container the defaults a runtime such as ours sets; ``initializers``
    adds ``dataset-initializer`` and ``model-initializer`` jobs before it, as in
    ``manifests/base/runtimes/torch_distributed_with_cache.yaml``/the dataset-init example."""
    container: dict[str, Any] = {"name": NODE_CONTAINER, "image": DEFAULT_IMAGE}
    for key, value in (("command", command), ("args", args), ("volumeMounts", mounts)):
        if value is not None:
            container[key] = value
    pod_spec: dict[str, Any] = {"containers": [container]}
    if volumes is not None:
        pod_spec["volumes"] = volumes
    metadata: dict[str, Any] = {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": "TrainingRuntime" if namespace else "ClusterTrainingRuntime",
        "metadata": metadata,
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        *(initializer_jobs() if initializers else []),
                        {
                            "name": "node",
                            "template": {
                                "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
                                "spec": {"template": {"spec": pod_spec}},
                            },
                        },
                    ]
                }
            },
        },
    }


def shipped_runtime(name: str = DEFAULT_RUNTIME) -> dict[str, Any] | None:
    """Our runtime ``name`` as ``kubetrain render runtimes`` installs it (the package
    ``kubetrain.runtimes``, the checkout's ``runtimes/``), or None if it ships no such runtime."""
    manifest = resources.files("kubetrain.runtimes") / f"{name}.yaml"
    if not manifest.is_file():
        return None
    return yaml.safe_load(manifest.read_text())


def initializer_jobs() -> list[dict[str, Any]]:
    """The initializer ReplicatedJobs the Trainer's JobSet plugin checks for (kubeflow/trainer
    v2.3.0 ``pkg/runtime/framework/plugins/jobset/jobset.go`` ``Validate``): a job and container
    named after the step, mounting the ``initializer`` volume."""
    return [
        {
            "name": step,
            "template": {
                "metadata": {"labels": {ANCESTOR_LABEL: step}},
                "spec": {
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": step,
                                    "image": f"ghcr.io/kubeflow/trainer/{step}",
                                    "volumeMounts": [
                                        {"name": "initializer", "mountPath": "/workspace"}
                                    ],
                                }
                            ],
                            "volumes": [{"name": "initializer", "emptyDir": {}}],
                        }
                    }
                },
            },
        }
        for step in ("dataset-initializer", "model-initializer")
    ]


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
    pod_spec: dict[str, Any] | None = None,
    pod_labels: dict[str, str] | None = None,
    pod_annotations: dict[str, str] | None = None,
    replicated_job: str = NODE_CONTAINER,
    restart_attempt: int = 0,
) -> dict[str, Any]:
    """Node ``index`` of a job as its controller creates it: a Pending pod with the labels
    JobSet (``kind="trainer"``; jobset v0.12.0 ``pkg/controllers/jobset_controller.go``
    ``labelAndAnnotateObject``: ``restart-attempt`` is the JobSet's ``status.restarts`` when
    its Job was made) or the Job controller (``kind="job"``) put on it. ``pod_spec``,
    ``pod_labels`` and ``pod_annotations`` are the template's (the fake Trainer's merged one,
    or the Job's): the Job controller copies the pod template's labels and annotations onto
    each pod (kubernetes pkg/controller/controller_utils.go ``GetPodFromTemplate``,
    ``getPodsAnnotationSet``); else a bare ``node`` container running ``image``."""
    suffix = secrets.token_hex(3)[:5]
    if kind == "trainer":
        job_name = f"{job}-{replicated_job}-0"
        labels = {
            **(pod_labels or {}),
            JOBSET_NAME: job,
            REPLICATED_JOB: replicated_job,
            JOB_INDEX: "0",
            "jobset.sigs.k8s.io/replicatedjob-replicas": "1",
            RESTART_ATTEMPT: str(restart_attempt),
            COMPLETION_INDEX: str(index),
            JOB_NAME: job_name,
            "trainer.kubeflow.org/trainjob-ancestor-step": "trainer",
        }
        pod_name = name or f"{job_name}-{index}-{suffix}"
        hostname, subdomain = f"{job_name}-{index}", job
    else:
        labels = {JOB_NAME: job, "job-name": job, COMPLETION_INDEX: str(index)}
        pod_name = name or f"{job}-{index}-{suffix}"
        hostname, subdomain = f"{job}-{index}", job
    metadata: dict[str, Any] = {
        "name": pod_name,
        "namespace": namespace,
        "labels": labels,
        "annotations": {**(pod_annotations or {}), COMPLETION_INDEX: str(index)},
    }
    if owner is not None:
        metadata["ownerReferences"] = [owner_reference(owner)]
    spec = (
        copy.deepcopy(pod_spec)
        if pod_spec is not None
        else {
            "containers": [{"name": NODE_CONTAINER, "image": image}],
            "restartPolicy": "OnFailure",
        }
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {**spec, "hostname": hostname, "subdomain": subdomain},
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


def step_pod(workflow: dict[str, Any], name: str) -> dict[str, Any]:
    """A pipeline step's pod as Argo's controller creates it (KFP runs on Argo too): owned by
    the Workflow (controller reference) and labelled with it (argo-workflows v4.1.2
    ``workflow/controller/workflowpod.go``), its container ``main``."""
    meta = workflow["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": meta.get("namespace", "default"),
            "labels": {"workflows.argoproj.io/workflow": meta["name"]},
            "ownerReferences": [owner_reference(workflow)],
        },
        "spec": {"containers": [{"name": "main", "image": DEFAULT_IMAGE}]},
        "status": {"phase": "Running"},
    }


def kfp_step_env(pod: dict[str, Any]) -> dict[str, str]:
    """All a KFP step's container learns of its pod: KFP_POD_NAME and KFP_POD_UID by the
    downward API (kubeflow/pipelines 2.17.0 ``backend/src/v2/compiler/argocompiler/common.go``
    ``commonEnvs``); no namespace, no POD_NAME."""
    return {"KFP_POD_NAME": pod["metadata"]["name"], "KFP_POD_UID": pod["metadata"]["uid"]}
