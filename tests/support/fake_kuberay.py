"""A fake KubeRay operator (v1.7.0) for the emulator: a ``ray.io/v1`` RayJob created through the
API server is played as KubeRay plays it, and its Ray cluster is real: the head, the workers
and the submitter are local processes running the commands KubeRay puts in their pods.

Every rule is from ray-project/kuberay, tag v1.7.0, under ``ray-operator/controllers/ray/``:

* RayJob (``rayjob_controller.go`` ``Reconcile``, ~85-530), K8sJobMode: first
  ``validateRayJob`` (~536): ``utils/validation.go`` ``ValidateRayJobMetadata`` (name at most 47
  characters, a DNS-1035 label), ``ValidateRayJobSpec`` (~543: suspend needs
  shutdownAfterJobFinishes, ttlSecondsAfterFinished >= 0 and only with it, a rayClusterSpec,
  ``ValidateRayClusterSpec`` wrapped "The RayJob spec is invalid: ...", positive deadlines,
  backoffLimit >= 0) and ``ValidateRayJobStatus``; a rule broken -> jobDeploymentStatus and
  reason ``ValidationFailed``, message the rule's, a Warning event ``InvalidRayJobSpec`` /
  ``InvalidRayJobMetadata`` "<ns>/<name>: <message>". New: the finalizer
  ``ray.io/rayjob-finalizer`` is added, ``initRayJobStatusIfNeed`` (~912) sets jobId
  (spec.jobId, else ``utils/util.go`` ``GenerateRayJobId`` "<job>-<5 random>"), rayClusterName
  (``GenerateRayClusterName``, "<job>-<5 random>", the alphabet of k8s.io/apimachinery
  ``util/rand.String``), startTime and Initializing. Initializing: suspend -> Suspending,
  ``checkActiveDeadlineAndUpdateStatusIfNeeded`` / ``checkPreRunningDeadline...`` (Failed,
  DeadlineExceeded / PreRunningDeadlineExceeded), the RayCluster is created
  (``constructRayClusterForRayJob``: the job's labels and annotations, ``ray.io/originated-from-cr-
  name``, ``ray.io/originated-from-crd: RayJob``, ``ray.io/job-submission-mode``, owned by the
  job), its state mirrored into ``rayClusterStatus`` until it is ``ready``; then dashboardURL
  (``utils.FetchHeadServiceURL``: "<head svc>.<ns>.svc.cluster.local:<dashboard port>"), the
  submitter Job (``createK8sJobIfNeed``, ``createNewK8sJob``: named as the RayJob, backoffLimit
  2 or submitterConfig's, ``getSubmitterTemplate`` / ``common/job.go`` ``GetSubmitterTemplate``,
  ``GetDefaultSubmitterContainer``: container ``ray-job-submitter``, the head's image,
  restartPolicy Never; ``configureSubmitterContainer``: ``/bin/bash -ce --`` and the
  ``BuildJobSubmitCommand`` line: wait for ``api/gcs_healthz``, ``ray job status`` || ``ray job
  submit --no-wait ... --submission-id <jobId> -- <entrypoint>``, then ``ray job logs --follow``;
  env PYTHONUNBUFFERED, RAY_DASHBOARD_ADDRESS, RAY_JOB_SUBMISSION_ID) and Running. Running:
  suspend, deadline, the job's own head Service "<job>-head-svc" (``reconcileServices``,
  ``BuildHeadServiceForRayJob``), ``checkSubmitterAndUpdateStatusIfNeeded`` (a Failed submitter
  Job fails the RayJob: AppFailed if the Ray job had FAILED, else SubmissionFailed "Job
  submission has failed. Reason: ... Message: ..."), then the Ray job's info from the dashboard
  (``dashboardclient`` ``GetJobInfo``: GET /api/jobs/<id>; 404 after the submitter finished:
  Failed, AppFailed "Submitter completed but Ray job not found in RayCluster."); jobStatus and
  message are Ray's, ``rayJobInfo`` its start/end; a terminal Ray status once the submitter Job
  finished is Complete (FAILED: Failed, AppFailed); ``checkSubmitterFinishedTimeout...`` (30 s).
  Suspending/Retrying: the RayCluster and the submitter Job deleted, then Suspended / New with
  the cluster and job fields reset; Suspended resumes to New when spec.suspend turns false.
  Complete/Failed: ``shutdownAfterJobFinishes`` deletes the RayCluster (not the submitter Job,
  so its log stays) ``ttlSecondsAfterFinished`` after endTime (``handleShutdownAfterJobFinishes``).
  ``checkBackoffLimitAndUpdateStatusIfNeeded`` counts failed/succeeded and retries (Retrying)
  within backoffLimit. ``updateRayJobStatus`` writes only when jobStatus, jobDeploymentStatus
  or the cluster status (``utils/consistency.go`` ``InconsistentRayClusterStatus``) change,
  endTime set on a terminal one. Deletion: a job not terminal is stopped (POST
  /api/jobs/<id>/stop), the finalizer removed; the API server then collects the RayCluster,
  the Services and the submitter Job, and their pods.
* RayCluster (``raycluster_controller.go`` ``rayClusterReconcile``, ``reconcileHeadService``,
  ``reconcilePods``, ``buildHeadPod`` / ``buildWorkerPod``, ``calculateStatus``): the head
  Service "<cluster>-head-svc" (``common/service.go`` ``BuildServiceForHeadPod``: headless,
  the head container's named ports or the defaults, ``metrics`` added, sorted), one head pod
  (generateName ``utils.PodName`` "<cluster>-head-"), per worker group
  ``GetWorkerGroupDesiredReplicas`` pods "<cluster>-<group>-worker-" with
  ``ray.io/worker-group-replica-index`` (RayMultiHostIndexing, on by default); each pod
  ``common/pod.go`` ``DefaultHeadPodTemplate`` / ``DefaultWorkerPodTemplate`` + ``BuildPod``:
  labels (``labelPod``: ``ray.io/is-ray-node``, ``ray.io/cluster``, ``ray.io/node-type``,
  ``ray.io/group``, ``ray.io/identifier``, ``app.kubernetes.io/name: kuberay``,
  ``app.kubernetes.io/created-by: kuberay-operator``), the ray container's command
  ``/bin/bash -c --`` "ulimit -n ...; ray start ..." from rayStartParams
  (``setMissingRayStartParams``, ``generateRayStartCommand``, ``convertParamMap``: num-cpus /
  memory / num-gpus from the container's limits, ``--block``, ``--dashboard-host=0.0.0.0``,
  ``--metrics-export-port=8080``, ``--dashboard-agent-listen-port=52365``, workers
  ``--address=<head svc fqdn>:6379``), the env of ``setContainerEnvVars`` (RAY_ADDRESS,
  RAY_PORT, FQ_RAY_IP, KUBERAY_GEN_RAY_START_CMD...), the workers' ``wait-gcs-ready`` init
  container, the probes (``initLivenessAndReadinessProbe``); state ``ready`` once every pod runs
  and is ready, conditions HeadPodReady and RayClusterProvisioned.

What one machine changes, in the processes only (the objects keep KubeRay's values):

* every Ray port is a free local one (GCS ``--port``, ``--dashboard-port``,
  ``--ray-client-server-port``, the dashboard agent's, metrics, runtime-env agent, node and
  object manager; worker ports random): several clusters share this machine, where pods each
  have their own network namespace;
* the head Service's name resolves to 127.0.0.1: "<svc>.<ns>.svc.cluster.local:<port>" in a
  command or env value becomes 127.0.0.1 and the local port behind that Service port, and the
  workers' ``--address`` the head's local GCS; ``--dashboard-host`` is 127.0.0.1, not 0.0.0.0
  (an unauthenticated job API must not listen on this machine's other addresses); the node IP
  is left to Ray, which on one machine is this machine's address for every node (Ray 2.60
  turns ``--node-ip-address 127.0.0.1`` into it too: ``services.resolve_ip_for_localhost``);
* each Ray node gets a short ``--temp-dir`` of its own (/tmp/kt-kr-<hex>: a container's own
  /tmp; AF_UNIX socket paths must stay under 107 characters);
* the image is this machine: a container's ``ray`` and ``python`` are this virtualenv's (its bin
  folder first on PATH); the container starts with this user's environment minus every
  ``RAY_*`` variable (a container has none), ``RAY_AUTH_MODE=disabled`` and
  ``RAY_USAGE_STATS_ENABLED=0`` unless its pod env says otherwise (a container has no
  ~/.ray/auth_token, which on this shared HOME would turn token auth on), and
  ``RAY_START_ULIMIT_OPEN_FILES`` lowered to this machine's hard limit when that is below
  KubeRay's 65536;
* a worker's ray container starts once the head's GCS port accepts connections (what its
  ``wait-gcs-ready`` init container waits for with ``ray health-check``, not run here); a pod is
  ready when its readiness probe's HTTP endpoints answer (Ray >= 2.53: the agent's
  ``/api/healthz``; older: ``api/local_raylet_healthz``, and on the head ``api/gcs_healthz``);
* the controllers reconcile every ``POLL_SECONDS`` instead of requeueing every 3 s.

A pod's containers' output is its log (``pods/log``), the submitter pod's is the driver's output
(what ``ray job logs --follow`` prints). Deleting a pod (directly, or the API server collecting
it with its RayCluster or Job) stops its container's whole process tree (every process carries
a marker in its environment: raylet, GCS, dashboard, Ray workers, the driver), as does ``stop``;
``ray stop`` is never run (it stops every Ray process of the user on the machine).
Not modelled: SidecarMode, HTTPMode and InteractiveMode, clusterSelector, deletionStrategy,
autoscaling, token auth, GCS fault tolerance, jobStatusCheckFailureStartTime, CrashLoopBackOff
delays (a ray container that exits is restarted in place at once under restartPolicy Always, as
the kubelet does; a pod that ends is deleted and made again, ``shouldDeletePod``).
"""

