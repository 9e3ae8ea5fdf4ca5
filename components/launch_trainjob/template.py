"""The launch step as an Argo Workflows container template (Hera)."""

from __future__ import annotations

from hera.workflows import Container

from kubetrain.components._shared.argo_steps import (
    SHARED_VOLUME,
    SharedVolume,
    api_retry,
    input_parameter,
    inputs,
    output_parameter,
    step_template,
)
from kubetrain.images import COMPONENT_IMAGE

#: The label `argo logs` selects a workflow's pods by; on the TrainJob's pods it makes
#: `argo logs WORKFLOW -c node` show the training logs.
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"


def launch_trainjob_template(
    name: str = "launch-trainjob",
    volume: SharedVolume = SHARED_VOLUME,
    image: str = COMPONENT_IMAGE,
) -> Container:
    """`kubetrain launch` of our DDP/FSDP trainer; the job name derives from ``run_name`` (the
    workflow's name), so a retried launch adopts the job it already created. The nodes mount
    claim ``shared_pvc`` at the volume's path, where the dataset and checkpoints are."""
    mount = volume.mount_path
    parameters = [
        input_parameter("run_name", "the workflow run; the job name derives from it"),
        input_parameter("data", "dataset folder written by the prep step (on the claim)"),
        input_parameter("checkpoint_dir", "where rank 0 writes checkpoints (on the claim)"),
        input_parameter("shared_pvc", "PersistentVolumeClaim the nodes mount at " + mount),
        input_parameter("backend", "trainer (TrainJob), job (Indexed Job) or local", "trainer"),
        input_parameter("namespace", "namespace of the job", "{{workflow.namespace}}"),
        input_parameter("nodes", "training nodes (pods)", "2"),
        input_parameter("procs_per_node", "torchrun processes per node", "1"),
        input_parameter("strategy", "ddp or fsdp", "ddp"),
        input_parameter("model", "mlp, cnn or package.module:callable", "mlp"),
        input_parameter("epochs", "training epochs", "10"),
        input_parameter("batch_size", "batch size per process", "32"),
        input_parameter("lr", "learning rate", "0.001"),
        input_parameter("image", "trainer image; empty = the default trainer image", ""),
        input_parameter("runtime", "ClusterTrainingRuntime the TrainJob refers to",
                        "torch-distributed"),
        input_parameter("cpu", "CPU per node (Kubernetes quantity); empty = the runtime's", ""),
        input_parameter("memory", "memory per node; empty = the runtime's", ""),
        input_parameter("gpu", "GPUs per node", "0"),
        input_parameter("max_restarts", "restarts of every node after one fails (the runtime's "
                        "failurePolicy.maxRestarts must allow them)", "0"),
        input_parameter("storage_secret", "Secret with S3 endpoint and keys for s3:// data and "
                        "checkpoints; empty = none", ""),
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
            "--model",
            inputs("model"),
            "--epochs",
            inputs("epochs"),
            "--batch-size",
            inputs("batch_size"),
            "--lr",
            inputs("lr"),
        ],  # fmt: skip
        parameters,
        [
            output_parameter("job_name", "name of the TrainJob (or Job) launched"),
            output_parameter("checkpoint_dir", "where the job writes its checkpoints"),
        ],
        volume=volume,
        retry=api_retry(),
        image=image,
    )
