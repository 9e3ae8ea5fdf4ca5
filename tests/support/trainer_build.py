"""How Kubeflow Trainer 2.3 and JobSet 0.12 turn a TrainJob into node pods, for ``FakeTrainer``.

Each rule is from the upstream source it names (kubeflow/trainer tag v2.3.0,
kubernetes-sigs/jobset tag v0.12.0):

* the runtime is the ``ClusterTrainingRuntime``/``TrainingRuntime`` named by ``spec.runtimeRef``;
  a missing one is an error (``pkg/runtime/core/clustertrainingruntime.go``: "not found
  ClusterTrainingRuntime specified in TrainJob"; ``trainingruntime.go``: "TrainingRuntime
  specified in TrainJob is not found");
* ``spec.runtimePatches[].trainingRuntimeSpec.template.spec`` are strategic-merge patches of the
  runtime's JobSet spec, in order (``trainingruntime.go`` ``mergeRuntimePatches``; the patch
  strategies are the Go struct tags: ``replicatedJobs`` by name (jobset
  ``api/jobset/v1alpha2/jobset_types.go``), and the core/v1 PodSpec's: containers, volumes,
  env, imagePullSecrets by name, volumeMounts by mountPath, ports by containerPort; any other
  list, ``tolerations`` and ``args`` included, is replaced);
* the replicated job labelled ``trainer.kubeflow.org/trainjob-ancestor-step: trainer`` runs the
  trainer: ``mlPolicy.numNodes`` pods, or the TrainJob's ``numNodes``; in its ``node`` container
  the TrainJob's image, command and args replace the runtime's only when set — nil keeps the
  runtime's, an empty list replaces them (``pkg/runtime/framework/plugins/jobset/builder.go``
  ``Trainer``); its env is upserted by name; ``resourcesPerNode`` is merged into the runtime's
  resources (``trainingruntime.go`` ``newRuntimeInfo``, ``MergeResourceRequirements``);
* the torch plugin upserts PET_NNODES, PET_NPROC_PER_NODE (the TrainJob's ``numProcPerNode``,
  else "auto", which without GPUs becomes the CPU request, else limit, at least 1),
  PET_NODE_RANK (the completion index), PET_MASTER_ADDR ``<job>-node-0-0.<job>`` and
  PET_MASTER_PORT 29500 (``pkg/runtime/framework/plugins/torch/torch.go`` ``EnforceMLPolicy``,
  ``pkg/constants/constants.go``);
* JobSet names jobs ``<jobset>-<replicatedJob>-<jobIndex>`` and pods
  ``<job>-<podIndex>-<5 random>``, and its webhook refuses a JobSet whose longest job or pod
  name would not be a DNS-1035 label of at most 63 characters (jobset
  ``pkg/webhooks/jobset_webhook.go`` ``ValidateCreate``; the pod check adds ``-abcde``);
* JobSet's defaulting webhook gives every replicated job's pod template ``restartPolicy:
  OnFailure`` when it sets none (jobset ``pkg/webhooks/jobset_webhook.go`` ``Default``, ~124),
  and the Job's ``backoffLimit`` is 6 when the runtime sets none (kubernetes
  ``pkg/apis/batch/v1/defaults.go`` ``SetDefaults_Job``); the JobSet's ``failurePolicy`` is the
  runtime's (a TrainJob cannot patch it);
* under ``mlPolicy.mpi`` (``pkg/runtime/framework/plugins/mpi/mpi.go``; ``MpiParts``): the
  trainer-ancestor job is the launcher, with the runtime's ``mlPolicy.numNodes`` pods (1;
  ``trainingruntime.go`` ``newRuntimeInfo``), the ``node`` job gets ``numNodes - 1`` (at least
  1) pods under ``runLauncherAsNode``, else ``numNodes`` (``EnforceMLPolicy``), and its ``node``
  container the TrainJob's env too under ``runLauncherAsNode`` (``builder.go`` ``Trainer``
  ~142); see ``MpiParts`` for the rest;
* a build failure is no condition: the controller emits a Warning event
  ``TrainJobResourcesCreationFailed`` "TrainJob resources reconciliation failed: <error>",
  truncated to 950 characters (``pkg/controller/trainjob_controller.go`` ``Reconcile``).
"""

