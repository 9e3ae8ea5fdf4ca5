"""A fake Kubeflow Trainer (and batch Job controller) for the emulator: the very object a
backend submits drives real multi-process training on this machine.

When a ``TrainJob`` (or an Indexed ``Job``) is created on the emulator, ``FakeTrainer`` turns it
back into a job spec, the way the Trainer's torch plugin would set up the nodes, and runs it
with the local backend (one process per node with the PET_* environment, master 127.0.0.1 on a
free port). Meanwhile it plays the cluster: one pod per node with the labels JobSet / the Job
controller put on them, Pending then Running, the node's output streamed into the pod's log,
the container terminated with the node's exit code, and finally the job's Complete or Failed
condition.

Restarts, as the kubelet, the Job controller and JobSet make them (a failed node's torchrun
world is lost, so every node's processes start again together; a run in which some node
exited 0 and another failed is not restarted, and the fake records an error):

* ``restartPolicy`` OnFailure or Always (JobSet's default for a runtime that sets none,
  ``trainer_build``): the failed containers show terminated (a process killed by SIGKILL as
  OOMKilled), then, from their second restart on, CrashLoopBackOff (kubernetes
  ``pkg/kubelet/kuberuntime/kuberuntime_manager.go`` ``doBackOff``), then run again with
  ``restartCount`` + 1 and the old run in ``lastState``; once the pods' restart counts add up to
  the Job's ``backoffLimit`` (default 6; 0: any restart) the Job fails BackoffLimitExceeded and
  its active pods are deleted (``pkg/controller/job/job_controller.go`` ``syncJob``,
  ``pastBackoffLimitOnFailure``, ``deleteActivePods``);
* ``restartPolicy`` Never: the pod fails; while the Job's failed pods are at most
  ``backoffLimit`` a new pod replaces each failed index, else the Job fails (``syncJob``
  ``exceedsBackoffLimit``, ``manageJob``);
* a failed Job fails the JobSet (reason FailedJobs) unless the runtime's JobSet has a
  ``failurePolicy``: then every pod is deleted and made again, labelled with the next
  ``restart-attempt``, until ``maxRestarts`` restarts were made (then ReachedMaxRestarts;
  jobset v0.12.0 ``pkg/controllers/failure_policy.go``; rules are not modelled and make the
  fake record an error); the TrainJob gets the JobSet's Complete or Failed condition as is
  (trainer v2.3.0 ``pkg/runtime/framework/plugins/jobset/jobset.go`` ``Status``).

Deleting or suspending the object stops the processes (the emulator garbage-collects the
pods, which the job owns).

Translation: a TrainJob is built the way Trainer 2.3 and JobSet build its pods
(``trainer_build``: its runtime's pod template, ``runtimePatches`` merged strategically, the
TrainJob's trainer fields, the torch plugin's PET_* env, JobSet's name-length rule); a build
failure gives a Warning event ``TrainJobResourcesCreationFailed`` and nothing else, as on a real
cluster. The pods carry the merged spec; the local processes run its ``node`` container's
command and args (``$(VAR)`` expanded as the kubelet does) with its env (downward-API
``fieldRef`` values resolved against the first pod). While it runs, the Trainer's validating
webhook refuses (403) a TrainJob whose runtime does not exist or lacks the initializer it asks
for, or that sets one of the five PET_* variables torchrun's plugin reserves (PET_NNODES,
PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT: ``pkg/constants/
constants.go`` ``TorchRunReservedEnvNames``; other PET_* names pass), answered as the API
server answers a denial (``kube_api.webhook_denial``) (kubeflow/trainer v2.3.0
``pkg/webhooks/trainjob_webhook.go``, ``clustertrainingruntime.go`` and ``trainingruntime.go``
``ValidateObjects``, ``plugins/jobset/jobset.go`` and ``plugins/torch/torch.go``
``Validate``); ``webhook=False`` stands for a cluster whose runtime went away after the
TrainJob was admitted.
On a runtime with ``mlPolicy.mpi`` (kubeflow/trainer v2.3.0 ``pkg/runtime/framework/plugins/
mpi/mpi.go``; ``trainer_build.MpiParts``) the fake builds what the MPI plugin builds: the
``<job>-mpi-ssh-auth`` Secret (``kubernetes.io/ssh-auth``, immutable, made once) and the
``<job>-mpi-hostfile`` ConfigMap with its ``slots=`` lines, the OMPI_MCA_* env and volumes on
the launcher's ``node`` container; the ``node`` job's pods (sshd upstream) are made first and
show Running and ready, and only then the launcher's pod, as the runtime's ``dependsOn: node
Ready`` makes JobSet wait (jobset v0.12.0 ``pkg/controllers/depends_on.go``). The launcher is
the run's one rank pod: its command ``mpirun [options] PROGRAM`` (``mpirun_program``) becomes a
local job with ``launcher="mpi"`` over the hostfile's hosts and slots, run for real by the
local backend's mpirun, whose output is the launcher pod's log and whose exit code is its
container's; restarts follow the launcher's Job and JobSet as above. The job ends when the
launcher does (the runtime's ``successPolicy`` targets the launcher), and JobSet then deletes
the node pods still running (``jobset_controller.go`` ``Reconcile``: a finished JobSet deletes
its active Jobs). The webhook refuses the reserved OpenMPI variables (``mpi.go``
``Validate``, ``MPIReservedEnvNames``). Not modelled: sshd and ssh itself (the ranks all run
on this machine), the Secret's keys being used, a runtime whose launcher is not a node of
its own.
From an Indexed Job, the ``node`` container gives command and args, and its env
``PET_NNODES``/``PET_NPROC_PER_NODE`` the topology. In both, ``PET_NODE_RANK``,
``PET_MASTER_ADDR`` and ``PET_MASTER_PORT`` are replaced by the local ones.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path
from typing import Any

import kmock

from kubetrain.backends.base import COMPLETE, FAILED, RUNNING
from kubetrain.backends.local.backend import LocalBackend
from kubetrain.backends.local.files import node_log
from kubetrain.backends.local.log_tail import LogTail
from kubetrain.jobspec import TrainJobSpec
from tests.support import objects, trainer_build
from tests.support.controller import FakeController
from tests.support.emulator import KubeEmulator, resource_of
from tests.support.kube_api import webhook_denial
from tests.support.trainer_build import BuildError, TrainerPods

POLL_SECONDS = 0.05
TRAINJOBS, JOBS = "trainjobs", "jobs"
#: Core Secrets, which the MPI plugin makes; the emulator's built-in resources lack them, so
#: the fake registers them on start (their place is kube_api.BUILTIN_RESOURCES).
SECRETS = kmock.resource("", "v1", "secrets")
#: The env the torch plugin sets and a TrainJob may not (kubeflow/trainer v2.3.0
#: pkg/constants/constants.go TorchRunReservedEnvNames ~300); the local run sets its own, and any
#: other PET_* (PET_MAX_RESTARTS, PET_RDZV_*) reaches torchrun as the pod's env would.
TORCH_RESERVED_ENV = frozenset(
    {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
)
TRAINJOB_WEBHOOK = "validator.trainjob.trainer.kubeflow.org"
#: The recorder name of the TrainJob controller (kubeflow/trainer v2.3.0 pkg/controller/setup.go).
TRAINJOB_CONTROLLER = "trainer-trainjob-controller"
#: How long a crashed container shows terminated before the kubelet's next sync restarts it,
#: and how long it then waits in CrashLoopBackOff (the kubelet's back-off is 10 s, doubling;
#: kubernetes pkg/kubelet/kuberuntime/kuberuntime_manager.go doBackOff: none before the first
#: restart). Short here: a wait must tell a restart from a job that cannot finish by the pod.
TERMINATED_SECONDS = 0.3
CRASH_LOOP_BACKOFF_SECONDS = 0.5
SIGKILL_EXIT_CODE = 128 + 9


def _env_values(env: list[dict[str, Any]] | None) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in env or [] if "value" in e}


def _count(value: Any, default: int = 1) -> int:
    """numProcPerNode may be an int, a digit string, or "auto"/"cpu"/"gpu" (one per node here)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _resolved_env(container: dict[str, Any], pod: dict[str, Any]) -> dict[str, str]:
    """The container's env as the kubelet gives it: values ``$(VAR)``-expanded in order,
    ``fieldRef`` from ``pod``; references to Secrets/ConfigMaps are not resolved here."""
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = trainer_build.expand(str(var["value"]), env)
        elif "fieldRef" in (var.get("valueFrom") or {}):
            env[var["name"]] = trainer_build.field_value(
                pod, var["valueFrom"]["fieldRef"]["fieldPath"]
            )
    return env


