"""A fake Kubeflow Training Operator v1 for the emulator: the very PyTorchJob a backend submits
is played as the operator plays it, each of its pods a real process on this machine.

Every rule is from kubeflow/training-operator, branch release-1.9 (its v1.9.0 files are the
same), the file named:

* defaults, in memory only (``pkg/apis/kubeflow.org/v1/pytorch_defaults.go``
  ``SetDefaults_PyTorchJob``): replicas 1, restartPolicy OnFailure, port ``pytorchjob-port``
  23456 in container ``pytorch``, cleanPodPolicy None; an ``elasticPolicy``'s missing bound
  is the other one, both the Worker replicas when neither is set (``setElasticPolicy``, ~38-55);
  nprocPerNode "auto" unless an elasticPolicy sets the deprecated ``nProcPerNode``
  (``setDefaultNprocPerNode``, ~68-74);
* the validating webhook (``pkg/webhooks/pytorch/pytorchjob_webhook.go``, registered as
  ``validator.pytorchjob.training-operator.kubeflow.org``): the name a DNS-1035 label, only
  Master/Worker replicas, each with containers that all have an image and one named
  ``pytorch``, Master replicas exactly 1, Worker at least 1; with an ``elasticPolicy``
  (``validateSpec``, ~93-113) a Worker spec is required and ``elasticPolicy.nProcPerNode``
  (deprecated) is forbidden beside ``nprocPerNode``; a denial is a 403;
* on create, condition Created "PyTorchJob <job> is created." (``pkg/controller.v1/pytorch/
  pytorchjob_controller.go`` ``onOwnerCreateFunc``); reasons are ``PyTorchJob`` + the
  condition's (``pkg/util/status.go`` ``NewReason``);
* per replica index one headless Service and one Pod, both ``<job>-<type lowercased>-<index>``
  (``pkg/controller.v1/common/util.go`` ``GenGeneralName``; ``pod.go`` ``createNewPod``,
  ``service.go`` ``CreateNewService``), labelled ``training.kubeflow.org/operator-name:
  pytorchjob-controller``, ``job-name``, ``replica-type`` (lowercase), ``replica-index`` and, on
  the master, ``job-role: master``, owned by the job (controller reference); the pod's
  restartPolicy is the replica's;
* the env appended to every container (``pkg/controller.v1/pytorch/envvar.go`` ``setPodEnv``
  ~43-127, ``master.go``): PYTHONUNBUFFERED=1; with a Master spec only, MASTER_PORT,
  PET_MASTER_PORT, MASTER_ADDR and PET_MASTER_ADDR (``<job>-master-0``), WORLD_SIZE (replicas x
  nprocPerNode, 1 per node when it is not a number), RANK and PET_NODE_RANK (master 0, worker
  i + 1); PET_NPROC_PER_NODE when nprocPerNode is set; then without an elasticPolicy
  PET_NNODES = replicas, with one the elastic env instead (``elastic.go`` ``Generate``
  ~68-122): PET_RDZV_ENDPOINT (``rdzvHost`` else ``<job>-worker-0``, ``:`` ``rdzvPort`` else
  the Worker's ``pytorchjob-port``), PET_RDZV_BACKEND (``rdzvBackend``, else c10d), PET_NNODES
  "MIN:MAX", then only when set PET_MAX_RESTARTS, PET_NPROC_PER_NODE (``nProcPerNode``),
  PET_RDZV_ID, PET_RDZV_CONF (``key=value`` joined by commas), PET_STANDALONE; workers of a job
  with a Master also get the ``init-pytorch`` init container (``initcontainer.go``
  ``setInitContainer``, ~105-136), which is not run here;
* status (``pytorchjob_controller.go`` ``UpdateJobStatus`` ~369-445): with a Master, Running
  once the master runs, and the master Succeeded is the job Succeeded ("PyTorchJob <job> is
  successfully completed."); with Worker replicas only, Running ("PyTorchJob <ns>/<job> is
  running.") while a worker runs, and Succeeded ("PyTorchJob <ns>/<job> successfully
  completed.") once every worker has, or, with an elasticPolicy, once ANY worker has (the
  others then go by cleanPodPolicy); Succeeded turns Running False; a failed pod of a replica
  whose restartPolicy is Never fails the job ("PyTorchJob <job> is failed because <n> <type>
  replica(s) failed."); under OnFailure the container is restarted in place (restartCount + 1
  as it starts again; its pod stays Running, so no Restarting condition, which needs pods of
  phase Failed) until the running pods' restart counts add up to
  ``backoffLimit``, which fails the job "Job <job> has failed because it has reached the
  specified backoff limit" and deletes every pod and Service (``pkg/controller.v1/common/
  job.go`` ``ReconcileJobs``, ``pkg/core/job.go`` ``PastBackoffLimit``);
* a finished job's pods go by cleanPodPolicy (``job.go`` ``DeletePodsAndServices``): None keeps
  them, Running deletes those still running or pending (their processes stopped), All deletes
  all; each pod's Service goes with it;
* ``runPolicy.activeDeadlineSeconds`` (``pkg/core/job.go`` ``PastActiveDeadline``): past it the
  job fails "Job <job> has failed because it was active longer than specified deadline", its
  pods going by cleanPodPolicy (``job.go`` ``ReconcileJobs``);
* ``runPolicy.suspend``: pods and Services deleted, conditions Suspended True and Running False
  (``job.go`` ``ReconcileJobs``).

What one machine changes, in the processes only (the pods keep the operator's values):
MASTER_ADDR/PET_MASTER_ADDR become 127.0.0.1 and the master port a free local one; the host of
PET_RDZV_ENDPOINT becomes 127.0.0.1 and its port a free local one, and PET_RDZV_CONF gets
``is_host=1`` in worker-0's process and ``is_host=0`` in the others'. On a cluster torchrun's
c10d rendezvous hosts its store in the process whose hostname or address matches the
endpoint's host (torch ``c10d_rendezvous_backend.py`` ``_create_tcp_store``: ``is_host`` from
the conf, else ``_matches_machine_hostname``), which for ``<job>-worker-0`` is worker-0's pod
alone; on one machine 127.0.0.1 matches every process, so the first to start would host the
store and the others fall back to clients: a lost worker-1 could take the store with it. The
Services route nothing; volumes (a shipped script's ConfigMap included) are not mounted; env
from Secrets is not resolved. ``kill_node`` SIGKILLs one pod's whole process tree, as a lost
machine.
"""

