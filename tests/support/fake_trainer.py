"""A fake Kubeflow Trainer (and batch Job controller) for the emulator: the very object a
backend submits drives real multi-process training on this machine.

When a ``TrainJob`` (or an Indexed ``Job``) is created on the emulator, ``FakeTrainer`` turns it
back into a job spec, the way the Trainer's torch plugin would set up the nodes, and runs it
with the local backend (one process per node with the PET_* environment, master 127.0.0.1 on a
free port). Meanwhile it plays the cluster: one pod per node with the labels JobSet / the Job
controller put on them, Pending then Running, the node's output streamed into the pod's log,
the container terminated with the node's exit code, and finally the job's Complete or Failed
condition. Deleting or suspending the object stops the processes (the emulator
garbage-collects the pods, which the job owns).

Translation: a TrainJob is built the way Trainer 2.3 and JobSet build its pods
(``trainer_build``: its runtime's pod template, ``runtimePatches`` merged strategically, the
TrainJob's trainer fields, the torch plugin's PET_* env, JobSet's name-length rule); a build
failure gives a Warning event ``TrainJobResourcesCreationFailed`` and nothing else, as on a real
cluster. The pods carry the merged spec; the local processes run its ``node`` container's
command and args (``$(VAR)`` expanded as the kubelet does) with its env (downward-API
``fieldRef`` values resolved against the first pod). While it runs, the Trainer's validating
webhook refuses (403) a TrainJob whose runtime does not exist or lacks the initializer it asks
for, or that sets a PET_* variable (kubeflow/trainer v2.3.0 ``pkg/webhooks/trainjob_webhook.go``,
``clustertrainingruntime.go`` and ``trainingruntime.go`` ``ValidateObjects``,
``plugins/jobset/jobset.go`` and ``plugins/torch/torch.go`` ``Validate``); ``webhook=False``
stands for a cluster whose runtime went away after the TrainJob was admitted.
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

from kubetrain.backends.base import COMPLETE, FAILED, RUNNING
from kubetrain.backends.local.backend import LocalBackend
from kubetrain.backends.local.files import node_log
from kubetrain.backends.local.log_tail import LogTail
from kubetrain.jobspec import TrainJobSpec
from tests.support import objects, trainer_build
from tests.support.controller import FakeController
from tests.support.emulator import KubeEmulator, resource_of
from tests.support.kube_api import api_error
from tests.support.trainer_build import BuildError, TrainerPods

POLL_SECONDS = 0.05
TRAINJOBS, JOBS = "trainjobs", "jobs"
TRAINJOB_WEBHOOK = "validator.trainjob.trainer.kubeflow.org"
#: The recorder name of the TrainJob controller (kubeflow/trainer v2.3.0 pkg/controller/setup.go).
TRAINJOB_CONTROLLER = "trainer-trainjob-controller"


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
        env={k: v for k, v in env.items() if not k.startswith("PET_")},
        num_nodes=pods.num_nodes,
        procs_per_node=_count(pods.procs_per_node),
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
        env={k: v for k, v in env.items() if not k.startswith("PET_")},
        num_nodes=_count(env.get("PET_NNODES"), obj["spec"].get("completions") or 1),
        procs_per_node=_count(env.get("PET_NPROC_PER_NODE")),
    )


class _Run(threading.Thread):
    """One job: its local run mirrored into pods, logs and the job's conditions."""

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
        self.pods: dict[int, str] = {}

    def run(self) -> None:
        try:
            self._run()
        except Exception as error:  # the controller must not die silently mid-test
            if not self.stopped.is_set():  # else: its pods were deleted under it, as meant
                self.trainer.errors.append(error)

    def _create_pods(self) -> tuple[TrainJobSpec, str]:
        """The job's pods, as JobSet or the Job controller creates them, and its local run."""
        if self.built is None:
            spec = spec_from_indexed_job(self.obj)
            image = self.obj["spec"]["template"]["spec"]["containers"][0].get(
                "image", objects.DEFAULT_IMAGE
            )
            for rank in range(spec.num_nodes):
                pod = objects.node_pod(
                    self.name,
                    rank,
                    namespace=self.namespace,
                    kind="job",
                    image=image,
                    owner=self.obj,
                )
                self.pods[rank] = self.emulator.create_pod(pod)["metadata"]["name"]
            return spec, image
        image = self.built.container.get("image", objects.DEFAULT_IMAGE)
        created = []
        for rank in range(self.built.num_nodes):
            pod = objects.node_pod(
                self.name,
                rank,
                namespace=self.namespace,
                image=image,
                owner=self.obj,
                pod_spec=self.built.pod_spec,
                pod_labels=self.built.pod_labels,
                replicated_job=self.built.replicated_job,
            )
            created.append(self.emulator.create_pod(pod))
            self.pods[rank] = created[-1]["metadata"]["name"]
        return spec_from_trainjob(self.obj, self.built, created[0]), image

    def _run(self) -> None:
        spec, image = self._create_pods()
        self.local.launch(spec)
        job_dir = self.local.job_dir(self.name)
        tails = {rank: LogTail(node_log(job_dir, rank)) for rank in self.pods}
        running = False
        while not self.stopped.is_set():
            status = self.local.status(self.name)
            if status.state in (RUNNING, COMPLETE, FAILED) and not running:
                running = True
                for pod in self.pods.values():
                    self._set_container(pod, image, objects.running(), "Running")
            if running:
                for rank, tail in tails.items():
                    lines = tail.read_lines(final=status.finished)
                    if lines:
                        self.emulator.append_log(self.pods[rank], lines, self.namespace)
            if status.finished:
                self._finish(status, image)
                return
            time.sleep(POLL_SECONDS)

    def _set_container(self, pod: str, image: str, state: dict[str, Any], phase: str) -> None:
        status = objects.pod_status(phase, [objects.container_status(image, state)])
        self.emulator.set_pod_status(pod, status, self.namespace)

    def _finish(self, status: Any, image: str) -> None:
        codes = {node.rank: node.exit_code for node in status.nodes}
        for rank, pod in self.pods.items():
            code = codes.get(rank)
            code = 128 - code if code is not None and code < 0 else (code or 0)
            phase = "Succeeded" if code == 0 else "Failed"
            self._set_container(pod, image, objects.terminated(code), phase)
        if self.plural == TRAINJOBS:
            condition = (
                objects.condition("Complete", reason="JobSetCompleted", message=status.message)
                if status.state == COMPLETE
                else objects.condition("Failed", reason="JobSetFailed", message=status.message)
            )
            self.emulator.set_conditions(TRAINJOBS, self.name, [condition], self.namespace)
        else:
            self.emulator.patch_status(JOBS, self.name, self._job_status(status), self.namespace)

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
            for pod in self.pods.values():
                try:
                    self.emulator.delete("pods", pod, self.namespace)
                except Exception:  # already garbage-collected
                    pass


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
            & {
                "PET_NNODES",
                "PET_NPROC_PER_NODE",
                "PET_NODE_RANK",
                "PET_MASTER_ADDR",
                "PET_MASTER_PORT",
            }
        )
        problems = trainer_build.initializer_errors(trainjob, runtime)
        if problems:
            self._deny(problems[0] if len(problems) == 1 else f"[{', '.join(problems)}]")
        if reserved:
            self._deny(
                "spec.trainer.env: Invalid value: ...: must not have reserved envs, invalid envs "
                f"configured: [{' '.join(reserved)}]"
            )

    @staticmethod
    def _deny(message: str) -> None:
        """controller-runtime answers a validator's plain error with a 403 denial."""
        raise api_error(
            403, f'admission webhook "{TRAINJOB_WEBHOOK}" denied the request: {message}'
        )