def spec_from_trainjob(obj: dict[str, Any], pods: TrainerPods, pod: dict[str, Any]) -> TrainJobSpec:
    """The local run of the pods JobSet would run: ``pod`` (the first one) resolves the env."""
    container = pods.container
    env = _resolved_env(container, pod)
    return TrainJobSpec(
        name=obj["metadata"]["name"],
        command=tuple(trainer_build.expand(a, env) for a in container.get("command") or ()),
        args=tuple(trainer_build.expand(a, env) for a in container.get("args") or ()),
        env={k: v for k, v in env.items() if k not in TORCH_RESERVED_ENV},
        num_nodes=pods.num_nodes,
        procs_per_node=_count(pods.procs_per_node),
    )


#: mpirun's options the translation knows, with how many values each takes (Open MPI 5
#: ``mpirun --help``); any other is not modelled and fails the translation.
MPIRUN_OPTIONS = {
    **dict.fromkeys(("--hostfile", "-hostfile", "--machinefile", "-machinefile"), 1),
    **dict.fromkeys(("-np", "-n", "--np", "--n", "-c"), 1),
    **dict.fromkeys(("--bind-to", "--map-by", "--rank-by", "-x"), 1),
    **dict.fromkeys(("--mca", "-mca"), 2),
    **dict.fromkeys(
        ("--allow-run-as-root", "--oversubscribe", "--tag-output", "--report-bindings"), 0
    ),
}