from __future__ import annotations

import copy
import datetime
import json
import math
import os
import queue
import re
import resource as rlimit
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kmock
import yaml

from kubetrain.backends.local.log_tail import LogTail
from kubetrain.backends.local.processes import stop_marked_processes
from tests.support import objects, trainer_build
from tests.support.controller import FakeController
from tests.support.emulator import KubeEmulator
from tests.support.kube_api import now_iso

RAYJOB = kmock.resource("ray.io", "v1", "rayjobs")
RAYCLUSTER = kmock.resource("ray.io", "v1", "rayclusters")
CRD_DIR = Path(__file__).parent / "crds"
KUBERAY_VERSION = "v1.7.0"
#: utils/constant.go
FINALIZER = "ray.io/rayjob-finalizer"
CR_NAME_LABEL = "ray.io/originated-from-cr-name"
CRD_LABEL = "ray.io/originated-from-crd"
CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"
GROUP_LABEL = "ray.io/group"
IS_RAY_NODE_LABEL = "ray.io/is-ray-node"
IDENTIFIER_LABEL = "ray.io/identifier"
SUBMISSION_MODE_LABEL = "ray.io/job-submission-mode"
REPLICA_INDEX_LABEL = "ray.io/worker-group-replica-index"
APP_NAME_LABEL = "app.kubernetes.io/name"
CREATED_BY_LABEL = "app.kubernetes.io/created-by"
COMPONENT_NAME = "kuberay-operator"
HEAD_GROUP = "headgroup"
SUBMITTER_CONTAINER = "ray-job-submitter"
MAX_RAYJOB_NAME_LENGTH = 47
DEFAULT_GCS_PORT, DEFAULT_DASHBOARD_PORT, DEFAULT_CLIENT_PORT = 6379, 8265, 10001
DEFAULT_METRICS_PORT, DEFAULT_AGENT_LISTEN_PORT, DEFAULT_SERVING_PORT = 8080, 52365, 8000
DEFAULT_SUBMITTER_BACKOFF_LIMIT = 2
#: rayjob_controller.go DefaultSubmitterFinishedTimeout.
SUBMITTER_FINISHED_TIMEOUT_SECONDS = 30
#: utils/constant.go BasePythonHealthCommand, RayDashboardGCSHealthCheckTimeoutSeconds.
HEALTH_COMMAND = (
    "python -c \"import urllib.request; r=urllib.request.urlopen('%s', timeout=%d); "
    "exit(0 if b'success' in r.read() else 1)\""
)
HEALTH_TIMEOUT_SECONDS = 10
#: k8s.io/apimachinery/pkg/util/rand: alphanums without vowels.
RAND_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
TERMINAL_JOB_STATUSES = ("STOPPED", "SUCCEEDED", "FAILED")
#: Marks every process of one pod, so stopping it finds the whole tree (Ray's too).
POD_MARKER = "KUBETRAIN_FAKE_KUBERAY_POD"
#: Every Ray node's --temp-dir starts with this (short: AF_UNIX paths < 107 characters).
TEMP_PREFIX = "/tmp/kt-kr-"
POLL_SECONDS = 0.2
STOP_GRACE_SECONDS = 5.0
DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")

_CRDS: dict[str, dict[str, Any]] = {}


