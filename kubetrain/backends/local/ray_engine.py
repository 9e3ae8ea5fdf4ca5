"""A ``--launcher ray`` job on this machine, played as KubeRay v1.7.0 runs a RayJob in
``K8sJobMode``.

On a cluster the RayJob controller (``ray-operator/controllers/ray/rayjob_controller.go``,
``Reconcile``: ``JobDeploymentStatusInitializing`` ~206-224) creates a RayCluster, waits for
it to be Ready (its head pod and every worker pod running), then starts the submitter Job,
whose command (``common/job.go`` ``BuildJobSubmitCommand``) waits for the dashboard's
``api/gcs_healthz``, runs ``ray job submit --no-wait --submission-id <id> -- <entrypoint>`` and
follows the driver with ``ray job logs --follow <id>``: the submitter pod's log is the driver's
output. The job ends when Ray says the Ray job is terminal (SUCCEEDED, FAILED or STOPPED) and
the submitter has finished (``JobDeploymentStatusRunning`` ~330-356). Each Ray pod runs the
``ray start`` command ``common/pod.go`` generates from ``rayStartParams``
(``generateRayStartCommand`` ~1390, flags sorted and booleans bare in ``convertParamMap``
~1518; ``setMissingRayStartParams`` ~1345 adds ``--address`` to workers, ``--block``,
``--dashboard-host`` on the head, ``--metrics-export-port`` and
``--dashboard-agent-listen-port``), with ``RAY_ADDRESS`` set to the head's GCS address
(``setContainerEnvVars`` ~1302).

Here the supervisor does the same with processes it owns (``owned_processes``): a head
(``--num-cpus 0``: it takes no training work, as seed 004's RayCluster's head), one worker
raylet per node (``--num-cpus <procs per node>``; ``--num-gpus`` from the node's GPUs), each
started by this interpreter's Ray with the job's environment (``supervisor.base_env``) in the
job's folder (the driver runs in the head raylet's working directory); it waits until all
``num_nodes + 1`` nodes are alive in the GCS, submits the entrypoint with
``JobSubmissionClient`` (the entrypoint exactly as ``spec.ray_entrypoint`` gives it: here no
submitter shell parses it first), follows it into node 0's log (what `kubetrain wait`/`logs`
stream) as ``ray job logs --follow`` does, through Ray's SDK (``ray_follow``: the driver's
lines once, without the CLI's banners and its repeat of them), and maps the Ray job's end to the
job's (``ray_job_end``), said in one line there.
Every Ray process (GCS, raylets, dashboard and its agents, workers, the driver) is below the
supervisor, a child subreaper, and carries the job's identity: the cluster is stopped with
the job's processes (never with `ray stop`, which ends every Ray of this user here).

Several clusters run on one machine, where each RayCluster has pods of its own: every port
KubeRay sets is a free one here (``ports``), the others Ray picks at random (port 0), and each
job has its own short temp folder (``TEMP_PARENT``): AF_UNIX socket paths under it must stay
under 107 characters. Ray 2.60's ``ray start`` replaces a loopback ``--node-ip-address`` by
this machine's address (``services.resolve_ip_for_localhost``), so no node IP is given: the
workers join the head at the address the head registered (``head_address``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from kubetrain.backends import owned_processes
from kubetrain.backends.base import COMPLETE, FAILED, RUNNING, JobStatus, NodeStatus
from kubetrain.backends.local.files import node_log, read_record, write_status
from kubetrain.backends.local.supervisor import base_env, finish, stop_nodes, with_our_interpreter
from kubetrain.backends.torchrun_report import describe_code
from kubetrain.jobspec import TrainJobSpec
from kubetrain.storage import atomic

#: How a job ended: (state, reason, message).
End = tuple[str, str, str]
#: The fix when Ray is not installed (the ``kubetrain[ray]`` extra brings ``ray[default,train]``).
MISSING_RAY_FIX = "pip install 'kubetrain[ray]'"
HEAD_LOG = "ray-head.log"
#: The job's Ray cluster, for `kubetrain delete` when the supervisor could not clean up.
RECORD = "ray.json"
#: Where each job's Ray temp folder is made: short, as Ray's AF_UNIX sockets live under it.
TEMP_PARENT = "/tmp"
TEMP_PREFIX = "kt-ray-"
#: How long the cluster may take to have every node alive: a busy machine starts raylets
#: slowly (KubeRay waits without bound; its RayJob's preRunningDeadlineSeconds is opt-in).
START_TIMEOUT_SECONDS = 300.0
#: How often the GCS and the Ray job are asked about while the supervisor waits.
QUERY_SECONDS = 0.5
#: Ray's job states that end a job (``rayjob_types.go`` ``IsJobTerminal``).
SUCCEEDED, FAILED_JOB, STOPPED = "SUCCEEDED", "FAILED", "STOPPED"
#: What Ray's message of a failed entrypoint says before the driver's last log lines
#: (ray 2.60 ``dashboard/modules/job/job_supervisor.py``, ``JobSupervisor.run``).
LOGS_IN_MESSAGE = ", last available logs"
#: What of a failed ``ray start``'s log is read for its error.
LOG_TAIL_BYTES = 16384
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")
#: Ray's "Failed to start GCS." goes on with the GCS's error lines, not kept in one line.
ERROR_FILES_NOTE = re.compile(r"\s+Last \d+ lines of error files:$")
#: What Ray's output says of a port another process holds (the GCS's gRPC server's error).
PORT_TAKEN = "Address already in use"
#: How long the log follower may go on once Ray says the job ended (its last lines).
FOLLOW_GRACE_SECONDS = 10.0
#: The module that follows a Ray job's log into node 0's log.
FOLLOWER = "kubetrain.backends.local.ray_follow"
#: Where the follower's Ray client logs (its stderr): not the driver's output.
FOLLOWER_LOG = "ray-follow.log"
#: The environment a Ray client reads its auth settings from (token auth, Ray 2.52+).
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def ray_installed() -> bool:
    return importlib.util.find_spec("ray") is not None


def ray_cli() -> list[str]:
    """This interpreter's ``ray`` command: every node and the driver's Ray workers run the
    Ray (and the Python) that starts them, one version across the cluster, as one image's."""
    return [sys.executable, "-m", "ray.scripts.scripts"]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on loopback now (all held until all are found)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass(frozen=True)
