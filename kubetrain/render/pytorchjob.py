"""Render a TrainJobSpec as a Training Operator v1 ``PyTorchJob`` (kubeflow.org/v1), for
clusters still on Kubeflow Training Operator 1.8/1.9 instead of Trainer v2.

Built with the ``kubeflow-training`` 1.9 SDK's generated models (``kubeflow.training.models``)
and serialized by its ``ApiClient``, so a field the v1 API does not have fails here and not on
the cluster; the pod template is the ``V1PodTemplateSpec`` those models re-export. A fixed-size
job is one ``Master`` replica and ``nodes - 1`` ``Worker`` replicas (no Worker spec for one
node); an elastic one (``--nodes MIN:MAX``) is MAX ``Worker`` replicas and no Master (below).
Every replica runs the same pod: container ``pytorch`` (the operator reads exit codes and ports
only from a container of that name, and its webhook refuses a replica without one), port
``pytorchjob-port`` 23456 set explicitly (the operator's defaulting adds it otherwise;
kubeflow/training-operator v1.9.0 ``pkg/apis/kubeflow.org/v1/pytorch_types.go``,
``pytorch_defaults.go``; ``pkg/webhooks/pytorch/pytorchjob_webhook.go``).

What the operator injects into every container (v1.9.0 ``pkg/controller.v1/pytorch/
envvar.go`` ``setPodEnv``, ``master.go``; the same in v1.7.0 to v1.9.0), after the
container's own env, so it wins over a variable of the same name:

* ``PYTHONUNBUFFERED=1``;
* with a Master spec (a fixed-size job's): ``MASTER_PORT``/``PET_MASTER_PORT`` = the master's
  ``pytorchjob-port`` (23456), ``MASTER_ADDR``/``PET_MASTER_ADDR`` = ``<job>-master-0``, the
  master's headless Service (one per replica pod, named like it, ``pkg/controller.v1/common/
  service.go``); ``WORLD_SIZE`` = replicas x ``nprocPerNode`` (1 when it is not a number);
  ``RANK`` and ``PET_NODE_RANK`` = the node's rank: 0 for the master, worker index + 1;
* ``PET_NPROC_PER_NODE`` = ``nprocPerNode`` (we always set it), ``PET_NNODES`` = replicas
  (without ``elasticPolicy``; with one, the elastic env below instead);
* workers get an ``init-pytorch`` init container waiting until ``<job>-master-0`` resolves
  (``initcontainer.go``), only when the job has a Master.

An elastic job (``spec.elastic``) is rendered as the upstream elastic examples are
(``examples/pytorch/elastic/echo/echo.yaml``, ``imagenet/imagenet.yaml`` at v1.9.0):

* ``Worker`` replicas only, MAX of them: with a Master, the master's success alone ends the job
  (``pytorchjob_controller.go`` ``UpdateJobStatus`` ~383-401) and every node gets a fixed
  ``PET_NODE_RANK`` (``envvar.go`` ~67-97), while an elastic job's node ranks are torchrun's to
  assign at each rendezvous; with no Master the job Succeeded once any worker succeeded
  (``UpdateJobStatus`` ~404-418: "If ``ElasticPolicy`` is not nil and any worker has
  completed");
* ``elasticPolicy``: ``minReplicas`` MIN, ``maxReplicas`` MAX, ``rdzvBackend`` c10d,
  ``maxRestarts`` = ``max_restarts`` (torchrun's ``--max-restarts`` on each node: a lost or
  joining peer restarts a node's workers, and a failure of its own counts too). The operator
  turns them into ``PET_RDZV_ENDPOINT`` = ``<job>-worker-0:23456`` (the Worker's port; worker-0's
  torchrun hosts the c10d store, as its hostname matches the endpoint, so a lost worker-0
  takes the rendezvous with it until it is back: a separate store, ``rdzvBackend`` etcd-v2
  with ``rdzvHost``, would avoid that), ``PET_RDZV_BACKEND``,
  ``PET_NNODES`` = "MIN:MAX", ``PET_MAX_RESTARTS`` (``pkg/controller.v1/pytorch/elastic.go``
  ``Generate``); ``nprocPerNode`` stays in ``spec`` (``elasticPolicy.nProcPerNode`` is deprecated
  and refused beside it: ``pytorchjob_webhook.go`` ``validateSpec``). No ``metrics``: the HPA they
  make (``hpa.go`` ``ReconcileHPA``) would change the Worker replicas under us;
* ``restartPolicy: OnFailure``: a lost node's container is restarted in place by the kubelet
  and its torchrun rejoins the rendezvous, while the others go on (their torchruns restart
  their workers at the new world size and the trainer resumes from its newest checkpoint);
* the container env carries ``jobspec.ELASTIC_NODE_ENV``, torch's opt-out of the shared
  rendezvous store: without it a node that rejoins a running job fails its rendezvous with
  ``DistStoreError: wait timeout after 60000ms, keys: /torch.rendezvous.<id>.1/MASTER_ADDR``
  (and the survivor on its role_info keys), as tests/test_elastic_pytorchjob.py's run showed
  with the variable set to 0.

Against Trainer v2 (torch plugin: PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
PET_MASTER_ADDR ``<job>-node-0-0.<job>``, PET_MASTER_PORT 29500): the PET_* names torchrun reads
are the same, so ``torchrun ...`` (our image's ``torchrun -m kubetrain.train``, or a user's
``torchrun train.py``) takes nodes, processes, node rank and master from them unchanged; only
the master's name and port differ. The extra RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT are
node-level, and torchrun replaces them with each worker process's own; a program started
without torchrun and one process per node gets a correct ``env://`` rendezvous from them (our
trainer's ``init_runtime`` joins it). A spec env setting one of those is refused here, since
the operator would override it silently.

``runPolicy`` (``pkg/controller.v1/common/job.go`` ``ReconcileJobs``, ``pkg/core/job.go``):

* ``cleanPodPolicy: Running``: once the job has Succeeded or Failed, pods still running or
  pending are deleted (with their Services), finished ones kept, so the failed node's log can be
  read (``DeletePodsAndServices``);
* ``max_restarts`` 0: ``restartPolicy: Never`` and no ``backoffLimit``: the first failed pod
  fails the job ("PyTorchJob <job> is failed because 1 Worker replica(s) failed.",
  ``pytorchjob_controller.go`` ``UpdateJobStatus``), and cleanPodPolicy keeps its log on every
  release. A ``backoffLimit: 0`` would instead, on v1.7.0 to v1.9.3, delete every pod, the
  failed one and its log included: past the backoff limit (or the active deadline)
  ``ReconcileJobs`` called ``DeletePodsAndServices`` before setting the Failed condition, and
  ``DeletePodsAndServices`` honours cleanPodPolicy only for a finished job. v1.9.4 sets the
  condition first ("fix: respect cleanPodPolicy when job exceeds backoffLimit",
  kubeflow/trainer#3420, commit 8e41c03 on release-1.9), so there cleanPodPolicy applies to a
  job failed by its backoff limit or deadline too;
* ``max_restarts`` k > 0: ``restartPolicy: OnFailure`` (the kubelet restarts a failed node's
  container in place) and ``backoffLimit`` = k x nodes + 1: the operator sums the restart counts
  of every running pod's containers and fails the job once the sum reaches the limit
  (``PastBackoffLimit``), and one rank's failure restarts every node (their torchruns lose the
  group and exit too), so k whole-job restarts add k x nodes. An elastic job gets the same
  k x MAX + 1 for another reason: only a lost node's own container restarts (the others'
  torchruns restart their workers inside the container), so each of the MAX nodes may be lost
  k times. Its pods are then deleted on every release, v1.9.4 included: a container restarted
  in place leaves its pod Running, which cleanPodPolicy Running deletes;
* ``activeDeadlineSeconds`` and ``suspend`` as the spec says (suspending deletes the pods,
  resuming creates them again).

``ttlSecondsAfterFinished`` and ``schedulingPolicy`` are not set: the spec has neither (a
runtime, gang scheduling included, is a Trainer v2 notion and is not used here).
"""