def _crd(plural: str) -> dict[str, Any]:
    if plural not in _CRDS:
        with open(CRD_DIR / f"ray.io_{plural}.yaml") as file:
            _CRDS[plural] = yaml.load(file, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return copy.deepcopy(_CRDS[plural])


def rayjob_crd() -> dict[str, Any]:
    """KubeRay v1.7.0's RayJob CRD (``crds/SOURCE.txt``)."""
    return _crd("rayjobs")


def raycluster_crd() -> dict[str, Any]:
    """KubeRay v1.7.0's RayCluster CRD (``crds/SOURCE.txt``)."""
    return _crd("rayclusters")


# ------------------------------------------------------------------------------------ names
def rand_string(length: int = 5) -> str:
    return "".join(secrets.choice(RAND_ALPHABET) for _ in range(length))


def generate_ray_cluster_name(rayjob: str) -> str:
    """``utils.GenerateRayClusterName``."""
    return f"{rayjob}-{rand_string()}"


def generate_ray_job_id(rayjob: str) -> str:
    """``utils.GenerateRayJobId``."""
    return f"{rayjob}-{rand_string()}"


def pod_name_prefix(prefix: str, node_type: str) -> str:
    """``utils.PodName`` as a generateName: at most 50 characters of ``prefix``."""
    return f"{prefix[:50]}-{node_type}-".lower()


def head_service_name(cluster: dict[str, Any]) -> str:
    """``utils.GenerateHeadServiceName`` for a RayCluster."""
    custom = ((cluster["spec"]["headGroupSpec"].get("headService") or {}).get("metadata")) or {}
    return custom.get("name") or f"{cluster['metadata']['name']}-head-svc"


def service_fqdn(service: str, namespace: str) -> str:
    return f"{service}.{namespace}.svc.cluster.local"


def check_label(value: str) -> str:
    """``utils.CheckLabel``: the last 63 characters, not starting with punctuation."""
    value = value[-63:]
    return "r" + value[1:] if not value[0].isalnum() else value


# ------------------------------------------------------------------------------- validation
def rayjob_validation_error(rayjob: dict[str, Any]) -> tuple[str, str] | None:
    """(event reason, message) of the first rule ``validateRayJob`` finds broken, else None."""
    name = rayjob["metadata"]["name"]
    if len(name) > MAX_RAYJOB_NAME_LENGTH:
        return "InvalidRayJobMetadata", (
            "The RayJob metadata is invalid: RayJob name should be no more than "
            f"{MAX_RAYJOB_NAME_LENGTH} characters"
        )
    if not DNS1035.fullmatch(name):
        return "InvalidRayJobMetadata", (
            "The RayJob metadata is invalid: RayJob name should be a valid DNS1035 label: "
            "[a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
            "start with an alphabetic character, and end with an alphanumeric character "
            "(e.g. 'my-name',  or 'abc-123', regex used for validation is "
            "'[a-z]([-a-z0-9]*[a-z0-9])?')]"
        )
    spec = rayjob["spec"]
    error = rayjob_spec_error(spec, rayjob["metadata"].get("annotations") or {})
    if error:
        return "InvalidRayJobSpec", error
    return None


def rayjob_spec_error(spec: dict[str, Any], annotations: dict[str, str]) -> str | None:
    """``utils.ValidateRayJobSpec`` (validation.go ~543-630), the rules for our modes."""
    invalid = "The RayJob spec is invalid: "
    shutdown = bool(spec.get("shutdownAfterJobFinishes"))
    if spec.get("suspend") and not shutdown:
        return invalid + (
            "a RayJob with shutdownAfterJobFinishes set to false is not allowed to be suspended"
        )
    ttl = spec.get("ttlSecondsAfterFinished") or 0
    if ttl < 0:
        return invalid + "TTLSecondsAfterFinished must be a non-negative integer"
    if not shutdown and ttl > 0:  # validateDeletionConfiguration
        return invalid + (
            "a RayJob with shutdownAfterJobFinishes set to false cannot have "
            "TTLSecondsAfterFinished"
        )
    if spec.get("rayClusterSpec") is None and not spec.get("clusterSelector"):
        return invalid + "one of RayClusterSpec or ClusterSelector must be set"
    if spec.get("rayClusterSpec") is not None:
        error = raycluster_spec_error(spec["rayClusterSpec"], annotations)
        if error:
            return invalid + error
    for field in ("activeDeadlineSeconds", "preRunningDeadlineSeconds"):
        if spec.get(field) is not None and spec[field] <= 0:
            return invalid + f"{field} must be a positive integer"
    if spec.get("backoffLimit") is not None and spec["backoffLimit"] < 0:
        return invalid + "backoffLimit must be a positive integer"
    return None


def raycluster_spec_error(spec: dict[str, Any], annotations: dict[str, str]) -> str | None:
    """``utils.ValidateRayClusterSpec`` (validation.go ~103-330): the rules without autoscaling,
    fault tolerance, auth, TLS or history server (not modelled)."""
    head = spec["headGroupSpec"]
    if not head["template"]["spec"].get("containers"):
        return "headGroupSpec should have at least one container"
    groups = [
        ("Head", head),
        *((w.get("groupName"), w) for w in spec.get("workerGroupSpecs") or []),
    ]
    for index, (name, group) in enumerate(groups):
        if index and not group["template"]["spec"].get("containers"):
            return "workerGroupSpec should have at least one container"
        if index:
            low, high = group.get("minReplicas"), group.get("maxReplicas")
            if low is None or high is None:
                return (
                    f"worker group {name} must set both minReplicas and maxReplicas when "
                    "autoscaling is disabled"
                )
            if low < 0:
                return f"worker group {name} has negative minReplicas {low}"
            if high < 0:
                return f"worker group {name} has negative maxReplicas {high}"
            if low > high:
                return f"worker group {name} has minReplicas {low} greater than maxReplicas {high}"
        params = group.get("rayStartParams") or {}
        if any(
            params.get(k) for k in ("num-cpus", "num-gpus", "memory", "resources")
        ) and group.get("resources"):
            return (
                f"resource fields should not be set in both rayStartParams and Resources for "
                f"{name} group; please use only one"
            )
        if "labels" in params:
            return (
                f"rayStartParams['labels'] is not supported for {name} group; please use the "
                "top-level Labels field instead"
            )
    return None


# ---------------------------------------------------------------------------- ray start
def quantity_value(text: str) -> int:
    """resource.Quantity ``Value()``: the quantity rounded up to an integer."""
    from kubernetes.utils import parse_quantity

    return math.ceil(parse_quantity(str(text)))


def complete_start_params(
    node_type: str, params: dict[str, str], head_port: str, fqdn: str
) -> dict[str, str]:
    """``setMissingRayStartParams`` (pod.go ~1345)."""
    params = dict(params)
    if node_type == "worker":
        params.setdefault("address", f"{fqdn}:{head_port}")
    else:
        params.setdefault("dashboard-host", "0.0.0.0")
    params.setdefault("metrics-export-port", str(DEFAULT_METRICS_PORT))
    params["block"] = "true"
    params.setdefault("dashboard-agent-listen-port", str(DEFAULT_AGENT_LISTEN_PORT))
    return params


def resource_params(params: dict[str, str], resources: dict[str, Any]) -> dict[str, str]:
    """``generateRayStartCommand``'s num-cpus (limit, else request), memory (limit) and
    num-gpus (``addWellKnownAcceleratorResources``: a limit whose name ends in "gpu")."""
    params = dict(params)
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    if "num-cpus" not in params:
        cpu = limits.get("cpu") or requests.get("cpu")
        if cpu and quantity_value(cpu):
            params["num-cpus"] = str(quantity_value(cpu))
    if "memory" not in params and limits.get("memory") and quantity_value(limits["memory"]):
        params["memory"] = str(quantity_value(limits["memory"]))
    for key in sorted(limits):
        if "num-gpus" not in params and key.endswith("gpu") and quantity_value(limits[key]):
            params["num-gpus"] = str(quantity_value(limits[key]))
    return params


def convert_param_map(params: dict[str, str]) -> str:
    """``convertParamMap``: sorted flags; "true" a bare flag, "false" dropped (but for the three
    that take a boolean value), anything else ``--key=value``."""
    flags = ""
    for key in sorted(params):
        value = str(params[key])
        if value.lower() in ("true", "false") and key not in (
            "log-color",
            "include-dashboard",
            "include-log-monitor",
        ):
            if value.lower() == "true":
                flags += f" --{key} "
        else:
            flags += f" --{key}={value} "
    return flags


def ray_start_command(node_type: str, params: dict[str, str]) -> str:
    head = " --head" if node_type == "head" else ""
    return f"ray start{head} {convert_param_map(params)}"


def group_params(group: dict[str, Any]) -> dict[str, str]:
    """rayStartParams with the group's top-level ``resources`` (``updateRayStartParamsResources``)
    and ``labels`` (``updateRayStartParamsLabels``) folded in."""
    params = {k: str(v) for k, v in (group.get("rayStartParams") or {}).items()}
    extra: dict[str, float] = {}
    for name, amount in (group.get("resources") or {}).items():
        lowered = name.lower()
        if lowered == "cpu":
            params["num-cpus"] = str(quantity_value(amount))
        elif lowered == "memory":
            params["memory"] = str(quantity_value(amount))
        elif lowered.endswith("gpu"):
            params["num-gpus"] = str(quantity_value(amount))
        else:
            from kubernetes.utils import parse_quantity

            extra[name] = float(parse_quantity(str(amount)))
    if extra:
        params["resources"] = f"'{json.dumps(extra, separators=(',', ':'))}'"
    if group.get("labels"):
        params["labels"] = ",".join(f"{k}={v}" for k, v in sorted(group["labels"].items()))
    return params


def head_port(cluster: dict[str, Any]) -> str:
    """``common.GetHeadPort``."""
    return str((cluster["spec"]["headGroupSpec"].get("rayStartParams") or {}).get("port", 6379))


def supports_unified_health_check(ray_version: str) -> bool:
    """``supportsUnifiedHealthCheck``: Ray >= 2.53.0 answers ``/api/healthz`` on its agent."""
    match = re.match(r"v?(\d+)\.(\d+)", ray_version or "")
    return bool(match) and (int(match.group(1)), int(match.group(2))) >= (2, 53)


def _probe(node_type: str, params: dict[str, str], ray_version: str, readiness: bool) -> dict:
    """``initLivenessAndReadinessProbe`` for the ray container."""
    agent = int(params.get("dashboard-agent-listen-port", DEFAULT_AGENT_LISTEN_PORT))
    probe: dict[str, Any] = {
        "initialDelaySeconds": 10 if readiness else 30,
        "timeoutSeconds": (5 if node_type == "head" else 2),
        "periodSeconds": 5,
        "successThreshold": 1,
        "failureThreshold": 10 if readiness else 120,
    }
    if supports_unified_health_check(ray_version):
        probe["httpGet"] = {"path": "/api/healthz", "port": agent}
        return probe
    # utils/constant.go BaseWgetHealthCommand
    wget = "wget --tries 1 -T %d -q -O- http://localhost:%d/%s | grep success"
    checks = [wget % (2, agent, "api/local_raylet_healthz")]
    if node_type == "head":
        dashboard = int(params.get("dashboard-port", DEFAULT_DASHBOARD_PORT))
        checks.append(wget % (10, dashboard, "api/gcs_healthz"))
    probe["exec"] = {"command": ["bash", "-c", " && ".join(checks)]}
    return probe


def _env_exists(env: list[dict[str, Any]], name: str) -> bool:
    return any(var.get("name") == name for var in env)


def ray_container_env(
    env: list[dict[str, Any]], node_type: str, fqdn: str, port: str, start: str, crd: str
) -> list[dict[str, Any]]:
    """``setContainerEnvVars`` (pod.go ~1207), the env appended to the ray container."""
    env = list(env)
    ip = "127.0.0.1" if node_type == "head" else fqdn
    if node_type == "worker":
        env += [{"name": "FQ_RAY_IP", "value": ip}, {"name": "RAY_IP", "value": ip.split(".")[0]}]

    def field(name: str, path: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}

    env += [
        field("RAY_CLUSTER_NAME", f"metadata.labels['{CLUSTER_LABEL}']"),
        field("RAY_CLUSTER_NAMESPACE", "metadata.namespace"),
        field("RAY_CLOUD_INSTANCE_ID", "metadata.name"),
        field("RAY_NODE_TYPE_NAME", f"metadata.labels['{GROUP_LABEL}']"),
        {"name": "KUBERAY_GEN_RAY_START_CMD", "value": start},
    ]
    defaults = [
        ("RAY_PORT", port),
        ("RAY_ADDRESS", f"{ip}:{port}"),
        ("RAY_USAGE_STATS_KUBERAY_IN_USE", "1"),
    ]
    for name, value in defaults:
        if not _env_exists(env, name):
            env.append({"name": name, "value": value})
    if node_type == "head":
        tags = f"kuberay_version={KUBERAY_VERSION};kuberay_crd={crd}"
        env.append({"name": "RAY_USAGE_STATS_EXTRA_TAGS", "value": tags})
    if not _env_exists(env, "RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE"):
        env.append({"name": "RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE", "value": "1"})
    return env


def ray_pod(cluster: dict[str, Any], node_type: str, group: dict[str, Any], index: int = 0):
    """The pod ``buildHeadPod`` / ``buildWorkerPod`` make (Pending), and its ray container's
    complete rayStartParams (what the local run starts from)."""
    name, namespace = cluster["metadata"]["name"], cluster["metadata"]["namespace"]
    fqdn = service_fqdn(head_service_name(cluster), namespace)
    port = head_port(cluster)
    group_name = HEAD_GROUP if node_type == "head" else group["groupName"]
    template = copy.deepcopy(group["template"])
    spec = template["spec"]
    container = spec["containers"][0]
    params = complete_start_params(node_type, group_params(group), port, fqdn)
    params = resource_params(params, container.get("resources") or {})
    start = ray_start_command(node_type, params)
    ports = container.setdefault("ports", [])
    if not any(p.get("name") == "metrics" for p in ports):
        ports.append({"name": "metrics", "containerPort": DEFAULT_METRICS_PORT})
    # convertCmdToString: each part as " <part> ".
    user = "".join(f" {part} " for part in container.get("command") or [])
    user += "".join(f" {part} " for part in container.get("args") or [])
    if "ray start" in user:
        raise NotImplementedError("fake KubeRay: a ray container with its own `ray start`")
    generated = "ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536}; " + start
    container["command"] = ["/bin/bash", "-c", "--"]
    container["args"] = [f"{user} && {generated}" if user else generated]
    crd = (cluster["metadata"].get("labels") or {}).get(CRD_LABEL, "RayCluster")
    container["env"] = ray_container_env(
        container.get("env") or [], node_type, fqdn, port, start, crd
    )
    ray_version = cluster["spec"].get("rayVersion", "")
    container.setdefault("livenessProbe", _probe(node_type, params, ray_version, False))
    container.setdefault("readinessProbe", _probe(node_type, params, ray_version, True))
    labels = {
        **((template.get("metadata") or {}).get("labels") or {}),
        **(group.get("labels") or {}),
    }
    fixed = {
        IS_RAY_NODE_LABEL: "yes",
        CLUSTER_LABEL: name,
        NODE_TYPE_LABEL: node_type,
        GROUP_LABEL: group_name,
        IDENTIFIER_LABEL: check_label(f"{name}-{node_type}"),
        APP_NAME_LABEL: "kuberay",
        CREATED_BY_LABEL: COMPONENT_NAME,
    }
    labels = {
        **fixed,
        **{
            k: v
            for k, v in labels.items()
            if k not in (NODE_TYPE_LABEL, GROUP_LABEL, CLUSTER_LABEL)
        },
    }
    if node_type == "worker":
        labels[REPLICA_INDEX_LABEL] = str(index)
        wait = (
            "SECONDS=0; while true; do if ray health-check --address "
            f'{fqdn}:{port} > /dev/null 2>&1; then echo "GCS is ready."; break; fi; '
            'echo "$SECONDS seconds elapsed: Waiting for GCS to be ready."; sleep 5; done'
        )
        spec["initContainers"] = [
            *(spec.get("initContainers") or []),
            {
                "name": "wait-gcs-ready",
                "image": container["image"],
                "command": ["/bin/bash", "-c", "--"],
                "args": [wait],
                "env": [
                    *copy.deepcopy(group["template"]["spec"]["containers"][0].get("env") or []),
                    {"name": "FQ_RAY_IP", "value": fqdn},
                    {"name": "RAY_IP", "value": fqdn.split(".")[0]},
                ],
                "resources": {
                    "limits": {"cpu": "200m", "memory": "256Mi"},
                    "requests": {"cpu": "200m", "memory": "256Mi"},
                },
            },
        ]
        prefix = pod_name_prefix(f"{name}-{group_name}", "worker")
        waiting = "PodInitializing"
    else:
        prefix = pod_name_prefix(name, "head")
        waiting = "ContainerCreating"
    metadata = {
        "generateName": prefix,
        "namespace": namespace,
        "labels": labels,
        "annotations": dict((template.get("metadata") or {}).get("annotations") or {}),
        "ownerReferences": [objects.owner_reference(cluster)],
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
        "status": _pod_status("Pending", container, waiting, ready=False),
    }
    return pod, params


def head_service(cluster: dict[str, Any]) -> dict[str, Any]:
    """``reconcileHeadService`` / ``BuildServiceForHeadPod``: headless, publishing not-ready
    addresses, the head container's named ports (else the defaults) plus metrics."""
    name = cluster["metadata"]["name"]
    head = cluster["spec"]["headGroupSpec"]
    container = head["template"]["spec"]["containers"][0]
    ports = {
        p.get("name") or f"{p['containerPort']}-port": p["containerPort"]
        for p in container.get("ports") or []
    } or {
        "client": DEFAULT_CLIENT_PORT,
        "gcs-server": DEFAULT_GCS_PORT,
        "dashboard": DEFAULT_DASHBOARD_PORT,
        "metrics": DEFAULT_METRICS_PORT,
        "serve": DEFAULT_SERVING_PORT,
    }
    ports.setdefault("metrics", DEFAULT_METRICS_PORT)
    selector = {
        CLUSTER_LABEL: name,
        NODE_TYPE_LABEL: "head",
        IDENTIFIER_LABEL: check_label(f"{name}-head"),
        APP_NAME_LABEL: ((head["template"].get("metadata") or {}).get("labels") or {}).get(
            APP_NAME_LABEL, "kuberay"
        ),
        CREATED_BY_LABEL: COMPONENT_NAME,
    }
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": head_service_name(cluster),
            "namespace": cluster["metadata"]["namespace"],
            "labels": dict(selector),
            "annotations": dict(cluster["spec"].get("headServiceAnnotations") or {}),
            "ownerReferences": [objects.owner_reference(cluster)],
        },
        "spec": {
            "selector": selector,
            "ports": [
                {"name": k, "port": v, "appProtocol": "tcp"} for k, v in sorted(ports.items())
            ],
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
        },
    }