from __future__ import annotations

import base64
import copy
import json
import math
import re
from dataclasses import dataclass
from typing import Any

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_ANCESTOR = "trainer"
NODE = "node"
MASTER_PORT = 29500
#: What the Job controller and JobSet's webhook default (module docstring).
DEFAULT_RESTART_POLICY = "OnFailure"
DEFAULT_BACKOFF_LIMIT = 6
JOBSET_WEBHOOK = "vjobset.kb.io"
CREATION_FAILED = "TrainJobResourcesCreationFailed"
#: list field -> the key its items are merged by (patchMergeKey); other lists are replaced.
MERGE_KEYS = {
    "replicatedJobs": "name",
    "dependsOn": "name",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "hostAliases": "ip",
}


#: The MPI plugin's names (kubeflow/trainer v2.3.0 pkg/constants/constants.go ~90-187).
LAUNCHER = "launcher"
SSH_AUTH_SUFFIX, SSH_AUTH_VOLUME = "-mpi-ssh-auth", "mpi-ssh-auth"
HOSTFILE_SUFFIX, HOSTFILE_VOLUME = "-mpi-hostfile", "mpi-hostfile"
HOSTFILE_DIR, HOSTFILE_NAME = "/etc/mpi", "hostfile"
SSH_PUBLIC_KEY = "ssh-publickey"
OPENMPI_ENV_HOSTFILE = "OMPI_MCA_orte_default_hostfile"
OPENMPI_ENV_KEEP_FQDN = "OMPI_MCA_orte_keep_fqdn_hostnames"
OPENMPI_ENV_DEFAULT_SLOTS = "OMPI_MCA_orte_set_default_slots"
OPENMPI_ENV_RSH_ARGS = "OMPI_MCA_plm_rsh_args"
#: ``MPIReservedEnvNames``: what a TrainJob may not set on an MPI runtime (``Validate``).
MPI_RESERVED_ENV = frozenset(
    {OPENMPI_ENV_HOSTFILE, OPENMPI_ENV_KEEP_FQDN, OPENMPI_ENV_DEFAULT_SLOTS, OPENMPI_ENV_RSH_ARGS}
)


class BuildError(Exception):
    """The Trainer could not build the TrainJob's objects: its message is the event's."""


@dataclass
class MpiParts:
    """What the MPI plugin adds to a TrainJob's JobSet (``mpi.go``): the ``node`` job's pods
    (``node_count`` of ``node_pod_spec``, sshd in the upstream runtime), the hostfile
    ``<endpoint> slots=<numProcPerNode>`` lines of the launcher (under ``runLauncherAsNode``)
    and node pods in the runtime's replicatedJobs order (``buildHostFileConfigMap``,
    ``isNode``; endpoints ``<job>-<rjob>-0-<i>.<subdomain>``: ``plugins/jobset/jobset.go``
    ``IdentifyPodNetwork``), its ConfigMap, and the ssh-auth Secret (``buildSSHAuthSecret``)."""

    node_pod_spec: dict[str, Any]
    node_pod_labels: dict[str, str]
    node_count: int
    hosts: list[str]
    slots: int
    secret: dict[str, Any]
    config_map: dict[str, Any]

    @property
    def hostfile(self) -> str:
        return self.config_map["data"][HOSTFILE_NAME]


