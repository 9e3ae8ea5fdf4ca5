"""Render a TrainJobSpec (``launcher`` ray) as a KubeRay ``RayJob`` (``ray.io/v1``): KubeRay
makes a RayCluster from the job's ``rayClusterSpec``, a submitter Kubernetes Job runs ``ray job
submit`` against it, and the driver (the spec's command, ``spec.ray_entrypoint``) runs on the
head; its Ray Train workers run on the worker group's pods.

Read at KubeRay v1.7.0 (``ray-operator/apis/ray/v1/rayjob_types.go``, ``raycluster_types.go``;
``controllers/ray/rayjob_controller.go``, ``common/job.go``, ``common/pod.go``,
``utils/validation.go``; samples ``config/samples/ray-job.sample.yaml``, ``ray-job.shutdown.yaml``):

* ``submissionMode: K8sJobMode``: the submitter is a Kubernetes Job named like the RayJob
  (``createNewK8sJob``), whose pod's log is the driver's output: ``common/job.go``
  ``BuildJobSubmitCommand`` submits with ``--no-wait`` then follows with ``ray job logs
  --follow``. Its pod template is ours (``submitterPodTemplate``, container
  ``ray-job-submitter`` with KubeRay's default resources, ``GetDefaultSubmitterContainer``)
  rather than KubeRay's default, so the submitter pod carries our labels, runs non-root and
  opts out of an Istio sidecar (a sidecar outliving the submitter would keep its Job from
  completing); its command is left empty, so KubeRay writes the ``ray job submit`` one
  (``configureSubmitterContainer``). KubeRay's ``submitterConfig.backoffLimit`` default (2)
  stays: a retried submitter checks ``ray job status`` before submitting again.
* ``shutdownAfterJobFinishes: true`` and ``ttlSecondsAfterFinished`` TTL_SECONDS_AFTER_FINISHED
  (60): a minute after the job ends KubeRay deletes the RayCluster (its head and workers free
  their nodes) but keeps the submitter Job, so the driver's log stays readable
  (``handleShutdownAfterJobFinishes``); the minute leaves the head's and workers' own logs to
  ``kubectl logs`` right after a failure. ``suspend`` needs ``shutdownAfterJobFinishes``
  (``ValidateRayJobSpec``).
* ``activeDeadlineSeconds`` from the spec (an int32 there: a larger one is refused here);
  ``backoffLimit`` = ``max_restarts`` (each retry is a new RayCluster and submitter,
  ``checkBackoffLimitAndUpdateStatusIfNeeded``; our trainer resumes from its checkpoints).
* ``rayClusterSpec``: ``rayVersion`` RAY_VERSION (the ``kubetrain[ray]`` extra's pin; the image
  must hold that Ray); no autoscaler, so the worker group's ``minReplicas`` and
  ``maxReplicas`` are both set (``ValidateRayClusterSpec``), to ``num_nodes`` like
  ``replicas``. Containers set no command: KubeRay generates ``ray start`` from
  ``rayStartParams`` (``BuildPod``). The head takes no training work (``num-cpus: "0"``, as seed
  004's RayCluster does) and serves the dashboard on every interface (``dashboard-host``, what
  ``setMissingRayStartParams`` defaults to, said here so the object shows it); each worker
  offers ``num-cpus`` = ``procs_per_node`` (Ray Train places one worker per CPU by default) and
  ``num-gpus`` = its GPUs. The group's ``resources`` map stays unset (it may not be set with
  those params, ``validateRayGroupResources``). KubeRay mounts a memory-backed /dev/shm itself
  (``BuildPod`` ``addEmptyDir``), so no ``dshm`` volume is added.
* Both pod templates carry the image, the spec's env (head and workers: the driver and the
  Train workers inherit it) and storage Secret by reference, volumes (and a shipped script's
  ConfigMap at /workspace), service account, node selector, tolerations, our labels and
  security context; the workers ``resources_per_node``, the head HEAD_RESOURCES. Env KubeRay
  sets after the container's own (``setContainerEnvVars``), or refuses
  (``ValidateRayClusterSpec``), is refused here.
* The name: a DNS-1035 label of at most MAX_NAME (47) characters (``ValidateRayJobMetadata``;
  ``utils/constant.go`` ``MaxRayJobNameLength``: the RayCluster is ``<name>-<5 random>``,
  ``GenerateRayClusterName``, and its Services' names must fit); KubeRay would otherwise
  fail it as ValidationFailed after it was created.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping
from typing import Any

from kubetrain import rules
from kubetrain.errors import InvalidInput
from kubetrain.jobspec import Resources, TrainJobSpec
from kubetrain.render import pod, refuse_elastic, refuse_launcher
from kubetrain.render.metadata import (
    object_labels,
    object_metadata,
    pod_labels,
    spec_annotations,
    validate_namespace,
)
from kubetrain.render.script import command_with_mounted_script, script_sha256

API_VERSION = "ray.io/v1"
KIND = "RayJob"
#: The Ray the RayCluster runs: the version ``kubetrain[ray]`` pins (pyproject.toml).
RAY_VERSION = "2.60.0"
SUBMISSION_MODE = "K8sJobMode"
TTL_SECONDS_AFTER_FINISHED = 60
#: ``utils/constant.go`` MaxRayJobNameLength (MaxRayClusterNameLength 53 - 6).
MAX_NAME = 47
INT32_MAX = 2**31 - 1
HEAD_CONTAINER, WORKER_CONTAINER = "ray-head", "ray-worker"
#: KubeRay's submitter container name and default resources (``utils/constant.go``
#: SubmitterContainerName; ``common/job.go`` GetDefaultSubmitterContainer).
SUBMITTER_CONTAINER = "ray-job-submitter"
SUBMITTER_RESOURCES = {
    "limits": {"cpu": "1", "memory": "1Gi"},
    "requests": {"cpu": "500m", "memory": "200Mi"},
}
WORKER_GROUP = "workers"
#: The head runs GCS, the dashboard and the driver, no training: KubeRay's samples give it 1
#: CPU; the memory is requested and is the limit, as for every node we render.
HEAD_RESOURCES = Resources(cpu="1", memory="4Gi")
#: The head's ports, named as KubeRay's head Service reads them (``utils/constant.go``
#: DefaultGcsServerPort, DefaultDashboardPort, DefaultClientPort), as in its samples.
HEAD_PORTS = (("gcs-server", 6379), ("dashboard", 8265), ("client", 10001))
#: Env KubeRay appends to every Ray container after the container's own, so a value the spec
#: gives would be silently replaced (``common/pod.go`` setContainerEnvVars), or honours in a
#: way that breaks the cluster (RAY_ADDRESS: where the workers' and the driver's Ray connects).
OPERATOR_ENV = (
    "RAY_ADDRESS",
    "RAY_IP",
    "FQ_RAY_IP",
    "RAY_PORT",
    "RAY_CLUSTER_NAME",
    "RAY_CLUSTER_NAMESPACE",
    "RAY_CLOUD_INSTANCE_ID",
    "RAY_NODE_TYPE_NAME",
    "KUBERAY_GEN_RAY_START_CMD",
)
#: Env ``ValidateRayClusterSpec`` fails the RayJob for (GCS fault tolerance set up by env; the
#: autoscaler v2 without autoscaling).
REFUSED_ENV = ("RAY_REDIS_ADDRESS", "REDIS_PASSWORD", "REDIS_USERNAME", "RAY_enable_autoscaler_v2")


def render_rayjob(
    spec: TrainJobSpec, *, namespace: str = "default", owner: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The RayJob for ``spec`` as a plain dict (camelCase keys, nothing unset). A shipped
    script's ConfigMap comes from ``render_script_configmap`` and must exist first."""
    spec = spec.validate()
    validate_namespace(namespace)
    check_rayjob_spec(spec)
    job_spec: dict[str, Any] = {
        "entrypoint": entrypoint(spec),
        "submissionMode": SUBMISSION_MODE,
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": TTL_SECONDS_AFTER_FINISHED,
        "rayClusterSpec": {
            "rayVersion": RAY_VERSION,
            "headGroupSpec": {
                "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
                "template": _node_template(spec, head=True),
            },
            "workerGroupSpecs": [
                {
                    "groupName": WORKER_GROUP,
                    "replicas": spec.num_nodes,
                    "minReplicas": spec.num_nodes,
                    "maxReplicas": spec.num_nodes,
                    "rayStartParams": worker_start_params(spec),
                    "template": _node_template(spec, head=False),
                }
            ],
        },
        "submitterPodTemplate": _submitter_template(spec),
    }
    optional = (
        ("activeDeadlineSeconds", spec.active_deadline_seconds),
        ("backoffLimit", spec.max_restarts or None),
        ("suspend", True if spec.suspend else None),
    )
    job_spec.update({key: value for key, value in optional if value is not None})
    metadata = object_metadata(
        spec.name,
        namespace,
        object_labels(spec),
        owner,
        spec_annotations(spec, script_sha256(spec)),
    )
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": job_spec}


