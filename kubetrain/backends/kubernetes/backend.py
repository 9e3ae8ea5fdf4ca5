"""The cluster backends: a job as a Kubeflow Trainer ``TrainJob`` (``trainer``), as a Training
Operator v1 ``PyTorchJob`` (``pytorchjob``, for clusters still on Training Operator 1.8/1.9),
as a KubeRay ``RayJob`` (``rayjob``: a Ray Train program on a RayCluster; its one node is the
submitter, whose log is the driver's output), or, on clusters without any, as an Indexed Job +
headless Service (``job``).

From the steps' point of view they behave like the local backend: ``launch`` returns at once
with the name, ``wait`` streams rank 0's log and ends Complete or Failed with the failing node's
exit code, ``logs`` reads the node pods, ``delete`` leaves nothing running. On top of that:

* launch checks everything before creating anything (the Trainer and its version, the
  runtime, rendering), makes the pipeline run's Workflow the owner, and adopts a job a retried
  step already created when its spec is the same;
* wait learns of completion from a watch event, not by polling; fails early, with the pod's
  events, on an image that cannot be pulled or a pod no node can take (after a grace period),
  a crash loop or an out-of-memory kill (when the job may not restart), and with the job's
  Warning event when it gets no pod at all; and on SIGTERM (a cancelled run) deletes or suspends
  the job (``BackendOptions.on_cancel``) before exiting 143;
* 403s name the missing permission, 5xx answers and dropped connections are retried (with
  jitter, after the server's Retry-After); a DELETE whose answer was lost is not "not found".
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import cached_property
from typing import Any

import kubernetes.client

from kubetrain import rules
from kubetrain.backends import BackendOptions
from kubetrain.backends.base import (
    FAILED,
    RUNNING,
    TERMINAL_STATES,
    JobRow,
    JobStatus,
    StallTimeout,
)
from kubetrain.backends.cancel import Cancelled, signals_cancel
from kubetrain.backends.kubernetes.client import (
    SERVICE_ACCOUNT_NAMESPACE_FILE,
    Action,
    ApiError,
    NotFound,
    RetryPolicy,
    load_api_client,
    pod_namespace,
    resolve_namespace,
)
from kubetrain.backends.kubernetes.kinds import (
    KINDS,
    JobKind,
    driver_failure,
    launcher_pod_selector,
)
from kubetrain.backends.kubernetes.launch import (
    KubeRayNotInstalled,
    TrainerNotInstalled,
    TrainingOperatorNotInstalled,
    adopt_or_refuse,
    check_runtime,
    create_or_adopt,
    is_mpi_runtime,
    node_resources,
    read_runtime,
    require_pytorchjob_api,
    require_rayjob_api,
    trainer_version,
)
from kubetrain.backends.kubernetes.logs import check_node, split_lines
from kubetrain.backends.kubernetes.objects import KubeObjects
from kubetrain.backends.kubernetes.owner import find_owner
from kubetrain.backends.kubernetes.pods import (
    PodProblem,
    first_failure,
    latest_by_node,
    list_job_pods,
    live_nodes,
    node_container,
    node_statuses,
)
from kubetrain.backends.kubernetes.wait import (
    CAUSE_LOG_LINES,
    NO_PODS_GRACE_SECONDS,
    Stalled,
    WaitContext,
    WaitSession,
    event_time,
    timestamp,
)
from kubetrain.backends.kubernetes.watch import WATCH_SECONDS
from kubetrain.errors import InvalidInput, JobNotFound, JobStalled, KubetrainError
from kubetrain.jobspec import TrainJobSpec
from kubetrain.progress import node_range
from kubetrain.render import render_job
from kubetrain.render.metadata import (
    JOB_NAME_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    validate_namespace,
)
from kubetrain.render.pod import default_checkpoint_dir
from kubetrain.render.script import script_configmap_name

EVENTS_SHOWN = 5
#: The backends whose job kind an operator serves (a missing API means it is not installed).
OPERATOR_BACKENDS = ("trainer", "pytorchjob", "rayjob")


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class KubernetesBackend:
    """``kind`` "trainer" (a TrainJob), "pytorchjob" (a PyTorchJob) or "job" (Indexed Job +
    Service), in
    ``options.namespace`` (empty: the one we run in, ``resolve_namespace``, with the pod's
    namespace read from ``namespace_file``). The client is created on first use (from the pod's
    ServiceAccount or KUBECONFIG) unless ``api_client`` is given; the grace periods say how
    long a node pod may fail to pull its image / be unschedulable (None: the options', see
    ``BackendOptions.unschedulable_grace``) and how long a job may have no pod before the wait
    looks for why and gives up."""

    def __init__(
        self,
        kind: str = "trainer",
        options: BackendOptions | None = None,
        api_client: kubernetes.client.ApiClient | None = None,
        *,
        retry: RetryPolicy | None = None,
        image_pull_grace: float = 60.0,
        unschedulable_grace: float | None = None,
        no_pods_grace: float = NO_PODS_GRACE_SECONDS,
        namespace_file: str = SERVICE_ACCOUNT_NAMESPACE_FILE,
        watch_seconds: int = WATCH_SECONDS,
        warn: Callable[[str], None] = _stderr,
    ) -> None:
        if kind not in KINDS:
            raise InvalidInput(
                "backend",
                f"{kind!r} is not a cluster backend",
                "use trainer, job, pytorchjob or rayjob",
            )
        self.kind: JobKind = KINDS[kind]
        self.options = (options or BackendOptions()).validate()
        self._api_client = api_client
        self.retry = retry or RetryPolicy()
        self.image_pull_grace = image_pull_grace
        self.unschedulable_grace = (
            self.options.unschedulable_grace if unschedulable_grace is None else unschedulable_grace
        )
        self.no_pods_grace = no_pods_grace
        self.namespace_file = namespace_file
        self.watch_seconds = watch_seconds
        self.warn = warn

    @cached_property
    def namespace(self) -> str:
        """The namespace of the jobs: the option's, else the one we run in."""
        return resolve_namespace(self.options.namespace, self.namespace_file)

    @cached_property
    def objects(self) -> KubeObjects:
        return KubeObjects(self._api_client or load_api_client(), self.retry)

    def wait_context(self) -> WaitContext:
        """What a ``WaitSession`` needs of this backend (it is not given the backend itself:
        ``wait`` must not import this module back)."""
        return WaitContext(
            objects=self.objects,
            kind=self.kind,
            namespace=self.namespace,
            watch_seconds=self.watch_seconds,
            image_pull_grace=self.image_pull_grace,
            unschedulable_grace=self.unschedulable_grace,
            warn=self.warn,
            no_pods_grace=self.no_pods_grace,
        )

    def default_checkpoint_dir(self, name: str) -> str:
        """``/mnt/shared/checkpoints/<name>``: on the shared PVC our runtimes mount at
        /mnt/shared in every node, so rank 0 writes where the collect step reads."""
        return default_checkpoint_dir(name)

    # ------------------------------------------------------------------------ launch
    def launch(self, spec: TrainJobSpec) -> str:
        spec = spec.validate()
        namespace = validate_namespace(self.namespace)
        version = ""
        runtime: dict[str, Any] = {}
        if self.kind.backend == "trainer":
            # Before any request: JobSet could never name this job's pods.
            rules.jobset_pod_names(spec.name, spec.replicated_jobs(), "name")
            version = trainer_version(
                self.objects, self.options.trainer_version, namespace, self.warn
            )
            runtime = check_runtime(self.objects, spec, namespace, self.warn)
        elif self.kind.backend == "pytorchjob":
            from kubetrain.render.pytorchjob import check_pytorchjob_spec

            # Before any request: names the operator could not give, initializers, env.
            check_pytorchjob_spec(spec)
            require_pytorchjob_api(self.objects, namespace)
        elif self.kind.backend == "rayjob":
            from kubetrain.render.rayjob import check_rayjob_spec

            # Before any request: a name KubeRay fails, env it overrides, the launcher.
            check_rayjob_spec(spec)
            require_rayjob_api(self.objects, namespace)
        elif spec.max_restarts:
            raise InvalidInput(
                "max_restarts",
                "the job backend cannot restart every node together (a JobSet can)",
                "use --backend trainer with a runtime whose failurePolicy allows restarts, "
                "or --max-restarts 0",
            )
        owner = find_owner(
            self.objects, namespace, self.warn, pod_namespace=pod_namespace(self.namespace_file)
        )
        rendered = self.render(spec, version, owner, node_resources(runtime))
        job = rendered[-1]
        try:
            existing = self.objects.get(job["apiVersion"], job["kind"], spec.name, namespace)
        except NotFound:
            create_or_adopt(self.objects, rendered, spec.name, self.kind.backend, namespace)
            return spec.name
        adopt_or_refuse(existing, job, self.kind.backend, namespace)
        state, _, _ = self.kind.state(existing)
        self.warn(
            f"kubetrain: {self.kind.kind} {spec.name} already exists with this spec (a retried "
            f"launch); using it (state {state})"
        )
        return spec.name

    def render(
        self,
        spec: TrainJobSpec,
        trainer_version: str,
        owner: dict[str, str] | None,
        runtime_resources: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """Every object of the job, in creation order (the job's own object last): the same
        list ``kubetrain render`` prints, from the one ``render_job``; ``runtime_resources``
        are the runtime's node container's (what Trainer < 2.3 replaces)."""
        return render_job(
            spec, self.kind.backend, self.namespace, trainer_version, owner, runtime_resources
        )

    # ------------------------------------------------------------------------ status
    def get_job(self, name: str) -> dict[str, Any]:
        try:
            return self.objects.get(self.kind.api_version, self.kind.kind, name, self.namespace)
        except NotFound as missing:
            raise self._no_such_job(name, missing) from None

    def _no_such_job(self, name: str, missing: NotFound) -> KubetrainError:
        if missing.resource_missing and self.kind.backend == "trainer":
            return TrainerNotInstalled()
        if missing.resource_missing and self.kind.backend == "pytorchjob":
            return TrainingOperatorNotInstalled()
        if missing.resource_missing and self.kind.backend == "rayjob":
            return KubeRayNotInstalled()
        return JobNotFound(
            f"no {self.kind.kind} named {name!r} in namespace {self.namespace}; check the name "
            f"and --namespace (`kubectl get {self.kind.plural} -n {self.namespace}`)"
        )

    def list_pods(self, name: str) -> list[kubernetes.client.V1Pod]:
        """The job's pods (``list_job_pods``, which a wait session calls too)."""
        return list_job_pods(self.objects, self.kind, self.namespace, name)

    def _state(
        self, job: dict[str, Any], pods: list[kubernetes.client.V1Pod]
    ) -> tuple[str, str, str]:
        """The object's conditions, and Running while undecided with a pod running."""
        state, reason, message = self.kind.state(job)
        if state not in TERMINAL_STATES and any(
            pod.status and pod.status.phase == "Running" for pod in pods
        ):
            state = RUNNING
        return state, reason, message

    def _job_pods(
        self, name: str, job: dict[str, Any]
    ) -> tuple[list[kubernetes.client.V1Pod], int]:
        """The pods whose state and logs are the job's, and how many nodes they are: an MPI
        TrainJob's launcher pod is its one node (its ``node`` pods run sshd; wait.py), a
        RayJob's submitter pod its one (the driver's output; ``kinds.RAYJOB``)."""
        if self.kind.backend == "rayjob":
            return self.list_pods(name), 1
        if self.kind.backend == "trainer":
            ref = (job.get("spec") or {}).get("runtimeRef") or {}
            try:
                runtime = read_runtime(
                    self.objects,
                    ref.get("kind") or "ClusterTrainingRuntime",
                    ref.get("name") or "",
                    self.namespace,
                )
            except ApiError:  # unreadable: taken for a torch runtime, as the wait takes it
                runtime = {}
            if is_mpi_runtime(runtime):
                listing = self.objects.call(
                    Action("list", "pods", namespace=self.namespace),
                    self.objects.core.list_namespaced_pod,
                    self.namespace,
                    label_selector=launcher_pod_selector(name),
                )
                return list(listing.items), 1
        return self.list_pods(name), _nodes_of(job)

    def status(self, name: str) -> JobStatus:
        job = self.get_job(name)
        pods, _ = self._job_pods(name, job)
        state, reason, message = self._state(job, pods)
        failure = first_failure(pods) if state == FAILED else None
        if state == FAILED and self.kind.backend == "rayjob":
            failure = driver_failure(job) or failure
        elastic = self.kind.elastic_nodes(job)
        nodes = node_statuses(pods)
        for node in nodes:
            if failure and node.rank == failure[0]:
                node.exit_code = failure[1]
        return JobStatus(
            name=name,
            state=state,
            reason=reason,
            message=message,
            nodes=nodes,
            failed_rank=failure[0] if failure else None,
            created_at=timestamp(job.get("metadata", {}).get("creationTimestamp")),
            node_range=node_range(*elastic) if elastic else "",
            live_nodes=live_nodes(pods) if elastic else None,
        )

    # -------------------------------------------------------------------------- wait
    def wait(
        self,
        name: str,
        timeout: float | None = None,
        on_log_line: Callable[[str], None] | None = None,
        stall_timeout: StallTimeout = None,
    ) -> JobStatus:
        """Follow the job to its end (see ``WaitSession``). With ``stall_timeout``, a running
        job that prints no rank-0 log line for that long is stopped as a cancelled wait
        stops it (``options.on_cancel``) and reported as ``JobStalled`` (exit 3). A pod
        problem that ends the session early is explained and acted on here (``fail_early``)."""
        with signals_cancel() as cancel:
            session = WaitSession(
                self.wait_context(),
                name,
                timeout=timeout,
                on_log_line=on_log_line,
                cancel=cancel,
                stall_timeout=stall_timeout,
            )
            try:
                result = session.run()
            except Stalled as stalled:
                outcome = self.release(name)
                raise JobStalled(
                    f"{self.kind.kind} {name} made no progress: no log line from rank 0 for "
                    f"{stalled.seconds:g}s while running (a stopped or hung rank); {outcome}; "
                    f"look at `kubetrain logs --backend {self.kind.backend} {name}`, or raise "
                    "--stall-timeout if the job may rightly be silent that long"
                ) from None
            except Cancelled as cancelled:
                outcome = self.release(name)
                raise KubetrainError(
                    f"stopped waiting for {self.kind.kind} {name}: cancelled by {cancelled}; "
                    f"{outcome}",
                    exit_code=128 + cancelled.signum,
                ) from None
            if result.problem is not None:
                return self.fail_early(name, result.problem, result.status)
            return result.status

    def release(self, name: str) -> str:
        """Stop a job we give up on (``options.on_cancel``): delete or suspend it. Returns what
        was done, for the message; never raises."""
        try:
            if self.options.on_cancel == "suspend":
                self.objects.patch(
                    self.kind.api_version,
                    self.kind.kind,
                    name,
                    self.namespace,
                    self.kind.suspend_patch(),
                )
                return (
                    f"suspended {self.kind.kind} {name} (delete it with `kubetrain delete "
                    f"--backend {self.kind.backend} --namespace {self.namespace} {name}`)"
                )
            self.delete(name)
            return f"deleted {self.kind.kind} {name} and its pods"
        except KubetrainError as error:
            return (
                f"could not {self.options.on_cancel} {self.kind.kind} {name} ({error}); remove "
                f"it with `kubetrain delete --backend {self.kind.backend} --namespace "
                f"{self.namespace} {name}`"
            )

    def fail_early(self, name: str, problem: PodProblem, status: JobStatus) -> JobStatus:
        """A pod problem that will not go away (a wait session's ``WaitResult.problem``):
        explain it (events, last log lines), release the job so it holds no resources, and
        report it as Failed. The log tail is kept long enough to hold the failing rank's
        exception, which `wait` names, not just torchrun's report after it."""
        events = self.pod_events(problem.pod) if problem.pod else ""
        tail = (
            self.read_log(problem.pod, CAUSE_LOG_LINES, problem.container)
            if problem.exit_code
            else []
        )
        outcome = self.release(name)
        message = problem.message
        if events:
            message += f"; events: {events}"
        status.state, status.reason = FAILED, problem.reason
        status.message = f"{message}; {outcome}, since it cannot finish by itself"
        status.failed_rank = problem.node
        for node in status.nodes:
            if node.rank == problem.node and problem.exit_code is not None:
                node.exit_code = problem.exit_code
        status.log_tail = tail
        return status

    def pod_events(self, pod: str) -> str:
        """The pod's latest events as "Reason: message; ..." (best effort)."""
        action = Action("list", "events", namespace=self.namespace)
        try:
            listing = self.objects.call(
                action,
                self.objects.core.list_namespaced_event,
                self.namespace,
                field_selector=f"involvedObject.name={pod}",
            )
        except ApiError:
            return ""
        events = sorted(listing.items, key=event_time)
        return "; ".join(f"{e.reason}: {e.message}" for e in events[-EVENTS_SHOWN:])

    # -------------------------------------------------------------------------- logs
    def read_log(self, pod: str, tail_lines: int | None = None, container: str = "") -> list[str]:
        """A pod's node-container log (or ``container``'s: a RayCluster pod's Ray container),
        or its previous run's while it waits to restart."""
        action = Action("get", "pods/log", name=pod, namespace=self.namespace)
        previous = False
        try:
            current = self.objects.call(
                Action("get", "pods", name=pod, namespace=self.namespace),
                self.objects.core.read_namespaced_pod,
                pod,
                self.namespace,
            )
            status = node_container(current)
            previous = bool(
                status and status.state and status.state.waiting and status.restart_count
            )
            extra = {"tail_lines": tail_lines} if tail_lines else {}
            response = self.objects.call(
                action,
                self.objects.core.read_namespaced_pod_log,
                pod,
                self.namespace,
                container=container or self.kind.container,
                previous=previous,
                _preload_content=False,
                **extra,
            )
        except NotFound:
            return []
        except ApiError as error:
            if error.status == 400:  # not started yet
                return []
            raise
        return list(split_lines([response.data]))

    def logs(self, name: str, node: int | None = None, follow: bool = False) -> Iterator[str]:
        job = self.get_job(name)  # JobNotFound first
        job_pods, nodes_count = self._job_pods(name, job)
        check_node(node, nodes_count, name)
        if follow:
            yield from self._follow_logs(name, node, nodes_count)
            return
        pods = latest_by_node(job_pods)
        if node is not None and node not in pods:
            raise KubetrainError(
                f"node {node} of {self.kind.kind} {name} has no pod (yet); wait for it with "
                f"`kubetrain logs {name} --node {node} --follow` (nodes with pods: "
                f"{sorted(pods) or 'none'})"
            )
        nodes = [node] if node is not None else sorted(pods)
        for index in nodes:
            for line in self.read_log(pods[index].metadata.name):
                yield f"[node-{index}] {line}" if len(nodes) > 1 else line

    def _follow_logs(self, name: str, node: int | None, nodes_count: int) -> Iterator[str]:
        """Lines of one node (or all, prefixed) as they come, until the job ends."""
        nodes = (node,) if node is not None else tuple(range(nodes_count))
        lines: queue.Queue = queue.Queue()
        done = object()
        session = WaitSession(
            self.wait_context(),
            name,
            timeout=None,
            on_log_line=lines.put,
            log_nodes=nodes,
            prefix_lines=len(nodes) > 1,
            fail_early=False,
        )
        errors: list[BaseException] = []

        def run() -> None:
            try:
                session.run()  # no pod problem to act on: fail_early=False
            except BaseException as error:  # re-raised in the consuming thread
                errors.append(error)
            finally:
                lines.put(done)

        thread = threading.Thread(target=run, name="logs-follow", daemon=True)
        thread.start()
        try:
            while (line := lines.get()) is not done:
                yield line
        finally:
            session.stop()
        if errors:
            raise errors[0]

    # -------------------------------------------------------------------------- list
    def list_jobs(self) -> list[JobRow]:
        """kubetrain's jobs of this kind in the namespace (labelled ``managed-by: kubetrain``,
        ``render.metadata.object_labels``), by name; one list of the jobs, then one of each
        job's pods to tell Running from Created, as ``status`` does."""
        namespace = self.namespace
        try:
            listing = self.objects.call(
                Action("list", self.kind.plural, self.kind.group, namespace=namespace),
                self.objects.custom.list_namespaced_custom_object,
                self.kind.group,
                self.kind.version,
                namespace,
                self.kind.plural,
                label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}",
            )
        except NotFound as missing:
            if missing.resource_missing and self.kind.backend in OPERATOR_BACKENDS:
                raise self._no_such_job("", missing) from None
            raise
        now = time.time()
        rows = []
        for job in sorted(listing.get("items") or [], key=lambda job: job["metadata"]["name"]):
            name = job["metadata"]["name"]
            state, _, _ = self._state(job, self.list_pods(name))
            created_at = timestamp(job["metadata"].get("creationTimestamp"))
            elastic = self.kind.elastic_nodes(job)
            nodes = node_range(*elastic) if elastic else _nodes_of(job)
            rows.append(JobRow(name, state, max(0.0, now - created_at), nodes))
        return rows

    # ------------------------------------------------------------------------ delete
    def delete(self, name: str) -> None:
        """The job, then its Service and script ConfigMap when they are ours. In the
        background: the garbage collector removes the JobSet and pods after the job is gone.
        Foreground deletion keeps a TrainJob, deletionTimestamp set, while its JobSet goes,
        and Trainer v2.3's reconcile has no deletionTimestamp guard, so it can build the
        JobSet again (trainer v2.3.0 ``pkg/controller/trainjob_controller.go`` Reconcile; the
        bug class of kubernetes-sigs/jobset#561)."""
        deleted = False
        try:
            self.objects.delete(
                self.kind.api_version, self.kind.kind, name, self.namespace, "Background"
            )
            deleted = True
        except NotFound as missing:
            if missing.resource_missing and self.kind.backend in OPERATOR_BACKENDS:
                raise self._no_such_job(name, missing) from None
        extras = [("v1", "ConfigMap", script_configmap_name(name))]
        if self.kind.backend == "job":
            extras.append(("v1", "Service", name))
        for api_version, kind, extra in extras:
            try:
                obj = self.objects.get(api_version, kind, extra, self.namespace)
                if (obj.get("metadata", {}).get("labels") or {}).get(JOB_NAME_LABEL) == name:
                    self.objects.delete(api_version, kind, extra, self.namespace, "Background")
                    deleted = True
            except NotFound:
                continue
        if not deleted:
            raise JobNotFound(
                f"no {self.kind.kind} named {name!r} in namespace {self.namespace}; nothing to "
                "delete: check the name and --namespace, or pass --ignore-not-found"
            )


def _nodes_of(job: dict[str, Any]) -> int:
    """Nodes of a TrainJob (``spec.trainer.numNodes``), a PyTorchJob (its replicas, each 1
    when unset: kubeflow/training-operator v1.9.0 ``pkg/apis/kubeflow.org/v1/
    pytorch_defaults.go``), a RayJob (its worker groups' replicas: the Ray worker nodes) or an
    Indexed Job (``completions``). ``numNodes`` is optional
    (trainer v2.3.0 ``pkg/apis/trainer/v1alpha1/trainjob_types.go``; the runtime's then
    applies), but the TrainJobs we render always carry it."""
    spec = job.get("spec") or {}
    worker_groups = (spec.get("rayClusterSpec") or {}).get("workerGroupSpecs")
    if worker_groups:
        return sum(int((group or {}).get("replicas") or 0) for group in worker_groups) or 1
    replica_specs = spec.get("pytorchReplicaSpecs")
    if replica_specs:
        return sum(int((r or {}).get("replicas", 1)) for r in replica_specs.values()) or 1
    return int((spec.get("trainer") or {}).get("numNodes") or spec.get("completions") or 1)