# ------------------------------------------------------------------------------ submitter
def _go_quote(text: str) -> str:
    """Go's ``strconv.Quote`` for the strings it is given here."""
    return json.dumps(text, ensure_ascii=False)


def submit_command(rayjob: dict[str, Any]) -> list[str]:
    """``common.BuildJobSubmitCommand`` (job.go ~92-215) in K8sJobMode."""
    spec, status = rayjob["spec"], rayjob.get("status") or {}
    address = status.get("dashboardURL", "")
    if not address.startswith("http://"):
        address = "http://" + address
    job_id = status.get("jobId", "")
    health = HEALTH_COMMAND % (f"{address}/api/gcs_healthz", HEALTH_TIMEOUT_SECONDS)
    waiting = _go_quote(f"Waiting for Ray Dashboard GCS to become healthy at {address} ...")
    cmd = ["until", health, ">/dev/null", "2>&1", ";", "do", "echo", waiting, ";"]
    cmd += ["sleep", "2", ";", "done", ";"]
    cmd += ["if", "!", "ray", "job", "status", "--address", address, job_id]
    cmd += [">/dev/null", "2>&1", ";", "then"]
    cmd += ["ray", "job", "submit", "--address", address, "--no-wait"]
    if spec.get("runtimeEnvYAML"):
        runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
        cmd += ["--runtime-env-json", _go_quote(_compact_json(runtime_env))]
    if spec.get("metadata"):
        cmd += ["--metadata-json", _go_quote(_compact_json(spec["metadata"]))]
    if job_id:
        cmd += ["--submission-id", job_id]
    if (spec.get("entrypointNumCpus") or 0) > 0:
        cmd += ["--entrypoint-num-cpus", f"{float(spec['entrypointNumCpus']):f}"]
    if (spec.get("entrypointNumGpus") or 0) > 0:
        cmd += ["--entrypoint-num-gpus", f"{float(spec['entrypointNumGpus']):f}"]
    if spec.get("entrypointResources"):
        cmd += ["--entrypoint-resources", _go_quote(spec["entrypointResources"])]
    cmd += ["--", spec.get("entrypoint", "").strip(), ";", "fi", ";"]
    cmd += ["ray", "job", "logs", "--address", address, "--follow", job_id]
    return cmd


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def submitter_job(rayjob: dict[str, Any], cluster: dict[str, Any]) -> dict[str, Any]:
    """The submitter Job ``createNewK8sJob`` creates (pod template: ``getSubmitterTemplate``)."""
    spec = rayjob["spec"]
    name = rayjob["metadata"]["name"]
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    template = copy.deepcopy(spec.get("submitterPodTemplate")) or {
        "spec": {
            "containers": [
                {
                    "name": SUBMITTER_CONTAINER,
                    "image": head["image"],
                    "resources": {
                        "limits": {"cpu": "1", "memory": "1Gi"},
                        "requests": {"cpu": "500m", "memory": "200Mi"},
                    },
                }
            ],
            "restartPolicy": "Never",
        }
    }
    container = template["spec"]["containers"][0]
    if not container.get("command"):
        container["command"] = ["/bin/bash", "-ce", "--"]
        container["args"] = [" ".join(submit_command(rayjob))]
    status = rayjob["status"]
    container["env"] = [
        *(container.get("env") or []),
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "RAY_DASHBOARD_ADDRESS", "value": status["dashboardURL"]},
        {"name": "RAY_JOB_SUBMISSION_ID", "value": status["jobId"]},
    ]
    origin = {CR_NAME_LABEL: name, CRD_LABEL: "RayJob", CREATED_BY_LABEL: COMPONENT_NAME}
    template.setdefault("metadata", {}).setdefault("labels", {}).update(origin)
    backoff = (spec.get("submitterConfig") or {}).get("backoffLimit")
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": rayjob["metadata"]["namespace"],
            "labels": dict(origin),
            "ownerReferences": [objects.owner_reference(rayjob)],
        },
        "spec": {
            "backoffLimit": DEFAULT_SUBMITTER_BACKOFF_LIMIT if backoff is None else backoff,
            "template": template,
        },
    }


# ------------------------------------------------------------------------- status rules
def parse_time(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def go_time(stamp: float, layout: str = "") -> str:
    """A time as Go prints a ``*metav1.Time`` with %v, or in ``time.DateTime`` layout."""
    moment = datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc)
    if layout == "DateTime":
        return moment.strftime("%Y-%m-%d %H:%M:%S")
    return moment.strftime("%Y-%m-%d %H:%M:%S +0000 UTC")


def check_active_deadline(rayjob: dict[str, Any], status: dict[str, Any], now: float) -> bool:
    """``checkActiveDeadlineAndUpdateStatusIfNeeded`` and the pre-running one (~1060-1095)."""
    for field, reason, before_running in (
        ("activeDeadlineSeconds", "DeadlineExceeded", False),
        ("preRunningDeadlineSeconds", "PreRunningDeadlineExceeded", True),
    ):
        deadline = rayjob["spec"].get(field)
        if deadline is None or (before_running and status["jobDeploymentStatus"] == "Running"):
            continue
        started = parse_time(status["startTime"])
        if now < started + deadline:
            continue
        status.update(jobDeploymentStatus="Failed", reason=reason)
        status["message"] = (
            f"The RayJob has passed the {field}. StartTime: {go_time(started)}. "
            f"{field[0].upper()}{field[1:]}: {deadline}"
        )
        return True
    return False


def running_outcome(job_status: str, submitter_finished: bool) -> tuple[str, str]:
    """(jobDeploymentStatus, reason) from the Ray job's status in Running (~345-360): terminal
    only once the submitter Job finished too; a FAILED job is Failed, AppFailed."""
    if job_status in TERMINAL_JOB_STATUSES and submitter_finished:
        return ("Failed", "AppFailed") if job_status == "FAILED" else ("Complete", "")
    return "Running", ""


def count_outcome(rayjob: dict[str, Any], status: dict[str, Any]) -> None:
    """``checkBackoffLimitAndUpdateStatusIfNeeded`` (~488-530)."""
    failed = status.get("failed") or 0
    succeeded = status.get("succeeded") or 0
    if status.get("jobDeploymentStatus") == "Failed":
        failed += 1
    if status.get("jobStatus") == "SUCCEEDED" and status.get("jobDeploymentStatus") == "Complete":
        succeeded += 1
    status.update(failed=failed, succeeded=succeeded)
    limit = rayjob["spec"].get("backoffLimit")
    if status.get("jobDeploymentStatus") == "Failed" and limit is not None and failed < limit + 1:
        if status.get("reason") not in ("DeadlineExceeded", "JobStatusCheckTimeoutExceeded"):
            status["jobDeploymentStatus"] = "Retrying"