def check_rayjob_spec(spec: TrainJobSpec) -> None:
    """What a RayJob cannot do for ``spec``, refused in one line before anything is created:
    a launcher other than ray, MIN:MAX nodes, a name KubeRay fails, Trainer initializers, a
    deadline over int32, env KubeRay overrides or refuses."""
    refuse_launcher(spec, "rayjob")
    refuse_elastic(spec.nodes_text, "rayjob")
    if len(spec.name) > MAX_NAME:
        raise InvalidInput(
            "name",
            f"{rules.shown(spec.name)} is {len(spec.name)} characters: KubeRay fails a RayJob "
            f"named longer than {MAX_NAME} (it names the RayCluster <name>-<5 characters> and "
            "its Services after that)",
            f"use a name of at most {MAX_NAME} characters",
        )
    pod.refuse_initializers(spec, "a RayJob")
    if spec.active_deadline_seconds is not None and spec.active_deadline_seconds > INT32_MAX:
        raise InvalidInput(
            "active_deadline_seconds",
            f"{spec.active_deadline_seconds} is more than a RayJob takes ({INT32_MAX}, an int32)",
            f"give at most {INT32_MAX} seconds, or none",
        )
    check_ray_env(spec.env)


def check_ray_env(env: Mapping[str, str]) -> None:
    """Refuse env a RayJob's Ray nodes cannot take: what KubeRay sets itself (OPERATOR_ENV) or
    fails the RayJob for (REFUSED_ENV). The local engine plays KubeRay (the same env is its
    nodes'), so its launch refuses the same, before anything is created."""
    for key in env:
        if key in OPERATOR_ENV:
            raise InvalidInput(
                "env",
                f"{key} is set by KubeRay itself in a RayJob's Ray containers (and by the local "
                "Ray engine, which plays KubeRay)",
                f"drop it: KubeRay sets {', '.join(OPERATOR_ENV)} from the RayCluster",
            )
        if key in REFUSED_ENV:
            raise InvalidInput(
                "env",
                f"{key} makes KubeRay fail the RayJob (GCS fault tolerance and the autoscaler "
                "are configured in the RayCluster, not by env)",
                "drop it",
            )