class ClusterPlan:
    """The ports and temp folder of one job's Ray cluster."""

    temp_dir: str
    gcs_port: int
    dashboard_port: int
    client_server_port: int
    #: (dashboard agent listen port, metrics export port) of the head, then of each worker.
    node_ports: tuple[tuple[int, int], ...]

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @classmethod
    def make(cls, workers: int) -> ClusterPlan:
        ports = free_ports(3 + 2 * (workers + 1))
        temp_dir = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=TEMP_PARENT)
        pairs = tuple(zip(ports[3::2], ports[4::2], strict=True))
        return cls(temp_dir, ports[0], ports[1], ports[2], pairs)


def start_command(params: dict[str, str], head: bool) -> list[str]:
    """``ray start`` with ``params`` as KubeRay's ``convertParamMap`` writes them: sorted,
    "true" a bare flag, "false" left out; as a list, for no shell runs it."""
    command = [*ray_cli(), "start", *(["--head"] if head else [])]
    for name in sorted(params):
        value = params[name]
        if value.lower() == "true":
            command.append(f"--{name}")
        elif value.lower() != "false":
            command.append(f"--{name}={value}")
    return command


def head_params(spec: TrainJobSpec, plan: ClusterPlan) -> dict[str, str]:
    """The head's rayStartParams: no training work (num-cpus 0), the dashboard on loopback
    only (here it would be open to the machine's network), every port of its own."""
    agent_port, metrics_port = plan.node_ports[0]
    return {
        "block": "true",
        "dashboard-agent-listen-port": str(agent_port),
        "dashboard-host": "127.0.0.1",
        "dashboard-port": str(plan.dashboard_port),
        "disable-usage-stats": "true",
        "metrics-export-port": str(metrics_port),
        "num-cpus": "0",
        "port": str(plan.gcs_port),
        "ray-client-server-port": str(plan.client_server_port),
        "temp-dir": plan.temp_dir,
    }


def worker_params(
    spec: TrainJobSpec, plan: ClusterPlan, node: int, head_address: str
) -> dict[str, str]:
    """Worker ``node``'s rayStartParams: the head's GCS address, room for ``procs_per_node``
    Train workers (num-cpus; num-gpus when the node has GPUs, as KubeRay reads them from the
    pod's limits), ports and a temp folder of its own: raylets started at once in one temp
    folder race for the same socket names (one failed with "bind: Address already in use"
    here and its ``ray start`` timed out), as two pods never do."""
    agent_port, metrics_port = plan.node_ports[node + 1]
    params = {
        "address": f"{head_address}:{plan.gcs_port}",
        "block": "true",
        "dashboard-agent-listen-port": str(agent_port),
        "disable-usage-stats": "true",
        "metrics-export-port": str(metrics_port),
        "num-cpus": str(spec.procs_per_node),
        "temp-dir": f"{plan.temp_dir}/{node + 1}",
    }
    if spec.resources_per_node.gpu:
        params["num-gpus"] = str(spec.resources_per_node.gpu)
    return params