def shutdown_at(rayjob: dict[str, Any]) -> float | None:
    """When ``handleShutdownAfterJobFinishes`` deletes the RayCluster: endTime + ttl; None
    without shutdownAfterJobFinishes."""
    if not rayjob["spec"].get("shutdownAfterJobFinishes"):
        return None
    ttl = rayjob["spec"].get("ttlSecondsAfterFinished") or 0
    return parse_time(rayjob["status"]["endTime"]) + ttl


def cluster_status_changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """``utils.InconsistentRayClusterStatus``."""
    keys = (
        "state",
        "reason",
        "readyWorkerReplicas",
        "availableWorkerReplicas",
        "desiredWorkerReplicas",
        "minWorkerReplicas",
        "maxWorkerReplicas",
        "endpoints",
        "head",
        "conditions",
    )
    return any((old or {}).get(k) != (new or {}).get(k) for k in keys)


# ------------------------------------------------------------------------------ pods
def _pod_status(
    phase: str,
    container: dict[str, Any],
    state: str,
    ready: bool,
    exit_code: int | None = None,
    restarts: int = 0,
    last_state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    if state == "running":
        container_state = objects.running()
    elif state == "terminated":
        container_state = objects.terminated(exit_code or 0)
    else:  # a waiting reason
        container_state = objects.waiting(state)
    status = objects.container_status(
        container["image"],
        container_state,
        restart_count=restarts,
        last_state=last_state,
        name=container["name"],
    )
    status["ready"] = ready
    flag = "True" if ready else "False"
    conditions = [
        objects.condition("PodScheduled", "True", reason="Scheduled"),
        objects.condition("Initialized", "True" if phase != "Pending" else "False"),
        objects.condition("ContainersReady", flag, reason="" if ready else "ContainersNotReady"),
        objects.condition("Ready", flag, reason="" if ready else "ContainersNotReady"),
    ]
    for condition in conditions:
        if condition["reason"] == condition["type"]:
            condition["reason"] = ""
    return {
        "phase": phase,
        "conditions": conditions,
        "containerStatuses": [status],
        "podIP": "127.0.0.1",
        "startTime": now_iso(),
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(url: str) -> bool:
    """Whether ``url`` answers 200 with "success" in its body (the probes' ``grep success``)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200 and b"success" in response.read()
    except (OSError, urllib.error.URLError):
        return False


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def container_env(container: dict[str, Any], pod: dict[str, Any]) -> dict[str, str]:
    """The container's env as the kubelet gives it: values ``$(VAR)``-expanded in order,
    ``fieldRef`` from the pod; Secrets and ConfigMaps are not resolved here."""
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = trainer_build.expand(str(var["value"]), env)
        elif "fieldRef" in (var.get("valueFrom") or {}):
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            env[var["name"]] = trainer_build.field_value(pod, path)
    return env


def machine_env() -> dict[str, str]:
    """What every container starts from here (module docstring: the image is this machine)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    interpreter = os.path.dirname(sys.executable)
    base["PATH"] = f"{interpreter}{os.pathsep}{base.get('PATH', '')}"
    base.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    hard = rlimit.getrlimit(rlimit.RLIMIT_NOFILE)[1]
    if hard != rlimit.RLIM_INFINITY and hard < 65536:
        base["RAY_START_ULIMIT_OPEN_FILES"] = str(hard)
    return base


class PodProcess:
    """One pod's first container as a local process tree, its output the pod's log."""

    def __init__(
        self,
        fake: FakeKubeRay,
        pod: dict[str, Any],
        argv: list[str],
        env: dict[str, str],
        temp_dir: str | None = None,
        probed: bool = True,
    ) -> None:
        self.fake = fake
        #: Whether a readiness probe decides when it is ready (else: once it runs).
        self.probed = probed
        self.name = pod["metadata"]["name"]
        self.namespace = pod["metadata"]["namespace"]
        self.container = pod["spec"]["containers"][0]
        self.restart_policy = pod["spec"].get("restartPolicy", "Always")
        self.restarts = 0
        self.last_state: dict[str, Any] | None = None
        self.argv = argv
        self.env = env
        self.temp_dir = temp_dir
        self.marker = secrets.token_hex(8)
        self.log = fake.root / f"{self.namespace}-{self.name}.log"
        self.tail = LogTail(self.log)
        self.process: subprocess.Popen | None = None
        self.exit_code: int | None = None
        self.ready = False
        self.deleted = False

    def start(self) -> None:
        workdir = self.fake.root / f"{self.namespace}-{self.name}"
        workdir.mkdir(parents=True, exist_ok=True)
        env = {**machine_env(), **self.env, POD_MARKER: self.marker}
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                env=env,
                cwd=workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.ready = not self.probed
        self.set_status("Running", "running", ready=self.ready)

    def restart(self, code: int) -> None:
        """The kubelet restarts the container in place (restartPolicy Always, or OnFailure after
        a failure): what is left of the old run is killed with it (the container's cgroup), the
        new run counts one more restart."""
        stop_marked_processes(POD_MARKER, self.marker, STOP_GRACE_SECONDS)
        self.restarts += 1
        self.last_state = objects.terminated(code)
        self.exit_code = None
        self.start()

    def poll(self) -> int | None:
        if self.process is not None and self.exit_code is None:
            code = self.process.poll()
            if code is not None:
                self.exit_code = 128 - code if code < 0 else code
        return self.exit_code

    def copy_logs(self, final: bool = False) -> None:
        lines = self.tail.read_lines(final=final)
        if lines and not self.deleted:
            self.fake.emulator.append_log(self.name, lines, self.namespace, self.container["name"])

    def set_status(self, phase: str, state: str, ready: bool, code: int | None = None) -> None:
        if self.deleted:
            return
        status = _pod_status(
            phase, self.container, state, ready, code, self.restarts, self.last_state
        )
        try:
            self.fake.emulator.set_pod_status(self.name, status, self.namespace)
        except Exception:  # deleted meanwhile: the DELETED event stops it
            pass

    def stop(self) -> None:
        """The pod is gone: its whole process tree stopped (SIGTERM, then SIGKILL)."""
        stop_marked_processes(POD_MARKER, self.marker, STOP_GRACE_SECONDS)
        if self.process is not None:
            self.process.wait()
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


# ------------------------------------------------------------------------- the RayCluster
class _ClusterRun(threading.Thread):
    """One RayCluster: its head Service, pods and their processes, its status."""

    def __init__(self, fake: FakeKubeRay, cluster: dict[str, Any]) -> None:
        super().__init__(name=f"fake-kuberay-{cluster['metadata']['name']}", daemon=True)
        self.fake = fake
        self.emulator = fake.emulator
        self.name = cluster["metadata"]["name"]
        self.namespace = cluster["metadata"]["namespace"]
        self.uid = cluster["metadata"]["uid"]
        self.stopped = threading.Event()
        self.head_ports = {
            "port": _free_port(),
            "dashboard-port": _free_port(),
            "ray-client-server-port": _free_port(),
            "metrics-export-port": _free_port(),
        }
        self.pods: dict[str, tuple[PodProcess, str, dict[str, str]]] = {}
        self.service: dict[str, Any] | None = None

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                cluster = self.emulator.get(RAYCLUSTER, self.name, self.namespace)
                if cluster is None or cluster["metadata"]["uid"] != self.uid:
                    return
                if not self._reconcile(cluster):
                    return
                time.sleep(POLL_SECONDS)
        except Exception as error:  # the controller must not die silently mid-test
            if not self.stopped.is_set():
                self.fake.errors.append(error)

    # The local addresses behind the head Service's ports (module docstring).
    def local_ports(self) -> dict[str, int]:
        return {
            "gcs-server": self.head_ports["port"],
            "dashboard": self.head_ports["dashboard-port"],
            "client": self.head_ports["ray-client-server-port"],
            "metrics": self.head_ports["metrics-export-port"],
        }

    def localize(self, text: str) -> str:
        """``text`` with the head Service's in-cluster addresses made local."""
        if self.service is None:
            return text
        local = self.local_ports()
        names = [self.service["metadata"]["name"], *self.fake.aliases.get(self.uid, [])]
        for service in names:
            fqdn = service_fqdn(service, self.namespace)
            for port in self.service["spec"]["ports"]:
                if port["name"] in local:
                    text = text.replace(
                        f"{fqdn}:{port['port']}", f"127.0.0.1:{local[port['name']]}"
                    )
        return text

    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.head_ports['dashboard-port']}"

    def _reconcile(self, cluster: dict[str, Any]) -> bool:
        spec = cluster["spec"]
        error = raycluster_spec_error(spec, cluster["metadata"].get("annotations") or {})
        if error:  # rayClusterReconcile: an event, nothing made
            self.fake.event(
                cluster,
                "InvalidRayClusterSpec",
                f"The RayCluster spec is invalid {self.namespace}/{self.name}: {error}",
            )
            return False
        if cluster["metadata"].get("deletionTimestamp"):
            return True
        if self.service is None:
            self.service = self.emulator.create("services", head_service(cluster), self.namespace)
        live = {p["metadata"]["name"]: p for p in self._pods()}
        if spec.get("suspend"):
            for name in list(live):
                self._delete_pod(name)
            live = {}
        else:
            if not any(role == "head" for _, role, _ in self.pods.values()):
                self._create_pod(cluster, "head", spec["headGroupSpec"], 0)
            for group in spec.get("workerGroupSpecs") or []:
                self._scale_group(cluster, group, live)
        self._run_pods()
        self._write_status(cluster)
        return True

    def _pods(self) -> list[dict[str, Any]]:
        return [
            p
            for p in self.emulator.list("pods", self.namespace)
            if (p["metadata"].get("labels") or {}).get(CLUSTER_LABEL) == self.name
        ]

    def _scale_group(self, cluster: dict[str, Any], group: dict[str, Any], live: dict) -> None:
        """``reconcilePods`` for one worker group: pods made up to the desired replicas (lowest
        free replica index first), the extra ones deleted."""
        desired = desired_replicas(group)
        mine = [
            name
            for name, (_, role, _) in self.pods.items()
            if role == group["groupName"] and name in live
        ]
        used = {int(live[n]["metadata"]["labels"][REPLICA_INDEX_LABEL]) for n in mine}
        index = 0
        for _ in range(desired - len(mine)):
            while index in used:
                index += 1
            used.add(index)
            self._create_pod(cluster, "worker", group, index)
        for name in mine[desired:]:
            self._delete_pod(name)

    def _create_pod(self, cluster: dict[str, Any], node_type: str, group: dict, index: int) -> None:
        body, params = ray_pod(cluster, node_type, group, index)
        pod = self.emulator.create_pod(body)
        reason = "CreatedHeadPod" if node_type == "head" else "CreatedWorkerPod"
        kind = "head" if node_type == "head" else "worker"
        name = pod["metadata"]["name"]
        self.fake.event(cluster, reason, f"Created {kind} Pod {self.namespace}/{name}", "Normal")
        local = dict(params)
        temp = f"{TEMP_PREFIX}{secrets.token_hex(4)}"
        self.fake.temp_dirs.append(temp)
        local_ports = [
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "metrics-export-port",
            "runtime-env-agent-port",
            "node-manager-port",
            "object-manager-port",
        ]
        local.update({key: str(_free_port()) for key in local_ports})
        local.update({"temp-dir": temp, "min-worker-port": "0", "max-worker-port": "0"})
        if node_type == "head":
            local.update({k: str(v) for k, v in self.head_ports.items()})
            local["dashboard-host"] = "127.0.0.1"
        else:
            local["address"] = f"127.0.0.1:{self.head_ports['port']}"
        container = pod["spec"]["containers"][0]
        args = container["args"][0].replace(
            ray_start_command(node_type, params), ray_start_command(node_type, local)
        )
        env = container_env(container, pod)
        env.update(
            RAY_ADDRESS=f"127.0.0.1:{self.head_ports['port']}",
            RAY_PORT=str(self.head_ports["port"]),
            KUBERAY_GEN_RAY_START_CMD=ray_start_command(node_type, local),
        )
        if node_type == "worker":
            env.update(FQ_RAY_IP="127.0.0.1", RAY_IP="127.0.0.1")
        process = PodProcess(self.fake, pod, [*container["command"], args], env, temp)
        role = "head" if node_type == "head" else group["groupName"]
        self.pods[name] = (process, role, local)
        self.fake.adopt(process)

    def _delete_pod(self, name: str) -> None:
        self.pods.pop(name, None)
        try:
            self.emulator.delete("pods", name, self.namespace)
        except Exception:  # already gone
            pass

    def _run_pods(self) -> None:
        """Start what may start (the head at once, workers once the GCS answers), mirror
        readiness, exits and output into the pods."""
        gcs_up = _accepts(self.head_ports["port"])
        for name, (process, role, params) in list(self.pods.items()):
            if process.deleted:
                self.pods.pop(name)
                continue
            if process.process is None:
                if role == "head" or gcs_up:
                    process.start()
                continue
            process.copy_logs()
            code = process.poll()
            if code is not None:
                process.copy_logs(final=True)
                policy = process.restart_policy
                if policy == "Always" or (policy == "OnFailure" and code):
                    process.restart(code)
                    continue
                # The pod ends; shouldDeletePod (~1512): KubeRay deletes a Failed or Succeeded
                # pod and makes a new one on its next reconcile.
                phase = "Succeeded" if code == 0 else "Failed"
                process.set_status(phase, "terminated", ready=False, code=code)
                self._delete_pod(name)
                continue
            ready = self._probe(role, params)
            if ready != process.ready:
                process.ready = ready
                process.set_status("Running", "running", ready=ready)

    def _probe(self, role: str, params: dict[str, str]) -> bool:
        cluster = self.emulator.get(RAYCLUSTER, self.name, self.namespace) or {"spec": {}}
        agent = f"http://127.0.0.1:{params['dashboard-agent-listen-port']}/api"
        if supports_unified_health_check(cluster["spec"].get("rayVersion", "")):
            return _answers(f"{agent}/healthz")
        if not _answers(f"{agent}/local_raylet_healthz"):
            return False
        return role != "head" or _answers(f"{self.dashboard_url()}/api/gcs_healthz")

    def _write_status(self, cluster: dict[str, Any]) -> None:
        """``calculateStatus`` (~1970-2135), the fields not about resources or endpoints."""
        old = cluster.get("status") or {}
        pods = self._pods()
        workers = [p for p in pods if p["metadata"]["labels"].get(NODE_TYPE_LABEL) == "worker"]
        groups = cluster["spec"].get("workerGroupSpecs") or []
        desired = sum(desired_replicas(g) for g in groups)

        def ready(pod: dict[str, Any]) -> bool:
            status = pod.get("status") or {}
            return status.get("phase") == "Running" and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in status.get("conditions") or []
            )

        status = {
            **old,
            "observedGeneration": cluster["metadata"].get("generation", 1),
            "readyWorkerReplicas": sum(1 for p in workers if ready(p)),
            "availableWorkerReplicas": sum(1 for p in workers if p["status"]["phase"] == "Running"),
            "desiredWorkerReplicas": desired,
            "minWorkerReplicas": sum(g.get("minReplicas", 0) for g in groups),
            "maxWorkerReplicas": sum(g.get("maxReplicas", 0) for g in groups),
        }
        all_ready = bool(pods) and all(ready(p) for p in pods)
        if len(pods) == desired + 1 and all_ready:
            status["state"] = "ready"
            status.pop("reason", None)
        if cluster["spec"].get("suspend") and not pods:
            status["state"] = "suspended"
        heads = [p for p in pods if p["metadata"]["labels"].get(NODE_TYPE_LABEL) == "head"]
        conditions = {c["type"]: c for c in old.get("conditions") or []}
        head_ready = bool(heads) and ready(heads[0])
        self._set_condition(
            conditions,
            "HeadPodReady",
            head_ready,
            "HeadPodRunningAndReady"
            if head_ready
            else "HeadPodNotFound"
            if not heads
            else "ContainersNotReady",
        )
        provisioned = conditions.get("RayClusterProvisioned", {}).get("status") == "True"
        if not provisioned:
            self._set_condition(
                conditions,
                "RayClusterProvisioned",
                all_ready,
                "AllPodRunningAndReadyFirstTime" if all_ready else "RayClusterPodsProvisioning",
                "All Ray Pods are ready for the first time"
                if all_ready
                else "RayCluster Pods are being provisioned for first time",
            )
        status["conditions"] = list(conditions.values())
        if status.get("state") != old.get("state"):
            times = dict(old.get("stateTransitionTimes") or {})
            times[status["state"]] = now_iso()
            status["stateTransitionTimes"] = times
        if status != old:
            status["lastUpdateTime"] = now_iso()
            self.fake.replace_status(RAYCLUSTER, self.name, self.namespace, status)

    @staticmethod
    def _set_condition(
        conditions: dict, type_: str, true: bool, reason: str, message: str = ""
    ) -> None:
        value = "True" if true else "False"
        old = conditions.get(type_)
        if old and (old["status"], old["reason"], old.get("message", "")) == (
            value,
            reason,
            message,
        ):
            return
        conditions[type_] = {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now_iso(),
        }

    def stop(self) -> None:
        self.stopped.set()
        if self is not threading.current_thread():
            self.join(timeout=30)


