"""KFP component of the launch step."""

from typing import NamedTuple

from kfp import dsl

from kubetrain.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def launch_trainjob(
    dataset: dsl.Input[dsl.Dataset],
    run_name: str = "",
    job_name: str = "",
    backend: str = "local",
    nodes: int = 2,
    procs_per_node: int = 1,
    strategy: str = "ddp",
    model: str = "mlp",
    epochs: int = 10,
    batch_size: int = 32,
    lr: float = 0.001,
    checkpoint_dir: str = "",
    image: str = "",
    runtime: str = "torch-distributed",
) -> NamedTuple("LaunchOutputs", [("job_name", str), ("checkpoint_dir", str)]):  # noqa: UP014
    """Start a distributed DDP/FSDP training job on the dataset and return its name at once.

    The job name is ``job_name`` if given, else derived from ``run_name`` (pass the pipeline
    run's name so a retried step finds its own job). An empty ``image`` means the trainer image
    configured in the components image ($KUBETRAIN_TRAINER_IMAGE, else ours).
    """
    from collections import namedtuple

    from kubetrain.components.launch_trainjob.launch import TrainingOptions, launch_training
    from kubetrain.images import TRAINER_IMAGE

    options = TrainingOptions(
        data_dir=dataset.path,
        checkpoint_dir=checkpoint_dir,
        strategy=strategy,
        model=model,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
    )
    result = launch_training(
        options,
        backend=backend,
        job_name=job_name,
        run_name=run_name,
        nodes=nodes,
        procs_per_node=procs_per_node,
        image=image or TRAINER_IMAGE,
        runtime=runtime,
    )
    print(f"launched {result.job_name}; checkpoints in {result.checkpoint_dir}")
    return namedtuple("LaunchOutputs", ["job_name", "checkpoint_dir"])(
        result.job_name, result.checkpoint_dir
    )
