"""Render a TrainJobSpec as a Kubeflow Trainer ``TrainJob`` (trainer.kubeflow.org/v1alpha1).

Built with the ``kubeflow_trainer_api`` models, so a field the v2.3 API does not have fails
here and not on the cluster. Pod-level settings (volumes and their mounts in the ``node``
container, node selector, tolerations, service account, pod labels, the Istio opt-out
annotation) go through ``spec.runtimePatches`` on Trainer v2.2+ and
``spec.podTemplateOverrides`` on v2.1; the v2.3 models lack the latter, so the v2.1 entry is a
plain dict holding the same patch. The Trainer merges either into the runtime's pod template,
metadata included (trainer v2.3.0 ``pkg/runtime/core/trainingruntime.go``
``mergeRuntimePatches``, a strategic merge of the JobSet spec; v2.1.0
``mergePodTemplateOverrides``, labels and annotations), so the node pods of any runtime,
a user's own too, carry our annotation.

Under ``launcher`` mpi the TrainJob is for an MPI runtime (ours: ``kubetrain-deepspeed-mpi``):
its trainer command is mpirun started in the ``launcher`` pod (``mpirun_command``), and the pod
settings go to the ``launcher`` and the ``node`` jobs alike, since both run ranks
(runLauncherAsNode) and read the same volumes. The trainer's ``resourcesPerNode`` and ``env``
need nothing more: the Trainer gives them to both jobs itself (trainer v2.3.0
``pkg/runtime/core/trainingruntime.go`` newRuntimeInfo ``isMPILauncherAsNode``,
``pkg/runtime/framework/plugins/jobset/builder.go`` Trainer).
"""

from __future__ import annotations

from typing import Any

from kubeflow_trainer_api.models.io_k8s_api_core_v1_env_var import IoK8sApiCoreV1EnvVar
from kubeflow_trainer_api.models.io_k8s_api_core_v1_local_object_reference import (
    IoK8sApiCoreV1LocalObjectReference,
)
from kubeflow_trainer_api.models.io_k8s_api_core_v1_resource_requirements import (
    IoK8sApiCoreV1ResourceRequirements,
)
from kubeflow_trainer_api.models.io_k8s_api_core_v1_toleration import IoK8sApiCoreV1Toleration
from kubeflow_trainer_api.models.io_k8s_api_core_v1_volume import IoK8sApiCoreV1Volume
from kubeflow_trainer_api.models.io_k8s_api_core_v1_volume_mount import IoK8sApiCoreV1VolumeMount
from kubeflow_trainer_api.models.io_k8s_apimachinery_pkg_apis_meta_v1_object_meta import (
    IoK8sApimachineryPkgApisMetaV1ObjectMeta,
)
from kubeflow_trainer_api.models.trainer_v1alpha1_container_patch import (
    TrainerV1alpha1ContainerPatch,
)
from kubeflow_trainer_api.models.trainer_v1alpha1_dataset_initializer import (
    TrainerV1alpha1DatasetInitializer,
)
from kubeflow_trainer_api.models.trainer_v1alpha1_initializer import TrainerV1alpha1Initializer
from kubeflow_trainer_api.models.trainer_v1alpha1_job_set_spec_patch import (
    TrainerV1alpha1JobSetSpecPatch,
)
from kubeflow_trainer_api.models.trainer_v1alpha1_job_set_template_patch import (
    TrainerV1alpha1JobSetTemplatePatch,
)
from kubeflow_trainer_api.models.trainer_v1alpha1_job_spec_patch import TrainerV1alpha1JobSpecPatch
from kubeflow_trainer_api.models.trainer_v1alpha1_job_template_patch import (
    TrainerV1alpha1JobTemplatePatch,
)
from kubeflow_trainer_api.models.trainer_v1alpha1_model_initializer import (
    TrainerV1alpha1ModelInitializer,
)
from kubeflow_trainer_api.models.trainer_v1alpha1_pod_spec_patch import TrainerV1alpha1PodSpecPatch
from kubeflow_trainer_api.models.trainer_v1alpha1_pod_template_patch import (
    TrainerV1alpha1PodTemplatePatch,
)
from kubeflow_trainer_api.models.trainer_v1alpha1_replicated_job_patch import (
    TrainerV1alpha1ReplicatedJobPatch,
)
from kubeflow_trainer_api.models.trainer_v1alpha1_runtime_patch import TrainerV1alpha1RuntimePatch
from kubeflow_trainer_api.models.trainer_v1alpha1_runtime_ref import TrainerV1alpha1RuntimeRef
from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob
from kubeflow_trainer_api.models.trainer_v1alpha1_train_job_spec import (
    TrainerV1alpha1TrainJobSpec,
)
from kubeflow_trainer_api.models.trainer_v1alpha1_trainer import TrainerV1alpha1Trainer
from kubeflow_trainer_api.models.trainer_v1alpha1_training_runtime_spec_patch import (
    TrainerV1alpha1TrainingRuntimeSpecPatch,
)