def desired_replicas(group: dict[str, Any]) -> int:
    """``utils.GetWorkerGroupDesiredReplicas``: replicas within [min, max], 0 if suspended."""
    if group.get("suspend"):
        return 0
    low, high = group.get("minReplicas", 0), group.get("maxReplicas", 2**31 - 1)
    replicas = group.get("replicas")
    if replicas is None or replicas < low:
        return low
    return min(replicas, high)


# ------------------------------------------------------------------------------ the RayJob
class _SubmitterRun:
    """The submitter Job's pods as the Job controller runs them (restartPolicy Never: a new
    pod per failure while failures stay within backoffLimit, then Failed BackoffLimitExceeded;
    kubernetes pkg/controller/job/job_controller.go ``syncJob``)."""

    def __init__(self, fake: FakeKubeRay, job: dict[str, Any], cluster: _ClusterRun) -> None:
        self.fake = fake
        self.job = job
        self.cluster = cluster
        self.failed = 0
        self.process: PodProcess | None = None
        self.finished = False

    def tick(self) -> None:
        if self.finished:
            return
        if self.process is None:
            self._start_pod()
            return
        self.process.copy_logs()
        code = self.process.poll()
        if code is None:
            return
        self.process.copy_logs(final=True)
        phase = "Succeeded" if code == 0 else "Failed"
        self.process.set_status(phase, "terminated", ready=False, code=code)
        if code == 0:
            self._finish(True)
        else:
            self.failed += 1
            if self.failed > self.job["spec"]["backoffLimit"]:
                self._finish(False)
            else:
                self._start_pod()

    def _start_pod(self) -> None:
        name, namespace = self.job["metadata"]["name"], self.job["metadata"]["namespace"]
        template = copy.deepcopy(self.job["spec"]["template"])
        uid = self.job["metadata"]["uid"]
        labels = {
            **((template.get("metadata") or {}).get("labels") or {}),
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": name,
            "controller-uid": uid,
            "job-name": name,
        }
        container = template["spec"]["containers"][0]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{name}-",
                "namespace": namespace,
                "labels": labels,
                "ownerReferences": [objects.owner_reference(self.job)],
            },
            "spec": template["spec"],
            "status": _pod_status("Pending", container, "ContainerCreating", ready=False),
        }
        pod = self.fake.emulator.create_pod(body)
        env = {k: self.cluster.localize(v) for k, v in container_env(container, pod).items()}
        argv = [self.cluster.localize(part) for part in container["command"] + container["args"]]
        self.process = PodProcess(self.fake, pod, argv, env, probed=False)
        self.fake.adopt(self.process)
        self.process.start()
        self.fake.replace_status(
            kmock.resource("batch", "v1", "jobs"),
            name,
            namespace,
            {"active": 1, "failed": self.failed, "startTime": now_iso()},
        )

    def _finish(self, succeeded: bool) -> None:
        """The Job's terminal conditions (``syncJob``): SuccessCriteriaMet + Complete, or
        FailureTarget + Failed BackoffLimitExceeded."""
        self.finished = True
        if succeeded:
            conditions = [
                objects.condition("SuccessCriteriaMet", reason="CompletionsReached"),
                objects.condition("Complete", reason="CompletionsReached"),
            ]
        else:
            message = "Job has reached the specified backoff limit"
            conditions = [
                objects.condition("FailureTarget", reason="BackoffLimitExceeded", message=message),
                objects.condition("Failed", reason="BackoffLimitExceeded", message=message),
            ]
        status = {"conditions": conditions, "succeeded": int(succeeded), "failed": self.failed}
        if succeeded:
            status["completionTime"] = now_iso()
        name, namespace = self.job["metadata"]["name"], self.job["metadata"]["namespace"]
        self.fake.replace_status(kmock.resource("batch", "v1", "jobs"), name, namespace, status)