from __future__ import annotations

import json
from typing import Any

from kubeflow.training.api_client import ApiClient
from kubeflow.training.models import (
    KubeflowOrgV1ElasticPolicy,
    KubeflowOrgV1PyTorchJob,
    KubeflowOrgV1PyTorchJobSpec,
    KubeflowOrgV1ReplicaSpec,
    KubeflowOrgV1RunPolicy,
    V1PodTemplateSpec,
)

from kubetrain import rules
from kubetrain.errors import InvalidInput
from kubetrain.jobspec import ELASTIC_NODE_ENV, ELASTIC_RDZV_BACKEND, TrainJobSpec
from kubetrain.render import pod, refuse_launcher
from kubetrain.render.metadata import (
    object_labels,
    object_metadata,
    pod_labels,
    spec_annotations,
    validate_namespace,
)
from kubetrain.render.script import node_program, script_sha256

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
#: The container the operator reads exit codes and the master port from (pytorch_types.go).
CONTAINER = "pytorch"
PORT_NAME = "pytorchjob-port"
#: The operator's default master port (pytorch_types.go PyTorchJobDefaultPort).
MASTER_PORT = 23456
MASTER, WORKER = "Master", "Worker"
CLEAN_POD_POLICY = "Running"
#: What the operator sets in every container after its own env (envvar.go, master.go).
OPERATOR_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "PYTHONUNBUFFERED")
#: What it sets after them in an elastic job's containers (elastic.go ``Generate``).
OPERATOR_ELASTIC_ENV = ("PET_RDZV_ENDPOINT", "PET_RDZV_BACKEND", "PET_MAX_RESTARTS")


