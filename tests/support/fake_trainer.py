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

Translation: from a TrainJob, ``spec.trainer`` gives command, args, env, ``numNodes`` and
``numProcPerNode``; from an Indexed Job, the ``node`` container gives command and args, and its
env ``PET_NNODES``/``PET_NPROC_PER_NODE`` the topology, while ``PET_NODE_RANK`` (the downward-API
completion index), ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT`` are replaced by the local ones.
"""

from __future__ import annotations

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
from tests.support import objects
from tests.support.emulator import KubeEmulator

POLL_SECONDS = 0.05
TRAINJOBS, JOBS = "trainjobs", "jobs"


def _env_values(env: list[dict[str, Any]] | None) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in env or [] if "value" in e}


def _count(value: Any, default: int = 1) -> int:
    """numProcPerNode may be an int, a digit string, or "auto"/"cpu"/"gpu" (one per node here)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def spec_from_trainjob(obj: dict[str, Any]) -> TrainJobSpec:
    trainer = (obj.get("spec") or {}).get("trainer") or {}
    return TrainJobSpec(
        name=obj["metadata"]["name"],
        command=tuple(trainer.get("command") or ()),
        args=tuple(trainer.get("args") or ()),
        env=_env_values(trainer.get("env")),
        num_nodes=_count(trainer.get("numNodes")),
        procs_per_node=_count(trainer.get("numProcPerNode")),
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

    def __init__(self, trainer: FakeTrainer, plural: str, obj: dict[str, Any]) -> None:
        super().__init__(name=f"fake-trainer-{obj['metadata']['name']}", daemon=True)
        self.trainer = trainer
        self.emulator = trainer.emulator
        self.plural = plural
        self.obj = obj
        self.name = obj["metadata"]["name"]
        self.namespace = obj["metadata"].get("namespace", self.emulator.namespace)
        self.stopped = threading.Event()
        self.local = LocalBackend(trainer.root)
        self.pods: dict[int, str] = {}

    def run(self) -> None:
        try:
            self._run()
        except Exception as error:  # the controller must not die silently mid-test
            if not self.stopped.is_set():  # else: its pods were deleted under it, as meant
                self.trainer.errors.append(error)

    def _run(self) -> None:
        translate = spec_from_trainjob if self.plural == TRAINJOBS else spec_from_indexed_job
        spec = translate(self.obj)
        kind = "trainer" if self.plural == TRAINJOBS else "job"
        image = self._image()
        for rank in range(spec.num_nodes):
            pod = objects.node_pod(
                self.name, rank, namespace=self.namespace, kind=kind, image=image, owner=self.obj
            )
            self.pods[rank] = self.emulator.create_pod(pod)["metadata"]["name"]
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

    def _image(self) -> str:
        if self.plural == TRAINJOBS:
            return ((self.obj.get("spec") or {}).get("trainer") or {}).get(
                "image", objects.DEFAULT_IMAGE
            )
        return self.obj["spec"]["template"]["spec"]["containers"][0].get(
            "image", objects.DEFAULT_IMAGE
        )

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


class FakeTrainer:
    """Runs what is submitted to ``emulator`` until ``stop()``; use as a context manager."""

    def __init__(self, emulator: KubeEmulator, root: str | Path) -> None:
        self.emulator = emulator
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
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        self._events.put(None)
        self._thread.join(timeout=30)
        for run in list(self.runs.values()):
            run.stop()

    def __enter__(self) -> FakeTrainer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

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
                self.runs[key] = _Run(self, plural, obj)
                self.runs[key].start()