def mpirun_program(line: list[str]) -> tuple[list[str], int | None, dict[str, str]]:
    """(one rank's program, -np or None, env its -x NAME=VALUE and --mca give) of the
    launcher's ``mpirun [options] PROGRAM...``; ValueError for anything else."""
    if not line or Path(line[0]).name not in ("mpirun", "mpiexec"):
        raise ValueError(f"the launcher runs {line[:1]}, not mpirun")
    position, np, env = 1, None, {}
    while position < len(line) and line[position].startswith("-"):
        option = line[position]
        if option not in MPIRUN_OPTIONS:
            raise ValueError(f"mpirun option {option} is not modelled")
        values = line[position + 1 : position + 1 + MPIRUN_OPTIONS[option]]
        if option in ("-np", "-n", "--np", "--n", "-c"):
            np = int(values[0])
        elif option == "-x" and "=" in values[0]:
            name, _, value = values[0].partition("=")
            env[name] = value
        elif option in ("--mca", "-mca"):
            env[f"OMPI_MCA_{values[0]}"] = values[1]
        position += 1 + MPIRUN_OPTIONS[option]
    if position == len(line):
        raise ValueError("mpirun is given no program")
    return line[position:], np, env


def spec_from_mpi_trainjob(
    obj: dict[str, Any], pods: TrainerPods, launcher: dict[str, Any]
) -> TrainJobSpec:
    """The local run of an MPI TrainJob's launcher: its mpirun's program as the local
    backend's ``launcher="mpi"`` job over the hostfile's hosts (nodes) and slots."""
    assert pods.mpi is not None
    container = pods.container
    env = _resolved_env(container, launcher)
    line = [trainer_build.expand(a, env) for a in (container.get("command") or ())]
    line += [trainer_build.expand(a, env) for a in (container.get("args") or ())]
    program, np, mpirun_env = mpirun_program(line)
    hosts, slots = len(pods.mpi.hosts), pods.mpi.slots
    if np is not None and np != hosts * slots:
        raise NotImplementedError(
            f"fake Trainer: mpirun -np {np} on a hostfile of {hosts} x {slots} slots"
        )
    env = {**env, **mpirun_env}
    return TrainJobSpec(
        name=obj["metadata"]["name"],
        command=tuple(program),
        env={k: v for k, v in env.items() if k not in trainer_build.MPI_RESERVED_ENV},
        num_nodes=hosts,
        procs_per_node=slots,
        launcher="mpi",
    )