class _RayJobRun(threading.Thread):
    """One RayJob reconciled as ``RayJobReconciler.Reconcile`` does (module docstring)."""

    def __init__(self, fake: FakeKubeRay, rayjob: dict[str, Any]) -> None:
        super().__init__(name=f"fake-kuberay-job-{rayjob['metadata']['name']}", daemon=True)
        self.fake = fake
        self.emulator = fake.emulator
        self.name = rayjob["metadata"]["name"]
        self.namespace = rayjob["metadata"]["namespace"]
        self.uid = rayjob["metadata"]["uid"]
        self.stopped = threading.Event()
        self.submitter: _SubmitterRun | None = None

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                rayjob = self.emulator.get(RAYJOB, self.name, self.namespace)
                if rayjob is None or rayjob["metadata"]["uid"] != self.uid:
                    return
                if not self._reconcile(rayjob):
                    return
                if self.submitter is not None:
                    self.submitter.tick()
                time.sleep(POLL_SECONDS)
        except Exception as error:  # the controller must not die silently mid-test
            if not self.stopped.is_set():
                self.fake.errors.append(error)

    def _cluster(self, status: dict[str, Any]) -> _ClusterRun | None:
        return self.fake.cluster_run(self.namespace, status.get("rayClusterName", ""))

    def _reconcile(self, rayjob: dict[str, Any]) -> bool:
        """One ``Reconcile``; False once nothing is left to do for this RayJob."""
        meta = rayjob["metadata"]
        status = copy.deepcopy(rayjob.get("status") or {})
        if meta.get("deletionTimestamp"):
            if status.get("jobStatus", "") not in TERMINAL_JOB_STATUSES:
                self._stop_ray_job(status)
            finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
            self._patch_finalizers(finalizers)
            return False
        original = copy.deepcopy(status)
        invalid = rayjob_validation_error(rayjob)
        if invalid is not None:
            reason, message = invalid
            self.fake.event(rayjob, reason, f"{self.namespace}/{self.name}: {message}")
            status.update(
                jobDeploymentStatus="ValidationFailed", reason="ValidationFailed", message=message
            )
            self._write(original, status)
            return False
        if rayjob["spec"].get("submissionMode", "K8sJobMode") != "K8sJobMode":
            raise NotImplementedError("fake KubeRay: only K8sJobMode is modelled")
        state = status.get("jobDeploymentStatus", "")
        now = time.time()
        spec = rayjob["spec"]
        if state == "":
            if FINALIZER not in (meta.get("finalizers") or []):
                self._patch_finalizers([*(meta.get("finalizers") or []), FINALIZER])
            status.setdefault("jobId", spec.get("jobId") or generate_ray_job_id(self.name))
            status.setdefault("rayClusterName", generate_ray_cluster_name(self.name))
            status.update(jobDeploymentStatus="Initializing", startTime=now_iso())
        elif state == "Initializing":
            if spec.get("suspend"):
                status["jobDeploymentStatus"] = "Suspending"
            elif not check_active_deadline(rayjob, status, now):
                cluster = self._get_or_create_cluster(rayjob, status)
                if not status.get("dashboardURL"):
                    if (cluster.get("status") or {}).get("state") != "ready":
                        status["rayClusterStatus"] = cluster.get("status") or {}
                        return self._finish_tick(rayjob, original, status)
                    status["dashboardURL"] = self._dashboard_url(cluster)
                self._create_submitter(rayjob, cluster, status)
                status["jobDeploymentStatus"] = "Running"
        elif state == "Running":
            if spec.get("suspend"):
                status["jobDeploymentStatus"] = "Suspending"
            elif not check_active_deadline(rayjob, status, now):
                self._running(rayjob, status, now)
        elif state in ("Suspending", "Retrying"):
            if not self._release(status):
                return True
            for field in ("rayClusterStatus", "rayClusterName", "dashboardURL", "jobId"):
                status.pop(field, None)
            for field in ("message", "reason", "rayJobInfo", "jobStatus"):
                status.pop(field, None)
            self.submitter = None
            status["jobDeploymentStatus"] = "Suspended" if state == "Suspending" else ""
        elif state == "Suspended":
            if spec.get("suspend"):
                return True
            status.pop("jobStatus", None)
            status["jobDeploymentStatus"] = ""
        elif state in ("Complete", "Failed"):
            return self._finished(rayjob)
        else:
            return True
        return self._finish_tick(rayjob, original, status)

    def _patch_finalizers(self, finalizers: list[str]) -> None:
        changes = {"metadata": {"finalizers": finalizers}}
        self.emulator.patch(RAYJOB, self.name, changes, self.namespace)

    def _finish_tick(self, rayjob: dict, original: dict, status: dict) -> bool:
        count_outcome(rayjob, status)
        self._write(original, status)
        return True

    def _write(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        """``updateRayJobStatus``: only when the state machine's fields change."""
        if (
            old.get("jobStatus", "") == new.get("jobStatus", "")
            and old.get("jobDeploymentStatus", "") == new.get("jobDeploymentStatus", "")
            and not cluster_status_changed(old.get("rayClusterStatus"), new.get("rayClusterStatus"))
        ):
            return
        if new.get("jobDeploymentStatus") in ("Complete", "Failed"):
            new["endTime"] = now_iso()
        self.fake.replace_status(RAYJOB, self.name, self.namespace, new)

    def _get_or_create_cluster(self, rayjob: dict[str, Any], status: dict) -> dict[str, Any]:
        """``getOrCreateRayClusterInstance`` / ``constructRayClusterForRayJob``."""
        name = status["rayClusterName"]
        cluster = self.emulator.get(RAYCLUSTER, name, self.namespace)
        if cluster is not None:
            return cluster
        labels = {
            **(rayjob["metadata"].get("labels") or {}),
            CR_NAME_LABEL: self.name,
            CRD_LABEL: "RayJob",
            SUBMISSION_MODE_LABEL: rayjob["spec"].get("submissionMode", "K8sJobMode"),
        }
        body = {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": labels,
                "annotations": dict(rayjob["metadata"].get("annotations") or {}),
                "ownerReferences": [objects.owner_reference(rayjob)],
            },
            "spec": copy.deepcopy(rayjob["spec"]["rayClusterSpec"]),
        }
        cluster = self.emulator.create(RAYCLUSTER, body, self.namespace)
        message = f"Created RayCluster {self.namespace}/{name}"
        self.fake.event(rayjob, "CreatedRayCluster", message, "Normal")
        return cluster

    def _dashboard_url(self, cluster: dict[str, Any]) -> str:
        """``utils.FetchHeadServiceURL`` for the dashboard port."""
        service = self.emulator.get("services", head_service_name(cluster), self.namespace)
        port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "dashboard")
        return f"{service_fqdn(service['metadata']['name'], self.namespace)}:{port}"

    def _create_submitter(self, rayjob: dict, cluster: dict, status: dict) -> None:
        """``createK8sJobIfNeed``."""
        if self.emulator.get("jobs", self.name, self.namespace) is not None:
            return
        body = submitter_job({**rayjob, "status": status}, cluster)
        job = self.emulator.create("jobs", body, self.namespace)
        message = f"Created Kubernetes Job {self.namespace}/{self.name}"
        self.fake.event(rayjob, "CreatedRayJobSubmitter", message, "Normal")
        run = self._cluster(status)
        assert run is not None, "the RayCluster's run starts with the cluster"
        self.submitter = _SubmitterRun(self.fake, job, run)

    def _running(self, rayjob: dict[str, Any], status: dict[str, Any], now: float) -> None:
        """The Running case (~250-365)."""
        cluster = self._get_or_create_cluster(rayjob, status)
        self._reconcile_service(rayjob, cluster)
        job = self.emulator.get("jobs", self.name, self.namespace) or {}
        conditions = (job.get("status") or {}).get("conditions") or []
        failed = next(
            (c for c in conditions if c["type"] == "Failed" and c["status"] == "True"), None
        )
        if failed is not None:
            status["jobDeploymentStatus"] = "Failed"
            if status.get("jobStatus") == "FAILED":
                status["reason"] = "AppFailed"
            else:
                status["reason"] = "SubmissionFailed"
                status["message"] = (
                    f"Job submission has failed. Reason: {failed['reason']}. Message: "
                    f"{failed.get('message', '')}"
                )
            return
        finished = next(
            (
                c
                for c in conditions
                if c["type"] in ("Complete", "Failed") and c["status"] == "True"
            ),
            None,
        )
        finished_at = parse_time(finished["lastTransitionTime"]) if finished else None
        if finished_at is not None and now >= finished_at + SUBMITTER_FINISHED_TIMEOUT_SECONDS:
            status.update(
                jobStatus="FAILED",
                jobDeploymentStatus="Failed",
                reason="JobDeploymentStatusTransitionGracePeriodExceeded",
                message=(
                    f"The RayJob submitter finished at {go_time(finished_at, 'DateTime')} but "
                    "the ray job did not reach terminal state within "
                    f"{SUBMITTER_FINISHED_TIMEOUT_SECONDS}s"
                ),
            )
            return
        info = self._job_info(status)
        if info is None:
            if finished_at is not None:
                status.update(
                    jobDeploymentStatus="Failed",
                    reason="AppFailed",
                    message="Submitter completed but Ray job not found in RayCluster.",
                )
            return
        if info is False:
            return
        deployment, reason = running_outcome(info.get("status", ""), finished_at is not None)
        status["rayClusterStatus"] = cluster.get("status") or {}
        status["jobStatus"] = info.get("status", "")
        status["jobDeploymentStatus"] = deployment
        status["reason"] = reason
        status["message"] = info.get("message") or ""
        for field in ("start_time", "end_time"):
            if info.get(field):
                stamp = datetime.datetime.fromtimestamp(info[field] / 1000, datetime.timezone.utc)
                key = "startTime" if field == "start_time" else "endTime"
                status.setdefault("rayJobInfo", {})[key] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
        for field in ("reason", "message"):
            if not status[field]:
                status.pop(field)

    def _job_info(self, status: dict[str, Any]) -> dict[str, Any] | None | bool:
        """``GetJobInfo``: the job's info, None if the dashboard says 404, False if it cannot
        be asked now."""
        run = self._cluster(status)
        if run is None:
            return False
        url = f"{run.dashboard_url()}/api/jobs/{status['jobId']}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            return None if error.code == 404 else False
        except (OSError, ValueError):
            return False

    def _stop_ray_job(self, status: dict[str, Any]) -> None:
        """``StopJob`` (POST /api/jobs/<id>/stop); failures only logged, as upstream."""
        run = self._cluster(status)
        if run is None or not status.get("jobId"):
            return
        request = urllib.request.Request(
            f"{run.dashboard_url()}/api/jobs/{status['jobId']}/stop",
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass
        except (OSError, urllib.error.URLError):
            pass

    def _reconcile_service(self, rayjob: dict[str, Any], cluster: dict[str, Any]) -> None:
        """``reconcileServices`` / ``BuildHeadServiceForRayJob``: "<job>-head-svc"."""
        name = f"{self.name}-head-svc"
        if self.emulator.get("services", name, self.namespace) is not None:
            return
        body = head_service(cluster)
        body["metadata"].update(
            name=name,
            labels={
                CR_NAME_LABEL: self.name,
                CRD_LABEL: "RayJob",
                NODE_TYPE_LABEL: "head",
                IDENTIFIER_LABEL: check_label(f"{self.name}-head"),
            },
            ownerReferences=[objects.owner_reference(rayjob)],
            annotations={},
        )
        self.emulator.create("services", body, self.namespace)
        run = self.fake.cluster_run(self.namespace, cluster["metadata"]["name"])
        if run is not None:
            self.fake.aliases.setdefault(run.uid, []).append(name)
        self.fake.event(
            rayjob, "CreatedService", f"Created the service {self.namespace}/{name}", "Normal"
        )

    def _release(self, status: dict[str, Any]) -> bool:
        """``deleteClusterResources`` and ``deleteSubmitterJob``: True once both are gone."""
        gone = True
        for resource, name in ((RAYCLUSTER, status.get("rayClusterName")), ("jobs", self.name)):
            if name and self.emulator.get(resource, name, self.namespace) is not None:
                self.emulator.delete(resource, name, self.namespace, policy="Background")
                gone = False
        return gone

    def _finished(self, rayjob: dict[str, Any]) -> bool:
        """Complete/Failed: ``handleShutdownAfterJobFinishes``; False once done."""
        if self.submitter is not None:
            self.submitter.tick()  # its last output still reaches the pod's log
        when = shutdown_at(rayjob)
        if when is None:
            return False
        if time.time() < when:
            return True
        name = rayjob["status"].get("rayClusterName")
        if name and self.emulator.get(RAYCLUSTER, name, self.namespace) is not None:
            self.emulator.delete(RAYCLUSTER, name, self.namespace, policy="Background")
            message = f"Deleted cluster {self.namespace}/{name}"
            self.fake.event(rayjob, "DeletedRayCluster", message, "Normal")
        return False

    def stop(self) -> None:
        self.stopped.set()
        if self is not threading.current_thread():
            self.join(timeout=30)


# ------------------------------------------------------------------------------ the operator
class FakeKubeRay(FakeController):
    """Plays KubeRay v1.7.0 for RayJobs and RayClusters on ``emulator`` until ``stop()``; use
    as a context manager. ``install`` serves the v1.7.0 CRDs first. ``errors`` collects what
    a reconcile raised (a test asserts it is empty)."""

    def __init__(self, emulator: KubeEmulator, root: str | Path, install: bool = True) -> None:
        self.emulator = emulator
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.install = install
        self.webhook = False  # KubeRay's webhooks are optional; the controller validates
        self.errors: list[Exception] = []
        self.runs: dict[tuple[str, str, str], Any] = {}
        #: Per RayCluster uid, other Services naming its head (a RayJob's "<job>-head-svc").
        self.aliases: dict[str, list[str]] = {}
        self.processes: dict[tuple[str, str], PodProcess] = {}
        #: Every Ray node's --temp-dir: a process naming one is a Ray process of this fake.
        self.temp_dirs: list[str] = []
        self._stoppers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._events: queue.Queue = queue.Queue()
        self._unsubscribe: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._dispatch, name="fake-kuberay", daemon=True)

    def start(self) -> FakeKubeRay:
        if self.install and self.emulator.get("customresourcedefinitions", _crd_name()) is None:
            self.emulator.install_kuberay()
        watched = ("rayjobs", "rayclusters", "pods")
        self._unsubscribe = self.emulator.on_event(
            lambda plural, event: self._events.put((plural, event)) if plural in watched else None
        )
        self._thread.start()
        return self

    def _dispatch(self) -> None:
        while (item := self._events.get()) is not None:
            plural, event = item
            meta = event["object"]["metadata"]
            namespace = meta.get("namespace", "")
            if plural == "pods":
                if event["type"] == "DELETED":
                    self._pod_deleted(namespace, meta["name"])
                continue
            key = (plural, namespace, meta["name"])
            run = self.runs.get(key)
            if event["type"] == "DELETED":
                if run is not None and run.uid == meta["uid"]:
                    self.runs.pop(key).stop()
                continue
            # KubeRay reconciles a RayJob on every event of it (v1.7.0 rayjob_controller.go
            # SetupWithManager ~864: For(&rayv1.RayJob{})): one whose run ended (its cluster gone
            # after the TTL) is reconciled again, e.g. to let its finalizer go on deletion
            if run is None or run.uid != meta["uid"] or not run.is_alive():
                kind = _RayJobRun if plural == "rayjobs" else _ClusterRun
                self.runs[key] = kind(self, event["object"])
                self.runs[key].start()

    def cluster_run(self, namespace: str, name: str) -> _ClusterRun | None:
        return self.runs.get(("rayclusters", namespace, name))

    def dashboard_url(self, cluster: str, namespace: str = "default") -> str:
        """The local address of RayCluster ``cluster``'s dashboard (its head Service's
        ``dashboard`` port), for Ray's own clients in tests."""
        run = self.cluster_run(namespace, cluster)
        if run is None:
            raise KeyError(f"no RayCluster {namespace}/{cluster} is running")
        return run.dashboard_url()

    def adopt(self, process: PodProcess) -> None:
        with self._lock:
            self.processes[(process.namespace, process.name)] = process

    def _pod_deleted(self, namespace: str, name: str) -> None:
        """A deleted pod's container stops (in a thread: stopping takes up to the grace)."""
        with self._lock:
            process = self.processes.pop((namespace, name), None)
        if process is None:
            return
        process.deleted = True
        stopper = threading.Thread(target=process.stop, name=f"stop-{name}", daemon=True)
        self._stoppers.append(stopper)
        stopper.start()

    def replace_status(
        self, resource: kmock.resource, name: str, namespace: str, status: dict[str, Any]
    ) -> None:
        """Write ``status`` whole through the status subresource (an object deleted meanwhile
        is left alone)."""
        api = self.emulator.api

        def replace() -> None:
            key = api.key(resource, namespace, name)
            current = api.live(key)
            if current is not None:
                api.write_object(key, {**copy.deepcopy(current), "status": status}, "status")

        self.emulator.call(replace)

    def event(self, involved: dict[str, Any], reason: str, message: str, type_: str = "Warning"):
        body = objects.event(involved, reason, message, type_)
        body["source"] = {"component": "rayjob-controller"}
        try:
            self.emulator.create("events", body, involved["metadata"].get("namespace"))
        except Exception:  # the object is being deleted
            pass

    def stop(self) -> None:
        super().stop()
        with self._lock:
            left = list(self.processes.values())
            self.processes.clear()
        for process in left:
            process.deleted = True
            stopper = threading.Thread(target=process.stop, name=f"stop-{process.name}")
            self._stoppers.append(stopper)
            stopper.start()
        for stopper in self._stoppers:
            stopper.join(timeout=30)


def _crd_name() -> str:
    return _crd("rayjobs")["metadata"]["name"]