from __future__ import annotations

import copy
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kubetrain.backends.local.log_tail import LogTail
from kubetrain.backends.local.processes import stop_marked_processes
from tests.support import objects, trainer_build
from tests.support.controller import FakeController
from tests.support.emulator import KubeEmulator
from tests.support.kube_api import now_iso, webhook_denial
from tests.support.processes import descendants

PYTORCHJOBS = "pytorchjobs"
CRD_FILE = Path(__file__).parent / "crds" / "kubeflow.org_pytorchjobs.yaml"
WEBHOOK = "validator.pytorchjob.training-operator.kubeflow.org"
CONTROLLER = "pytorchjob-controller"
CONTAINER = "pytorch"
PORT_NAME = "pytorchjob-port"
DEFAULT_PORT = 23456
#: elasticPolicy.rdzvBackend's default (elastic.go ``generateEnvBackend``: BackendC10D).
DEFAULT_RDZV_BACKEND = "c10d"
MASTER, WORKER = "Master", "Worker"
OPERATOR_NAME = "training.kubeflow.org/operator-name"
JOB_NAME = "training.kubeflow.org/job-name"
REPLICA_TYPE = "training.kubeflow.org/replica-type"
REPLICA_INDEX = "training.kubeflow.org/replica-index"
JOB_ROLE = "training.kubeflow.org/job-role"
INIT_IMAGE = "alpine:3.10"
INIT_MAX_TRIES = 100
#: Marks every process of one job, so stopping it finds torchrun's workers too.
RUN_MARKER = "KUBETRAIN_FAKE_OPERATOR_RUN"
#: How long a container restarted in place shows CrashLoopBackOff first (the kubelet's is
#: 10 s, doubling; a wait must not take it for a job that cannot finish).
CRASH_LOOP_BACKOFF_SECONDS = 0.5
POLL_SECONDS = 0.05
STOP_GRACE_SECONDS = 5.0
DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def pytorchjob_crd() -> dict[str, Any]:
    """The vendored release-1.9 PyTorchJob CRD (``crds/SOURCE.txt``), parsed once."""
    return copy.deepcopy(_crd())