from kubetrain import rules
from kubetrain.errors import InvalidInput
from kubetrain.images import TRAINER_IMAGE
from kubetrain.jobspec import NODE_JOB, Initializer, TrainJobSpec
from kubetrain.names import JOB_NAME_ENV
from kubetrain.render import pod
from kubetrain.render.metadata import (
    object_labels,
    object_metadata,
    pod_labels,
    spec_annotations,
    validate_namespace,
)
from kubetrain.render.script import (
    IN_FOLDER,
    command_with_mounted_script,
    node_program,
    script_sha256,
)

API_VERSION = "trainer.kubeflow.org/v1alpha1"
KIND = "TrainJob"
RUNTIME_API_GROUP = "trainer.kubeflow.org"
#: The key of our entry in spec.runtimePatches (a list map keyed by manager).
PATCH_MANAGER = "kubetrain.io/manager"
#: TrainJob forms we render; "auto" must be resolved (from the cluster's CRD) before rendering.
RENDERED_VERSIONS = ("2.1", "2.2", "2.3")
LATEST_VERSION = "2.3"
#: Trainer versions whose TrainJob has podTemplateOverrides instead of runtimePatches.
POD_TEMPLATE_OVERRIDE_VERSIONS = ("2.1",)
#: Trainer versions that replace the runtime's node resources with resourcesPerNode instead of
#: merging them (trainer v2.2.0 ``pkg/runtime/core/trainingruntime.go``: ``Resources =
#: *trainJob.Spec.Trainer.ResourcesPerNode.DeepCopy()``, and its
#: ``pkg/runtime/framework/plugins/jobset/builder.go`` Trainer: ``WithResources``; v2.3.0
#: merges them with ``MergeResourceRequirements``, a strategic merge of the two maps).
REPLACING_RESOURCES_VERSIONS = ("2.1", "2.2")
#: The MPI runtime's job that runs mpirun, and where its hostfile is mounted (trainer v2.3.0
#: ``pkg/constants/constants.go`` Launcher, MPIHostfileDir + MPIHostfileName).
LAUNCHER_JOB = "launcher"
MPI_HOSTFILE = "/etc/mpi/hostfile"
#: The OpenMPI env the Trainer's MPI plugin sets in the launcher, which its webhook refuses in
#: a TrainJob's env (trainer v2.3.0 ``pkg/constants/constants.go`` ~306 MPIReservedEnvNames,
#: checked by ``pkg/runtime/framework/plugins/mpi/mpi.go`` Validate ~96: "must not have
#: reserved envs"). Other OMPI_MCA_* (e.g. btl_tcp_if_include) are the user's to tune.
MPI_RESERVED_ENV_NAMES = (
    "OMPI_MCA_orte_default_hostfile",
    "OMPI_MCA_plm_rsh_args",
    "OMPI_MCA_orte_keep_fqdn_hostnames",
    "OMPI_MCA_orte_set_default_slots",
)


