"""The pod-level pieces of a job (resources, volumes, mounts, tolerations) as plain
Kubernetes dicts, defined once for the TrainJob and the Indexed Job renderers."""

from __future__ import annotations

from typing import Any

from kubetrain.errors import InvalidInput
from kubetrain.jobspec import Resources, TrainJobSpec
from kubetrain.names import JOB_NAME_ENV
from kubetrain.render.script import script_volume, script_volume_mount

#: The container the Trainer injects PET_* into; its runtimes' replicated job has this name too.
NODE = "node"
GPU_RESOURCE = "nvidia.com/gpu"
#: torchrun's rendezvous port (the Trainer's PET_MASTER_PORT).
MASTER_PORT = 29500
#: Where our runtimes mount the shared PVC `kubetrain-shared` (data and checkpoints).
SHARED_MOUNT_PATH = "/mnt/shared"
DEFAULT_DATA_DIR = f"{SHARED_MOUNT_PATH}/data"
#: The user our images run as (images/*.Dockerfile: USER 10001:10001); pods say so too, so
#: the kubelet refuses to start one as root whatever image it is given.
NON_ROOT_UID = 10001
#: The pod annotation that keeps Istio from injecting its sidecar.
ISTIO_SIDECAR_INJECT = "sidecar.istio.io/inject"


def pod_annotations() -> dict[str, str]:
    """What every node pod carries, whichever backend makes it: no Istio sidecar. A Kubeflow
    profile's namespace has Istio injection on, and KFP opts every run pod out for that reason
    (kubeflow/pipelines 2.17.0 ``backend/src/apiserver/template/v2_template.go`` ~170,
    ``SetAnnotationsToAllTemplatesIfKeyNotExist(AnnotationKeyIstioSidecarInject, "false")``);
    in a node pod the sidecar breaks torchrun's rendezvous between pods and keeps a pod whose
    trainer has finished Running (kubeflow/trainer#2794, #2872). A cluster that wants the
    sidecar can still ask for it with the pod label ``sidecar.istio.io/inject=true``: Istio
    prefers the label to the annotation (istio/istio ``pkg/kube/inject/inject.go``
    ``injectRequired``)."""
    return {ISTIO_SIDECAR_INJECT: "false"}


def pod_security_context() -> dict[str, Any]:
    """Non-root, its files on shared volumes owned by our group, the runtime's seccomp
    profile (as in our runtimes, `kubetrain render runtimes`)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        "fsGroup": NON_ROOT_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    """No privilege escalation and no Linux capabilities."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def default_checkpoint_dir(job_name: str) -> str:
    """Our trainer's checkpoint folder inside the pods, on the shared volume."""
    return f"{SHARED_MOUNT_PATH}/checkpoints/{job_name}"


def resource_requirements(resources: Resources) -> dict[str, dict[str, str]]:
    """CPU and memory are requested and are also the limits: Trainer v2.3 merges these into
    the runtime's resources key by key (kubeflow/trainer v2.3.0
    pkg/util/trainingruntime/trainingruntime.go MergeResourceRequirements), so
    a request without its limit would sit under the runtime's own limit (our torch-ddp-cpu
    limits cpu, which the Kubeflow SDK requires) and make an invalid pod once it is larger.
    GPUs are limits, as the device plugin requires."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if resources.cpu:
        requests["cpu"] = resources.cpu
        limits["cpu"] = resources.cpu
    if resources.memory:
        requests["memory"] = resources.memory
        limits["memory"] = resources.memory
    if resources.gpu:
        limits[GPU_RESOURCE] = str(resources.gpu)
    return {key: value for key, value in (("requests", requests), ("limits", limits)) if value}


#: NCCL and DataLoader workers use shared memory, and a container's /dev/shm is 64Mi: GPU
#: pods get a memory-backed one, as our GPU runtimes give theirs (runtimes/torch-ddp-gpu.yaml).
SHARED_MEMORY_VOLUME = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
SHARED_MEMORY_MOUNT = {"name": "dshm", "mountPath": "/dev/shm"}


def wants_shared_memory(spec: TrainJobSpec) -> bool:
    return spec.resources_per_node.gpu > 0


def volumes(spec: TrainJobSpec, shared_memory: bool = False) -> list[dict[str, Any]]:
    """The spec's volumes; with ``shared_memory`` (a renderer with no runtime to give it),
    a GPU pod's /dev/shm too."""
    rendered = [
        {
            "name": volume.name,
            "persistentVolumeClaim": {
                "claimName": volume.claim_name,
                **({"readOnly": True} if volume.read_only else {}),
            },
        }
        for volume in spec.volumes
    ]
    if spec.script:
        rendered.append(script_volume(spec))
    if shared_memory and wants_shared_memory(spec):
        rendered.append(SHARED_MEMORY_VOLUME)
    return rendered