def render_pytorchjob(
    spec: TrainJobSpec, *, namespace: str = "default", owner: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The PyTorchJob for ``spec`` as a plain dict (camelCase keys, no None values). A
    shipped script's ConfigMap comes from ``render_script_configmap`` and must exist first."""
    spec = spec.validate()
    validate_namespace(namespace)
    check_pytorchjob_spec(spec)
    if spec.elastic:  # no Master: see the module's docstring
        replicas = {MASTER: 0, WORKER: spec.num_nodes}
    else:
        replicas = {MASTER: 1, WORKER: spec.num_nodes - 1}
    restart_policy = "OnFailure" if spec.max_restarts else "Never"
    template = _pod_template(spec)
    job = KubeflowOrgV1PyTorchJob(
        api_version=API_VERSION,
        kind=KIND,
        metadata=_model(
            object_metadata(
                spec.name,
                namespace,
                object_labels(spec),
                owner,
                spec_annotations(spec, script_sha256(spec)),
            ),
            "V1ObjectMeta",
        ),
        spec=KubeflowOrgV1PyTorchJobSpec(
            nproc_per_node=str(spec.procs_per_node),
            elastic_policy=_elastic_policy(spec),
            pytorch_replica_specs={
                replica_type: KubeflowOrgV1ReplicaSpec(
                    replicas=count, restart_policy=restart_policy, template=template
                )
                for replica_type, count in replicas.items()
                if count
            },
            run_policy=KubeflowOrgV1RunPolicy(
                clean_pod_policy=CLEAN_POD_POLICY,
                backoff_limit=spec.max_restarts * spec.num_nodes + 1 if spec.max_restarts else None,
                active_deadline_seconds=spec.active_deadline_seconds,
                suspend=True if spec.suspend else None,
            ),
        ),
    )
    return ApiClient().sanitize_for_serialization(job)


def check_pytorchjob_spec(spec: TrainJobSpec) -> None:
    """What a PyTorchJob cannot do for ``spec``, refused before anything is created: names the
    operator could not give its pods and Services, the Trainer's initializers, env the
    operator would silently override, and ``launcher`` mpi (a PyTorchJob has no launcher)."""
    refuse_launcher(spec, "pytorchjob")
    rules.pytorchjob_replica_names(spec.name, spec.num_nodes, "name", workers_only=spec.elastic)
    pod.refuse_initializers(spec, "a PyTorchJob")
    for key in spec.env:
        if key in OPERATOR_ENV:
            raise InvalidInput(
                "env",
                f"{key} is set by the Training Operator itself in a PyTorchJob",
                "drop it: the operator sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK and "
                "PYTHONUNBUFFERED from --nodes/--procs-per-node",
            )
        if spec.elastic and key in OPERATOR_ELASTIC_ENV:
            raise InvalidInput(
                "env",
                f"{key} is set by the Training Operator itself in an elastic PyTorchJob",
                f"drop it: the operator sets {', '.join(OPERATOR_ELASTIC_ENV)} from its "
                "elasticPolicy (--nodes MIN:MAX, --max-restarts)",
            )


def _elastic_policy(spec: TrainJobSpec) -> KubeflowOrgV1ElasticPolicy | None:
    """An elastic job's ``elasticPolicy`` (the module's docstring says why these fields)."""
    if not spec.elastic:
        return None
    return KubeflowOrgV1ElasticPolicy(
        min_replicas=spec.min_nodes,
        max_replicas=spec.num_nodes,
        rdzv_backend=ELASTIC_RDZV_BACKEND,
        max_restarts=spec.max_restarts,
    )


class _Body:
    """A JSON body for ``ApiClient.deserialize``, which reads ``.data``."""

    def __init__(self, value: Any) -> None:
        self.data = json.dumps(value)


def _model(value: dict[str, Any], model: str) -> Any:
    """A plain Kubernetes dict (what the shared ``render.pod`` helpers build) as the model
    ``model`` of ``kubeflow.training.models``, e.g. ``V1PodTemplateSpec``."""
    return ApiClient().deserialize(_Body(value), model)


def _pod_template(spec: TrainJobSpec) -> V1PodTemplateSpec:
    """Every replica's pod: our labels, the ``pytorch`` container, the pod-level settings."""
    command, args = node_program(spec)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        "command": command,
        "ports": [{"name": PORT_NAME, "containerPort": MASTER_PORT, "protocol": "TCP"}],
        "securityContext": pod.container_security_context(),
    }
    optional_container = (
        ("args", args),
        ("env", _container_env(spec)),
        ("envFrom", pod.storage_env_from(spec)),
        ("resources", pod.resource_requirements(spec.resources_per_node)),
        ("volumeMounts", pod.volume_mounts(spec, shared_memory=True)),
    )
    container.update({key: value for key, value in optional_container if value})
    pod_spec: dict[str, Any] = {
        "securityContext": pod.pod_security_context(),
        "containers": [container],
    }
    pod_spec.update(pod.placement_and_volumes(spec))
    # No Istio sidecar, as on every backend (pod.pod_annotations), and the kubeflow-training
    # SDK's own rule for every PyTorchJob pod (1.9 kubeflow/training/utils/utils.py
    # get_pod_template_spec): in a Kubeflow profile namespace an injected sidecar keeps the
    # master pod Running after `pytorch` exits, so the job would never succeed.
    metadata = {"labels": pod_labels(spec), "annotations": pod.pod_annotations()}
    body = {"metadata": metadata, "spec": pod_spec}
    return _model(body, "V1PodTemplateSpec")


def _container_env(spec: TrainJobSpec) -> list[dict[str, str]]:
    """The spec's env (``pod.named_env``), after ``jobspec.ELASTIC_NODE_ENV`` in an elastic
    job's nodes (a spec setting it to another value is refused by ``TrainJobSpec.validate``)."""
    named = pod.named_env(spec)
    if not spec.elastic:
        return named
    return pod.env_list({**ELASTIC_NODE_ENV, **{var["name"]: var["value"] for var in named}})