def _crd() -> dict[str, Any]:
    global _CRD
    if _CRD is None:
        import yaml

        with open(CRD_FILE) as file:
            _CRD = yaml.load(file, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return _CRD


_CRD: dict[str, Any] | None = None


def replica_name(job: str, replica_type: str, index: int) -> str:
    return f"{job}-{replica_type.lower()}-{index}"


def condition(type_: str, message: str, status: str = "True") -> dict[str, Any]:
    return {
        **objects.condition(type_, status, reason=f"PyTorchJob{type_}", message=message),
        "lastUpdateTime": now_iso(),
    }


def defaulted(job: dict[str, Any]) -> dict[str, Any]:
    """The job as ``SetDefaults_PyTorchJob`` leaves it (in memory, not stored)."""
    job = copy.deepcopy(job)
    spec = job["spec"]
    spec.setdefault("runPolicy", {}).setdefault("cleanPodPolicy", "None")
    for replica in spec["pytorchReplicaSpecs"].values():
        replica.setdefault("replicas", 1)
        replica.setdefault("restartPolicy", "OnFailure")
        containers = replica["template"]["spec"]["containers"]
        container = next((c for c in containers if c["name"] == CONTAINER), containers[0])
        ports = container.setdefault("ports", [])
        if not any(p.get("name") == PORT_NAME for p in ports):
            ports.append({"name": PORT_NAME, "containerPort": DEFAULT_PORT})
    elastic = spec.get("elasticPolicy")
    if elastic is not None:  # setElasticPolicy
        workers = (spec["pytorchReplicaSpecs"].get(WORKER) or {}).get("replicas")
        low, high = elastic.get("minReplicas"), elastic.get("maxReplicas")
        elastic["minReplicas"] = low if low is not None else high if high is not None else workers
        elastic["maxReplicas"] = high if high is not None else low if low is not None else workers
    if elastic is None or elastic.get("nProcPerNode") is None:  # setDefaultNprocPerNode
        spec.setdefault("nprocPerNode", "auto")
    return job


def replica_port(job: dict[str, Any], replica_type: str) -> int:
    """``getPortFromPyTorchJob``: the replica's ``pytorchjob-port`` in container ``pytorch``."""
    pod = job["spec"]["pytorchReplicaSpecs"][replica_type]["template"]["spec"]["containers"]
    container = next(c for c in pod if c["name"] == CONTAINER)
    return next(p["containerPort"] for p in container["ports"] if p.get("name") == PORT_NAME)


def elastic_env(job: dict[str, Any]) -> list[dict[str, str]]:
    """``ElasticEnvVarGenerator.Generate`` (elastic.go ~68-122) for a defaulted job with an
    elasticPolicy, in its order."""
    name = job["metadata"]["name"]
    policy = job["spec"]["elasticPolicy"]
    host = policy.get("rdzvHost") or replica_name(name, WORKER, 0)
    port = policy.get("rdzvPort") or replica_port(job, WORKER)
    env = [
        {"name": "PET_RDZV_ENDPOINT", "value": f"{host}:{port}"},
        {"name": "PET_RDZV_BACKEND", "value": policy.get("rdzvBackend") or DEFAULT_RDZV_BACKEND},
        {"name": "PET_NNODES", "value": f"{policy['minReplicas']}:{policy['maxReplicas']}"},
    ]
    optional = (
        ("PET_MAX_RESTARTS", policy.get("maxRestarts")),
        ("PET_NPROC_PER_NODE", policy.get("nProcPerNode")),
        ("PET_RDZV_ID", policy.get("rdzvId")),
    )
    env += [{"name": key, "value": str(value)} for key, value in optional if value is not None]
    if policy.get("rdzvConf") is not None:
        conf = ",".join(f"{c['key']}={c['value']}" for c in policy["rdzvConf"])
        env.append({"name": "PET_RDZV_CONF", "value": conf})
    if policy.get("standalone"):
        env.append({"name": "PET_STANDALONE", "value": ""})
    return env


def nproc_int(job: dict[str, Any]) -> int:
    """``getNprocPerNodeInt``: nprocPerNode as a number, 1 when it is not one."""
    try:
        return int(job["spec"].get("nprocPerNode"))
    except (TypeError, ValueError):
        return 1


def operator_env(job: dict[str, Any], replica_type: str, index: int) -> list[dict[str, str]]:
    """What ``setPodEnv`` appends to every container of the pod."""
    name = job["metadata"]["name"]
    replicas = sum(r["replicas"] for r in job["spec"]["pytorchReplicaSpecs"].values())
    env = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if MASTER in job["spec"]["pytorchReplicaSpecs"]:
        rank = index + 1 if replica_type == WORKER else index
        port = str(replica_port(job, MASTER))
        env += [
            {"name": "MASTER_PORT", "value": port},
            {"name": "PET_MASTER_PORT", "value": port},
            {"name": "MASTER_ADDR", "value": replica_name(name, MASTER, 0)},
            {"name": "PET_MASTER_ADDR", "value": replica_name(name, MASTER, 0)},
            {"name": "WORLD_SIZE", "value": str(replicas * nproc_int(job))},
            {"name": "RANK", "value": str(rank)},
            {"name": "PET_NODE_RANK", "value": str(rank)},
        ]
    if job["spec"].get("nprocPerNode") is not None:
        env.append({"name": "PET_NPROC_PER_NODE", "value": str(job["spec"]["nprocPerNode"])})
    if job["spec"].get("elasticPolicy") is not None:
        env += elastic_env(job)
    else:
        env.append({"name": "PET_NNODES", "value": str(replicas)})
    return env


def init_container(job: str) -> dict[str, Any]:
    """``initcontainer.go``'s template: a worker waits until the master's name resolves."""
    return {
        "name": "init-pytorch",
        "image": INIT_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "resources": {
            "limits": {"cpu": "100m", "memory": "20Mi"},
            "requests": {"cpu": "50m", "memory": "10Mi"},
        },
        "command": [
            "sh",
            "-c",
            f"err=1;for i in $(seq {INIT_MAX_TRIES}); do if nslookup "
            f"{replica_name(job, MASTER, 0)}; then err=0 && break; fi;echo waiting for master; "
            "sleep 2; done; exit $err",
        ],
    }


def replica_labels(job: str, replica_type: str, index: int) -> dict[str, str]:
    labels = {
        OPERATOR_NAME: CONTROLLER,
        JOB_NAME: job,
        REPLICA_TYPE: replica_type.lower(),
        REPLICA_INDEX: str(index),
    }
    if replica_type == MASTER:
        labels[JOB_ROLE] = "master"
    return labels


def operator_pod(job: dict[str, Any], replica_type: str, index: int) -> dict[str, Any]:
    """The pod ``createNewPod`` makes for one replica of a (defaulted) job, Pending."""
    name = job["metadata"]["name"]
    replica = job["spec"]["pytorchReplicaSpecs"][replica_type]
    template = copy.deepcopy(replica["template"])
    spec = template["spec"]
    for container in spec["containers"]:
        container["env"] = [*(container.get("env") or []), *operator_env(job, replica_type, index)]
    if replica_type == WORKER and MASTER in job["spec"]["pytorchReplicaSpecs"]:
        spec["initContainers"] = [*(spec.get("initContainers") or []), init_container(name)]
    spec["restartPolicy"] = replica["restartPolicy"]
    image = next(c for c in spec["containers"] if c["name"] == CONTAINER)["image"]
    metadata = template.get("metadata") or {}
    labels = {**(metadata.get("labels") or {}), **replica_labels(name, replica_type, index)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": replica_name(name, replica_type, index),
            "namespace": job["metadata"]["namespace"],
            "labels": labels,
            "annotations": dict(metadata.get("annotations") or {}),
            "ownerReferences": [objects.owner_reference(job)],
        },
        "spec": spec,
        "status": objects.pod_status(
            "Pending",
            [objects.container_status(image, objects.waiting("ContainerCreating"), name=CONTAINER)],
        ),
    }