def node_env(spec: TrainJobSpec, gcs_address: str) -> dict[str, str]:
    """A Ray node's environment: the job's (``base_env``: the spec's env, its identity), and
    RAY_ADDRESS as KubeRay sets it (launch refuses it in the spec, ``check_ray_env``)."""
    return {**base_env(spec), "RAY_ADDRESS": gcs_address}


def entrypoint(spec: TrainJobSpec) -> str:
    """The Ray job's entrypoint, our trainer run by this interpreter (``with_our_interpreter``):
    the driver runs with the raylets' PATH, the caller's, whose ``python`` may lack kubetrain."""
    program = with_our_interpreter([*spec.command, *spec.args])
    return replace(spec, command=program[:1], args=program[1:]).ray_entrypoint


def outcome(job_status: str, message: str) -> End:
    """(state, reason, message) of the job whose Ray job ended in ``job_status``. KubeRay makes
    a FAILED Ray job's RayJob Failed (reason AppFailed) and any other terminal one Complete
    (``rayjob_controller.go`` ~340-348); a STOPPED Ray job (`ray job stop`) did not finish its
    training, so here it fails the job (reason Stopped) rather than let collect take a partial
    run. Ray's message of a failed entrypoint goes on with the driver's last log lines, which
    node 0's log holds: the message is what comes before them. A message that is a Python
    traceback (Ray could not start the entrypoint) is said by its last line, the exception."""
    lines = message.strip().splitlines()
    first = lines[0] if lines else ""
    if first.startswith("Traceback (most recent call last)"):
        first = lines[-1]
    first = first.split(LOGS_IN_MESSAGE)[0]
    if job_status == SUCCEEDED:
        return COMPLETE, "Completed", first or "the Ray job succeeded"
    if job_status == STOPPED:
        return FAILED, "Stopped", f"the Ray job was stopped{': ' + first if first else ''}"
    return FAILED, "AppFailed", first or f"the Ray job ended {job_status}"


def ray_job_end(status: JobStatus, info) -> End:  # noqa: ANN001 - ray's JobDetails, lazily
    """The job's end from Ray's record of its ended Ray job (``JobDetails``), node 0 (the
    driver, whose output is its log) given the driver's exit code, so that `kubetrain wait`
    exits with it as with a failed torchrun node's: Ray records it for an entrypoint that
    exited (ray 2.60 ``job_supervisor.py`` ``JobSupervisor.run``, ``driver_exit_code``), none
    for a stopped one or one that did not start (wait exits 1 then)."""
    state, reason, message = outcome(str(info.status.value), info.message or "")
    status.nodes[0].exit_code = info.driver_exit_code
    if state == FAILED:
        status.failed_rank = 0
    return state, reason, message


def start_error(log: Path) -> str:
    """What a failed ``ray start`` said, in one line: its exception's line (its last line
    otherwise), and that a port was taken when Ray's output says so (the GCS's own error names
    the port: ``ray-head.log`` holds it)."""
    try:
        text = log.read_bytes()[-LOG_TAIL_BYTES:].decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = next((line for line in reversed(lines) if EXCEPTION_LINE.match(line)), "")
    said = ERROR_FILES_NOTE.sub("", said or (lines[-1] if lines else ""))
    if PORT_TAKEN in text:
        said += f" (a port it was given is in use by another process; see {log.name})"
    return said