@dataclass
class TrainerPods:
    """What the JobSet of a TrainJob runs for the trainer: ``num_nodes`` pods of ``pod_spec``
    (the merged template, PET_* env and the defaulted restartPolicy included) in replicated
    job ``replicated_job``, whose Job fails past ``backoff_limit``; ``failure_policy`` is the
    JobSet's (None: the first failed Job fails it)."""

    pod_spec: dict[str, Any]
    pod_labels: dict[str, str]
    pod_annotations: dict[str, str]
    replicated_job: str
    num_nodes: int
    procs_per_node: str
    backoff_limit: int = DEFAULT_BACKOFF_LIMIT
    failure_policy: dict[str, Any] | None = None
    #: The MPI plugin's part (None: not an MPI runtime); then the pods above are the launcher's.
    mpi: MpiParts | None = None

    @property
    def restart_policy(self) -> str:
        return self.pod_spec["restartPolicy"]

    @property
    def container(self) -> dict[str, Any]:
        return next(c for c in self.pod_spec["containers"] if c["name"] == NODE)


def strategic_merge(target: Any, patch: Any, field: str = "") -> Any:
    """``patch`` applied to ``target`` as Kubernetes' strategic merge patch does for the
    fields in MERGE_KEYS (directives such as ``$patch`` are not supported)."""
    if isinstance(patch, dict) and isinstance(target, dict):
        merged = dict(target)
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = strategic_merge(merged[key], value, key)
            else:
                merged[key] = copy.deepcopy(value)
        return merged
    merge_key = MERGE_KEYS.get(field)
    if merge_key and isinstance(patch, list) and isinstance(target, list):
        merged_list = [copy.deepcopy(item) for item in target]
        for item in patch:
            position = next(
                (
                    i
                    for i, old in enumerate(merged_list)
                    if isinstance(old, dict) and old.get(merge_key) == item.get(merge_key)
                ),
                None,
            )
            if position is None:
                merged_list.append(copy.deepcopy(item))
            else:
                merged_list[position] = strategic_merge(merged_list[position], item)
        return merged_list
    return copy.deepcopy(patch)