def operator_service(job: dict[str, Any], replica_type: str, index: int) -> dict[str, Any]:
    """``CreateNewService``: headless, selecting the replica's pod, its containers' ports."""
    name = job["metadata"]["name"]
    labels = replica_labels(name, replica_type, index)
    labels.pop(JOB_ROLE, None)
    containers = job["spec"]["pytorchReplicaSpecs"][replica_type]["template"]["spec"]["containers"]
    container = next(c for c in containers if c["name"] == CONTAINER)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": replica_name(name, replica_type, index),
            "namespace": job["metadata"]["namespace"],
            "labels": labels,
            "ownerReferences": [objects.owner_reference(job)],
        },
        "spec": {
            "clusterIP": "None",
            "selector": labels,
            "ports": [
                {"name": p["name"], "port": p["containerPort"]}
                for p in container.get("ports") or []
                if p.get("name")
            ],
        },
    }


def webhook_errors(job: dict[str, Any]) -> list[str]:
    """``validatePyTorchJob`` on create (run-policy updates aside)."""
    errors = []
    name = job["metadata"].get("name", "")
    if not (len(name) <= 63 and DNS1035.fullmatch(name)):
        errors.append(f'metadata.name: Invalid value: "{name}": should match: a DNS-1035 label')
    specs = (job.get("spec") or {}).get("pytorchReplicaSpecs")
    elastic = (job.get("spec") or {}).get("elasticPolicy")
    if elastic is not None:
        if WORKER not in (specs or {}):
            errors.append(
                "spec.pytorchReplicaSpecs[Worker]: Required value: must be configured if "
                "elastic policy is used"
            )
        if elastic.get("nProcPerNode") is not None and job["spec"].get("nprocPerNode") is not None:
            errors.append(
                "spec.elasticPolicy.nProcPerNode: Forbidden: must not be used with "
                "spec.nprocPerNode"
            )
    if specs is None:
        errors.append("spec.pytorchReplicaSpecs: Required value: must be required")
    for replica_type, replica in (specs or {}).items():
        path = f"spec.pytorchReplicaSpecs[{replica_type}]"
        containers = path + ".template.spec.containers"
        if replica_type not in (MASTER, WORKER):
            errors.append(
                f'{path}: Unsupported value: "{replica_type}": supported values: "Master", "Worker"'
            )
        pod_containers = ((replica or {}).get("template") or {}).get("spec", {}).get("containers")
        if not pod_containers:
            errors.append(f"{containers}: Required value: must be specified")
        for index, container in enumerate(pod_containers or []):
            if not container.get("image"):
                errors.append(f"{containers}[{index}].image: Required value: must be required")
        if not any(c.get("name") == CONTAINER for c in pod_containers or []):
            errors.append(
                f"{containers}: Required value: must have at least one container with name "
                f"{CONTAINER}"
            )
        replicas = (replica or {}).get("replicas")
        if replica_type == MASTER and replicas != 1:
            errors.append(f"{path}.replicas: Forbidden: must be 1")
        elif replica_type == WORKER and replicas is not None and replicas < 1:
            errors.append(f"{path}.replicas: Forbidden: must be at least 1")
    return errors


