"""KFP component of the launch step."""

from typing import NamedTuple, Optional

from kfp import dsl

from kubetrain.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def launch_trainjob(
    dataset: dsl.Input[dsl.Dataset],
    run_name: str = "",
    job_name: str = "",
    backend: str = "trainer",
    nodes: str = "2",
    procs_per_node: str = "auto",
    strategy: str = "ddp",
    model: str = "mlp",
    epochs: int = 10,
    batch_size: int = 32,
    lr: float = 0.001,
    checkpoint_dir: str = "",
    image: str = "",
    runtime: str = "torch-ddp-cpu",
    namespace: str = "",
    shared_pvc: str = "",
    shared_mount: str = "/mnt/shared",
    service_account: str = "",
    storage: str = "",
    storage_secret: str = "",
    max_restarts: int = 0,
    cpu: str = "",
    memory: str = "",
    gpu: int = 0,
    env: Optional[dict] = None,  # noqa: UP045 (KFP reads the annotation)
    node_selector: Optional[dict] = None,  # noqa: UP045
    tolerations: Optional[list] = None,  # noqa: UP045
    command: Optional[list] = None,  # noqa: UP045
    script: str = "",
    checkpoint_every: int = 1,
    keep_checkpoints: int = 3,
    trainer_version: str = "auto",
    runtime_kind: str = "ClusterTrainingRuntime",
    volumes: Optional[list] = None,  # noqa: UP045
    labels: Optional[dict] = None,  # noqa: UP045
    pod_labels: Optional[dict] = None,  # noqa: UP045
    suspend: bool = False,
    active_deadline_seconds: int = 0,
    dataset_uri: str = "",
    dataset_secret: str = "",
    model_uri: str = "",
    model_secret: str = "",
    zero_stage: int = 2,
    deepspeed_config: str = "",
    launcher: str = "torchrun",
) -> NamedTuple("LaunchOutputs", [("job_name", str), ("checkpoint_dir", str)]):  # noqa: UP014
    """Start a distributed DDP/FSDP/DeepSpeed training job on the dataset and return its name
    at once.

    The job name is ``job_name`` if given, else derived from ``run_name`` (pass the pipeline
    run's name so a retried step finds its own job). ``namespace`` empty: this step's own
    (the run's), where the claims it mounts are. An empty ``image`` means the trainer image
    configured in the components image ($KUBETRAIN_TRAINER_IMAGE, else ours).

    On a cluster backend with ``shared_pvc`` (mounted into this step at ``shared_mount``, e.g.
    with kfp-kubernetes ``mount_pvc``), the dataset is copied onto the claim and the TrainJob's
    nodes mount it at the same path for data and checkpoints.

    With ``storage`` (an object-storage URL such as ``s3://bucket/prefix``), the nodes read
    the dataset where ``dataset`` points (see dataset_prep) and write checkpoints under
    ``storage/checkpoints/<run_name>``; they get the endpoint and keys from Secret
    ``storage_secret`` (its name only is rendered into the job).

    ``procs_per_node``: processes per node, a number or ``auto`` (one per GPU with ``gpu``, else
    1). ``cpu``, ``memory`` (Kubernetes quantities) and ``gpu`` are what each node asks for; ``env``
    (name -> text) is set in every node; ``node_selector`` (label -> value) and
    ``tolerations`` (texts ``KEY[=VALUE][:EFFECT]``, e.g. ``nvidia.com/gpu:NoSchedule``) say
    where the nodes may run: the options of `kubetrain launch` of the same names.

    ``command`` (a list: the program and its arguments) runs instead of our trainer, e.g.
    ``["torchrun", "train.py"]``, with ``script`` (a file this step can read, shipped with the
    job) as on the CLI. The other inputs are `kubetrain launch`'s options of the same names
    (``volumes``: texts ``NAME=CLAIM:/PATH[:ro]``; ``active_deadline_seconds`` 0: none).

    ``nodes``: a whole number, or ``MIN:MAX`` for an elastic job that goes on while at least
    MIN nodes remain (backends pytorchjob and local). ``max_restarts``: after a node fails,
    every node starts again up to this many times and training resumes from the newest
    checkpoint (on a cluster the runtime's JobSet ``failurePolicy.maxRestarts`` must allow
    it); for an elastic job, torchrun's ``--max-restarts`` (at least 1).

    ``strategy`` ``deepspeed`` trains with ZeRO stage ``zero_stage`` (1, 2 or 3), or with
    ``deepspeed_config``: a DeepSpeed JSON config as text, or a path this step can read,
    whose settings win over ours. ``launcher`` ``mpi`` starts the processes with mpirun from
    a launcher (Kubeflow Trainer's MPI policy; backends trainer and local); ``ray`` (and
    backend ``rayjob``, which always runs it) runs ``command`` once as a Ray job's entrypoint
    on a Ray cluster of a head and ``nodes`` worker nodes (a KubeRay RayJob, or Ray on this
    machine for backend local). With launcher mpi, ``command`` is one rank's program; with
    ``torchrun`` (the default) it runs on every node.
    """
    from collections import namedtuple

    from kubetrain.backends import BackendOptions
    from kubetrain.components.launch_trainjob.launch import (
        LaunchRequest,
        TrainingOptions,
        initializer,
        launch,
        parse_toleration,
        parse_volume,
        shared_volume,
        text_list,
        text_mapping,
    )
    from kubetrain.errors import terminal_text
    from kubetrain.jobspec import Resources

    request = LaunchRequest(
        training=TrainingOptions(
            data_dir=dataset.path,
            checkpoint_dir=checkpoint_dir,
            strategy=strategy,
            model=model,
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            checkpoint_every=checkpoint_every,
            keep_checkpoints=keep_checkpoints,
            zero_stage=zero_stage,
            deepspeed_config=deepspeed_config,
        ),
        command=tuple(text_list(command, "command")),
        name=job_name,
        run_name=run_name,
        nodes=nodes,
        procs_per_node=procs_per_node,
        image=image,
        runtime=runtime,
        runtime_kind=runtime_kind,
        resources=Resources(cpu=cpu, memory=memory, gpu=gpu),
        env=text_mapping(env, "env"),
        volumes=tuple(parse_volume(v) for v in text_list(volumes, "volumes")),
        shared_volume=shared_volume(shared_pvc, shared_mount),
        labels=text_mapping(labels, "labels"),
        pod_labels=text_mapping(pod_labels, "pod_labels"),
        node_selector=text_mapping(node_selector, "node_selector"),
        tolerations=tuple(parse_toleration(t) for t in text_list(tolerations, "tolerations")),
        service_account=service_account,
        storage_url=storage,
        storage_secret=storage_secret,
        max_restarts=max_restarts,
        suspend=suspend,
        active_deadline_seconds=active_deadline_seconds or None,
        dataset_initializer=initializer(dataset_uri, dataset_secret),
        model_initializer=initializer(model_uri, model_secret),
        script=script,
        launcher=launcher,
    )
    options = BackendOptions(namespace=namespace, trainer_version=trainer_version)
    result = launch(request, backend=backend, options=options)
    print(terminal_text(f"launched {result.job_name}; checkpoints in {result.checkpoint_dir}"))
    return namedtuple("LaunchOutputs", ["job_name", "checkpoint_dir"])(
        result.job_name, result.checkpoint_dir
    )
