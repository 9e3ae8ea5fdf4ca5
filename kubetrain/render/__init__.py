"""Render a TrainJobSpec into Kubernetes objects: a Kubeflow Trainer ``TrainJob``, a Training
Operator v1 ``PyTorchJob``, or an Indexed Job + headless Service for clusters without either,
plus the ConfigMap of a shipped script. Pure functions: nothing here talks to a cluster.

The renderers load on first use: the pipeline definitions need only ``kubetrain.render.pod``'s
constants, and the Trainer API models behind ``render_trainjob`` take 0.4 s to import.
"""

from __future__ import annotations

import importlib
from typing import Any

from kubetrain import rules
from kubetrain.errors import InvalidInput

_HOMES = {
    "render_indexed_job": "kubetrain.render.indexed_job",
    "render_pytorchjob": "kubetrain.render.pytorchjob",
    "render_rayjob": "kubetrain.render.rayjob",
    "render_script_configmap": "kubetrain.render.script",
    "render_trainjob": "kubetrain.render.trainjob",
}
__all__ = [*_HOMES, "launcher_for", "render_job", "refuse_elastic", "refuse_launcher"]
#: The backends whose objects are rendered (the local backend runs processes instead).
RENDERED_BACKENDS = ("trainer", "job", "pytorchjob", "rayjob")
#: The backends that run ``launcher`` mpi: Kubeflow Trainer's MPI policy (our
#: ``kubetrain-deepspeed-mpi`` runtime) and mpirun on this machine. A PyTorchJob and an Indexed
#: Job have no launcher, hostfile or ssh keys to run mpirun with.
MPI_BACKENDS = ("trainer", "local")
#: The backends that run ``launcher`` ray: a KubeRay RayJob, and Ray on this machine.
RAY_BACKENDS = ("rayjob", "local")
#: The launchers only some backends run, and those backends.
_LAUNCHER_BACKENDS = {"mpi": MPI_BACKENDS, "ray": RAY_BACKENDS}


def launcher_for(launcher: str, backend: str) -> str:
    """The launcher a job asking for ``launcher`` runs with on ``backend``: a RayJob's is
    always Ray (every face's default, torchrun, means the backend's own there)."""
    return "ray" if backend == "rayjob" and launcher == "torchrun" else launcher


def refuse_launcher(spec: Any, backend: str, field: str = "launcher") -> None:
    """``spec`` (a TrainJobSpec, a launch request, a run's parameters: anything with a
    ``launcher``) with a launcher ``backend`` cannot run (mpi off the Trainer, ray off a
    RayJob, anything but ray on a RayJob), refused in one line naming ``field`` as the face
    calls it."""
    launcher = launcher_for(spec.launcher, backend)
    backends = _LAUNCHER_BACKENDS.get(launcher, ())
    if backend == "rayjob" and launcher != "ray":
        raise InvalidInput(
            field,
            f"{rules.shown(launcher)} is not run by backend rayjob: a RayJob's workers are "
            "started by Ray Train",
            "leave the launcher out (rayjob runs ray), or use backend "
            f"{' or '.join(_LAUNCHER_BACKENDS.get(launcher, ('trainer', 'local')))}",
        )
    if backends and backend not in backends:
        raise InvalidInput(
            field,
            f"{launcher} is not run by backend {rules.shown(backend)}",
            f"use backend {' or '.join(backends)}, or launcher torchrun",
        )


#: Why a backend has no ``--nodes MIN:MAX`` (``jobspec.ELASTIC_BACKENDS`` have it).
_NOT_ELASTIC = {
    "trainer": "Kubeflow Trainer v2.3 has no elastic training (its elasticPolicy was never "
    "implemented and was removed in v2.2, kubeflow/trainer#3235)",
    "job": "an Indexed Job starts a fixed number of pods, each with a fixed rank",
    "rayjob": "kubetrain runs a RayJob on a fixed worker group (ScalingConfig num_workers = "
    "nodes x procs per node)",
}


def refuse_elastic(nodes: int | str, backend: str, field: str = "nodes") -> None:
    """``nodes`` ``MIN:MAX`` on a backend that cannot run an elastic job, refused in one line
    naming why and the backends that can; a bad ``nodes`` gets its own line."""
    from kubetrain.jobspec import ELASTIC_BACKENDS, resolve_nodes

    min_nodes, max_nodes = resolve_nodes(nodes, field)
    if min_nodes is not None and backend not in ELASTIC_BACKENDS:
        why = _NOT_ELASTIC.get(backend, f"backend {rules.shown(backend)} has no elastic jobs")
        raise InvalidInput(
            field,
            f"{min_nodes}:{max_nodes} asks for an elastic job, and {why}",
            f"use backend {' or '.join(ELASTIC_BACKENDS)} (a PyTorchJob with elasticPolicy), "
            f"or a fixed --nodes {max_nodes}",
        )


def render_job(
    spec: Any,
    backend: str,
    namespace: str,
    trainer_version: str,
    owner: dict[str, str] | None = None,
    runtime_resources: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Every object of ``spec``'s job on ``backend`` (trainer: a TrainJob; job: a headless
    Service + Indexed Job; pytorchjob: a PyTorchJob; rayjob: a RayJob), in creation order,
    the job's own object last: a shipped script's ConfigMap first. The one list both
    `kubetrain render` prints and the backend creates; ``runtime_resources``: the runtime's
    node container's, when known (``render_trainjob``)."""
    from kubetrain.render.indexed_job import render_indexed_job
    from kubetrain.render.pytorchjob import render_pytorchjob
    from kubetrain.render.script import render_script_configmap
    from kubetrain.render.trainjob import render_trainjob

    refuse_launcher(spec, backend)
    refuse_elastic(spec.nodes_text, backend)
    rendered = []
    if spec.script:
        rendered.append(render_script_configmap(spec, namespace, owner=owner))
    if backend == "trainer":
        rendered.append(
            render_trainjob(
                spec,
                namespace=namespace,
                trainer_version=trainer_version,
                owner=owner,
                runtime_resources=runtime_resources,
            )
        )
    elif backend == "pytorchjob":
        rendered.append(render_pytorchjob(spec, namespace=namespace, owner=owner))
    elif backend == "rayjob":
        from kubetrain.render.rayjob import render_rayjob

        rendered.append(render_rayjob(spec, namespace=namespace, owner=owner))
    else:
        rendered += render_indexed_job(spec, namespace=namespace, owner=owner)
    return rendered


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