class _Node:
    """One pod's process: its container as the kubelet runs it, on 127.0.0.1."""

    def __init__(self, run: _Run, pod: dict[str, Any], replica_type: str, index: int) -> None:
        self.run = run
        self.pod = pod["metadata"]["name"]
        self.replica_type = replica_type
        self.index = index
        self.container = next(c for c in pod["spec"]["containers"] if c["name"] == CONTAINER)
        self.image = self.container["image"]
        self.restart_policy = pod["spec"]["restartPolicy"]
        self.log = run.directory / f"{self.pod}.log"
        self.tail = LogTail(self.log)
        self.process: subprocess.Popen | None = None
        self.restarts = 0
        self.exit_code: int | None = None
        self.last_state: dict[str, Any] | None = None

    def env(self) -> dict[str, str]:
        """The container's env as the kubelet gives it (values, ``$(VAR)`` expanded), the
        master's address and port and the rendezvous endpoint made local (the module's
        docstring says why worker-0 alone gets ``is_host=1``)."""
        env: dict[str, str] = {}
        for var in self.container.get("env") or []:
            if "value" in var:
                env[var["name"]] = trainer_build.expand(str(var["value"]), env)
        port = str(self.run.local_port)
        local = {}
        if "MASTER_ADDR" in env:
            local = {"MASTER_ADDR": "127.0.0.1", "PET_MASTER_ADDR": "127.0.0.1"}
            local.update({"MASTER_PORT": port, "PET_MASTER_PORT": port})
        if "PET_RDZV_ENDPOINT" in env:
            host = env["PET_RDZV_ENDPOINT"].rpartition(":")[0]
            hosts = self.pod == host == replica_name(self.run.name, WORKER, 0)
            local["PET_RDZV_ENDPOINT"] = f"127.0.0.1:{port}"
            conf = [env["PET_RDZV_CONF"]] if env.get("PET_RDZV_CONF") else []
            local["PET_RDZV_CONF"] = ",".join([*conf, f"is_host={int(hosts)}"])
        return {**env, **local}

    def start(self) -> None:
        env = self.env()
        program = [*(self.container.get("command") or []), *(self.container.get("args") or [])]
        argv = [trainer_build.expand(part, env) for part in program]
        interpreter = os.path.dirname(sys.executable)
        full_env = {
            "OMP_NUM_THREADS": self.run.core_share,
            **os.environ,
            "PATH": f"{interpreter}{os.pathsep}{os.environ.get('PATH', '')}",
            **env,
            RUN_MARKER: self.run.marker,
        }
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                argv,
                env=full_env,
                cwd=self.run.directory,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.exit_code = None

    def poll(self) -> int | None:
        """The exit code once the process has ended (a signal is 128 + its number)."""
        if self.process is None or self.exit_code is not None:
            return self.exit_code
        code = self.process.poll()
        if code is not None:
            self.exit_code = 128 - code if code < 0 else code
        return self.exit_code