def upsert_env(env: list[dict[str, Any]], updates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``apply.UpsertEnvVars``: replace by name, else append."""
    result = [dict(e) for e in env]
    for update in updates:
        for i, existing in enumerate(result):
            if existing.get("name") == update.get("name"):
                result[i] = copy.deepcopy(update)
                break
        else:
            result.append(copy.deepcopy(update))
    return result


def merge_resources(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``MergeResourceRequirements``: the TrainJob's limits and requests win per resource."""
    merged = copy.deepcopy(base)
    for kind in ("limits", "requests"):
        if override.get(kind):
            merged[kind] = {**(merged.get(kind) or {}), **override[kind]}
    if override.get("claims"):
        merged["claims"] = copy.deepcopy(override["claims"])
    return merged


def cpu_count(quantity: Any) -> int:
    """A CPU quantity as ``resource.Quantity.Value()`` reads it: whole CPUs, rounded up."""
    text = str(quantity)
    value = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    return math.ceil(value)


def procs_per_node(trainer: dict[str, Any], resources: dict[str, Any]) -> str:
    """PET_NPROC_PER_NODE as the torch plugin sets it (no GPU here: "auto" means CPUs)."""
    if trainer.get("numProcPerNode") is not None:
        return str(trainer["numProcPerNode"])
    gpus = any(
        "gpu" in name for kind in ("limits", "requests") for name in resources.get(kind) or {}
    )
    if gpus:
        return "auto"
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    cpu = requests.get("cpu") if requests.get("cpu") not in (None, "0") else limits.get("cpu")
    return str(max(1, cpu_count(cpu) if cpu is not None else 0))


def runtime_missing(trainjob: dict[str, Any]) -> str:
    """The error of a TrainJob whose runtime is not there, as the runtime's NewObjects says."""
    ref = trainjob["spec"]["runtimeRef"]
    name = ref["name"]
    if ref.get("kind", "ClusterTrainingRuntime") == "TrainingRuntime":
        return (
            "TrainingRuntime specified in TrainJob is not found: trainingruntimes."
            f'trainer.kubeflow.org "{name}" not found'
        )
    return (
        "not found ClusterTrainingRuntime specified in TrainJob: clustertrainingruntimes."
        f'trainer.kubeflow.org "{name}" not found'
    )


def initializer_errors(trainjob: dict[str, Any], runtime: dict[str, Any]) -> list[str]:
    """The JobSet plugin's ``Validate`` (``plugins/jobset/jobset.go``): a TrainJob with a
    dataset or model initializer needs a runtime job and container of that name, mounting the
    ``initializer`` volume (``plugins/jobset/constants/constants.go``)."""
    initializer = (trainjob.get("spec") or {}).get("initializer") or {}
    jobs = {
        rjob["name"]: rjob
        for rjob in ((runtime["spec"].get("template") or {}).get("spec") or {}).get(
            "replicatedJobs"
        )
        or []
    }
    ref = json.dumps(trainjob["spec"]["runtimeRef"])
    errors = []
    for field, step, config in (
        ("dataset", "dataset-initializer", "datasetConfig"),
        ("model", "model-initializer", "modelConfig"),
    ):
        if field not in initializer:
            continue
        pod_spec = (
            ((jobs.get(step) or {}).get("template") or {})
            .get("spec", {})
            .get("template", {})
            .get("spec", {})
        )
        containers = [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]
        container = next((c for c in containers if c.get("name") == step), None)
        if step not in jobs:
            problem = f"must have {step} job when trainJob is configured with input {config}"
        elif container is None:
            problem = f"must have container with name - {step} in the {step} job"
        elif not any(m.get("name") == "initializer" for m in container.get("volumeMounts") or []):
            problem = (
                f"must have volumeMount with name - initializer in container {step} of the "
                f"{step} job"
            )
        else:
            continue
        errors.append(f"spec.runtimeRef: Invalid value: {ref}: {problem}")
    return errors


def event_message(error: str) -> str:
    """The Warning event's message (``trainjob_controller.go``: ``%.950v``, then `` ...``)."""
    message = f"TrainJob resources reconciliation failed: {error[:950]}"
    return f"{message} ..." if len(error) > 950 else message


def check_names(jobset: str, replicated_jobs: list[dict[str, Any]]) -> None:
    """JobSet's webhook on the generated job and pod names; raises BuildError as the Trainer
    reports the denied apply."""
    errors = []
    for index, rjob in enumerate(replicated_jobs):
        replicas = rjob.get("replicas", 1)
        longest_job = f"{jobset}-{rjob['name']}-{replicas - 1}"
        if len(longest_job) > 63:
            errors.append(
                f'spec.replicatedJobs[{index}].name: Invalid value: "{longest_job}": JobSet name '
                "is too long, job names generated for this JobSet will exceed 63 characters"
            )
        completions = (rjob.get("template") or {}).get("spec", {}).get("completions") or 1
        longest_pod = f"{longest_job}-{completions - 1}-abcde"
        if len(longest_pod) > 63:
            errors.append(
                f'spec.replicatedJobs[{index}].name: Invalid value: "{longest_job}": JobSet name '
                "is too long, pod names generated for this JobSet will exceed 63 characters"
            )
    if errors:
        raise BuildError(
            f'admission webhook "{JOBSET_WEBHOOK}" denied the request: ' + "\n".join(errors)
        )


def build(trainjob: dict[str, Any], runtime: dict[str, Any] | None) -> TrainerPods:
    """The trainer's pods for ``trainjob`` on ``runtime`` (None: not found); BuildError if the
    Trainer or JobSet would refuse to create them."""
    if runtime is None:
        raise BuildError(runtime_missing(trainjob))
    spec = trainjob.get("spec") or {}
    trainer = spec.get("trainer") or {}
    jobset = copy.deepcopy((runtime["spec"].get("template") or {}).get("spec") or {})
    order = [rjob["name"] for rjob in jobset.get("replicatedJobs") or []]
    for patch in spec.get("runtimePatches") or []:
        patched = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec")
        if patched is not None:
            jobset = strategic_merge(jobset, patched)
    jobset["replicatedJobs"] = sorted(
        jobset.get("replicatedJobs") or [],
        key=lambda rjob: order.index(rjob["name"]) if rjob["name"] in order else len(order),
    )
    ml_policy = runtime["spec"].get("mlPolicy") or {}
    num_nodes = trainer.get("numNodes", ml_policy.get("numNodes", 1))
    mpi_policy = ml_policy.get("mpi")
    found = None
    for rjob in jobset["replicatedJobs"]:
        labels = ((rjob.get("template") or {}).get("metadata") or {}).get("labels") or {}
        job_spec = rjob.setdefault("template", {}).setdefault("spec", {})
        if labels.get(ANCESTOR_LABEL) == TRAINER_ANCESTOR:
            rjob["replicas"] = 1
            count = ml_policy.get("numNodes", 1) if mpi_policy is not None else num_nodes
            found = rjob
        elif mpi_policy is not None and rjob["name"] == NODE and "numNodes" in trainer:
            launcher_is_node = bool(mpi_policy.get("runLauncherAsNode"))
            count = max(num_nodes - 1, 1) if launcher_is_node else num_nodes
        else:
            count = job_spec.get("parallelism", 1)
        job_spec["parallelism"] = job_spec["completions"] = count
    if found is None:
        raise BuildError(f"runtime {runtime['metadata']['name']} has no trainer replicated job")
    check_names(trainjob["metadata"]["name"], jobset["replicatedJobs"])
    pod_template = found["template"]["spec"].get("template") or {}
    pod_spec = copy.deepcopy(pod_template.get("spec") or {})
    pod_spec["restartPolicy"] = pod_spec.get("restartPolicy") or DEFAULT_RESTART_POLICY
    backoff_limit = found["template"]["spec"].get("backoffLimit")
    containers = pod_spec.get("containers") or []
    node = next((c for c in containers if c.get("name") == NODE), None)
    if node is None:
        raise BuildError(f"runtime {runtime['metadata']['name']} has no {NODE} container")
    for field in ("image", "command", "args"):
        if trainer.get(field) is not None:
            node[field] = copy.deepcopy(trainer[field])
    node["env"] = upsert_env(node.get("env") or [], trainer.get("env") or [])
    if trainer.get("resourcesPerNode") is not None:
        node["resources"] = merge_resources(
            node.get("resources") or {}, trainer["resourcesPerNode"]
        )
    procs = procs_per_node(trainer, node.get("resources") or {})
    if "torch" in ml_policy:
        node["env"] = upsert_env(
            node["env"], pet_env(trainjob["metadata"]["name"], num_nodes, procs)
        )
    mpi = None
    if mpi_policy is not None:
        procs = str(trainer.get("numProcPerNode") or mpi_policy.get("numProcPerNode") or 1)
        mpi = mpi_parts(trainjob, jobset, mpi_policy, found, pod_spec, int(procs))
        num_nodes = found["template"]["spec"]["parallelism"]
    return TrainerPods(
        pod_spec=pod_spec,
        pod_labels=dict((pod_template.get("metadata") or {}).get("labels") or {}),
        pod_annotations=dict((pod_template.get("metadata") or {}).get("annotations") or {}),
        replicated_job=found["name"],
        num_nodes=num_nodes,
        procs_per_node=procs,
        backoff_limit=DEFAULT_BACKOFF_LIMIT if backoff_limit is None else backoff_limit,
        failure_policy=copy.deepcopy(jobset.get("failurePolicy")),
        mpi=mpi,
    )


def mpi_parts(
    trainjob: dict[str, Any],
    jobset: dict[str, Any],
    policy: dict[str, Any],
    launcher: dict[str, Any],
    launcher_pod_spec: dict[str, Any],
    slots: int,
) -> MpiParts:
    """The MPI plugin's ``EnforceMLPolicy`` on the launcher's pod spec (changed in place) and
    the node job's, and its ``Build`` (``MpiParts``). Only OpenMPI is implemented upstream
    ("MPI implementation for %v doesn't supported")."""
    if policy.get("mpiImplementation", "OpenMPI") != "OpenMPI":
        raise BuildError(f"MPI implementation for {policy['mpiImplementation']} doesn't supported")
    job = trainjob["metadata"]["name"]
    launcher_is_node = bool(policy.get("runLauncherAsNode"))
    nodes = next((r for r in jobset["replicatedJobs"] if r["name"] == NODE), None)
    node_template = (nodes or {}).get("template", {}).get("spec", {}).get("template") or {}
    node_pod_spec = copy.deepcopy(node_template.get("spec") or {})
    node_pod_spec["restartPolicy"] = node_pod_spec.get("restartPolicy") or DEFAULT_RESTART_POLICY
    if launcher_is_node:  # builder.go Trainer: the node job's node container gets the env too
        for container in node_pod_spec.get("containers") or []:
            if container.get("name") == NODE:
                container["env"] = upsert_env(
                    container.get("env") or [],
                    (trainjob["spec"].get("trainer") or {}).get("env") or [],
                )
    ssh_volume = {
        "name": SSH_AUTH_VOLUME,
        "secret": {
            "secretName": f"{job}{SSH_AUTH_SUFFIX}",
            "defaultMode": 0o400,
            "items": [
                {"key": "ssh-privatekey", "path": "id_rsa", "mode": 0o640},
                {"key": SSH_PUBLIC_KEY, "path": "id_rsa.pub", "mode": 0o644},
                {"key": SSH_PUBLIC_KEY, "path": "authorized_keys", "mode": 0o644},
            ],
        },
    }
    hostfile_volume = {
        "name": HOSTFILE_VOLUME,
        "configMap": {
            "name": f"{job}{HOSTFILE_SUFFIX}",
            "items": [{"key": HOSTFILE_NAME, "path": HOSTFILE_NAME, "mode": 0o444}],
        },
    }
    ssh_mount = {"name": SSH_AUTH_VOLUME, "mountPath": policy.get("sshAuthMountPath", "/root/.ssh")}
    for spec, is_launcher in ((launcher_pod_spec, True), (node_pod_spec, False)):
        volumes = [ssh_volume, hostfile_volume] if is_launcher else [ssh_volume]
        spec["volumes"] = strategic_merge(spec.get("volumes") or [], volumes, "volumes")
        for container in spec.get("containers") or []:
            if container.get("name") != NODE:  # the plugin changes node containers only
                continue
            mounts = [ssh_mount]
            if is_launcher:
                mounts.append({"name": HOSTFILE_VOLUME, "mountPath": HOSTFILE_DIR})
                container["env"] = upsert_env(container.get("env") or [], mpi_env(slots))
            container["volumeMounts"] = strategic_merge(
                container.get("volumeMounts") or [], mounts, "volumeMounts"
            )
    subdomain = (jobset.get("network") or {}).get("subdomain") or job
    hosts = [
        f"{job}-{rjob['name']}-0-{index}.{subdomain}"
        for rjob in jobset["replicatedJobs"]
        if rjob["name"] == NODE or (launcher_is_node and rjob is launcher)
        for index in range(rjob["template"]["spec"]["parallelism"])
    ]
    owner = {
        "apiVersion": trainjob["apiVersion"],
        "kind": "TrainJob",
        "name": job,
        "uid": trainjob["metadata"].get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }
    hostfile = "".join(f"{host} slots={slots}\n" for host in hosts)
    return MpiParts(
        node_pod_spec=node_pod_spec,
        node_pod_labels=dict((node_template.get("metadata") or {}).get("labels") or {}),
        node_count=nodes["template"]["spec"]["parallelism"] if nodes else 0,
        hosts=hosts,
        slots=slots,
        secret={
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"{job}{SSH_AUTH_SUFFIX}", "ownerReferences": [owner]},
            "type": "kubernetes.io/ssh-auth",
            "immutable": True,
            "data": ssh_key_pair(),
        },
        config_map={
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{job}{HOSTFILE_SUFFIX}", "ownerReferences": [owner]},
            "data": {HOSTFILE_NAME: hostfile},
        },
    )