def spec_from_indexed_job(obj: dict[str, Any]) -> TrainJobSpec:
    pod_spec = obj["spec"]["template"]["spec"]
    container = next(
        (c for c in pod_spec["containers"] if c["name"] == objects.NODE_CONTAINER),
        pod_spec["containers"][0],
    )
    env = _env_values(container.get("env"))
    return TrainJobSpec(
        name=obj["metadata"]["name"],
        command=tuple(container.get("command") or ()),
        args=tuple(container.get("args") or ()),
        env={k: v for k, v in env.items() if k not in TORCH_RESERVED_ENV},
        num_nodes=_count(env.get("PET_NNODES"), obj["spec"].get("completions") or 1),
        procs_per_node=_count(env.get("PET_NPROC_PER_NODE")),
    )


def _reason(code: int) -> str:
    """How the kubelet names a container's end: a process killed by SIGKILL stands here for
    the kernel's out-of-memory kill, which the kubelet reports as OOMKilled."""
    if code == 0:
        return "Completed"
    return "OOMKilled" if code == SIGKILL_EXIT_CODE else "Error"


class _Run(threading.Thread):
    """One job: its local runs mirrored into pods, logs and the job's conditions, restarted
    as its Job (``restartPolicy``, ``backoffLimit``) and, for a TrainJob, its JobSet
    (``failurePolicy.maxRestarts``) restart it (module docstring)."""

    def __init__(
        self,
        trainer: FakeTrainer,
        plural: str,
        obj: dict[str, Any],
        built: TrainerPods | None = None,
    ) -> None:
        super().__init__(name=f"fake-trainer-{obj['metadata']['name']}", daemon=True)
        self.trainer = trainer
        self.emulator = trainer.emulator
        self.plural = plural
        self.obj = obj
        self.name = obj["metadata"]["name"]
        self.namespace = obj["metadata"].get("namespace", self.emulator.namespace)
        self.stopped = threading.Event()
        self.local = LocalBackend(trainer.root)
        self.built = built
        if built is not None:
            self.restart_policy, self.backoff_limit = built.restart_policy, built.backoff_limit
        else:
            job_spec = obj["spec"]
            self.restart_policy = job_spec["template"]["spec"].get("restartPolicy", "Never")
            backoff_limit = job_spec.get("backoffLimit")
            self.backoff_limit = (
                trainer_build.DEFAULT_BACKOFF_LIMIT if backoff_limit is None else backoff_limit
            )
        self.pods: dict[int, str] = {}
        #: Per node: its container's restartCount and lastState (reset with each new pod).
        self.restart_counts: dict[int, int] = {}
        self.last_states: dict[int, dict[str, Any]] = {}
        #: The Job's status.failed, and the JobSet's status.restarts.
        self.failed_pods = 0
        self.jobset_restarts = 0
        self.pods_deleted = False
        self.local_runs = 0
        #: An MPI TrainJob's node pods (``_create_mpi_nodes``), deleted with the others.
        self.mpi_node_pods: list[str] = []

    def run(self) -> None:
        try:
            self._run()
        except Exception as error:  # the controller must not die silently mid-test
            if not self.stopped.is_set():  # else: its pods were deleted under it, as meant
                self.trainer.errors.append(error)

    def _create_pod(self, rank: int, image: str) -> dict[str, Any]:
        """Node ``rank``'s pod, as JobSet's Job or the Job controller creates it, Pending."""
        if self.built is None:
            template = self.obj["spec"]["template"].get("metadata") or {}
            pod = objects.node_pod(
                self.name,
                rank,
                namespace=self.namespace,
                kind="job",
                image=image,
                owner=self.obj,
                pod_annotations=template.get("annotations"),
            )
        else:
            pod = objects.node_pod(
                self.name,
                rank,
                namespace=self.namespace,
                image=image,
                owner=self.obj,
                pod_spec=self.built.pod_spec,
                pod_labels=self.built.pod_labels,
                pod_annotations=self.built.pod_annotations,
                replicated_job=self.built.replicated_job,
                restart_attempt=self.jobset_restarts,
            )
        created = self.emulator.create_pod(pod)
        self.pods[rank] = created["metadata"]["name"]
        self.restart_counts[rank] = 0
        self.last_states.pop(rank, None)
        return created

    def _create_pods(self) -> tuple[TrainJobSpec, str]:
        """The job's pods, as JobSet or the Job controller creates them, and its local run."""
        self.pods_deleted = False
        self.failed_pods = 0
        if self.built is None:
            spec = spec_from_indexed_job(self.obj)
            image = self.obj["spec"]["template"]["spec"]["containers"][0].get(
                "image", objects.DEFAULT_IMAGE
            )
            for rank in range(spec.num_nodes):
                self._create_pod(rank, image)
            return spec, image
        image = self.built.container.get("image", objects.DEFAULT_IMAGE)
        if self.built.mpi is not None:
            self._create_mpi_nodes()  # dependsOn: the launcher comes once they are ready
        created = [self._create_pod(rank, image) for rank in range(self.built.num_nodes)]
        if self.built.mpi is not None:
            return spec_from_mpi_trainjob(self.obj, self.built, created[0]), image
        return spec_from_trainjob(self.obj, self.built, created[0]), image

    def _create_mpi_nodes(self) -> None:
        """The MPI plugin's Secret (once: it is immutable) and hostfile ConfigMap, then the
        node job's pods, Running and ready (their sshd is not run here)."""
        mpi = self.built.mpi
        for resource, body in ((SECRETS, mpi.secret), ("configmaps", mpi.config_map)):
            if self.emulator.get(resource, body["metadata"]["name"], self.namespace) is None:
                self.emulator.create(resource, body, self.namespace)
        container = next(c for c in mpi.node_pod_spec["containers"] if c["name"] == "node")
        image = container.get("image", objects.DEFAULT_IMAGE)
        for index in range(mpi.node_count):
            pod = objects.node_pod(
                self.name,
                index,
                namespace=self.namespace,
                image=image,
                owner=self.obj,
                pod_spec=mpi.node_pod_spec,
                pod_labels=mpi.node_pod_labels,
                replicated_job=trainer_build.NODE,
                restart_attempt=self.jobset_restarts,
            )
            name = self.emulator.create_pod(pod)["metadata"]["name"]
            self.mpi_node_pods.append(name)
            ready = objects.condition("Ready")
            status = objects.pod_status(
                "Running",
                [objects.container_status(image, objects.running())],
                [objects.condition("PodScheduled", reason="Scheduled"), ready],
            )
            self.emulator.set_pod_status(name, status, self.namespace)

    def _run(self) -> None:
        while not self.stopped.is_set():
            spec, image = self._create_pods()
            status = self._run_job(spec, image)
            if status is None:
                return
            if status.state == COMPLETE or not self._restart_jobset():
                self._finish(status, image)
                return
            self._delete_pods()  # JobSet deletes the failed attempt's Jobs, and so their pods

    def _run_job(self, spec: TrainJobSpec, image: str) -> Any:
        """One Job's life: its nodes run, again after each restart in place or in replacement
        pods, until they all exit 0 or the Job fails; the last run's status (None: stopped)."""
        while True:
            status = self._run_nodes(spec, image)
            if status is None or status.state == COMPLETE or not self._restart_nodes(status):
                return status

    def _run_nodes(self, spec: TrainJobSpec, image: str) -> Any:
        """One local run of every node, mirrored into the pods; its final status."""
        self.local_runs += 1
        self.local = LocalBackend(
            self.trainer.root / f"{self.obj['metadata']['uid']}-{self.local_runs}"
        )
        self.local.launch(spec)
        job_dir = self.local.job_dir(self.name)
        tails = {rank: LogTail(node_log(job_dir, rank)) for rank in self.pods}
        running = False
        while not self.stopped.is_set():
            status = self.local.status(self.name)
            if status.state in (RUNNING, COMPLETE, FAILED) and not running:
                running = True
                for rank in self.pods:
                    self._set_container(rank, image, objects.running(), "Running")
            if running:
                for rank, tail in tails.items():
                    lines = tail.read_lines(final=status.finished)
                    if lines:
                        self.emulator.append_log(self.pods[rank], lines, self.namespace)
            if status.finished:
                return status
            time.sleep(POLL_SECONDS)
        return None

    def _restart_nodes(self, status: Any) -> bool:
        """After a failed run: whether the Job runs its nodes again, as the kubelet (in place,
        ``restartPolicy`` OnFailure or Always) or the Job controller (a replacement pod per
        failed index, Never) restarts them within ``backoffLimit``; False once the Job fails
        (BackoffLimitExceeded)."""
        image = self._image()
        codes = _exit_codes(status)
        failed = [rank for rank, code in codes.items() if code]
        ended = {rank: objects.terminated(code, _reason(code)) for rank, code in codes.items()}
        if self.restart_policy == "Never":
            for rank in failed:
                self._set_container(rank, image, ended[rank], "Failed")
            self.failed_pods += len(failed)
            if self.failed_pods > self.backoff_limit:  # job_controller.go exceedsBackoffLimit
                return False
            _whole_world(failed, codes)
            for rank in failed:  # manageJob: a new pod for each failed index
                self._create_pod(rank, image)
            return True
        _whole_world(failed, codes)
        for rank in failed:  # the container stopped; its pod stays Running
            self._set_container(rank, image, ended[rank], "Running")
        time.sleep(TERMINATED_SECONDS)
        backing_off = [rank for rank in failed if self.restart_counts[rank] > 0]
        for rank in backing_off:  # kubelet doBackOff: no back-off before the first restart
            waiting = objects.waiting("CrashLoopBackOff", "back-off restarting failed container")
            self._set_container(rank, image, waiting, "Running", last_state=ended[rank])
        if backing_off:
            time.sleep(CRASH_LOOP_BACKOFF_SECONDS)
        for rank in failed:
            self.restart_counts[rank] += 1
            self.last_states[rank] = ended[rank]
        restarts = sum(self.restart_counts.values())
        if restarts > 0 if self.backoff_limit == 0 else restarts >= self.backoff_limit:
            self._delete_pods()  # pastBackoffLimitOnFailure: the Job fails, deleteActivePods
            return False
        return True

    def _restart_jobset(self) -> bool:
        """JobSet's failure policy on the failed Job: without one the JobSet fails; with one,
        it restarts every Job (status.restarts + 1) until ``maxRestarts`` restarts were made
        (jobset v0.12.0 ``pkg/controllers/failure_policy.go`` ``executeFailurePolicy``,
        ``restartJobSetActionApplier``: the default action when no rule matches)."""
        policy = self.built.failure_policy if self.built is not None else None
        if policy is None:
            return False
        if policy.get("rules"):
            raise NotImplementedError("fake Trainer: failurePolicy.rules are not modelled")
        if self.jobset_restarts >= policy.get("maxRestarts", 0):
            return False
        self.jobset_restarts += 1
        return True

    def _image(self) -> str:
        if self.built is not None:
            return self.built.container.get("image", objects.DEFAULT_IMAGE)
        return self.obj["spec"]["template"]["spec"]["containers"][0].get(
            "image", objects.DEFAULT_IMAGE
        )

    def _set_container(
        self,
        rank: int,
        image: str,
        state: dict[str, Any],
        phase: str,
        last_state: dict[str, Any] | None = None,
    ) -> None:
        container = objects.container_status(
            image,
            state,
            restart_count=self.restart_counts.get(rank, 0),
            last_state=last_state or self.last_states.get(rank),
        )
        self.emulator.set_pod_status(
            self.pods[rank], objects.pod_status(phase, [container]), self.namespace
        )

    def _delete_pods(self) -> None:
        self._delete_mpi_nodes()
        for pod in self.pods.values():
            try:
                self.emulator.delete("pods", pod, self.namespace)
            except Exception:  # already garbage-collected
                pass
        self.pods_deleted = True

    def _delete_mpi_nodes(self) -> None:
        for pod in self.mpi_node_pods:
            try:
                self.emulator.delete("pods", pod, self.namespace)
            except Exception:  # already garbage-collected
                pass
        self.mpi_node_pods = []

    def _finish(self, status: Any, image: str) -> None:
        codes = _exit_codes(status)
        if not self.pods_deleted:
            for rank, code in codes.items():
                phase = "Succeeded" if code == 0 else "Failed"
                self._set_container(rank, image, objects.terminated(code, _reason(code)), phase)
        self._delete_mpi_nodes()  # the finished JobSet deletes its active Jobs
        if self.plural == TRAINJOBS:
            self.emulator.set_conditions(
                TRAINJOBS, self.name, [self._trainjob_condition(status)], self.namespace
            )
        else:
            self.emulator.patch_status(JOBS, self.name, self._job_status(status), self.namespace)

    def _trainjob_condition(self, status: Any) -> dict[str, Any]:
        """The JobSet's Complete or Failed condition, which the Trainer copies to the TrainJob
        under its own type (trainer v2.3.0 ``pkg/runtime/framework/plugins/jobset/jobset.go``
        ``Status``; reasons and messages: jobset v0.12.0 ``pkg/constants/constants.go``,
        ``failure_policy.go`` ``messageWithFirstFailedJob``)."""
        if status.state == COMPLETE:
            return objects.condition(
                "Complete", reason="AllJobsCompleted", message="jobset completed successfully"
            )
        first_failed = f"first failed job: {self.name}-{self.built.replicated_job}-0"
        if self.built.failure_policy is None:
            reason, message = "FailedJobs", "jobset failed due to one or more job failures"
        else:
            reason = "ReachedMaxRestarts"
            message = "jobset failed due to reaching max number of restarts"
        return objects.condition("Failed", reason=reason, message=f"{message} ({first_failed})")

    def _job_status(self, status: Any) -> dict[str, Any]:
        failed = sum(1 for node in status.nodes if node.exit_code)
        if status.state == COMPLETE:
            conditions = [
                objects.condition("SuccessCriteriaMet", reason="CompletionsReached"),
                objects.condition("Complete", reason="CompletionsReached"),
            ]
        else:
            conditions = [
                objects.condition("FailureTarget", reason="BackoffLimitExceeded"),
                objects.condition(
                    "Failed",
                    reason="BackoffLimitExceeded",
                    message="Job has reached the specified backoff limit",
                ),
            ]
        return {
            "conditions": conditions,
            "succeeded": len(status.nodes) - failed,
            "failed": failed,
        }

    def stop(self, delete_pods: bool = False) -> None:
        """The job was deleted or suspended: stop its processes (and, suspended, its pods)."""
        self.stopped.set()
        self.join(timeout=30)
        try:
            self.local.delete(self.name)
        except Exception:  # never launched, or already cleaned up
            pass
        if delete_pods:
            self._delete_pods()


