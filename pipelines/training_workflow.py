"""The kubetrain training workflow for Argo Workflows, built with Hera from the steps' templates:
prep → launch → wait → collect → evaluate → promote (only when the accuracy gate passed), with
an exit handler that deletes the TrainJob when the run fails or is stopped, and with a claim per
run whatever the outcome (see ``add_tasks``).

The dataset and checkpoints live on one claim that the steps and the TrainJob's nodes mount:
either a new ReadWriteMany claim per run (``ClaimTemplate``, the Workflow's default) or an
existing one named by the ``shared_pvc`` parameter (``ExistingClaim``, the WorkflowTemplate's).
The model registry must outlive the run: with a claim per run, which Argo deletes when the run
succeeds, promote publishes on the existing claim ``registry_pvc`` (or to a URL), never on the
run's own claim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from hera.workflows import DAG, Parameter, Workflow, WorkflowTemplate
from hera.workflows.models import (
    ObjectMeta,
    PersistentVolumeClaim,
    PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource,
    PodGC,
    PodSecurityContext,
    Quantity,
    TTLStrategy,
    Volume,
    VolumeClaimGC,
    VolumeResourceRequirements,
)

from kubetrain.components._shared.argo_steps import SHARED_VOLUME, SharedVolume
from kubetrain.components.collect_checkpoint.template import collect_checkpoint_template
from kubetrain.components.dataset_prep.template import dataset_prep_template
from kubetrain.components.evaluate_model.template import evaluate_model_template
from kubetrain.components.launch_trainjob.template import launch_trainjob_template
from kubetrain.components.promote_model.promote import REGISTRY_PVC_MOUNT, check_outlives_run
from kubetrain.components.promote_model.template import promote_model_template
from kubetrain.components.wait_trainjob.template import (
    delete_trainjob_template,
    wait_trainjob_template,
)
from kubetrain.images import COMPONENT_IMAGE
from kubetrain.jobspec import DEFAULT_RUNTIME
from kubetrain.render.pod import NON_ROOT_UID
from kubetrain.rules import DEFAULT_ZERO_STAGE

WORKFLOW_NAME = "kubetrain-training"
ENTRYPOINT = "train-and-evaluate"
EXIT_HANDLER = "cleanup"
#: Finished runs are deleted after a day when they succeeded, a week when they failed.
TTL_AFTER_SUCCESS = 24 * 3600
TTL_AFTER_FAILURE = 7 * 24 * 3600
#: The existing claim the promote step of a run with its own claim publishes the registry on.
REGISTRY_VOLUME = SharedVolume(name="registry", mount_path=REGISTRY_PVC_MOUNT)
DEFAULT_REGISTRY_PVC = "kubetrain-shared"


@dataclass(frozen=True)
class ClaimTemplate:
    """A new claim per run (``volumeClaimTemplates``), named ``<workflow>-<volume>`` by Argo and
    deleted when the run succeeds. Argo cannot substitute parameters into a claim template's
    size (argo-workflows#1932), so the size is set here, when the workflow is built."""

    size: str = "10Gi"
    storage_class: str = ""
    access_mode: str = "ReadWriteMany"


@dataclass(frozen=True)
class ExistingClaim:
    """An existing ReadWriteMany claim, named by the workflow parameter ``shared_pvc``."""

    default_claim: str = "kubetrain-shared"


#: Workflow parameters: name -> (default, description). Argo passes every value as a string.
PARAMETERS: dict[str, tuple[str, str]] = {
    "dataset_source": ("sklearn:digits", "dataset to prepare (see `kubetrain prep --help`)"),
    "test_fraction": ("0.2", "share of samples held out for evaluation"),
    "validation_fraction": ("0.1", "share of training samples scored each epoch (0: none)"),
    "seed": ("0", "seed of the train/test split"),
    "backend": (
        "trainer",
        "trainer (Kubeflow Trainer TrainJob), pytorchjob (Training Operator v1 PyTorchJob), job "
        "(Indexed Job), rayjob (KubeRay RayJob) or local",
    ),
    "nodes": (
        "2",
        "training nodes (pods); MIN:MAX: an elastic job that goes on while at least MIN remain "
        "(backend pytorchjob; needs max_restarts)",
    ),
    "max_restarts": (
        "0",
        "restarts of every node after one fails; with nodes MIN:MAX torchrun's --max-restarts",
    ),
    "procs_per_node": (
        "auto",
        "processes per node; auto = one per GPU with gpu, else 1 (launcher mpi without gpu "
        "needs a number)",
    ),
    "launcher": (
        "torchrun",
        "what starts the processes: torchrun on every node, mpi (mpirun from a launcher, "
        "as Kubeflow Trainer's MPI runtime; backends trainer and local) or ray (the command "
        "as a Ray job on a Ray cluster; backends rayjob and local)",
    ),
    "strategy": ("ddp", "ddp, fsdp or deepspeed"),
    "zero_stage": (str(DEFAULT_ZERO_STAGE), "strategy deepspeed: the ZeRO stage, 1, 2 or 3"),
    "deepspeed_config": (
        "",
        "strategy deepspeed: your DeepSpeed config, its JSON text or a path in the launch "
        "step's pod (on the claim); its settings win; empty = ours",
    ),
    "model": ("mlp", "mlp, cnn or package.module:callable"),
    "epochs": ("10", "training epochs"),
    "keep_checkpoints": ("3", "epoch checkpoints our trainer keeps (the newest); 0 keeps all"),
    "lr": ("0.001", "learning rate"),
    "batch_size": ("32", "batch size per process"),
    "image": ("", "trainer image of the nodes; empty = the components image's default"),
    "runtime": (DEFAULT_RUNTIME, "ClusterTrainingRuntime the TrainJob refers to"),
    "cpu": ("", "CPU per node; empty = the runtime's"),
    "memory": ("", "memory per node; empty = the runtime's"),
    "gpu": ("0", "GPUs per node"),
    "accuracy_threshold": ("0.95", "accuracy the model must reach to be promoted"),
    "wait_timeout_seconds": ("0", "fail the wait step after this many seconds; 0 = never"),
    "stall_timeout_seconds": (
        "auto",
        "stop a running job that logs nothing for this many seconds (exit 3); 0 = never; "
        "auto = 5 times the heartbeat rank 0 states (at least 120 s), else 1800",
    ),
    "unschedulable_grace_seconds": (
        "auto",
        "fail the wait step after a node pod is unschedulable this long (waiting for capacity "
        "or a gang); auto = 300, no limit for a gang runtime; 0 or empty = no limit",
    ),
    "on_cancel": ("delete", "what stopping the run does to the TrainJob: delete or suspend"),
    "model_registry": (
        "/mnt/shared/registry",
        "registry promoted models are published in: a folder on shared_pvc, or a URL such as "
        "s3://bucket/models (read with the steps' service account's identity)",
    ),
    "export": ("none", "also publish the model for serving: none, torch-export or torchscript"),
    "state_key": (
        "",
        "the state dict that is your model in a checkpoint of nested state (e.g. app.model); "
        "empty: the one named as a model",
    ),
    "storage_secret": ("", "Secret with AWS_* keys for s3:// data, given to the TrainJob's nodes"),
    "service_account": (
        "kubetrain",
        "ServiceAccount the steps run as (kubetrain render rbac creates it)",
    ),
    "command": (
        "[]",
        'your program instead of our trainer, a JSON list, e.g. ["torchrun", "train.py"]; it '
        "runs in its checkpoint folder with KUBETRAIN_DATA_DIR/KUBETRAIN_CHECKPOINT_DIR set, and "
        "`model` names the factory evaluate rebuilds it with; [] = our trainer",
    ),
    "script": ("", "a training script the steps can read (on the claim), shipped with the job"),
}


def workflow_parameter(name: str) -> str:
    return "{{workflow.parameters." + name + "}}"


def build_training_workflow(
    kind: Literal["Workflow", "WorkflowTemplate"] = "Workflow",
    storage: ClaimTemplate | ExistingClaim | None = None,
    volume: SharedVolume = SHARED_VOLUME,
    image: str = COMPONENT_IMAGE,
) -> Workflow:
    """The training workflow as a Hera ``Workflow`` or ``WorkflowTemplate``; storage defaults
    to a claim per run for a Workflow and an existing claim for a WorkflowTemplate."""
    if storage is None:
        storage = ClaimTemplate() if kind == "Workflow" else ExistingClaim()
    parameters = dict(PARAMETERS)
    if isinstance(storage, ExistingClaim):
        parameters["shared_pvc"] = (storage.default_claim, "ReadWriteMany claim for data")
        claim = workflow_parameter("shared_pvc")
        storage_fields = {
            "volumes": [
                Volume(
                    name=volume.name,
                    persistent_volume_claim=PersistentVolumeClaimVolumeSource(claim_name=claim),
                )
            ]
        }
    else:
        claim = "{{workflow.name}}-" + volume.name
        # The registry outlives the run: on an existing claim, not on the run's own.
        parameters["model_registry"] = (
            f"{REGISTRY_VOLUME.mount_path}/registry",
            "registry promoted models are published in: a folder on registry_pvc (mounted at "
            f"{REGISTRY_VOLUME.mount_path}), or a URL such as s3://bucket/models (read with the "
            "steps' service account's identity); never on the run's own claim, deleted when "
            "the run succeeds",
        )
        parameters["registry_pvc"] = (
            DEFAULT_REGISTRY_PVC,
            "existing claim the promote step mounts for model_registry (the KFP pipeline's "
            "registry is on kubetrain-shared too); the step mounts it even for a URL registry",
        )
        storage_fields = {
            "volume_claim_templates": [claim_template(volume.name, storage)],
            "volume_claim_gc": VolumeClaimGC(strategy="OnWorkflowSuccess"),
            "volumes": [
                Volume(
                    name=REGISTRY_VOLUME.name,
                    persistent_volume_claim=PersistentVolumeClaimVolumeSource(
                        claim_name=workflow_parameter("registry_pvc")
                    ),
                )
            ],
        }
    identity = (
        {"generate_name": WORKFLOW_NAME + "-"} if kind == "Workflow" else {"name": WORKFLOW_NAME}
    )
    workflow_class = Workflow if kind == "Workflow" else WorkflowTemplate
    with workflow_class(
        **identity,
        labels={"app.kubernetes.io/part-of": "kubetrain"},
        entrypoint=ENTRYPOINT,
        on_exit=EXIT_HANDLER,
        arguments=[
            Parameter(name=name, value=default, description=description)
            for name, (default, description) in parameters.items()
        ],
        pod_gc=PodGC(strategy="OnWorkflowSuccess"),
        # Files the steps write on the shared claim belong to our group (fsGroup).
        security_context=PodSecurityContext(run_as_non_root=True, fs_group=NON_ROOT_UID),
        ttl_strategy=TTLStrategy(
            seconds_after_success=TTL_AFTER_SUCCESS, seconds_after_failure=TTL_AFTER_FAILURE
        ),
        **storage_fields,
    ) as workflow:
        add_tasks(workflow, claim, volume, image, per_run_claim=isinstance(storage, ClaimTemplate))
    for template in workflow.templates:
        if not isinstance(template, DAG):
            template.service_account_name = workflow_parameter("service_account")
    return workflow


def claim_template(name: str, storage: ClaimTemplate) -> PersistentVolumeClaim:
    return PersistentVolumeClaim(
        metadata=ObjectMeta(name=name),
        spec=PersistentVolumeClaimSpec(
            access_modes=[storage.access_mode],
            storage_class_name=storage.storage_class or None,
            resources=VolumeResourceRequirements(requests={"storage": Quantity(storage.size)}),
        ),
    )


def add_tasks(
    workflow: Workflow, claim: str, volume: SharedVolume, image: str, per_run_claim: bool
) -> None:
    """The DAG of the run and the exit handler's, inside ``workflow``'s context.

    The exit handler deletes the TrainJob (in the background) when the run did not succeed;
    with a claim per run, whatever the outcome: Argo deletes that claim once the run has
    succeeded and its exit handler has run (volumeClaimGC OnWorkflowSuccess; argo-workflows
    v3.6.9/v4.1.2 workflow/controller/operator.go deletePVCs), and the finished TrainJob's
    pods, which Argo's pod GC does not own, still mount it: the claim stays Terminating behind
    them (ARGO_REMOVE_PVC_PROTECTION_FINALIZER=false) or is pulled from under them (the
    default, which strips the kubernetes.io/pvc-protection finalizer). With an existing
    claim a succeeded run's TrainJob is kept, for its status and logs.

    For the same reason, with a claim per run, promote mounts the existing claim
    ``registry_pvc`` instead of the run's, and refuses a registry on the run's claim."""
    run = "{{workflow.name}}"
    namespace = "{{workflow.namespace}}"
    shared = volume.mount_path
    p = workflow_parameter
    with DAG(name=ENTRYPOINT):
        prep = dataset_prep_template(volume=volume, image=image)(
            name="prep",
            arguments={
                "source": p("dataset_source"),
                "output": f"{shared}/datasets/{run}",
                "test_fraction": p("test_fraction"),
                "validation_fraction": p("validation_fraction"),
                "seed": p("seed"),
            },
        )
        launch = launch_trainjob_template(volume=volume, image=image)(
            name="launch",
            arguments={
                "run_name": run,
                "data": prep.get_parameter("dataset_dir").value,
                "checkpoint_dir": f"{shared}/checkpoints/{run}",
                "shared_pvc": claim,
                "namespace": namespace,
                **{
                    name: p(name)
                    for name in (
                        "backend",
                        "nodes",
                        "max_restarts",
                        "procs_per_node",
                        "launcher",
                        "strategy",
                        "zero_stage",
                        "deepspeed_config",
                        "model",
                        "epochs",
                        "keep_checkpoints",
                        "batch_size",
                        "lr",
                        "image",
                        "runtime",
                        "cpu",
                        "memory",
                        "gpu",
                        "storage_secret",
                        "command",
                        "script",
                    )
                },  # fmt: skip
            },
        )
        wait = wait_trainjob_template(image=image)(
            name="wait",
            arguments={
                "job_name": launch.get_parameter("job_name").value,
                "backend": p("backend"),
                "namespace": namespace,
                "timeout_seconds": p("wait_timeout_seconds"),
                "stall_timeout_seconds": p("stall_timeout_seconds"),
                "unschedulable_grace_seconds": p("unschedulable_grace_seconds"),
                "on_cancel": p("on_cancel"),
            },
        )
        collect = collect_checkpoint_template(volume=volume, image=image)(
            name="collect",
            arguments={
                "checkpoint_dir": launch.get_parameter("checkpoint_dir").value,
                "output": f"{shared}/models/{run}",
                "export": p("export"),
                # the user's explicit choice: custom model code a card names is built only so
                "model_factory": p("model"),
                "state_key": p("state_key"),
                # the checkpoint must load into that model for these samples
                "data": prep.get_parameter("dataset_dir").value,
            },
        )
        evaluate = evaluate_model_template(volume=volume, image=image)(
            name="evaluate",
            arguments=[
                collect.get_artifact("model"),
                Parameter(name="data", value=prep.get_parameter("dataset_dir").value),
                Parameter(name="threshold", value=p("accuracy_threshold")),
                Parameter(name="model_factory", value=p("model")),
            ],
        )
        promote = promote_model_template(
            volume=REGISTRY_VOLUME if per_run_claim else volume, image=image
        )(
            name="promote",
            when=f"{evaluate.get_parameter('passed').value} == true",
            arguments=[
                collect.get_artifact("model"),
                Parameter(name="registry", value=p("model_registry")),
                Parameter(name="version", value=run),
                Parameter(name="accuracy", value=evaluate.get_parameter("accuracy").value),
                *([Parameter(name="run_claim_mount", value=shared)] if per_run_claim else []),
            ],
        )
        prep >> launch >> wait >> collect >> evaluate >> promote
    with DAG(name=EXIT_HANDLER):
        # a Complete job goes too when Argo deletes the claim its finished pods mount
        delete_trainjob_template(image=image, keep_complete=not per_run_claim)(
            name="delete-trainjob",
            when=None if per_run_claim else "{{workflow.status}} != Succeeded",
            arguments={"run_name": run, "backend": p("backend"), "namespace": namespace},
        )


_WORKFLOW_PARAMETER = re.compile(r"\{\{workflow\.parameters\.([A-Za-z0-9_.-]+)\}\}")


def check_registry_outlives_run(document: dict[str, Any], arguments: dict[str, str]) -> None:
    """Refuse, before the run is created, a registry its promote step would refuse after the
    training: one on the run's own claim (a task passing ``run_claim_mount``), with the
    workflow's parameters set from ``arguments``."""
    spec = document["spec"]
    declared = (spec.get("arguments") or {}).get("parameters") or []
    values = {p["name"]: str(p.get("value", "")) for p in declared if "name" in p}
    values.update(arguments)
    for template in spec.get("templates") or []:
        for task in (template.get("dag") or {}).get("tasks") or []:
            given = (task.get("arguments") or {}).get("parameters") or []
            passed = {p.get("name"): str(p.get("value", "")) for p in given}
            if not passed.get("run_claim_mount") or "registry" not in passed:
                continue
            named = _WORKFLOW_PARAMETER.fullmatch(passed["registry"])
            registry = _WORKFLOW_PARAMETER.sub(
                lambda match: values.get(match.group(1), match.group(0)), passed["registry"]
            )
            field = f"--param {named.group(1)}" if named else "--package"
            check_outlives_run(registry, passed["run_claim_mount"], field)