def mpi_env(slots: int) -> list[dict[str, Any]]:
    """The OpenMPI variables the plugin upserts on the launcher's node container."""
    return [
        {"name": OPENMPI_ENV_HOSTFILE, "value": f"{HOSTFILE_DIR}/{HOSTFILE_NAME}"},
        {"name": OPENMPI_ENV_KEEP_FQDN, "value": "true"},
        {"name": OPENMPI_ENV_DEFAULT_SLOTS, "value": str(slots)},
        {"name": OPENMPI_ENV_RSH_ARGS, "value": "-o ConnectionAttempts=10"},
    ]


def ssh_key_pair() -> dict[str, str]:
    """The Secret's data as ``buildSSHAuthSecret`` makes it: an ECDSA P-521 key, the private
    one as an "EC PRIVATE KEY" PEM, the public one in authorized_keys form (base64, as Secret
    data is)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP521R1())
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return {
        "ssh-privatekey": base64.b64encode(private).decode(),
        SSH_PUBLIC_KEY: base64.b64encode(public + b"\n").decode(),
    }


def mpi_errors(trainjob: dict[str, Any], runtime: dict[str, Any]) -> list[str]:
    """The MPI plugin's ``Validate``: a TrainJob on an MPI runtime may not set the reserved
    OpenMPI variables, nor ask for 2+ nodes under ``runLauncherAsNode`` from a runtime without
    both a launcher and a node job."""
    policy = ((runtime.get("spec") or {}).get("mlPolicy") or {}).get("mpi")
    if policy is None:
        return []
    trainer = (trainjob.get("spec") or {}).get("trainer") or {}
    errors = []
    jobs = {
        rjob.get("name")
        for rjob in ((runtime["spec"].get("template") or {}).get("spec") or {}).get(
            "replicatedJobs"
        )
        or []
    }
    nodes = trainer.get("numNodes", 1)
    if nodes >= 2 and policy.get("runLauncherAsNode") and not {LAUNCHER, NODE} <= jobs:
        errors.append(
            f"spec.trainer.numNodes: Invalid value: {nodes}: must have 1 when MPI "
            "trainingRuntime with enabled runLauncherAsNode does not have either launcher and "
            "node"
        )
    reserved = sorted({e.get("name") for e in trainer.get("env") or []} & MPI_RESERVED_ENV)
    if reserved:
        errors.append(
            "spec.trainer.env: Invalid value: ...: must not have reserved envs, invalid envs "
            f"configured: [{' '.join(reserved)}]"
        )
    return errors


def pet_env(job: str, num_nodes: int, procs: str) -> list[dict[str, Any]]:
    """The torch plugin's PET_* variables (``torch.go``)."""
    return [
        {"name": "PET_NNODES", "value": str(num_nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": procs},
        {
            "name": "PET_NODE_RANK",
            "valueFrom": {
                "fieldRef": {
                    "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                }
            },
        },
        {"name": "PET_MASTER_ADDR", "value": f"{job}-{NODE}-0-0.{job}"},
        {"name": "PET_MASTER_PORT", "value": str(MASTER_PORT)},
    ]


def field_value(pod: dict[str, Any], path: str) -> str:
    """A downward-API ``fieldRef`` as the kubelet resolves it for ``pod``."""
    meta = pod["metadata"]
    match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": pod.get("spec", {}).get("nodeName", ""),
        "spec.serviceAccountName": pod.get("spec", {}).get("serviceAccountName", ""),
    }
    return str(simple.get(path, ""))


def expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion in command, args and env values (``$$`` escapes;
    an undefined variable stays as written)."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        value,
    )