def _whole_world(failed: list[int], codes: dict[int, int]) -> None:
    """A restart here runs every node again: refuse one where some node exited 0 (its pod is
    done; the others' torchrun could not form their world again without it, which one
    machine's run cannot show)."""
    if len(failed) < len(codes):
        raise NotImplementedError(
            f"fake Trainer: nodes {failed} failed while others succeeded; a restart of part "
            "of a torchrun world is not modelled"
        )


def _exit_codes(status: Any) -> dict[int, int]:
    """Per node, its container's exit code as the kubelet reports it (a signal: 128 + it)."""
    codes = {}
    for node in status.nodes:
        code = node.exit_code
        codes[node.rank] = 128 - code if code is not None and code < 0 else (code or 0)
    return codes


class FakeTrainer(FakeController):
    """Runs what is submitted to ``emulator`` until ``stop()``; use as a context manager."""

    def __init__(self, emulator: KubeEmulator, root: str | Path, webhook: bool = True) -> None:
        self.emulator = emulator
        self.webhook = webhook
        self.root = Path(root)
        self.errors: list[Exception] = []
        self.runs: dict[tuple[str, str, str], _Run] = {}
        self._events: queue.Queue = queue.Queue()
        self._unsubscribe = None
        self._thread = threading.Thread(target=self._dispatch, name="fake-trainer", daemon=True)

    def start(self) -> FakeTrainer:
        self._unsubscribe = self.emulator.on_event(
            lambda plural, event: (
                self._events.put((plural, event)) if plural in (TRAINJOBS, JOBS) else None
            )
        )
        if self.webhook:
            self.emulator.call(self.emulator.api.admission.append, self._validate)
        self._thread.start()
        return self

    def _dispatch(self) -> None:
        while (item := self._events.get()) is not None:
            plural, event = item
            obj = event["object"]
            meta = obj["metadata"]
            key = (plural, meta.get("namespace", ""), meta["name"])
            suspended = bool((obj.get("spec") or {}).get("suspend"))
            run = self.runs.get(key)
            if event["type"] == "DELETED" or suspended:
                if run is not None and (run.obj["metadata"]["uid"] == meta["uid"] or suspended):
                    self.runs.pop(key).stop(delete_pods=suspended)
                    if suspended and plural == TRAINJOBS:
                        self.emulator.set_conditions(
                            plural, meta["name"], [objects.condition("Suspended")], key[1]
                        )
                continue
            if event["type"] == "ADDED" and run is None:
                built = None
                if plural == TRAINJOBS:
                    try:
                        built = trainer_build.build(obj, self._runtime_of(obj))
                    except BuildError as error:
                        self._creation_failed(obj, str(error))
                        continue
                self.runs[key] = _Run(self, plural, obj, built)
                self.runs[key].start()

    def _runtime_of(self, trainjob: dict[str, Any]) -> dict[str, Any] | None:
        ref = trainjob["spec"]["runtimeRef"]
        if ref.get("kind", "ClusterTrainingRuntime") == "TrainingRuntime":
            return self.emulator.get(
                "trainingruntimes", ref["name"], trainjob["metadata"]["namespace"]
            )
        return self.emulator.get("clustertrainingruntimes", ref["name"])

    def _creation_failed(self, trainjob: dict[str, Any], error: str) -> None:
        """What the TrainJob controller does when it cannot build the JobSet: a Warning event,
        no condition (kubeflow/trainer v2.3.0 pkg/controller/trainjob_controller.go)."""
        event = objects.event(
            trainjob, trainer_build.CREATION_FAILED, trainer_build.event_message(error)
        )
        event["source"] = {"component": TRAINJOB_CONTROLLER}
        event["action"] = "Reconciling"
        event["reportingComponent"] = TRAINJOB_CONTROLLER
        self.emulator.create("events", event, trainjob["metadata"]["namespace"])

    def _validate(
        self, resource: Any, trainjob: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        """The Trainer's validating webhook (on the emulator's loop), on create and update: the
        runtime must exist, have the initializers asked for, and the TrainJob must not set the
        PET_* variables torchrun reserves."""
        if resource.plural != TRAINJOBS:
            return
        api = self.emulator.api
        spec = trainjob["spec"]
        ref = spec["runtimeRef"]
        namespace = trainjob["metadata"].get("namespace")
        if ref.get("kind", "ClusterTrainingRuntime") == "TrainingRuntime":
            key = api.key(resource_of("trainingruntimes"), namespace, ref["name"])
            kind = "trainingRuntime"
        else:
            key = api.key(resource_of("clustertrainingruntimes"), None, ref["name"])
            kind = "clusterTrainingRuntime"
        runtime = api.live(key)
        if runtime is None:
            error = trainer_build.runtime_missing(trainjob)
            self._deny(
                f"spec.{'RuntimeRef' if kind.startswith('cluster') else 'runtimeRef'}: Invalid "
                f"value: {json.dumps(ref)}: {error}: specified {kind} must be created before the "
                "TrainJob is created"
            )
        reserved = sorted(
            {e.get("name") for e in (spec.get("trainer") or {}).get("env") or []}
            & TORCH_RESERVED_ENV
        )
        problems = trainer_build.initializer_errors(trainjob, runtime)
        problems += trainer_build.mpi_errors(trainjob, runtime)
        if problems:
            self._deny(problems[0] if len(problems) == 1 else f"[{', '.join(problems)}]")
        if reserved:
            self._deny(
                "spec.trainer.env: Invalid value: ...: must not have reserved envs, invalid envs "
                f"configured: [{' '.join(reserved)}]"
            )

    @staticmethod
    def _deny(message: str) -> None:
        raise webhook_denial(TRAINJOB_WEBHOOK, message)