class Cluster:
    """One job's Ray cluster: its processes, the GCS and the Ray job, as the supervisor sees
    them."""

    def __init__(self, job_dir: Path, spec: TrainJobSpec, run_in: str) -> None:
        self.job_dir, self.spec, self.run_in = job_dir, spec, run_in
        self.plan = ClusterPlan.make(spec.num_nodes)
        atomic.write_json(job_dir / RECORD, {"temp_dir": self.plan.temp_dir})
        self.head: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.follower: subprocess.Popen | None = None

    @property
    def processes(self) -> list[subprocess.Popen]:
        started = [self.head, *self.workers, self.follower]
        return [proc for proc in started if proc is not None]

    def start(
        self, argv: list[str], env: dict[str, str], log: Path, errors: Path | None = None
    ) -> subprocess.Popen:
        """Start one process of the cluster, its output appended to ``log`` (its stderr to
        ``errors`` when given)."""
        to_errors = open(errors, "ab") if errors else contextlib.nullcontext(subprocess.STDOUT)
        with open(log, "ab") as output, to_errors as error_output:
            return owned_processes.start(
                argv,
                env=env,
                cwd=self.run_in,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=error_output,
            )

    def start_head(self) -> None:
        env = node_env(self.spec, f"127.0.0.1:{self.plan.gcs_port}")
        command = start_command(head_params(self.spec, self.plan), head=True)
        self.head = self.start(command, env, self.job_dir / HEAD_LOG)

    def start_workers(self, head_address: str) -> None:
        env = node_env(self.spec, f"{head_address}:{self.plan.gcs_port}")
        for node in range(self.spec.num_nodes):
            params = worker_params(self.spec, self.plan, node, head_address)
            log = self.job_dir / f"ray-worker-{node}.log"
            self.workers.append(self.start(start_command(params, head=False), env, log))

    def alive_nodes(self) -> list[str]:
        """The IP addresses of the nodes alive in the GCS (the head's first); none while the
        dashboard does not answer yet."""
        from ray.util.state import list_nodes

        try:
            nodes = list_nodes(
                address=self.plan.dashboard_url,
                filters=[("state", "=", "ALIVE")],
                timeout=10,
                raise_on_missing_output=False,
            )
        except Exception:  # noqa: BLE001 - any failure to ask means "not up yet"
            return []
        return [node.node_ip for node in sorted(nodes, key=lambda node: not node.is_head_node)]

    def head_failure(self) -> str:
        """Why the cluster cannot go on when the head's ``ray start`` has ended, else ""."""
        code = self.head.poll() if self.head is not None else None
        if code is None:
            return ""
        said = start_error(self.job_dir / HEAD_LOG)
        return f"the Ray head {describe_code(code)}{': ' + said if said else ''}"

    def client(self):  # noqa: ANN201 - ray's type, imported lazily
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.plan.dashboard_url)

    def submit(self) -> None:
        """Submit the entrypoint as the Ray job named after ours (the submitter's
        ``--submission-id``), then follow it into node 0's log as the submitter does."""
        self.client().submit_job(entrypoint=entrypoint(self.spec), submission_id=self.spec.name)
        follow = [sys.executable, "-m", FOLLOWER, self.plan.dashboard_url, self.spec.name]
        env = node_env(self.spec, f"127.0.0.1:{self.plan.gcs_port}")
        log, client_log = node_log(self.job_dir, 0), self.job_dir / FOLLOWER_LOG
        self.follower = self.start(follow, env, log, errors=client_log)

    def job_info(self):  # noqa: ANN201 - ray's JobDetails, imported lazily
        """Ray's record of the Ray job; None when the dashboard does not answer."""
        try:
            return self.client().get_job_info(self.spec.name)
        except Exception:  # noqa: BLE001 - a dashboard that does not answer is polled again
            return None

    def stop_follower(self) -> None:
        """End the log's follower (gone already when Ray closed the log)."""
        if self.follower is not None and self.follower.poll() is None:
            self.follower.kill()
            self.follower.wait()

    def stop(self) -> None:
        """Stop every process of the cluster and remove its temp folder. The ``ray start
        --block`` monitors are killed first: on SIGTERM each drains its node for up to 30 s
        (ray 2.60 ``_private/node.py`` ``Node._drain_node_before_shutdown``, ~666), its GCS
        already going; what they started gets the job's stop, SIGTERM then SIGKILL
        (``supervisor.stop_nodes``). The log's follower goes first: it would otherwise say
        that it lost the log as the cluster goes."""
        self.stop_follower()
        for monitor in (self.head, *self.workers):
            if monitor is not None and monitor.poll() is None:
                monitor.kill()
        stop_nodes(self.processes)
        shutil.rmtree(self.plan.temp_dir, ignore_errors=True)


def remove_ray_temp_dir(job_dir: Path) -> None:
    """Remove the Ray temp folder ``RECORD`` names, once the job's processes are stopped: a
    supervisor SIGKILLed could not. Only a folder of ours (``TEMP_PREFIX`` directly in
    ``TEMP_PARENT``) is ever removed, whatever the record says."""
    try:
        temp_dir = read_record(job_dir / RECORD).get("temp_dir")
    except (OSError, ValueError, RecursionError, AttributeError):
        return
    if not isinstance(temp_dir, str):
        return
    path = Path(temp_dir)
    if path.parent == Path(TEMP_PARENT) and path.name.startswith(TEMP_PREFIX):
        shutil.rmtree(path, ignore_errors=True)


