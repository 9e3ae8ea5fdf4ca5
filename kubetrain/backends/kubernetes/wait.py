"""Following a job on a cluster to its end: the job object and its node pods are watched
(``watch``), node logs streamed (``logs``), and one thread decides.

The job is Complete or Failed when its conditions say so, as a watch event reports it. Before
that, the pods may show it will never finish by itself: an image that cannot be pulled or a
pod no node can take (after a grace period), a crash loop or an out-of-memory kill (at once);
then the wait ends early with that problem, which the backend explains (the pod's events) and
acts on. The failing node's exit code comes from its container's termination as the pod watch
saw it, even if the pod is gone later.

A TrainJob on an MPI runtime (``mlPolicy.mpi``: kubeflow/trainer v2.3.0 ``pkg/runtime/
framework/plugins/mpi/mpi.go``) is followed through its launcher: the trainer runs there
(``mpirun``, every rank's output in its log) and the job ends when it does (the runtime's
``successPolicy`` targets it; ``plugins/jobset/jobset.go`` ``Status`` copies the JobSet's
condition), while its ``node`` pods only run sshd. So the launcher's pod is the job's one node
for its state, exit code, restarts and log (its failure names the rank mpirun reports,
``mpirun_report``); the node pods are still looked at for problems (one that cannot start keeps
the launcher from ever being made: JobSet's ``dependsOn``). The runtime, read once the job is
known, says which: until then no pod is taken for the job's.

An elastic PyTorchJob (``elasticPolicy``, Worker replicas only: worker i is node i) ends by
the operator's conditions like any other. Node 0 (worker-0) is streamed: it hosts the
rendezvous, and torch's c10d rendezvous ranks the nodes by their sorted host names (torch
2.13 ``dynamic_rendezvous.py`` ``_mark_rendezvous_complete``), so rank 0 runs there while it is
in the job. A node lost and restarted in place meanwhile is no problem but a membership change,
said in one notice each (``_say_losses``).

A session holds a ``WaitContext`` (the API objects, the job kind, namespace and the wait's
settings), not the backend: the backend uses this module, so this module does not use it back.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.client import V1Pod

from kubetrain.backends.base import (
    FAILED,
    RUNNING,
    TERMINAL_STATES,
    UNSCHEDULABLE_GRACE_SECONDS,
    JobStatus,
    StallTimeout,
    stall_seconds,
)
from kubetrain.backends.cancel import Cancelled, CancelRequest
from kubetrain.backends.kubernetes.client import Action, ApiError
from kubetrain.backends.kubernetes.kinds import (
    JOB_RUNNING,
    JOBSET_NAME_LABEL,
    LAUNCHER,
    RAY_CLUSTER_LABEL,
    RAY_NODE_LABEL,
    REPLICA_TYPE_LABEL,
    REPLICATED_JOB_LABEL,
    JobKind,
    driver_failure,
    launcher_pod_selector,
)
from kubetrain.backends.kubernetes.launch import (
    is_gang,
    is_mpi_runtime,
    read_runtime,
    runtime_replicated_job_specs,
)
from kubetrain.backends.kubernetes.logs import LogFollower, split_lines
from kubetrain.backends.kubernetes.objects import KubeObjects
from kubetrain.backends.kubernetes.pods import (
    IN_PLACE,
    PodProblem,
    diagnose,
    diagnose_ray_node,
    exit_code,
    failed_run,
    first_failure,
    in_place_restart,
    last_termination,
    latest_by_node,
    list_job_pods,
    live_nodes,
    node_statuses,
    replacement_pod,
    restart_attempt,
    restart_count,
    running_node,
    terminated,
)
from kubetrain.backends.kubernetes.watch import Change, Failure, ListWatcher, Snapshot
from kubetrain.backends.mpirun_report import first_failure as first_mpirun_failure
from kubetrain.backends.torchrun_report import first_failure as first_rank_failure
from kubetrain.errors import KubetrainError
from kubetrain.progress import membership, node_range
from kubetrain.render.metadata import JOB_NAME_LABEL as OUR_JOB_NAME_LABEL

#: How often the deciding thread wakes without news (grace periods, deadline, cancellation).
TICK_SECONDS = 0.2
#: How long a finished job's log streams get to deliver their last lines.
LOG_DRAIN_SECONDS = 15.0
#: ... and when the wait fails early (a crash-looping node may keep restarting meanwhile).
EARLY_FAILURE_DRAIN_SECONDS = 2.0
#: A Job's backoffLimit when it sets none (kubernetes pkg/apis/batch/v1/defaults.go
#: SetDefaults_Job), and the phases of the pods whose container restarts it counts.
DEFAULT_BACKOFF_LIMIT = 6
#: A RayJob's submitter Job's backoffLimit when ``submitterConfig`` sets none (ray-project/
#: kuberay v1.7.0 ``rayjob_controller.go`` ``createNewK8sJob``).
SUBMITTER_BACKOFF_LIMIT = 2
JOB_COUNTED_PHASES = ("Running", "Pending")
#: How long a job may have no pod at all before the wait looks for why: the Trainer reports a
#: JobSet it cannot build (a name JobSet refuses, a missing PodGroup CRD, a quota) only as a
#: Warning event on the TrainJob, never as a condition (trainer v2.3.0
#: ``pkg/controller/trainjob_controller.go`` Reconcile: TrainJobResourcesCreationFailed); the
#: Job controller reports pods it cannot create as FailedCreate events on the Job.
NO_PODS_GRACE_SECONDS = 120.0
#: How often the job's events are read again while it still has no pod.
NO_PODS_RECHECK_SECONDS = 10.0
JOB, PODS, LAUNCHER_PODS, CLUSTER_PODS = "job", "pods", "launcher-pods", "cluster-pods"
#: The replicated job that runs mpirun under an MPI runtime (trainer v2.3.0
#: pkg/constants/constants.go ``Launcher``).
#: Lines read from the end of a failed node's log to name the rank that failed first (the
#: rank's ``[rankN]:`` traceback comes ~50 lines before the end of torchrun's report), and
#: how many failed nodes' logs are read for it (one request each).
CAUSE_LOG_LINES = 400
CAUSE_NODES = 8


def event_time(event: Any) -> float:
    """When an event last happened (core/v1 events the new events API wrote carry only
    ``eventTime``)."""
    stamp = event.last_timestamp or event.event_time or event.metadata.creation_timestamp
    return stamp.timestamp() if stamp is not None else 0.0


def timestamp(value: str | None) -> float:
    """Seconds since the epoch of an API timestamp (RFC 3339, UTC); 0 when absent."""
    if not value:
        return 0.0
    parsed = datetime.datetime.strptime(value[:19], "%Y-%m-%dT%H:%M:%S")
    return parsed.replace(tzinfo=datetime.timezone.utc).timestamp()


class Stalled(Exception):
    """The running job showed no progress for ``seconds``; the backend stops it and reports
    ``JobStalled``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no progress for {seconds:g}s")
        self.seconds = seconds