def entrypoint(spec: TrainJobSpec) -> str:
    """``spec.ray_entrypoint`` with a shipped script's mention pointing where it is mounted,
    made to pass two shells whole: KubeRay v1.7.0 pastes a K8sJobMode entrypoint into the
    submitter's bash line (``common/job.go`` ``BuildJobSubmitCommand``: ``ray job submit ... --
    <entrypoint>``), whose words ``ray job submit`` joins again (ray 2.60
    ``dashboard/modules/job/cli.py``: ``shlex.join(entrypoint)``) for Ray's own shell. The
    plain program's quoted words survive that as they are; the working folder's ``&&`` would
    be run by the submitter's bash, so that line goes to Ray as ``sh -c LINE``."""
    if spec.script:
        command, args = command_with_mounted_script(spec)
        spec = dataclasses.replace(spec, command=tuple(command), args=tuple(args))
    line = spec.ray_entrypoint
    return shlex.join(["sh", "-c", line]) if spec.working_dir else line


def worker_start_params(spec: TrainJobSpec) -> dict[str, str]:
    """``ray start`` parameters of each worker: one CPU per Train worker, and its GPUs."""
    params = {"num-cpus": str(spec.procs_per_node)}
    if spec.resources_per_node.gpu:
        params["num-gpus"] = str(spec.resources_per_node.gpu)
    return params


def _node_template(spec: TrainJobSpec, *, head: bool) -> dict[str, Any]:
    """A head's or worker's pod: the Ray container first (KubeRay's ``RayContainerIndex``)."""
    resources = HEAD_RESOURCES if head else spec.resources_per_node
    container: dict[str, Any] = {
        "name": HEAD_CONTAINER if head else WORKER_CONTAINER,
        "image": spec.image,
        "securityContext": pod.container_security_context(),
    }
    optional_container = (
        ("ports", [{"name": n, "containerPort": p} for n, p in HEAD_PORTS] if head else []),
        ("env", pod.named_env(spec)),
        ("envFrom", pod.storage_env_from(spec)),
        ("resources", pod.resource_requirements(resources)),
        ("volumeMounts", pod.volume_mounts(spec)),
    )
    container.update({key: value for key, value in optional_container if value})
    pod_spec: dict[str, Any] = {
        "securityContext": pod.pod_security_context(),
        "containers": [container],
    }
    placement = (
        ("serviceAccountName", spec.service_account),
        ("nodeSelector", dict(spec.node_selector)),
        ("tolerations", pod.tolerations(spec)),
        ("volumes", pod.volumes(spec)),
    )
    pod_spec.update({key: value for key, value in placement if value})
    metadata = {"labels": pod_labels(spec), "annotations": pod.pod_annotations()}
    return {"metadata": metadata, "spec": pod_spec}


def _submitter_template(spec: TrainJobSpec) -> dict[str, Any]:
    """The submitter's pod (the module's docstring says why ours): KubeRay's default container
    with our labels, security context, service account and tolerations; no node selector (it
    needs no accelerator) and no volumes or env (it only talks to the dashboard)."""
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": pod.pod_security_context(),
        "containers": [
            {
                "name": SUBMITTER_CONTAINER,
                "image": spec.image,
                "resources": {key: dict(value) for key, value in SUBMITTER_RESOURCES.items()},
                "securityContext": pod.container_security_context(),
            }
        ],
    }
    placement = (
        ("serviceAccountName", spec.service_account),
        ("tolerations", pod.tolerations(spec)),
    )
    pod_spec.update({key: value for key, value in placement if value})
    metadata = {"labels": pod_labels(spec), "annotations": pod.pod_annotations()}
    return {"metadata": metadata, "spec": pod_spec}