def refuse_initializers(spec: TrainJobSpec, kind: str) -> None:
    """Kubeflow Trainer's dataset and model initializers, which ``kind`` does not have."""
    for field_name, value in (
        ("dataset_initializer", spec.dataset_initializer),
        ("model_initializer", spec.model_initializer),
    ):
        if value is not None:
            raise InvalidInput(
                field_name,
                f"needs Kubeflow Trainer's initializers, which {kind} does not have",
                "use --backend trainer, or fetch the data onto a --volume with `kubetrain prep`",
            )


def placement_and_volumes(spec: TrainJobSpec) -> dict[str, Any]:
    """The pod spec's service account, node selector, tolerations and volumes (a GPU pod's
    /dev/shm included), those set only, for a renderer that builds the whole pod."""
    optional = (
        ("serviceAccountName", spec.service_account),
        ("nodeSelector", dict(spec.node_selector)),
        ("tolerations", tolerations(spec)),
        ("volumes", volumes(spec, shared_memory=True)),
    )
    return {key: value for key, value in optional if value}


def volume_mounts(spec: TrainJobSpec, shared_memory: bool = False) -> list[dict[str, Any]]:
    mounts = [
        {
            "name": volume.name,
            "mountPath": volume.mount_path,
            **({"readOnly": True} if volume.read_only else {}),
        }
        for volume in spec.volumes
    ]
    if spec.script:
        mounts.append(script_volume_mount())
    if shared_memory and wants_shared_memory(spec):
        mounts.append(SHARED_MEMORY_MOUNT)
    return mounts


def tolerations(spec: TrainJobSpec) -> list[dict[str, str]]:
    return [
        {
            key: value
            for key, value in (
                ("key", toleration.key),
                ("operator", toleration.operator),
                ("value", toleration.value),
                ("effect", toleration.effect),
            )
            if value
        }
        for toleration in spec.tolerations
    ]


def env_list(env: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": name, "value": value} for name, value in env.items()]


def named_env(spec: TrainJobSpec) -> list[dict[str, str]]:
    """The user's env after the job's name (``JOB_NAME_ENV``), for a renderer with no runtime
    to set it (ours set it from the JobSet's label); the user's may set it otherwise."""
    return env_list({JOB_NAME_ENV: spec.name, **spec.env})


#: What S3 clients (botocore, s3fs) read their endpoint and credentials from.
STORAGE_ENV_KEYS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
)


def storage_env_from(spec: TrainJobSpec) -> list[dict[str, Any]]:
    """``envFrom`` for the storage Secret: every key of it, by reference only."""
    return [{"secretRef": {"name": spec.storage_secret}}] if spec.storage_secret else []


def storage_secret_env(spec: TrainJobSpec) -> list[dict[str, Any]]:
    """The storage Secret's S3 keys as ``secretKeyRef`` variables (optional: a Secret may hold
    only some), for where ``envFrom`` cannot go: the TrainJob's trainer and container patches
    carry ``env`` but not ``envFrom``."""
    if not spec.storage_secret:
        return []
    return [
        {
            "name": key,
            "valueFrom": {
                "secretKeyRef": {"name": spec.storage_secret, "key": key, "optional": True}
            },
        }
        for key in STORAGE_ENV_KEYS
    ]
