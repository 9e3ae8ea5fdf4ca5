"""The kubetrain training pipeline: prep → launch → wait → collect → evaluate → promote (behind
the accuracy gate)."""

from collections.abc import Callable
from typing import Any, Optional

from kfp import dsl, kubernetes

from kubetrain import rules
from kubetrain.components.collect_checkpoint.component import collect_checkpoint
from kubetrain.components.dataset_prep.component import dataset_prep
from kubetrain.components.evaluate_model.component import evaluate_model
from kubetrain.components.launch_trainjob.component import launch_trainjob
from kubetrain.components.promote_model.component import promote_model, promotion_gate
from kubetrain.components.wait_trainjob.component import delete_trainjob, wait_trainjob
from kubetrain.jobspec import DEFAULT_RUNTIME
from kubetrain.render.pod import NON_ROOT_UID, STORAGE_ENV_KEYS
from kubetrain.rules import DEFAULT_ZERO_STAGE

PIPELINE_NAME = "kubetrain-training"
#: Where the launch, collect and promote steps (and the TrainJob's nodes) mount the shared PVC.
SHARED_MOUNT = "/mnt/shared"
#: The run's unique name (the KFP backend's driver gives it the run's Argo Workflow name,
#: kubeflow/pipelines 2.17.0 backend/src/v2/driver/resolve.go and argocompiler/argo.go
#: runResourceName), which names its TrainJob and folders. Not PIPELINE_JOB_NAME_PLACEHOLDER:
#: that is the display name, shared by runs named alike and empty for recurring runs.
RUN = dsl.PIPELINE_JOB_RESOURCE_NAME_PLACEHOLDER


def build_training_pipeline(storage_secret: str = "") -> Callable[..., Any]:
    """The pipeline whose steps and TrainJob get the Secret ``storage_secret`` (S3 endpoint and
    keys) as env by reference, or no Secret at all when it is empty (the default; credentials
    from the node's or service account's identity). The Secret is chosen when compiling
    (`kubetrain compile --storage-secret NAME`), not as a run parameter: KFP renders a
    parameter's empty value as ``secretKeyRef.name: ""``, an invalid pod, and KFP <= 2.14
    ignores ``optional`` (kubeflow/pipelines 2.14.0 backend/src/v2/driver/k8s.go builds the
    secretKeyRef without it; 2.15.0 sets it), so a missing Secret keeps every step from starting."""
    if storage_secret:
        rules.dns1123_subdomain(
            storage_secret, "--storage-secret", "give the name of a Secret, e.g. s3-creds"
        )
    return _pipeline(storage_secret)