@dataclass(frozen=True)
class WaitContext:
    """What a wait needs of the backend, and no more: where the job is and the wait's
    settings (the grace periods a pod problem gets, how long one watch request lasts). The
    API objects' retry policy is the one the watchers and log followers use.

    ``unschedulable_grace`` None is "auto": UNSCHEDULABLE_GRACE_SECONDS, or no limit when the
    job's runtime schedules a gang; 0 is no limit. ``no_pods_grace``: how long a job may have
    no pod at all before its Warning events are read for why."""

    objects: KubeObjects
    kind: JobKind
    namespace: str
    watch_seconds: int
    image_pull_grace: float
    unschedulable_grace: float | None
    warn: Callable[[str], None]
    no_pods_grace: float = NO_PODS_GRACE_SECONDS


@dataclass(frozen=True)
class WaitResult:
    """How a wait ended: the job's final status, and the pod problem that ended it early
    (None when the job itself ended). The session only reports the problem; the backend
    explains it and releases the job (``KubernetesBackend.fail_early``)."""

    status: JobStatus
    problem: PodProblem | None = None


class WaitSession:
    """One wait (or one ``logs --follow``): start the watchers, decide, clean up. With
    ``fail_early`` False, pod problems are not looked for (the job's own end decides)."""

    def __init__(
        self,
        context: WaitContext,
        name: str,
        *,
        timeout: float | None,
        on_log_line: Callable[[str], None] | None,
        log_nodes: tuple[int, ...] = (0,),
        prefix_lines: bool = False,
        cancel: CancelRequest | None = None,
        fail_early: bool = True,
        stall_timeout: StallTimeout = None,
    ) -> None:
        self.context = context
        self.name = name
        self.kind = context.kind
        self.namespace = context.namespace
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.timeout = timeout
        self.cancel = cancel or CancelRequest()
        self.fail_early = fail_early
        self.events: queue.Queue = queue.Queue()
        self.stopped = threading.Event()
        self.job: dict[str, Any] | None = None
        self.job_seen = False
        self.job_deleted = False
        #: The pods whose state is the job's (its node pods, or an MPI job's launcher), and,
        #: as the watches last saw them, the node pods, the launcher pods and a RayJob's
        #: RayCluster's head and worker pods (of every cluster a retry made).
        self.pods: dict[str, V1Pod] = {}
        self.node_pods: dict[str, V1Pod] = {}
        self.launcher_pods: dict[str, V1Pod] = {}
        self.cluster_pods: dict[str, V1Pod] = {}
        #: Whether the job is an MPI TrainJob (followed through its launcher); None until its
        #: runtime is known.
        self.mpi: bool | None = None if context.kind.backend == "trainer" else False
        self.failure: tuple[int, int] | None = None  # (node, exit code) of the first failure
        self.problem_since: dict[tuple[str, str], float] = {}
        #: Since when the job has had no pod at all (None once it has one), and when its
        #: events are to be read next.
        self.no_pods_since: float | None = None
        self.events_due = 0.0
        self.no_pods_warned = False
        #: The reasons of the pod problems already said (``_problem``), and the failed runs
        #: said to be restarted: (pod, restart count, reason).
        self.problems_said: set[str] = set()
        self.restarts_said: set[tuple[str, int, str]] = set()
        #: The node runs an elastic job lost that were said (``_say_losses``): (pod uid, the
        #: run's start and end).
        self.losses_said: set[tuple[str, str, str]] = set()
        #: ... and the restarts of a node's container said (pod uid, restart count).
        self.returns_said: set[tuple[str, int]] = set()
        self._unschedulable_grace: float | None = None
        self._runtime_object: dict[str, Any] | None = None
        self.watchers = [self._job_watcher(), self._pod_watcher()]
        if self.kind.backend == "rayjob":
            self.watchers.append(self._pod_watcher(CLUSTER_PODS))
        self.followers: dict[int, LogFollower] = {}
        self.stall_timeout = stall_timeout
        #: Since when the running job has shown no progress (None while it is not running).
        self.quiet_since: float | None = None
        if stall_timeout is not None and on_log_line is None:
            on_log_line, log_nodes = (lambda line: None), (0,)  # follow rank 0 to see progress
        if on_log_line is not None:
            for node in log_nodes:
                line_to = self._prefixed(on_log_line, node) if prefix_lines else on_log_line
                if node == 0 and stall_timeout is not None:
                    line_to = self._noting_progress(line_to)
                self.followers[node] = LogFollower(
                    context.objects.core,
                    self.namespace,
                    line_to,
                    retry=context.objects.retry,
                    container=self.kind.container,
                    warn=context.warn,
                )

    def _noting_progress(self, on_line: Callable[[str], None]) -> Callable[[str], None]:
        def noted(line: str) -> None:
            self.quiet_since = time.monotonic()
            on_line(line)

        return noted

    def _stalled(self) -> float | None:
        """The stall limit passed, when the job has been running with no new rank-0 log line
        for that long (time spent pending or restarting does not count; a log that cannot be
        read at all, e.g. no permission on pods/log, is no sign of a stall); else None."""
        limit = stall_seconds(self.stall_timeout)
        if limit is None:
            return None
        follower = self.followers.get(0)
        if follower is None or not follower.is_alive():
            return None  # rank 0's log cannot be read (it said why): no progress to judge
        if self._current_state() != RUNNING:
            self.quiet_since = None
            return None
        now = time.monotonic()
        if self.quiet_since is None:
            self.quiet_since = now
        return limit if now - self.quiet_since > limit else None

    @staticmethod
    def _prefixed(on_line: Callable[[str], None], node: int) -> Callable[[str], None]:
        return lambda line: on_line(f"[node-{node}] {line}")

    def _job_watcher(self) -> ListWatcher:
        kind = self.kind
        return ListWatcher(
            JOB,
            self.events,
            Action("watch", kind.plural, kind.group, self.name, self.namespace),
            self.context.objects.custom.list_namespaced_custom_object,
            kind.group,
            kind.version,
            self.namespace,
            kind.plural,
            retry=self.context.objects.retry,
            watch_seconds=self.context.watch_seconds,
            field_selector=f"metadata.name={self.name}",
        )

    def _pod_watcher(self, source: str = PODS) -> ListWatcher:
        return ListWatcher(
            source,
            self.events,
            Action("watch", "pods", "", namespace=self.namespace),
            self.context.objects.core.list_namespaced_pod,
            self.namespace,
            retry=self.context.objects.retry,
            watch_seconds=self.context.watch_seconds,
            label_selector=self._pod_selector(source),
        )

    def _pod_selector(self, source: str) -> str:
        if source == LAUNCHER_PODS:
            return launcher_pod_selector(self.name)
        if source == CLUSTER_PODS:  # KubeRay's label and ours, on every head and worker pod
            return f"{RAY_NODE_LABEL}=yes,{OUR_JOB_NAME_LABEL}={self.name}"
        return self.kind.pod_selector(self.name)

    # ------------------------------------------------------------------------ running
    def run(self) -> WaitResult:
        """Follow the job until it ends (or a pod problem ends the wait early: its node's last
        log lines are drained first) and return how; raises on a timeout, ``Cancelled``,
        ``Stalled``, stop() or an API error. The watchers are stopped on return."""
        for thread in [*self.watchers, *self.followers.values()]:
            thread.start()
        try:
            while True:
                if self.cancel.signum is not None:
                    raise Cancelled(self.cancel.signum)
                if self.stopped.is_set():  # stop() from another thread (logs --follow closed)
                    raise KubetrainError(
                        f"stopped following {self.kind.kind} {self.name}; follow it again "
                        f"with `kubetrain logs --follow --backend {self.kind.backend} "
                        f"--namespace {self.namespace} {self.name}`"
                    )
                self._drain_events()
                decision = self._decide()
                if decision is not None:
                    status, problem = decision
                    if problem is None:
                        self._drain_logs(LOG_DRAIN_SECONDS)
                        return WaitResult(status)
                    self._drain_logs(EARLY_FAILURE_DRAIN_SECONDS)
                    return WaitResult(status, problem)
                if (limit := self._stalled()) is not None:
                    raise Stalled(limit)
                if self.deadline is not None and time.monotonic() > self.deadline:
                    raise KubetrainError(
                        f"timed out after {self.timeout:g}s waiting for {self.kind.kind} "
                        f"{self.name} (state {self._current_state()}); raise --timeout or look "
                        f"at `kubetrain logs --backend {self.kind.backend} {self.name}`",
                        exit_code=124,
                    )
        finally:
            self.stop()

    def stop(self) -> None:
        """End the watchers and log followers (and run(), if another thread runs it)."""
        self.stopped.set()
        for thread in [*self.watchers, *self.followers.values()]:
            thread.stop()

    def _drain_events(self) -> None:
        """Apply every message waiting (blocking one tick for the first)."""
        try:
            message = self.events.get(timeout=TICK_SECONDS)
        except queue.Empty:
            return
        while True:
            self._apply(message)
            try:
                message = self.events.get_nowait()
            except queue.Empty:
                return

    def _apply(self, message: Snapshot | Change | Failure) -> None:
        if isinstance(message, Failure):
            raise message.error
        if message.source == JOB:
            self._apply_job(message)
        else:
            self._apply_pods(message)

    def _apply_job(self, message: Snapshot | Change) -> None:
        if isinstance(message, Snapshot):
            if not message.items and not self.job_seen:
                raise KubetrainError(
                    f"no {self.kind.kind} named {self.name!r} in namespace {self.namespace}; "
                    f"check the name and --namespace (`kubectl get {self.kind.plural} -n "
                    f"{self.namespace}`)"
                )
            self.job = message.items[0] if message.items else None
        elif message.type == "DELETED":
            self.job = None
        else:
            self.job = message.obj
        self.job_seen = True
        self.job_deleted = self.job is None
        if self.mpi is None and self.job is not None:
            self.mpi = is_mpi_runtime(self._runtime())
            if self.mpi:
                watcher = self._pod_watcher(LAUNCHER_PODS)
                self.watchers.append(watcher)
                if not self.stopped.is_set():
                    watcher.start()
            self._follow_pods()

    def _apply_pods(self, message: Snapshot | Change) -> None:
        pods = {LAUNCHER_PODS: self.launcher_pods, CLUSTER_PODS: self.cluster_pods}.get(
            message.source, self.node_pods
        )
        if isinstance(message, Snapshot):
            pods.clear()
            pods.update({pod.metadata.uid or pod.metadata.name: pod for pod in message.items})
        elif message.type == "DELETED":
            pods.pop(message.obj.metadata.uid or message.obj.metadata.name, None)
        else:
            pods[message.obj.metadata.uid or message.obj.metadata.name] = message.obj
        self._follow_pods()

    def _follow_pods(self) -> None:
        """Take the job's pods (once it is known which) and give the followers theirs."""
        if self.mpi is None:
            return
        self.pods = self.launcher_pods if self.mpi else self.node_pods
        if self.failure is None:
            self.failure = first_failure(self.pods.values())
        latest = latest_by_node(self.pods.values())
        for node, follower in self.followers.items():
            follower.update(latest.get(node))

    # ----------------------------------------------------------------------- deciding
    def _current_state(self) -> str:
        if self.job is None:
            return "unknown"
        state, _, _ = self.kind.state(self.job)
        if state not in TERMINAL_STATES and self._pods_running():
            return RUNNING
        return state

    def _pods_running(self) -> bool:
        return any(pod.status and pod.status.phase == "Running" for pod in self.pods.values())

    def _decide(self) -> tuple[JobStatus, PodProblem | None] | None:
        """The final status (and the pod problem that ended it early), or None to go on."""
        if not self.job_seen:
            return None
        if self.job_deleted:
            message = f"the {self.kind.kind} was deleted while we waited for it"
            return self._status(FAILED, "Deleted", message), None
        state, reason, message = self.kind.state(self.job)
        if state in TERMINAL_STATES:
            self._catch_up_pods()
            return self._status(state, reason, message), None
        self._say_losses()
        if self.fail_early:
            problem = self._problem()
            if problem is not None:
                return self._status(FAILED, problem.reason, problem.message), problem
        return None

    def _problem(self) -> PodProblem | None:
        """A pod problem that has outlasted its grace period (said when the first of its reason
        starts, if it has one), or the reason a job with no pod at all will get none."""
        now = time.monotonic()
        seen: set[tuple[str, str]] = set()
        expired = None
        watched = [(pod, False) for pod in latest_by_node(self.pods.values()).values()]
        if self.mpi:  # a node pod that cannot start keeps the launcher from being made
            watched += [(pod, False) for pod in latest_by_node(self.node_pods.values()).values()]
        watched += [(pod, True) for pod in self._ray_cluster_pods()]
        for pod, ray_node in watched:
            problem = diagnose_ray_node(pod) if ray_node else diagnose(pod)
            if problem is None:
                continue
            restart = self._ray_node_restart if ray_node else self._restart_coming
            if problem.restartable and (coming := restart(pod)) is not None:
                self._say_restart(pod, problem, coming)
                continue
            key = (problem.pod, problem.reason)
            seen.add(key)
            grace = self._grace_seconds(problem.grace)
            if grace > 0 and problem.reason not in self.problems_said:
                self.problems_said.add(problem.reason)  # once, not once per node
                self.context.warn(f"kubetrain: {problem.message}; {self._waiting(problem, grace)}")
            since = self.problem_since.setdefault(key, now)
            if now - since >= grace and expired is None:
                expired = problem
                if grace > 0:
                    message = f"{problem.message} (still after {grace:g}s)"
                    expired = dataclasses.replace(problem, message=message)
        for key in set(self.problem_since) - seen:
            del self.problem_since[key]
        return expired or self._no_pods_problem(now)

    def _ray_cluster_pods(self) -> list[V1Pod]:
        """The head and worker pods of the RayJob's current RayCluster (``status.
        rayClusterName``, set as it starts Initializing and cleared for a retry: KubeRay v1.7.0
        ``rayjob_controller.go`` ``initRayJobStatusIfNeed``; a retried job's old cluster is
        being deleted)."""
        cluster = ((self.job or {}).get("status") or {}).get("rayClusterName")
        if not cluster:
            return []
        return [
            pod
            for pod in self.cluster_pods.values()
            if (pod.metadata.labels or {}).get(RAY_CLUSTER_LABEL) == cluster
        ]

    def _ray_node_restart(self, pod: V1Pod) -> str | None:
        """What comes of a Ray head's or worker's failed run (a crash loop, an out-of-memory
        kill, a failed init container), or None when nothing good will. The kubelet restarts
        it in place for ever (KubeRay v1.7.0 gives the pods no restartPolicy, so Always, but
        with autoscaler v2, ``common/pod.go`` ``DefaultHeadPodTemplate``; and replaces none that
        can restart, ``raycluster_controller.go`` ``shouldDeletePod``), while the RayJob stays
        Initializing until its cluster is Ready, which a node failing the same way each time
        (its image and ``ray start`` do not change) never is: no end but a deadline. Once the
        Ray job runs, a lost node is Ray's to survive or not (Ray Train's FailureConfig), and
        the RayJob's status says how the job ends; a node that runs again is back."""
        job_status = ((self.job or {}).get("status") or {}).get("jobStatus")
        if job_status == JOB_RUNNING:
            return (
                "the kubelet restarts it in place; the Ray job runs on, and its RayJob's status "
                "says whether it survives the loss"
            )
        if running_node(pod):
            return "the kubelet restarted it in place and it runs again"
        return None

    def _grace_seconds(self, grace: str) -> float:
        """How long a pod problem with this ``PodProblem.grace`` may last (0: none; infinity:
        no limit)."""
        if grace == "image_pull":
            return self.context.image_pull_grace
        if grace == "gang":  # the group waits for its last pod: no limit unless one is set
            chosen = self.context.unschedulable_grace
            return math.inf if chosen is None else chosen or math.inf
        if grace == "unschedulable":
            if self._unschedulable_grace is None:
                grace = self._grace_for_unschedulable()
                if self.job is None and self.kind.backend == "trainer":
                    return grace  # asked again once the job is known
                self._unschedulable_grace = grace
            return self._unschedulable_grace
        return 0.0

    def _grace_for_unschedulable(self) -> float:
        """The option, else no limit for a gang runtime, else UNSCHEDULABLE_GRACE_SECONDS;
        decided once the job (and so its runtime) is known."""
        chosen = self.context.unschedulable_grace
        if chosen is not None:
            return chosen or math.inf
        if self.kind.backend == "trainer" and self.job is None:
            return math.inf  # not decided yet: the job's runtime is not known
        return math.inf if is_gang(self._runtime()) else UNSCHEDULABLE_GRACE_SECONDS

    def _runtime(self) -> dict[str, Any]:
        """The TrainJob's runtime, read once (best effort: one we cannot read, or a batch Job,
        is an empty runtime: no gang, no restarts)."""
        if self._runtime_object is None:
            if self.kind.backend != "trainer" or self.job is None:
                return {}
            ref = (self.job.get("spec") or {}).get("runtimeRef") or {}
            try:
                self._runtime_object = read_runtime(
                    self.context.objects,
                    ref.get("kind") or "ClusterTrainingRuntime",
                    ref.get("name") or "",
                    self.namespace,
                )
            except ApiError:
                self._runtime_object = {}
        return self._runtime_object

    def _waiting(self, problem: PodProblem, grace: float) -> str:
        """What the wait does about a problem it gives time, for the line that says so."""
        unschedulable = problem.grace in ("unschedulable", "gang")
        option = "--unschedulable-grace-seconds" if unschedulable else ""
        if grace < math.inf:
            limit = f" ({option})" if option else ""
            return f"waiting up to {grace:g}s for it to clear{limit}"
        if self.context.unschedulable_grace is not None:
            why = "no limit was set"
        elif problem.grace == "gang":
            why = "its pod group is scheduled as a gang: it waits until the whole group fits"
        else:
            why = "the runtime schedules a gang: its pods wait until the whole group fits"
        return f"waiting for it to clear with no time limit ({why}; {option} sets one)"

    def _say_losses(self) -> None:
        """The membership changes of an elastic PyTorchJob the pods show, one notice each, in
        the local backend's words ("continuing with 1 of 1..2 nodes"; the live bar reads the
        count, ``progress.parse_membership``): a node run lost (its container ended with a
        non-zero code while the job goes on; the other nodes' torchruns see a lost peer and
        restart their workers at the new world size), and the lost node's container running
        again after the kubelet restarted it in place (``restartPolicy`` OnFailure, within
        ``runPolicy.backoffLimit``), when its torchrun joins the next rendezvous round. The
        rendezvous itself cannot be seen from here, only the pods: a node is counted from its
        container running again. A run is known by its termination's start and end, the same
        from its end through the back-off to the restart."""
        elastic = self.kind.elastic_nodes(self.job or {})
        if elastic is None:
            return
        nodes = node_range(*elastic)
        latest = latest_by_node(self.pods.values())
        running = {index for index, pod in latest.items() if running_node(pod)}
        for index, pod in sorted(latest.items()):
            uid = pod.metadata.uid or pod.metadata.name
            ended = last_termination(pod)
            if ended is not None and ended.exit_code:
                run = (uid, str(ended.started_at), str(ended.finished_at))
                if run not in self.losses_said:
                    self.losses_said.add(run)
                    self.context.warn(
                        f"kubetrain: {self._loss(index, pod, ended.exit_code, running, nodes)}"
                    )
            count = restart_count(pod)
            if index in running and count and (uid, count) not in self.returns_said:
                self.returns_said.add((uid, count))
                self.context.warn(
                    f"kubetrain: node {index} running again (its container's restart {count}); "
                    f"{membership(len(running), nodes)} once it rejoins the rendezvous"
                )

    def _loss(self, index: int, pod: V1Pod, code: int, running: set[int], nodes: str) -> str:
        """The notice of node ``index`` lost with ``code``, ``running`` the nodes running."""
        lost = f"node {index} lost (exit code {code})"
        left = len(running - {index})
        coming = self._restart_coming(pod)
        if coming is None:
            return (
                f"{lost}; {membership(left, nodes)} left; it is not restarted (restartPolicy "
                "Never, or runPolicy.backoffLimit reached), so the operator fails the job"
            )
        return f"{lost}; continuing with {membership(left, nodes)}; {coming} to rejoin"

    def _say_restart(self, pod: V1Pod, problem: PodProblem, coming: str) -> None:
        """One line per failed run (a pod's container run, counted by its restartCount) that
        the runtime runs again: no reason to end the wait, the job's own Failed condition
        says when its restarts run out. An elastic job's crash-looping node was said lost
        (``_say_losses``)."""
        if problem.reason == "CrashLoopBackOff" and self.kind.elastic_nodes(self.job or {}):
            return
        key = (pod.metadata.name, failed_run(pod), problem.reason)
        if key not in self.restarts_said:
            self.restarts_said.add(key)
            self.context.warn(f"kubetrain: {problem.message}; {coming}")

    def _restart_coming(self, pod: V1Pod) -> str | None:
        """What will run this failed node again, or None when nothing will: the kubelet in
        place (the pod's ``restartPolicy`` OnFailure or Always; JobSet v0.12.0 defaults a
        runtime's to OnFailure, ``pkg/webhooks/jobset_webhook.go`` ``Default``) or the Job
        controller with a new pod (Never) while the Job's ``backoffLimit`` allows (6 when
        unset: kubernetes ``pkg/apis/batch/v1/defaults.go``), else JobSet restarting every
        node while its ``failurePolicy.maxRestarts`` allows; for a PyTorchJob, the replica's
        restartPolicy and ``runPolicy.backoffLimit``. A TrainJob's limits are its runtime's (a
        TrainJob cannot patch them); one that cannot be read counts as Kubernetes' defaults:
        the wait then waits for the job's own end rather than end it early."""
        policy = (pod.spec.restart_policy if pod.spec else None) or "Always"
        attempt = restart_attempt(pod)
        launcher = (pod.metadata.labels or {}).get(REPLICATED_JOB_LABEL) == LAUNCHER
        pool = self.launcher_pods if launcher else self.node_pods
        pods = [p for p in pool.values() if restart_attempt(p) == attempt]
        if self.kind.backend == "pytorchjob":
            return self._operator_restart(pod, policy, pods)
        limit = self._backoff_limit(pod)
        if policy in IN_PLACE:
            coming = in_place_restart(
                pod, pods, limit, JOB_COUNTED_PHASES, "the Job's backoffLimit"
            )
        else:
            coming = replacement_pod(pod, pods, limit)
        return coming or self._jobset_restart(attempt)

    def _backoff_limit(self, pod: V1Pod) -> int:
        """The backoffLimit of the Job the pod belongs to: a batch Job's own, for a TrainJob
        the runtime's replicated job the pod runs in, for a RayJob its submitter Job's."""
        if self.kind.backend == "trainer":
            name = (pod.metadata.labels or {}).get(REPLICATED_JOB_LABEL)
            job = next(
                (j for j in runtime_replicated_job_specs(self._runtime()) if j[0] == name), None
            )
            limit = job[1].get("backoffLimit") if job else None
        elif self.kind.backend == "rayjob":  # the submitter Job's (createNewK8sJob)
            config = ((self.job or {}).get("spec") or {}).get("submitterConfig") or {}
            limit = config.get("backoffLimit", SUBMITTER_BACKOFF_LIMIT)
        else:
            limit = ((self.job or {}).get("spec") or {}).get("backoffLimit")
        return DEFAULT_BACKOFF_LIMIT if limit is None else int(limit)

    def _jobset_restart(self, attempt: str) -> str | None:
        """JobSet restarts every node after a Job fails while ``failurePolicy.maxRestarts``
        allows (jobset v0.12.0 ``pkg/controllers/failure_policy.go``
        ``restartJobSetActionApplier``; the pods' restart-attempt label is its
        ``status.restarts``); a rule whose action ignores the limit always allows one."""
        if self.kind.backend != "trainer":
            return None
        jobset = ((self._runtime().get("spec") or {}).get("template") or {}).get("spec") or {}
        policy = jobset.get("failurePolicy")
        if policy is None:
            return None
        made = int(attempt) if attempt.isdigit() else 0
        allowed = int(policy.get("maxRestarts") or 0)
        unlimited = any(
            str(rule.get("action", "")).endswith("AndIgnoreMaxRestarts")
            for rule in policy.get("rules") or []
        )
        if unlimited or made < allowed:
            return (
                f"JobSet restarts every node (restart {made + 1} of {allowed}, its "
                "failurePolicy.maxRestarts)"
            )
        return None

    def _operator_restart(self, pod: V1Pod, policy: str, pods: list[V1Pod]) -> str | None:
        """A PyTorchJob's replica restarts as its restartPolicy says (training-operator v1.9.0
        ``pkg/controller.v1/common/pod.go`` ``ReconcilePods``; ``pkg/core/pod.go``
        ``SetRestartPolicy`` gives the pod Never for ExitCode): OnFailure and Always in place
        within ``runPolicy.backoffLimit`` (none when unset), ExitCode with a new pod when the
        exit code is retryable (128 and above, a signal such as the OOM killer's), Never not
        at all."""
        spec = (self.job or {}).get("spec") or {}
        replica_type = (pod.metadata.labels or {}).get(REPLICA_TYPE_LABEL, "")
        replica = (spec.get("pytorchReplicaSpecs") or {}).get(replica_type.capitalize()) or {}
        replica_policy = replica.get("restartPolicy") or policy
        if replica_policy == "ExitCode":
            code = exit_code(pod)
            if code is not None and code >= 128:
                return (
                    f"the operator makes a new pod (exit code {code} is retryable under "
                    "restartPolicy ExitCode)"
                )
            return None
        if replica_policy not in IN_PLACE:
            return None
        limit = (spec.get("runPolicy") or {}).get("backoffLimit")
        return in_place_restart(
            pod, pods, limit, ("Running",), "the PyTorchJob's runPolicy.backoffLimit"
        )

    def _no_pods_problem(self, now: float) -> PodProblem | None:
        """Why the job has had no pod for ``no_pods_grace``: its latest Warning event (read
        every NO_PODS_RECHECK_SECONDS); without one, it is said once and the wait goes on."""
        _, reason, _ = self.kind.state(self.job or {})
        if self.node_pods or self.launcher_pods or self.cluster_pods or reason == "Suspended":
            self.no_pods_since = None
            return None
        if self.no_pods_since is None:
            self.no_pods_since = now
        waited = now - self.no_pods_since
        if waited < self.context.no_pods_grace or now < self.events_due:
            return None
        self.events_due = now + NO_PODS_RECHECK_SECONDS
        if self._has_other_pods():
            return None  # e.g. an initializer runs first; the node pods come after it
        warning = self._latest_warning()
        if warning is not None:
            reason, message = warning
            return PodProblem(
                reason,
                f"the {self.kind.kind} has no pods after {waited:.0f}s; its Warning event "
                f"{reason} says: {message}",
                "",
                None,
            )
        if not self.no_pods_warned:
            self.no_pods_warned = True
            self.context.warn(
                f"kubetrain: {self.kind.kind} {self.name} has no pods after {waited:.0f}s and "
                f"no Warning event says why; still waiting (`kubectl describe "
                f"{self.kind.plural} -n {self.namespace} {self.name}`)"
            )
        return None

    def _has_other_pods(self) -> bool:
        """Whether the job has pods the watch does not follow: a TrainJob's initializers'
        (trainer v2.3.0 runtimes start the node job after them, JobSet ``dependsOn``). A
        RayJob's RayCluster's pods are watched (``cluster_pods``)."""
        if self.kind.backend != "trainer":
            return False
        selector = f"{JOBSET_NAME_LABEL}={self.name}"
        objects = self.context.objects
        try:
            listing = objects.call(
                Action("list", "pods", namespace=self.namespace),
                objects.core.list_namespaced_pod,
                self.namespace,
                label_selector=selector,
            )
        except ApiError:
            return False
        return bool(listing.items)

    def _latest_warning(self) -> tuple[str, str] | None:
        """(reason, message) of the newest Warning event about this job (this uid: an event of
        an earlier job of the same name lives on for an hour), its JobSet or one of the
        JobSet's Jobs (``<job>-<replicatedJob>-<index>``: where the Job controller reports a
        quota or admission refusal as FailedCreate), best effort."""
        objects = self.context.objects
        try:
            listing = objects.call(
                Action("list", "events", namespace=self.namespace),
                objects.core.list_namespaced_event,
                self.namespace,
                field_selector="type=Warning",
            )
        except ApiError:
            return None
        uid = ((self.job or {}).get("metadata") or {}).get("uid")
        warnings = [
            event
            for event in listing.items
            if event.type == "Warning" and self._about_this_job(event.involved_object, uid)
        ]
        if not warnings:
            return None
        latest = max(warnings, key=event_time)
        return latest.reason or "", latest.message or ""

    def _about_this_job(self, involved: Any, uid: str | None) -> bool:
        if involved is None:
            return False
        if involved.kind == self.kind.kind and involved.name == self.name:
            return not (uid and involved.uid and involved.uid != uid)
        if self.kind.backend != "trainer":
            return False
        return (involved.kind == "JobSet" and involved.name == self.name) or (
            involved.kind == "Job" and (involved.name or "").startswith(f"{self.name}-")
        )

    def _catch_up_pods(self) -> None:
        """The job's end can arrive before its pods' (two watches): if a pod still looks
        alive, list them once, so exit codes and the log followers see how they ended."""
        latest = latest_by_node(self.pods.values()).values()
        if latest and all(terminated(pod) for pod in latest):
            return
        source = LAUNCHER_PODS if self.mpi else PODS
        try:
            if source == PODS:
                pods = list_job_pods(self.context.objects, self.kind, self.namespace, self.name)
            else:
                objects = self.context.objects
                pods = objects.call(
                    Action("list", "pods", namespace=self.namespace),
                    objects.core.list_namespaced_pod,
                    self.namespace,
                    label_selector=self._pod_selector(source),
                ).items
        except KubetrainError:
            return  # best effort: the status is decided already
        self._apply_pods(Snapshot(source, list(pods)))

    def _status(self, state: str, reason: str, message: str) -> JobStatus:
        pods = list(self.pods.values())
        nodes = node_statuses(pods)
        failure = self.failure or first_failure(pods)
        if state == FAILED and self.kind.backend == "rayjob":
            failure = driver_failure(self.job or {}) or failure
        failed_rank = None
        if state == FAILED and failure is not None:
            failed_rank, code = failure
            for node in nodes:
                if node.rank == failed_rank:
                    node.exit_code = code
            if found := self._failing_rank(pods):
                failed_rank, named = found
                if named not in message:  # a condition may quote it (our fake Trainer's does)
                    message = f"{message}; {named}"
        metadata = (self.job or {}).get("metadata") or {}
        elastic = self.kind.elastic_nodes(self.job or {})
        return JobStatus(
            name=self.name,
            state=state,
            reason=reason,
            message=message,
            nodes=nodes,
            failed_rank=failed_rank,
            created_at=timestamp(metadata.get("creationTimestamp")),
            finished_at=time.time() if state in TERMINAL_STATES else None,
            node_range=node_range(*elastic) if elastic else "",
            live_nodes=live_nodes(pods) if elastic else None,
        )

    def _failing_rank(self, pods: list[V1Pod]) -> tuple[int, str] | None:
        """(node, "[rank 2] RuntimeError: boom") for the rank that failed first, read from the
        failed nodes' log tails (``torchrun_report.first_failure``: the node whose container
        ended first is not always the one whose rank failed first); None when they name
        nothing but a peer's going away, or cannot be read (best effort)."""
        failed = [(i, p) for i, p in sorted(latest_by_node(pods).items()) if exit_code(p)]
        node_logs = {}
        for index, pod in failed[:CAUSE_NODES]:
            name = pod.metadata.name
            try:
                response = self.context.objects.call(
                    Action("get", "pods/log", name=name, namespace=self.namespace),
                    self.context.objects.core.read_namespaced_pod_log,
                    name,
                    self.namespace,
                    container=self.kind.container,
                    tail_lines=CAUSE_LOG_LINES,
                    _preload_content=False,
                )
            except KubetrainError:
                continue
            node_logs[index] = list(split_lines([response.data]))
        if self.mpi:  # the launcher's node: the rank is named in the message
            index = next(iter(node_logs), 0)
            launcher = first_mpirun_failure(node_logs.get(index, []), self._procs_per_node())
            return (index, launcher.describe()) if launcher is not None else None
        found = first_rank_failure(node_logs)
        if found is None or found[1].consequence:
            return None
        return found[0], found[1].describe()

    def _procs_per_node(self) -> int:
        """An MPI job's slots per host: the TrainJob's numProcPerNode, else its runtime's
        (``mpi.go`` ``EnforceMLPolicy``); 1 when neither says."""
        trainer = ((self.job or {}).get("spec") or {}).get("trainer") or {}
        policy = ((self._runtime().get("spec") or {}).get("mlPolicy") or {}).get("mpi") or {}
        value = trainer.get("numProcPerNode") or policy.get("numProcPerNode") or 1
        try:
            return max(1, int(value))
        except (TypeError, ValueError):
            return 1

    def _drain_logs(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        for follower in self.followers.values():
            follower.finish(max(0.0, deadline - time.monotonic()))