def render_trainjob(
    spec: TrainJobSpec,
    *,
    namespace: str = "default",
    trainer_version: str = LATEST_VERSION,
    owner: dict[str, Any] | None = None,
    runtime_resources: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The TrainJob for ``spec`` as a plain dict (camelCase keys, no None values).

    ``runtime_resources`` are the runtime's for its node container: Trainer before 2.3
    replaces them with ``resourcesPerNode``, so for those versions ours are rendered merged
    into them (``--cpu`` on a GPU runtime keeps its GPU)."""
    spec = spec.validate()
    validate_namespace(namespace)
    mpi = spec.launcher == "mpi"
    if mpi:
        _refuse_mpi_reserved_env(spec)
    launcher = [(LAUNCHER_JOB, 1, 1)] if mpi else []
    rules.jobset_pod_names(spec.name, [*spec.replicated_jobs(), *launcher], "name")
    legacy = _check_version(trainer_version, spec)
    pod_patch = _pod_template_patch(spec)
    patched_jobs = [NODE_JOB, LAUNCHER_JOB] if mpi else [NODE_JOB]
    metadata = object_metadata(
        spec.name,
        namespace,
        object_labels(spec),
        owner,
        spec_annotations(spec, script_sha256(spec)),
    )
    job = TrainerV1alpha1TrainJob(
        api_version=API_VERSION,
        kind=KIND,
        metadata=IoK8sApimachineryPkgApisMetaV1ObjectMeta.from_dict(metadata),
        spec=TrainerV1alpha1TrainJobSpec(
            runtime_ref=TrainerV1alpha1RuntimeRef(
                name=spec.runtime.name, kind=spec.runtime.kind, api_group=RUNTIME_API_GROUP
            ),
            trainer=_trainer(spec, trainer_version, runtime_resources or {}),
            initializer=_initializer(spec),
            suspend=True if spec.suspend else None,
            active_deadline_seconds=spec.active_deadline_seconds,
            runtime_patches=None if legacy else [_runtime_patch(pod_patch, patched_jobs)],
        ),
    )
    rendered = job.to_dict()
    if legacy:
        rendered["spec"]["podTemplateOverrides"] = [
            {"targetJobs": [{"name": name} for name in patched_jobs], **pod_patch.to_dict()}
        ]
    return rendered


def _refuse_mpi_reserved_env(spec: TrainJobSpec) -> None:
    """The OpenMPI env the MPI plugin owns, refused as its webhook refuses it: all of them,
    sorted, in one line."""
    reserved = sorted(name for name in spec.env if name in MPI_RESERVED_ENV_NAMES)
    if reserved:
        raise InvalidInput(
            "env",
            f"{', '.join(reserved)} {'is' if len(reserved) == 1 else 'are'} set by the "
            "Trainer's MPI policy itself",
            "drop it: the hostfile, its slots and ssh's options come from the runtime and "
            "--nodes/--procs-per-node",
        )


def mpirun_command(spec: TrainJobSpec) -> list[str]:
    """mpirun as the launcher runs it, before one rank's program.

    ``-np`` is every slot of the hostfile the MPI plugin writes: numNodes pods (the launcher
    is one of them under runLauncherAsNode, and ``max(numNodes-1, 1)`` node pods the rest:
    trainer v2.3.0 ``pkg/runtime/framework/plugins/mpi/mpi.go`` EnforceMLPolicy,
    buildHostFileConfigMap ``%s slots=%d``) of numProcPerNode ranks; with one node the spare
    node pod gets none. Ranks are unbound and placed slot by slot, as the MPI operator's
    examples run them (kubeflow/mpi-operator v0.8.0 ``examples/v2beta1/tensorflow-benchmarks/
    tensorflow-benchmarks.yaml``: ``-bind-to none -map-by slot ... -x PATH``): OpenMPI
    otherwise binds each rank of a small job to one core, where all its torch threads run.
    ``-x`` forwards env to the ranks of the other pods, which mpirun starts over ssh, in a
    session with none of the container's env: PATH, unbuffered output, the job's name, the
    user's env and the storage Secret's keys (by name: their values never enter the TrainJob).
    ``--wdir``: where a user's program runs."""
    forwarded = ["PATH", "PYTHONUNBUFFERED=1"]
    if JOB_NAME_ENV not in spec.env:
        forwarded.append(f"{JOB_NAME_ENV}={spec.name}")
    forwarded += [*spec.env, *(entry["name"] for entry in pod.storage_secret_env(spec))]
    ranks = str(spec.num_nodes * spec.procs_per_node)
    command = ["mpirun", "--hostfile", MPI_HOSTFILE, "-np", ranks, "--bind-to", "none"]
    command += ["--map-by", "slot", *(part for name in forwarded for part in ("-x", name))]
    return command + (["--wdir", spec.working_dir] if spec.working_dir else [])


def trainer_program(spec: TrainJobSpec) -> tuple[list[str], list[str]]:
    """``(command, args)`` of the TrainJob's trainer. Under ``launcher`` mpi: mpirun, then one
    rank's program; a ``working_dir`` is made and locked by the launcher's program around
    mpirun (``script.IN_FOLDER``), whose lock mpirun then holds for the job's life."""
    if spec.launcher != "mpi":
        return node_program(spec)
    command, args = command_with_mounted_script(spec)
    launcher = [*mpirun_command(spec), *command]
    if not spec.working_dir:
        return launcher, args
    return list(IN_FOLDER), [spec.working_dir, *launcher, *args]


def _check_version(trainer_version: str, spec: TrainJobSpec) -> bool:
    """True when the TrainJob must take the v2.1 form."""
    if trainer_version not in RENDERED_VERSIONS:
        raise InvalidInput(
            "trainer_version",
            f"{trainer_version!r} cannot be rendered",
            f"use one of {', '.join(RENDERED_VERSIONS)} (resolve auto from the cluster's "
            "TrainJob CRD first)",
        )
    legacy = trainer_version in POD_TEMPLATE_OVERRIDE_VERSIONS
    if legacy and spec.active_deadline_seconds is not None:
        raise InvalidInput(
            "active_deadline_seconds",
            f"TrainJob.spec.activeDeadlineSeconds needs Trainer v2.2 or newer, not "
            f"{trainer_version}",
            "drop --active-deadline-seconds, or upgrade Kubeflow Trainer to v2.2+",
        )
    return legacy


def _trainer(
    spec: TrainJobSpec, trainer_version: str, runtime_resources: dict[str, Any]
) -> TrainerV1alpha1Trainer:
    command, args = trainer_program(spec)
    resources = pod.resource_requirements(spec.resources_per_node)
    if resources and trainer_version in REPLACING_RESOURCES_VERSIONS:
        resources = merged_resources(runtime_resources, resources)
    return TrainerV1alpha1Trainer(
        image=_trainer_image(spec),
        command=command,
        # Always a list, empty too: the JobSet builder keeps the runtime's args when the
        # TrainJob's are nil (trainer v2.3.0 pkg/runtime/framework/plugins/jobset/builder.go
        # Trainer: `if args := jobTrainer.Args; args != nil`), so `-- hostname` would run
        # `hostname <the runtime's args>`.
        args=list(args),
        env=[
            IoK8sApiCoreV1EnvVar.from_dict(e)
            for e in [*pod.env_list(spec.env), *pod.storage_secret_env(spec)]
        ]
        or None,
        num_nodes=spec.num_nodes,
        num_proc_per_node=spec.procs_per_node,
        resources_per_node=IoK8sApiCoreV1ResourceRequirements.from_dict(resources)
        if resources
        else None,
    )


def _trainer_image(spec: TrainJobSpec) -> str | None:
    """The spec's image; none under ``launcher`` mpi when it is only the default (torchrun's)
    image: the Trainer gives a TrainJob's image to the launcher alone (trainer v2.3.0
    ``pkg/runtime/framework/plugins/jobset/builder.go`` Trainer: the trainer-ancestor job), and
    the node pods, which run ranks too, keep the runtime's; without one both run the runtime's
    (``images.DEEPSPEED_IMAGE`` in ours)."""
    if spec.launcher == "mpi" and spec.image == TRAINER_IMAGE:
        return None
    return spec.image


def merged_resources(base: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """``ours`` over ``base`` key by key in requests and in limits, as Trainer v2.3's
    ``MergeResourceRequirements`` (trainer v2.3.0 ``pkg/util/trainingruntime/
    trainingruntime.go``, a strategic merge patch) does on the cluster."""
    merged = {
        key: {**(base.get(key) or {}), **(ours.get(key) or {})} for key in ("requests", "limits")
    }
    return {key: value for key, value in merged.items() if value}


def _initializer(spec: TrainJobSpec) -> TrainerV1alpha1Initializer | None:
    """Storage URIs for the runtime's initializers; credentials only as a Secret reference."""
    if spec.dataset_initializer is None and spec.model_initializer is None:
        return None

    def source(init: Initializer | None, kind: type) -> Any:
        if init is None:
            return None
        secret = (
            IoK8sApiCoreV1LocalObjectReference(name=init.secret_name) if init.secret_name else None
        )
        return kind(storage_uri=init.storage_uri, secret_ref=secret)

    return TrainerV1alpha1Initializer(
        dataset=source(spec.dataset_initializer, TrainerV1alpha1DatasetInitializer),
        model=source(spec.model_initializer, TrainerV1alpha1ModelInitializer),
    )


def _pod_template_patch(spec: TrainJobSpec) -> TrainerV1alpha1PodTemplatePatch:
    """The pod settings the TrainJob's own fields cannot carry, for the ``node`` pods (and an
    MPI runtime's ``launcher`` pod, which runs ranks too).

    Never empty: the pods always get our labels, so the backend finds them (and rank 0) by
    ``kubetrain.io/job-name`` on either backend, and no Istio sidecar (``pod.pod_annotations``).
    """
    mounts = pod.volume_mounts(spec)
    pod_spec = TrainerV1alpha1PodSpecPatch(
        service_account_name=spec.service_account or None,
        node_selector=dict(spec.node_selector) or None,
        tolerations=[IoK8sApiCoreV1Toleration.from_dict(t) for t in pod.tolerations(spec)] or None,
        volumes=[IoK8sApiCoreV1Volume.from_dict(v) for v in pod.volumes(spec)] or None,
        containers=[
            TrainerV1alpha1ContainerPatch(
                name=pod.NODE,
                volume_mounts=[IoK8sApiCoreV1VolumeMount.from_dict(m) for m in mounts],
            )
        ]
        if mounts
        else None,
    )
    return TrainerV1alpha1PodTemplatePatch(
        metadata=IoK8sApimachineryPkgApisMetaV1ObjectMeta(
            labels=pod_labels(spec), annotations=pod.pod_annotations()
        ),
        spec=pod_spec if pod_spec.to_dict() else None,
    )


def _runtime_patch(
    pod_patch: TrainerV1alpha1PodTemplatePatch, jobs: list[str]
) -> TrainerV1alpha1RuntimePatch:
    """Our entry in runtimePatches: ``pod_patch`` applied to each of the runtime's ``jobs``."""
    return TrainerV1alpha1RuntimePatch(
        manager=PATCH_MANAGER,
        training_runtime_spec=TrainerV1alpha1TrainingRuntimeSpecPatch(
            template=TrainerV1alpha1JobSetTemplatePatch(
                spec=TrainerV1alpha1JobSetSpecPatch(
                    replicated_jobs=[
                        TrainerV1alpha1ReplicatedJobPatch(
                            name=name,
                            template=TrainerV1alpha1JobTemplatePatch(
                                spec=TrainerV1alpha1JobSpecPatch(template=pod_patch)
                            ),
                        )
                        for name in jobs
                    ]
                )
            )
        ),
    )
