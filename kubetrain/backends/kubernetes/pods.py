"""Reading a job's node pods: which node a pod is, how its container ended, and the problems
that mean a job will never finish by itself (an image that cannot be pulled, a crash loop, an
out-of-memory kill, a pod no node can take)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from kubernetes.client import (
    V1ContainerStateTerminated,
    V1ContainerStateWaiting,
    V1ContainerStatus,
    V1Pod,
)

from kubetrain.backends.base import NodeStatus
from kubetrain.backends.kubernetes.client import Action
from kubetrain.backends.kubernetes.kinds import (
    COMPLETION_INDEX,
    JOB_INDEX_LABEL,
    NODE_CONTAINERS,
    ORIGINATED_FROM_CRD_LABEL,
    RAY_NODE_TYPE_LABEL,
    RAYJOB_CRD_LABEL_VALUE,
    REPLICA_INDEX_LABEL,
    REPLICA_TYPE_LABEL,
    JobKind,
)
from kubetrain.backends.kubernetes.objects import KubeObjects
from kubetrain.render.rayjob import HEAD_RESOURCES, RAY_VERSION

#: Waiting reasons of a container whose image cannot be pulled.
PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "RegistryUnavailable")
#: Waiting reasons of a container the kubelet cannot create (a missing Secret/ConfigMap...).
CONFIG_REASONS = ("CreateContainerConfigError", "CreateContainerError")
OOM = "OOMKilled"
#: How a container stopped by its pod's deletion (SIGTERM) exits.
SIGTERM_EXIT_CODE = 128 + 15
#: How Volcano and scheduler-plugins' coscheduling name a pod's group.
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
#: The init container the Training Operator adds to PyTorchJob workers.
INIT_PYTORCH = "init-pytorch"
#: torchrun's node rank, which the Training Operator sets with a Master only.
NODE_RANK_ENV = "PET_NODE_RANK"


def list_job_pods(objects: KubeObjects, kind: JobKind, namespace: str, name: str) -> list[V1Pod]:
    """The pods of job ``name`` (every node, every restart), listed once. A plain function so
    that both the backend and a wait session (which does not hold the backend) can call it."""
    listing = objects.call(
        Action("list", "pods", namespace=namespace),
        objects.core.list_namespaced_pod,
        namespace,
        label_selector=kind.pod_selector(name),
    )
    return list(listing.items)


def node_index(pod: V1Pod) -> int | None:
    """The node (torchrun node rank) a pod runs: its completion index, from the label or, on
    clusters older than 1.28, the annotation; None for pods of another replicated job index.
    A PyTorchJob's master is node 0 and worker i node i + 1, as the operator ranks them
    (kubeflow/training-operator v1.9.0 ``pkg/controller.v1/pytorch/envvar.go`` ``setPodEnv``);
    in a job with Worker replicas only (an elastic one), worker i is node i. A RayJob's
    submitter pod is its one node, 0 (``kinds.RAYJOB``: it streams the driver's output).
    """
    metadata = pod.metadata
    labels = metadata.labels or {}
    if labels.get(ORIGINATED_FROM_CRD_LABEL) == RAYJOB_CRD_LABEL_VALUE:
        return 0
    replica_type = labels.get(REPLICA_TYPE_LABEL)
    if replica_type is not None:
        try:
            index = int(labels.get(REPLICA_INDEX_LABEL, ""))
        except ValueError:
            return None
        behind_master = index + 1 if operator_ranked(pod) else index
        return {"master": index, "worker": behind_master}.get(replica_type)
    if labels.get(JOB_INDEX_LABEL, "0") != "0":
        return None
    value = labels.get(COMPLETION_INDEX) or (metadata.annotations or {}).get(COMPLETION_INDEX)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def operator_ranked(pod: V1Pod) -> bool:
    """Whether the Training Operator gave a PyTorchJob pod's node container a node rank
    (``PET_NODE_RANK``): it does only when the job has a Master (``setPodEnv``, ~67-97), which
    then is node 0. Our specs cannot set the variable themselves
    (``jobspec.RESERVED_ENV_NAMES``)."""
    containers = pod.spec.containers if pod.spec else []
    return any(
        var.name == NODE_RANK_ENV
        for container in containers
        if container.name in NODE_CONTAINERS
        for var in container.env or []
    )


def node_container(pod: V1Pod) -> V1ContainerStatus | None:
    """The status of the container that runs the node (``node``, or a PyTorchJob's
    ``pytorch``), else of the pod's first container."""
    statuses = (pod.status.container_statuses if pod.status else None) or []
    return next(
        (s for s in statuses if s.name in NODE_CONTAINERS), statuses[0] if statuses else None
    )


def container_image(pod: V1Pod) -> str:
    containers = pod.spec.containers if pod.spec else []
    spec = next(
        (c for c in containers if c.name in NODE_CONTAINERS),
        containers[0] if containers else None,
    )
    return spec.image if spec is not None else ""


def last_termination(pod: V1Pod) -> V1ContainerStateTerminated | None:
    """How the node container's current run ended, else how its previous run did."""
    status = node_container(pod)
    if status is None:
        return None
    for state in (status.state, status.last_state):
        if state is not None and state.terminated is not None:
            return state.terminated
    return None


def _last_terminated(status: V1ContainerStatus) -> V1ContainerStateTerminated | None:
    return status.last_state.terminated if status.last_state is not None else None


def failed_run(pod: V1Pod) -> int:
    """Which run of the node container (its restartCount then) the problem ``diagnose``
    found is about: the current one when it has ended or waits to restart, else the one
    before."""
    status = node_container(pod)
    if status is None:
        return 0
    runs = status.restart_count or 0
    return runs - 1 if status.state is not None and status.state.running else runs


def exit_code(pod: V1Pod) -> int | None:
    """The node container's exit code once it has terminated (this run, else the last one)."""
    ended = last_termination(pod)
    return ended.exit_code if ended is not None else None


def started(pod: V1Pod) -> bool:
    """Whether the node container's current run has a log to read: it runs, or has ended.
    (While it waits to restart, the log served is the previous run's, already printed.)"""
    status = node_container(pod)
    if status is None or status.state is None:
        return False
    return bool(status.state.running or status.state.terminated)


def running_node(pod: V1Pod) -> bool:
    """Whether the node container runs now."""
    status = node_container(pod)
    return bool(status and status.state and status.state.running)


def live_nodes(pods: Iterable[V1Pod]) -> int:
    """An elastic job's nodes in it, as its pods show them: each node whose container runs
    or exited 0 (a lost one, ended or waiting to restart, is not)."""
    return sum(
        1 for pod in latest_by_node(pods).values() if running_node(pod) or exit_code(pod) == 0
    )


def restart_count(pod: V1Pod) -> int:
    """How many times the kubelet restarted the node container in place."""
    status = node_container(pod)
    return (status.restart_count or 0) if status else 0


def terminated(pod: V1Pod) -> bool:
    status = node_container(pod)
    return bool(status and status.state and status.state.terminated)


def instance(pod: V1Pod) -> tuple[str, int]:
    """One run of the node container: (pod uid, restart count). A restart or a new pod is a
    new instance whose log starts empty."""
    status = node_container(pod)
    return pod.metadata.uid or pod.metadata.name, status.restart_count if status else 0


def latest_by_node(pods: Iterable[V1Pod]) -> dict[int, V1Pod]:
    """Per node, the newest pod (a replaced pod's successor wins)."""
    latest: dict[int, V1Pod] = {}
    for pod in pods:
        index = node_index(pod)
        if index is None:
            continue
        current = latest.get(index)
        if current is None or _created(pod) >= _created(current):
            latest[index] = pod
    return latest


def _created(pod: V1Pod) -> float:
    stamp = pod.metadata.creation_timestamp
    return stamp.timestamp() if stamp is not None else 0.0


def node_statuses(pods: Iterable[V1Pod]) -> list[NodeStatus]:
    return [
        NodeStatus(rank=index, exit_code=exit_code(pod), log=pod.metadata.name)
        for index, pod in sorted(latest_by_node(pods).items())
    ]


def first_failure(pods: Iterable[V1Pod]) -> tuple[int, int] | None:
    """(node, exit code) of the node container that failed first, by finish time. Finish
    times have whole seconds: within the same second a container that failed by itself comes
    before one that ended on SIGTERM (143), which is how a JobSet's or a deletion's stopping
    of the other nodes ends them."""
    failures = []
    for index, pod in latest_by_node(pods).items():
        ended = last_termination(pod)
        if ended is not None and ended.exit_code:
            finished = ended.finished_at.timestamp() if ended.finished_at else float("inf")
            stopped = ended.exit_code == SIGTERM_EXIT_CODE
            failures.append((finished, stopped, index, ended.exit_code))
    if not failures:
        return None
    *_, index, code = min(failures)
    return index, code


@dataclass(frozen=True)
class PodProblem:
    """Why a job will not get anywhere by itself, mostly a node pod's problem (``pod`` is
    empty, ``node`` None, for a job that got no pods at all); ``grace`` names the wait's grace
    period it is given (``"image_pull"``, ``"unschedulable"``, ``"gang"``: unschedulable in a
    pod group) or is empty to fail at once."""

    reason: str
    message: str
    pod: str
    node: int | None
    grace: str = ""
    exit_code: int | None = None
    #: A failed run (an out-of-memory kill, a crash loop, a failed init container): a
    #: problem only when no restart can come (``restart_coming``).
    restartable: bool = False
    #: The container whose log tells more (empty: the job's node container).
    container: str = ""


def _pull_problem(
    waiting: V1ContainerStateWaiting | None, who: str, image: str, pod: str, index: int | None
) -> PodProblem | None:
    """``who`` (a node, or its init container) waits for an image it cannot pull: a bad
    name fails at once, a pull error gets the image-pull grace (a registry may come back)."""
    if waiting is None or waiting.reason not in PULL_REASONS + ("InvalidImageName",):
        return None
    detail = f": {waiting.message}" if waiting.message else ""
    return PodProblem(
        waiting.reason,
        f"{who} cannot pull image {image} ({waiting.reason}){detail}",
        pod,
        index,
        grace="" if waiting.reason == "InvalidImageName" else "image_pull",
    )


def _init_container_problem(pod: V1Pod, index: int | None, who: str) -> PodProblem | None:
    """An init container that holds the node back: one whose image cannot be pulled, or one
    that failed. The Training Operator gives PyTorchJob workers ``init-pytorch``, which looks
    up the master's Service 100 times, 2 s apart, then exits 1 (training-operator v1.9.0
    ``pkg/controller.v1/pytorch/initcontainer.go``; image ``alpine:3.10`` and 100 tries from
    ``pkg/config/config.go``):
    a master not Ready in ~200 s (a large image, a node scaling up) fails the worker there,
    before the ``pytorch`` container ever starts."""
    name = pod.metadata.name
    for status in (pod.status.init_container_statuses if pod.status else None) or []:
        state = status.state
        waiting = state.waiting if state is not None else None
        init = f"{who}'s init container {status.name}"
        if (problem := _pull_problem(waiting, init, status.image, name, index)) is not None:
            return problem
        ended = state.terminated if state is not None else None
        if ended is None and status.last_state is not None:
            ended = status.last_state.terminated
        if ended is not None and ended.exit_code:
            return PodProblem(
                "InitContainerFailed",
                f"{who}'s init container {status.name} exited with code "
                f"{ended.exit_code} before the node started"
                + (
                    " (it waits ~200 s for the master's Service)"
                    if status.name == INIT_PYTORCH
                    else ""
                ),
                name,
                index,
                exit_code=ended.exit_code,
                restartable=True,
            )
    return None


def in_pod_group(pod: V1Pod) -> bool:
    """Whether a gang scheduler places the pod with its group: a Training Operator with gang
    scheduling on marks every pod so (training-operator v1.9.0
    ``pkg/controller.v1/control/podgroup_control.go`` DecoratePodTemplateSpec: Volcano's
    group-name annotation, scheduler-plugins' pod-group label), and the whole group stays
    Unschedulable until every pod fits."""
    metadata = pod.metadata
    return VOLCANO_GROUP_ANNOTATION in (metadata.annotations or {}) or (
        COSCHEDULING_GROUP_LABEL in (metadata.labels or {})
    )


def diagnose(pod: V1Pod) -> PodProblem | None:
    """The pod's problem, if it has one. An out-of-memory kill, a crash loop or a failed init
    container is ``restartable``: the caller asks ``restart_coming`` whether the kubelet, the
    job's controller or JobSet will run the node again."""
    index = node_index(pod)
    if index is None:
        return None
    return _diagnose(pod, index, f"node {index}", f"node {index}'s pod {pod.metadata.name}")


def ray_node_fix(reason: str, node_type: str) -> str:
    """The fix said after a Ray ``node_type`` (head, worker) pod's problem of ``reason``; empty
    when the problem's own words say it."""
    if reason in PULL_REASONS + ("InvalidImageName",):
        return (
            f"every Ray node runs --image: give one this cluster can pull, holding Ray "
            f"{RAY_VERSION}"
        )
    if reason == "Unschedulable" and node_type == "head":
        head = HEAD_RESOURCES
        return (
            f"the head asks {head.cpu} CPU and {head.memory} (the driver runs there): make room "
            "for it, or fix the node selector and tolerations"
        )
    if reason == "Unschedulable":
        return (
            "lower --cpu, --memory, --gpu or --nodes to what the cluster's nodes have, or fix "
            "the node selector and tolerations"
        )
    if reason in CONFIG_REASONS:
        return "create what the pod refers to (a Secret, a ConfigMap, a claim) or drop it"
    if reason == "CrashLoopBackOff":
        return (
            "its `ray start` (KubeRay's, from rayStartParams) fails each time: read why with "
            f"`kubectl logs --previous`; --image must hold Ray {RAY_VERSION}"
        )
    return ""


def ray_memory_fix(node_type: str) -> str:
    if node_type == "head":
        return (
            f"the head ({HEAD_RESOURCES.memory}) runs the driver: keep the driver's own work "
            "light (the training runs on the workers)"
        )
    return "give the workers more with --memory or lower the batch size"


def diagnose_ray_node(pod: V1Pod) -> PodProblem | None:
    """The problem of a RayCluster's head or worker pod, named by its type (``ray.io/
    node-type``: KubeRay v1.7.0 ``common/pod.go`` ``labelPod``), with its fix. KubeRay submits
    the job, and so makes the submitter (our node 0), only once the RayCluster is Ready, every
    pod of it running (``rayjob_controller.go`` Reconcile, Initializing), so a head or worker
    that cannot start leaves the RayJob Initializing with no node pod of ours to diagnose.
    ``node`` is None: the pod runs no node of ours."""
    node_type = (pod.metadata.labels or {}).get(RAY_NODE_TYPE_LABEL)
    node_type = "head" if node_type == "head" else "worker"
    who = f"the Ray {node_type} pod {pod.metadata.name}"
    problem = _diagnose(pod, None, who, who, ray_memory_fix(node_type))
    if problem is None:
        return None
    fix = ray_node_fix(problem.reason, node_type)
    status = node_container(pod)
    return dataclasses.replace(
        problem,
        message=f"{problem.message}; {fix}" if fix else problem.message,
        container=status.name if status is not None else "",
    )


def _diagnose(
    pod: V1Pod,
    index: int | None,
    who: str,
    whose_pod: str,
    memory_fix: str = "give it more with --memory or lower the batch size",
) -> PodProblem | None:
    """``diagnose`` of a pod that ``who`` names in the messages (``whose_pod`` with its pod's
    name), ``memory_fix`` said after an out-of-memory kill."""
    name = pod.metadata.name
    for condition in (pod.status.conditions if pod.status else None) or []:
        if (
            condition.type == "PodScheduled"
            and condition.status == "False"
            and condition.reason == "Unschedulable"
        ):
            return PodProblem(
                "Unschedulable",
                f"{whose_pod} cannot be scheduled: {condition.message}",
                name,
                index,
                grace="gang" if in_pod_group(pod) else "unschedulable",
            )
    if (problem := _init_container_problem(pod, index, who)) is not None:
        return problem
    status = node_container(pod)
    if status is None or status.state is None:
        return None
    waiting = status.state.waiting
    image = container_image(pod) or status.image
    if (problem := _pull_problem(waiting, who, image, name, index)) is not None:
        return problem
    if waiting is not None and waiting.reason in CONFIG_REASONS:
        return PodProblem(
            waiting.reason,
            f"{who}'s container cannot be created ({waiting.reason}): {waiting.message}",
            name,
            index,
            grace="image_pull",
        )
    # The current run's end, else (running again, or waiting to) the run before it.
    current = status.state.terminated
    for ended in (current,) if current is not None else (_last_terminated(status),):
        if ended is not None and ended.reason == OOM:
            return PodProblem(
                OOM,
                f"{who} ran out of memory (OOMKilled, exit code {ended.exit_code}); {memory_fix}",
                name,
                index,
                exit_code=ended.exit_code or 137,
                restartable=True,
            )
    if waiting is not None and waiting.reason == "CrashLoopBackOff":
        code = exit_code(pod)
        return PodProblem(
            "CrashLoopBackOff",
            f"{who} keeps crashing (restarted {status.restart_count} times, last exit code {code})",
            name,
            index,
            exit_code=code,
            restartable=True,
        )
    return None


# ------------------------------------------------------------------------- restarts
#: Pod restart policies under which the kubelet starts a failed container again in place.
IN_PLACE = ("OnFailure", "Always")
#: The label JobSet gives every pod of one whole-set restart: its ``status.restarts`` then
#: (jobset v0.12.0 ``pkg/constants/constants.go`` RestartsKey).
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"


def restart_attempt(pod: V1Pod) -> str:
    return (pod.metadata.labels or {}).get(RESTART_ATTEMPT_LABEL, "")


def restarts_made(pods: Iterable[V1Pod], phases: tuple[str, ...]) -> int:
    """The container restarts a backoffLimit counts: the restartCount of every container and
    init container of the pods in ``phases`` (a Job: Running or Pending, kubernetes
    ``pkg/controller/job/job_controller.go`` ``pastBackoffLimitOnFailure``; a PyTorchJob:
    Running, training-operator v1.9.0 ``pkg/core/job.go`` ``PastBackoffLimit``)."""
    made = 0
    for pod in pods:
        if pod.status is None or pod.status.phase not in phases:
            continue
        statuses = [
            *(pod.status.init_container_statuses or []),
            *(pod.status.container_statuses or []),
        ]
        made += sum(status.restart_count or 0 for status in statuses)
    return made


def in_place_restart(
    pod: V1Pod,
    pods: Iterable[V1Pod],
    backoff_limit: int | None,
    phases: tuple[str, ...],
    limit_name: str,
) -> str | None:
    """Under ``restartPolicy`` OnFailure or Always the kubelet starts a failed container again
    in place (``restartCount`` goes up as it starts: a container not running yet counts the
    restart it waits for), and the job's controller fails the job once the restarts of its
    pods reach ``backoff_limit`` (None: no limit; 0: any restart). Returns what will happen,
    or None when no restart can come; the restart that reaches the limit still comes, and the
    controller's Failed condition then ends the job by itself."""
    status = node_container(pod)
    running = bool(status and status.state and status.state.running)
    after = restarts_made(pods, phases) + (0 if running else 1)
    if backoff_limit is None:
        return f"the kubelet restarts it in place (restart {after}; {limit_name} sets no limit)"
    if after <= backoff_limit:
        return (
            f"the kubelet restarts it in place (restart {after} of {backoff_limit}, "
            f"{limit_name}, counted over every node)"
        )
    return None


def replacement_pod(pod: V1Pod, pods: Iterable[V1Pod], backoff_limit: int) -> str | None:
    """Under ``restartPolicy`` Never the Job controller makes a new pod for a failed index
    until more pods failed than ``backoff_limit`` (``job_controller.go`` ``syncJob``:
    ``exceedsBackoffLimit``). None when no replacement can come."""
    failed = {
        p.metadata.uid or p.metadata.name for p in pods if p.status and p.status.phase == "Failed"
    }
    failed.add(pod.metadata.uid or pod.metadata.name)
    if len(failed) <= backoff_limit:
        return (
            f"the Job controller replaces the pod (failure {len(failed)} of {backoff_limit}, "
            "the Job's backoffLimit)"
        )
    return None