def say(job_dir: Path, line: str) -> None:
    """A ``kubetrain:`` line in node 0's log, which `kubetrain wait` streams."""
    with open(node_log(job_dir, 0), "a") as log:
        log.write(f"kubetrain: {line}\n")


def wait_until(
    ready: Callable[[], bool], cluster: Cluster, stop_requested: list[int], deadline: float
) -> str:
    """Poll ``ready`` until it holds; else why not: the head ended, a stop, the deadline."""
    while not ready():
        if stop_requested:
            return "stopped"
        if failure := cluster.head_failure():
            return failure
        if time.monotonic() > deadline:
            return f"the Ray cluster was not up after {START_TIMEOUT_SECONDS:g}s"
        time.sleep(QUERY_SECONDS)
    return ""


def supervise_ray(
    job_dir: Path, spec: TrainJobSpec, cwd: str, status: JobStatus, stop_requested: list[int]
) -> JobStatus:
    """Play the RayJob to its end (module docstring); the cluster is stopped whatever
    happens."""
    # The supervisor's own Ray client speaks to the cluster as its nodes do (token auth).
    os.environ.update({key: spec.env[key] for key in AUTH_ENV if key in spec.env})
    run_in = spec.working_dir or cwd
    if spec.working_dir:
        Path(spec.working_dir).mkdir(parents=True, exist_ok=True)
    cluster = Cluster(job_dir, spec, run_in)
    try:
        end = run_cluster(job_dir, spec, cluster, status, stop_requested)
    finally:
        cluster.stop()
    # Recorded once the cluster is gone: the job ends whole, as its pods would.
    return finish(job_dir, status, *end)


def run_cluster(
    job_dir: Path,
    spec: TrainJobSpec,
    cluster: Cluster,
    status: JobStatus,
    stop_requested: list[int],
) -> End:
    """Start the cluster, submit, follow (``follow_job``): the job's end."""
    began = time.monotonic()
    deadline = began + START_TIMEOUT_SECONDS
    say(job_dir, f"starting a Ray cluster: a head and {spec.num_nodes} worker node(s)")
    try:
        cluster.start_head()
        head: list[str] = []

        def head_alive() -> bool:
            head[:] = cluster.alive_nodes()
            return bool(head)

        failure = wait_until(head_alive, cluster, stop_requested, deadline)
        if not failure:
            cluster.start_workers(head[0])
            failure = wait_until(
                lambda: len(cluster.alive_nodes()) > spec.num_nodes,
                cluster,
                stop_requested,
                deadline,
            )
        if not failure:
            say(job_dir, f"Ray cluster up in {time.monotonic() - began:.0f}s; submitting")
            cluster.submit()
    except OSError as error:
        failure = f"cannot start Ray: {error}"
    except Exception as error:  # noqa: BLE001 - Ray's client errors, said in one line
        failure = f"cannot submit the Ray job: {type(error).__name__}: {error}"
    if failure == "stopped" or stop_requested:
        return stopped(stop_requested)
    if failure:
        say(job_dir, failure)
        return FAILED, "StartError", failure
    status.state, status.started_at = RUNNING, status.started_at or time.time()
    status.nodes = [NodeStatus(rank=0, pid=cluster.follower.pid, log=node_log(job_dir, 0).name)]
    write_status(job_dir, status)
    return follow_job(job_dir, cluster, status, stop_requested)


def stopped(stop_requested: list[int]) -> End:
    return FAILED, "Stopped", f"stopped by {signal.Signals(stop_requested[0]).name}"


def follow_job(
    job_dir: Path, cluster: Cluster, status: JobStatus, stop_requested: list[int]
) -> End:
    """Poll the Ray job until it is terminal and its log has been followed to the end (the
    submitter finished), the head ends, or we are told to stop."""
    ended_at = None
    while True:
        if stop_requested:
            return stopped(stop_requested)
        info = cluster.job_info()
        job_status = str(info.status.value) if info is not None else ""
        if job_status in (SUCCEEDED, FAILED_JOB, STOPPED):
            ended_at = ended_at or time.monotonic()
            follower = cluster.follower
            if follower.poll() is not None or time.monotonic() - ended_at > FOLLOW_GRACE_SECONDS:
                cluster.stop_follower()  # its last lines written: the end line comes after
                state, reason, message = ray_job_end(status, info)
                say(job_dir, f"Ray job {cluster.spec.name} {job_status} ({reason}): {message}")
                return state, reason, message
        if failure := cluster.head_failure():
            say(job_dir, failure)
            return FAILED, "HeadFailed", failure
        time.sleep(QUERY_SECONDS)