def _pipeline(storage_secret: str) -> Callable[..., Any]:
    @dsl.pipeline(
        name=PIPELINE_NAME,
        description=(
            "Prepare a dataset, train it with a distributed DDP/FSDP/DeepSpeed TrainJob, collect "
            "the checkpoint, evaluate it against an accuracy threshold and promote it to the model "
            "registry when it passes."
        ),
    )
    def training_pipeline(
        dataset_source: str = "sklearn:digits",
        test_fraction: float = 0.2,
        validation_fraction: float = 0.1,
        seed: int = 0,
        backend: str = "trainer",
        nodes: str = "2",
        max_restarts: int = 0,
        procs_per_node: str = "auto",
        strategy: str = "ddp",
        zero_stage: int = DEFAULT_ZERO_STAGE,
        deepspeed_config: str = "",
        launcher: str = "torchrun",
        model: str = "mlp",
        epochs: int = 10,
        keep_checkpoints: int = 3,
        lr: float = 0.001,
        batch_size: int = 32,
        image: str = "",
        runtime: str = DEFAULT_RUNTIME,
        checkpoint_dir: str = "",
        accuracy_threshold: float = 0.95,
        model_registry: str = f"{SHARED_MOUNT}/registry",
        wait_timeout_seconds: float = 0,
        stall_timeout_seconds: str = "auto",
        unschedulable_grace_seconds: str = "auto",
        namespace: str = "",
        shared_pvc: str = "kubetrain-shared",
        service_account: str = "",
        storage: str = "",
        cpu: str = "",
        memory: str = "",
        gpu: int = 0,
        command: Optional[list] = None,  # noqa: UP045 (KFP reads the annotation)
        script: str = "",
        state_key: str = "",
    ):
        # `backend` trainer (a TrainJob), pytorchjob (a Training Operator v1 PyTorchJob), job
        # (an Indexed Job) or rayjob (a KubeRay RayJob) runs on the cluster; local runs the job
        # inside the launch pod, for `kubetrain run`, which passes it. `namespace` empty: the
        # steps' own namespace (the run's), where the shared claim is.
        # `command` (a list) runs your program instead of our trainer, in its checkpoint folder with
        # KUBETRAIN_DATA_DIR/KUBETRAIN_CHECKPOINT_DIR set; `model` then names the factory
        # (package.module:callable) collect and evaluate rebuild your model with; collect checks
        # the checkpoint loads into it, and `state_key` names the model's state dict in a
        # checkpoint of nested state (e.g. app.model) where several may be the model.
        # `strategy` deepspeed trains with ZeRO stage `zero_stage`, or with `deepspeed_config`
        # (its JSON text, or a path in the launch step's pod); `launcher` mpi starts the
        # processes with mpirun (backends trainer and local), `command` then being one rank's;
        # `launcher` ray (backend rayjob runs it always) runs `command` once as a Ray job.
        # With `storage` (e.g. s3://bucket/prefix) the dataset, checkpoints and model live under
        # storage/{datasets,checkpoints,models}/<run>; the KFP artifacts hold LOCATION pointers.
        # The exit task deletes a failed or stopped run's job and keeps a Complete one; the job
        # decides, as KFP's status for the body is RUNNING when the dsl.If below is false
        # (tests/support/kfp_backend_states.py). A stopped run's wait step gets SIGTERM with
        # its whole process group (argo-workflows v4.1.2 cmd/argoexec/commands/signal.go
        # forwardSignals, osspecific Kill: kill(-pgid)), but KFP's launcher, in that group and
        # with no handler (kubeflow/pipelines 2.17.0 backend/src/v2/component/launcher_v2.go),
        # dies on it, and the emissary, the container's PID 1, exits within a second of that
        # (osspecific Wait polls each second), so wait's on_cancel may not finish. The exit task
        # runs after the body, whatever its outcome: KFP compiles it to an Argo exit hook of the
        # body's DAG (backend/src/v2/compiler/argocompiler/dag.go), and stops a run by setting
        # activeDeadlineSeconds to 0 (apiserver/resource/resource_manager.go TerminateWorkflow),
        # a deadline Argo does not apply to exit hooks (argo-workflows v4.1.2
        # workflow/controller/exit_handler.go, exec_control.go).
        cleanup = delete_trainjob(run_name=RUN, backend=backend, namespace=namespace)
        cleanup.set_caching_options(False)
        with dsl.ExitHandler(cleanup):
            prep = dataset_prep(
                source=dataset_source,
                test_fraction=test_fraction,
                validation_fraction=validation_fraction,
                seed=seed,
                storage=storage,
                run_name=RUN,
            )
            launch = launch_trainjob(
                dataset=prep.outputs["dataset"],
                run_name=RUN,
                backend=backend,
                nodes=nodes,
                max_restarts=max_restarts,
                procs_per_node=procs_per_node,
                strategy=strategy,
                zero_stage=zero_stage,
                deepspeed_config=deepspeed_config,
                launcher=launcher,
                model=model,
                epochs=epochs,
                keep_checkpoints=keep_checkpoints,
                batch_size=batch_size,
                lr=lr,
                checkpoint_dir=checkpoint_dir,
                image=image,
                runtime=runtime,
                namespace=namespace,
                shared_pvc=shared_pvc,
                shared_mount=SHARED_MOUNT,
                service_account=service_account,
                storage=storage,
                storage_secret=storage_secret,  # the compiled-in Secret, or none
                cpu=cpu,
                memory=memory,
                gpu=gpu,
                command=command,
                script=script,
            )
            launch.set_caching_options(False)
            wait = wait_trainjob(
                job_name=launch.outputs["job_name"],
                backend=backend,
                timeout_seconds=wait_timeout_seconds,
                namespace=namespace,
                stall_timeout_seconds=stall_timeout_seconds,
                unschedulable_grace_seconds=unschedulable_grace_seconds,
                checkpoint_dir=launch.outputs["checkpoint_dir"],
            )
            wait.set_caching_options(False)
            # Collect takes the checkpoint folder from wait, which returns it once the job is
            # Complete: on a cluster it cannot start while the nodes still train. The model spec is
            # the user's explicit choice: collect's export and evaluate may build custom model code
            # from it, which a card alone never makes them import.
            collect = collect_checkpoint(
                checkpoint_dir=wait.outputs["checkpoint_dir"],
                storage=storage,
                run_name=RUN,
                model_factory=model,
                state_key=state_key,
                dataset=prep.outputs["dataset"],
            )
            evaluate = evaluate_model(
                model=collect.outputs["model"],
                dataset=prep.outputs["dataset"],
                threshold=accuracy_threshold,
                model_factory=model,
            )
            gate = promotion_gate(
                passed=evaluate.outputs["passed"], model_registry=model_registry, storage=storage
            )
            with dsl.If(gate.output == True):  # noqa: E712 (a KFP condition, not a comparison)
                promote = promote_model(
                    model=collect.outputs["model"],
                    registry=model_registry,
                    version=RUN,
                    accuracy=evaluate.outputs["accuracy"],
                )
        # On a cluster, the dataset, checkpoints and registry are on a ReadWriteMany PVC that the
        # TrainJob's nodes mount too (KFP's local runner ignores these mounts).
        for task in (launch, collect, promote):
            kubernetes.mount_pvc(task, pvc_name=shared_pvc, mount_path=SHARED_MOUNT)
        # The steps that read or write `storage` (promote: a model_registry URL) get its endpoint
        # and keys by reference, as the TrainJob's nodes do (launch renders them into the job).
        for task in (prep, collect, evaluate, promote) if storage_secret else ():
            kubernetes.use_secret_as_env(
                task,
                secret_name=storage_secret,
                secret_key_to_env={key: key for key in STORAGE_ENV_KEYS},
                optional=True,
            )
        # Every step runs as our image's non-root user, enforced by the kubelet.
        for task in (prep, launch, wait, collect, evaluate, gate, promote, cleanup):
            kubernetes.set_security_context(
                task, run_as_user=NON_ROOT_UID, run_as_group=NON_ROOT_UID, run_as_non_root=True
            )

    return training_pipeline


training_pipeline = build_training_pipeline()
