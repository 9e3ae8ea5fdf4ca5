"""The launch step as an Argo Workflows container template (Hera)."""

from __future__ import annotations

from hera.workflows import Container

from kubetrain.components._shared.argo_steps import (
    SHARED_VOLUME,
    WORKFLOW_OWNER_ENV,
    SharedVolume,
    api_retry,
    input_parameter,
    inputs,
    output_parameter,
    step_template,
)
from kubetrain.images import COMPONENT_IMAGE
from kubetrain.jobspec import DEFAULT_RUNTIME
from kubetrain.rules import DEFAULT_ZERO_STAGE

#: The label `argo logs` selects a workflow's pods by; on the TrainJob's pods it makes
#: `argo logs WORKFLOW -c node` show the training logs.
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"


def launch_trainjob_template(
    name: str = "launch-trainjob",
    volume: SharedVolume = SHARED_VOLUME,
    image: str = COMPONENT_IMAGE,
) -> Container:
    """`kubetrain launch` of our DDP/FSDP/DeepSpeed trainer, or of the program ``command``
    names; the job name derives from ``run_name`` (the workflow's name), so a retried launch
    adopts the job it already created. The nodes mount claim ``shared_pvc`` at the volume's
    path, where the dataset and checkpoints are. Every option of `kubetrain launch` is a
    parameter (lists and mappings as JSON), so the template and the CLI cannot drift. The
    workflow owns the job (``WORKFLOW_OWNER_ENV``): deleting the workflow deletes its
    training."""
    mount = volume.mount_path
    parameters = [
        input_parameter("run_name", "the workflow run; the job name derives from it"),
        input_parameter("data", "dataset folder written by the prep step (on the claim)"),
        input_parameter("checkpoint_dir", "where rank 0 writes checkpoints (on the claim)"),
        input_parameter("shared_pvc", "PersistentVolumeClaim the nodes mount at " + mount),
        input_parameter("backend", "trainer (TrainJob), pytorchjob (PyTorchJob), job (Indexed "
                        "Job), rayjob (KubeRay RayJob) or local", "trainer"),
        input_parameter("namespace", "namespace of the job", "{{workflow.namespace}}"),
        input_parameter("nodes", "training nodes (pods); MIN:MAX: an elastic job (backend "
                        "pytorchjob; needs max_restarts)", "2"),
        input_parameter("procs_per_node", "processes per node; auto = one per GPU with gpu, "
                        "else 1 (launcher mpi without gpu needs a number)", "auto"),
        input_parameter("launcher", "what starts the processes: torchrun on every node, "
                        "mpi (mpirun from a launcher; backends trainer and local) or ray (the "
                        "command as a Ray job; backends rayjob and local)", "torchrun"),
        input_parameter("strategy", "ddp, fsdp or deepspeed", "ddp"),
        input_parameter("zero_stage", "strategy deepspeed: the ZeRO stage, 1, 2 or 3",
                        str(DEFAULT_ZERO_STAGE)),
        input_parameter("deepspeed_config", "strategy deepspeed: your DeepSpeed config, its "
                        "JSON text or a path in this step's pod; its settings win; empty = "
                        "ours", ""),
        input_parameter("model", "mlp, cnn or package.module:callable", "mlp"),
        input_parameter("epochs", "training epochs", "10"),
        input_parameter("batch_size", "batch size per process", "32"),
        input_parameter("lr", "learning rate", "0.001"),
        input_parameter("image", "trainer image; empty = the default trainer image", ""),
        input_parameter("runtime", "ClusterTrainingRuntime the TrainJob refers to",
                        DEFAULT_RUNTIME),
        input_parameter("cpu", "CPU per node (Kubernetes quantity); empty = the runtime's", ""),
        input_parameter("memory", "memory per node; empty = the runtime's", ""),
        input_parameter("gpu", "GPUs per node", "0"),
        input_parameter("max_restarts", "restarts of every node after one fails (the runtime's "
                        "failurePolicy.maxRestarts must allow them); with nodes MIN:MAX "
                        "torchrun's --max-restarts", "0"),
        input_parameter("storage_secret", "Secret with S3 endpoint and keys for s3:// data and "
                        "checkpoints; empty = none", ""),
        input_parameter("storage", "object storage (s3://bucket/prefix) for checkpoints; "
                        "empty = the claim", ""),
        input_parameter("command", 'the program every node runs instead of our trainer, a '
                        'JSON list, e.g. ["torchrun", "train.py"]; [] = our trainer', "[]"),
        input_parameter("script", "a training script this step can read, shipped with the "
                        "job (mounted at /workspace); empty = none", ""),
        input_parameter("job_name", "explicit job name; empty = derived from run_name", ""),
        input_parameter("env", 'environment of every node, a JSON object {"KEY": "value"}',
                        "{}"),
        input_parameter("node_selector", "node labels the nodes must match, a JSON object",
                        "{}"),
        input_parameter("tolerations", 'taints the nodes tolerate, a JSON list of '
                        '"KEY[=VALUE][:EFFECT]"', "[]"),
        input_parameter("volumes", 'more claims for every node, a JSON list of '
                        '"NAME=CLAIM:/PATH[:ro]"', "[]"),
        input_parameter("labels", "labels of the job object, a JSON object", "{}"),
        input_parameter("pod_labels", "labels of every node pod, a JSON object", "{}"),
        input_parameter("service_account", "ServiceAccount the nodes run as; empty = the "
                        "runtime's", ""),
        input_parameter("runtime_kind", "ClusterTrainingRuntime or TrainingRuntime",
                        "ClusterTrainingRuntime"),
        input_parameter("trainer_version", "TrainJob form: auto (read the CRD), 2.1, 2.2, 2.3",
                        "auto"),
        input_parameter("suspend", "create the job suspended: true or false", "false"),
        input_parameter("active_deadline_seconds", "fail the job after this many seconds "
                        "running; empty = none", ""),
        input_parameter("checkpoint_every", "checkpoint every N epochs", "1"),
        input_parameter("keep_checkpoints", "keep the newest N epoch checkpoints; 0 = all",
                        "3"),
        input_parameter("dataset_uri", "dataset for the Trainer's initializer; empty = none",
                        ""),
        input_parameter("dataset_secret", "Secret with the dataset's credentials", ""),
        input_parameter("model_uri", "model for the Trainer's initializer; empty = none", ""),
        input_parameter("model_secret", "Secret with the model's credentials", ""),
    ]  # fmt: skip
    return step_template(
        name,
        ["launch"],
        [
            "--backend",
            inputs("backend"),
            "--namespace",
            inputs("namespace"),
            "--run-name",
            inputs("run_name"),
            "--nodes",
            inputs("nodes"),
            "--procs-per-node",
            inputs("procs_per_node"),
            "--launcher",
            inputs("launcher"),
            "--image",
            inputs("image"),
            "--runtime",
            inputs("runtime"),
            "--cpu",
            inputs("cpu"),
            "--memory",
            inputs("memory"),
            "--gpu",
            inputs("gpu"),
            "--max-restarts",
            inputs("max_restarts"),
            "--storage-secret",
            inputs("storage_secret"),
            "--shared-pvc",
            inputs("shared_pvc"),
            "--shared-mount",
            mount,
            "--pod-label",
            WORKFLOW_LABEL + "={{workflow.name}}",
            "--data",
            inputs("data"),
            "--checkpoint-dir",
            inputs("checkpoint_dir"),
            "--strategy",
            inputs("strategy"),
            "--zero-stage",
            inputs("zero_stage"),
            "--deepspeed-config",
            inputs("deepspeed_config"),
            "--model",
            inputs("model"),
            "--epochs",
            inputs("epochs"),
            "--batch-size",
            inputs("batch_size"),
            "--lr",
            inputs("lr"),
            "--storage",
            inputs("storage"),
            "--command-json",
            inputs("command"),
            "--script",
            inputs("script"),
            "--name",
            inputs("job_name"),
            "--env",
            inputs("env"),
            "--node-selector",
            inputs("node_selector"),
            "--toleration",
            inputs("tolerations"),
            "--volume",
            inputs("volumes"),
            "--label",
            inputs("labels"),
            "--pod-label",
            inputs("pod_labels"),
            "--service-account",
            inputs("service_account"),
            "--runtime-kind",
            inputs("runtime_kind"),
            "--trainer-version",
            inputs("trainer_version"),
            "--suspend",
            inputs("suspend"),
            "--active-deadline-seconds",
            inputs("active_deadline_seconds"),
            "--checkpoint-every",
            inputs("checkpoint_every"),
            "--keep-checkpoints",
            inputs("keep_checkpoints"),
            "--dataset-uri",
            inputs("dataset_uri"),
            "--dataset-secret",
            inputs("dataset_secret"),
            "--model-uri",
            inputs("model_uri"),
            "--model-secret",
            inputs("model_secret"),
        ],  # fmt: skip
        parameters,
        [
            output_parameter("job_name", "name of the TrainJob (or Job) launched"),
            output_parameter("checkpoint_dir", "where the job writes its checkpoints"),
        ],
        volume=volume,
        retry=api_retry(),
        image=image,
        env=WORKFLOW_OWNER_ENV,
    )