class _Run(threading.Thread):
    """One PyTorchJob: its Services and pods, their processes, its conditions."""

    def __init__(self, operator: FakeTrainingOperator, obj: dict[str, Any]) -> None:
        super().__init__(name=f"fake-operator-{obj['metadata']['name']}", daemon=True)
        self.operator = operator
        self.emulator = operator.emulator
        self.obj = obj
        self.job = defaulted(obj)
        self.name = obj["metadata"]["name"]
        self.namespace = obj["metadata"]["namespace"]
        self.directory = operator.root / f"{self.namespace}-{self.name}-{obj['metadata']['uid']}"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.marker = secrets.token_hex(8)
        self.local_port = _free_port()
        self.stopped = threading.Event()
        self.started = time.monotonic()  # status.startTime, set on the first reconcile
        self.nodes: list[_Node] = []
        self.conditions: list[dict[str, Any]] = []
        replicas = sum(r["replicas"] for r in self.job["spec"]["pytorchReplicaSpecs"].values())
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        self.core_share = str(max(1, cores // (replicas * nproc_int(self.job))))

    def run(self) -> None:
        try:
            self._run()
        except Exception as error:  # the controller must not die silently mid-test
            if not self.stopped.is_set():  # else: its objects were deleted under it, as meant
                self.operator.errors.append(error)

    @property
    def has_master(self) -> bool:
        return MASTER in self.job["spec"]["pytorchReplicaSpecs"]

    def _set_condition(self, type_: str, message: str, status: str = "True") -> None:
        """``UpdateJobConditions``: one condition per type; Succeeded/Failed turn Running
        False; nothing changes once Failed."""
        if any(c["type"] == "Failed" and c["status"] == "True" for c in self.conditions):
            return
        kept = []
        for old in self.conditions:
            if old["type"] == type_:
                continue
            if type_ in ("Succeeded", "Failed") and old["type"] == "Running":
                old = {**old, "status": "False"}
            kept.append(old)
        self.conditions = [*kept, condition(type_, message, status)]
        self.emulator.patch_status(
            PYTORCHJOBS, self.name, {"conditions": self.conditions}, self.namespace
        )

    def _run(self) -> None:
        self._set_condition("Created", f"PyTorchJob {self.name} is created.")
        for replica_type in (MASTER, WORKER):
            replica = self.job["spec"]["pytorchReplicaSpecs"].get(replica_type)
            for index in range(replica["replicas"] if replica else 0):
                self.emulator.create(
                    "services", operator_service(self.job, replica_type, index), self.namespace
                )
                pod = self.emulator.create_pod(operator_pod(self.job, replica_type, index))
                self.nodes.append(_Node(self, pod, replica_type, index))
        for node in self.nodes:
            node.start()
            self._set_container(node, objects.running(), "Running")
        who = self.name if self.has_master else f"{self.namespace}/{self.name}"
        self._set_condition("Running", f"PyTorchJob {who} is running.")
        while not self.stopped.is_set():
            self._copy_logs(final=False)
            if self._decide() or self._past_active_deadline():
                return
            time.sleep(POLL_SECONDS)

    def _past_active_deadline(self) -> bool:
        """``runPolicy.activeDeadlineSeconds`` since the job's start (``pkg/core/job.go``
        ``PastActiveDeadline``): the job fails and its pods go by cleanPodPolicy
        (``job.go`` ``ReconcileJobs``, ``DeletePodsAndServices``)."""
        deadline = self.job["spec"]["runPolicy"].get("activeDeadlineSeconds")
        if deadline is None or time.monotonic() - self.started < deadline:
            return False
        self._fail(
            f"Job {self.name} has failed because it was active longer than specified deadline"
        )
        return True

    def _decide(self) -> bool:
        """Apply what ended since the last look; True once the job is finished."""
        failed: dict[str, int] = {}
        for node in self.nodes:
            if node.process is None or node.exit_code is not None and node.last_state is not None:
                continue
            code = node.poll()
            if code is None:
                continue
            self._copy_logs(final=True, only=node)
            ended = objects.terminated(code)
            if code and node.restart_policy == "OnFailure":
                node.last_state = ended
                # No Restarting condition: the operator sets it only for replicas whose pods
                # are phase Failed (pytorchjob_controller.go UpdateJobStatus, `failed > 0`),
                # and a container restarted in place leaves its pod Running.
                # The kubelet holds a container it restarts in place in a back-off, shown as
                # waiting CrashLoopBackOff (kubernetes pkg/kubelet/kuberuntime/
                # kuberuntime_manager.go doBackOff, ErrCrashLoopBackOff in
                # pkg/kubelet/container/sync_result.go), before starting it again; the
                # restartCount goes up as the new container starts (kuberuntime_container.go
                # startContainer: the last status's restartCount + 1).
                self._set_container(
                    node,
                    objects.waiting("CrashLoopBackOff", "back-off restarting failed container"),
                    "Running",
                    last_state=ended,
                )
                time.sleep(CRASH_LOOP_BACKOFF_SECONDS)
                node.restarts += 1
                node.last_state = None
                node.start()
                self._set_container(node, objects.running(), "Running", last_state=ended)
                if self._past_backoff_limit():
                    self._fail(
                        f"Job {self.name} has failed because it has reached the specified "
                        "backoff limit",
                        delete_all=True,
                    )
                    return True
                continue
            node.last_state = ended
            self._set_container(node, ended, "Succeeded" if code == 0 else "Failed")
            if code:
                failed[node.replica_type] = failed.get(node.replica_type, 0) + 1
        if (message := self._succeeded()) is not None:
            self._set_condition("Succeeded", message)
            self._clean_up()
            return True
        for replica_type, count in failed.items():
            self._fail(
                f"PyTorchJob {self.name} is failed because {count} {replica_type} replica(s) "
                "failed."
            )
            return True
        return False

    def _succeeded(self) -> str | None:
        """``UpdateJobStatus``'s Succeeded message once the job has succeeded, else None: the
        master succeeded; with no Master, every worker did, or with an elasticPolicy any."""
        done = [n for n in self.nodes if n.exit_code == 0 and n.last_state is not None]
        if self.has_master:
            if any(n.replica_type == MASTER for n in done):
                return f"PyTorchJob {self.name} is successfully completed."
            return None
        elastic = self.job["spec"].get("elasticPolicy") is not None
        if done and (len(done) == len(self.nodes) or elastic):
            return f"PyTorchJob {self.namespace}/{self.name} successfully completed."
        return None

    def kill(self, pod: str) -> list[int]:
        """SIGKILL pod ``pod``'s whole process tree at once: torchrun's agent and its workers,
        which run in sessions of their own (so a process group or session kill misses them),
        gathered before any is killed (a dead agent's workers are reparented)."""
        node = next(n for n in self.nodes if n.pod == pod)
        if node.process is None or node.poll() is not None:
            raise RuntimeError(f"pod {pod}'s process is not running")
        tree = [node.process.pid, *descendants(node.process.pid)]
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return tree

    def _past_backoff_limit(self) -> bool:
        limit = self.job["spec"]["runPolicy"].get("backoffLimit")
        if limit is None:
            return False
        restarts = sum(node.restarts for node in self.nodes)
        return restarts > 0 if limit == 0 else restarts >= limit

    def _fail(self, message: str, delete_all: bool = False) -> None:
        self._set_condition("Failed", message)
        if delete_all:
            self._delete_nodes(self.nodes)
        else:
            self._clean_up()

    def _clean_up(self) -> None:
        """cleanPodPolicy on a finished job."""
        policy = self.job["spec"]["runPolicy"]["cleanPodPolicy"]
        if policy == "None":
            return
        doomed = [n for n in self.nodes if policy == "All" or n.exit_code is None]
        self._delete_nodes(doomed)

    def _delete_nodes(self, nodes: list[_Node]) -> None:
        if nodes:
            stop_marked_processes(RUN_MARKER, self.marker, STOP_GRACE_SECONDS)
        for node in nodes:
            if node.process is not None:
                node.process.wait()
            for plural in ("pods", "services"):
                try:
                    self.emulator.delete(plural, node.pod, self.namespace)
                except Exception:  # already garbage-collected with the job
                    pass

    def _copy_logs(self, final: bool, only: _Node | None = None) -> None:
        for node in [only] if only is not None else self.nodes:
            lines = node.tail.read_lines(final=final)
            if lines:
                self.emulator.append_log(node.pod, lines, self.namespace, container=CONTAINER)

    def _set_container(
        self,
        node: _Node,
        state: dict[str, Any],
        phase: str,
        last_state: dict[str, Any] | None = None,
    ) -> None:
        status = objects.container_status(
            node.image, state, restart_count=node.restarts, last_state=last_state, name=CONTAINER
        )
        self.emulator.set_pod_status(node.pod, objects.pod_status(phase, [status]), self.namespace)

    def suspend(self) -> None:
        """``runPolicy.suspend``: every pod and Service goes; Suspended True, Running False."""
        self.stop(delete=True)
        if any(c["type"] == "Running" for c in self.conditions):
            self._set_condition("Running", f"PyTorchJob {self.name} is suspended.", "False")
        self._set_condition("Suspended", f"PyTorchJob {self.name} is suspended.")

    def stop(self, delete: bool = False) -> None:
        """The job was deleted (the emulator collects its pods) or suspended (``delete``)."""
        self.stopped.set()
        self.join(timeout=30)
        stop_marked_processes(RUN_MARKER, self.marker, STOP_GRACE_SECONDS)
        if delete:
            self._delete_nodes(self.nodes)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FakeTrainingOperator(FakeController):
    """Plays the Training Operator for PyTorchJobs on ``emulator`` until ``stop()``; use as a
    context manager. ``install`` serves the release-1.9 CRD first."""

    def __init__(
        self, emulator: KubeEmulator, root: str | Path, webhook: bool = True, install: bool = True
    ) -> None:
        self.emulator = emulator
        self.root = Path(root)
        self.webhook = webhook
        self.install = install
        self.errors: list[Exception] = []
        self.runs: dict[tuple[str, str], _Run] = {}
        self._events: queue.Queue = queue.Queue()
        self._unsubscribe = None
        self._thread = threading.Thread(target=self._dispatch, name="fake-operator", daemon=True)

    def start(self) -> FakeTrainingOperator:
        if self.install and self.emulator.get("customresourcedefinitions", _crd_name()) is None:
            self.emulator.install_training_operator()
        self._unsubscribe = self.emulator.on_event(
            lambda plural, event: self._events.put(event) if plural == PYTORCHJOBS else None
        )
        if self.webhook:
            self.emulator.call(self.emulator.api.admission.append, self._validate)
        self._thread.start()
        return self

    def _dispatch(self) -> None:
        while (event := self._events.get()) is not None:
            obj = event["object"]
            meta = obj["metadata"]
            key = (meta.get("namespace", ""), meta["name"])
            run = self.runs.get(key)
            suspended = bool(((obj.get("spec") or {}).get("runPolicy") or {}).get("suspend"))
            if event["type"] == "DELETED":
                if run is not None and run.obj["metadata"]["uid"] == meta["uid"]:
                    self.runs.pop(key).stop()
                continue
            if suspended:
                if run is not None:
                    self.runs.pop(key).suspend()
                continue
            if event["type"] == "ADDED" and run is None:
                self.runs[key] = _Run(self, obj)
                self.runs[key].start()

    def kill_node(self, name: str, pod: str, namespace: str = "default") -> list[int]:
        """SIGKILL the whole process tree of pod ``pod`` of PyTorchJob ``name``, as a machine
        lost at once; returns the pids killed."""
        return self.runs[(namespace, name)].kill(pod)

    def _validate(self, resource: Any, job: dict[str, Any], old: dict[str, Any] | None) -> None:
        """The operator's validating webhook (on the emulator's loop), create and update."""
        if resource.plural != PYTORCHJOBS:
            return
        errors = webhook_errors(job)
        if errors:
            shown = errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]"
            raise webhook_denial(WEBHOOK, shown)


def _crd_name() -> str:
    return _crd()["metadata"]["name"]
