"""B6 scale, on the emulated Kubernetes API server (``tests.support.KubeEmulator``):
``kubetrain launch --backend B --nodes N`` then ``kubetrain wait --backend B NAME`` for a big
job (256 nodes, 256 pods) and a small one (2 nodes), counting every API request the two
processes make, for B = trainer (a TrainJob) and pytorchjob (a Training Operator v1
PyTorchJob). A stand-in controller plays the Trainer/JobSet (or the Training Operator): it
creates the job's pods (Pending) when the job appears, sets them Running once the waiter
follows the job, and ``run_seconds`` later terminates them and marks the job Complete
(Succeeded). Unlike ``tests.support.fake_trainer`` and ``fake_training_operator`` it starts no
processes (256 real nodes would measure the machine, not our API traffic); its own writes are
in-process and not counted."""

from __future__ import annotations

import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.core import KUBETRAIN, Row, Settings, Stats, bench_env, log, run
from bench.figures.wait import IMAGE, NAMESPACE, Cluster, Waiter
from tests.support import objects
from tests.support.fake_training_operator import MASTER, WORKER, defaulted, operator_pod

GROWTH_LIMIT = 5  # requests(big job) - requests(small job) must not exceed this
#: backend -> (plural of its job, the condition that completes it, its node container).
JOBS = {
    "trainer": ("trainjobs", "Complete", objects.NODE_CONTAINER),
    "pytorchjob": ("pytorchjobs", "Succeeded", "pytorch"),
}
BACKEND_LABELS = {"trainer": "TrainJob", "pytorchjob": "PyTorchJob"}


@dataclass(frozen=True)
class Size:
    nodes: int
    run_seconds: float


@dataclass
class Sample:
    requests: Counter[str]
    launch_s: float
    wait_s: float

    @property
    def total(self) -> int:
        return sum(self.requests.values())


class PodPlayer:
    """Plays the Trainer (or the Training Operator) for one job on ``cluster``: ``nodes`` pods,
    Pending on creation, Running on ``go``, terminated with the job Complete (Succeeded)
    ``run_seconds`` after that."""

    def __init__(
        self, cluster: Cluster, name: str, nodes: int, run_seconds: float, backend: str
    ) -> None:
        self.emulator = cluster.emulator
        self.plural, self.complete, self.container = JOBS[backend]
        self.name = name
        self.nodes = nodes
        self.run_seconds = run_seconds
        self.go = threading.Event()
        self.done = threading.Event()
        self.errors: list[BaseException] = []
        self.pods: list[str] = []
        self._thread: threading.Thread | None = None
        self._unsubscribe = self.emulator.on_event(self._on_event)

    def _on_event(self, plural: str, event: dict[str, Any]) -> None:  # on the emulator's loop
        obj = event["object"]
        if plural != self.plural or event["type"] != "ADDED" or self._thread is not None:
            return
        if obj["metadata"]["name"] != self.name:
            return
        self._thread = threading.Thread(target=self._play, args=(obj,), daemon=True)
        self._thread.start()

    def _play(self, job: dict[str, Any]) -> None:
        try:
            for pod in self._pods(job):
                self.pods.append(self.emulator.create_pod(pod)["metadata"]["name"])
            if not self.go.wait(timeout=120):
                raise RuntimeError(f"{self.name}: the waiter never started")
            self._set_all(objects.running(), "Running")
            first = f"training on {self.nodes} nodes"
            self.emulator.append_log(self.pods[0], [first], NAMESPACE, self.container)
            time.sleep(self.run_seconds)
            self.emulator.append_log(self.pods[0], ["done"], NAMESPACE, self.container)
            self._set_all(objects.terminated(0), "Succeeded")
            condition = objects.condition(self.complete, reason="Completed")
            self.emulator.set_conditions(self.plural, self.name, [condition], NAMESPACE)
        except BaseException as error:  # surfaced by finish()
            self.errors.append(error)
        finally:
            self.done.set()

    def _pods(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """The node pods as JobSet (or the operator: master, then workers) names them."""
        if self.plural == "trainjobs":
            return [
                objects.node_pod(self.name, rank, namespace=NAMESPACE, image=IMAGE, owner=job)
                for rank in range(self.nodes)
            ]
        job = defaulted(job)
        workers = [operator_pod(job, WORKER, index) for index in range(self.nodes - 1)]
        return [operator_pod(job, MASTER, 0), *workers]

    def _set_all(self, state: dict[str, Any], phase: str) -> None:
        for pod in self.pods:
            container = objects.container_status(IMAGE, state, name=self.container)
            status = objects.pod_status(phase, [container])
            self.emulator.set_pod_status(pod, status, NAMESPACE)

    def finish(self) -> None:
        self.done.wait(timeout=120)
        self._unsubscribe()
        if self.errors:
            raise RuntimeError(f"{self.name}: the pod player failed") from self.errors[0]
        if not self.done.is_set():
            raise RuntimeError(f"{self.name}: the pod player never finished")


def launch_argv(cluster: Cluster, name: str, nodes: int, backend: str) -> list[str]:
    runtime = ["--runtime", cluster.runtime.name] if backend == "trainer" else []
    return [
        KUBETRAIN, "launch", "--backend", backend, "--namespace", NAMESPACE, "--name", name,
        "--nodes", str(nodes), *runtime, "--image", IMAGE, "--", "torchrun", "train.py",
    ]  # fmt: skip


def one_job(folder: Path, size: Size, tag: str, backend: str) -> Sample:
    """Launch and wait for one job on a cluster of its own; every request both processes made."""
    folder.mkdir()
    cluster = Cluster(folder)
    if backend == "pytorchjob":
        cluster.emulator.install_training_operator()
    plural = JOBS[backend][0]
    name = f"scale-{size.nodes}"
    try:
        player = PodPlayer(cluster, name, size.nodes, size.run_seconds, backend)
        since = time.monotonic()
        env = bench_env(KUBECONFIG=cluster.kubeconfig)
        argv = launch_argv(cluster, name, size.nodes, backend)
        launch_s, done = run(argv, env=env, timeout=120)
        if done.stdout.strip().splitlines()[-1:] != [name]:
            raise RuntimeError(f"{tag}: launch printed {done.stdout[-300:]!r}")
        started = time.perf_counter()

        def wait_argv(cluster: Cluster, name: str) -> list[str]:
            return [KUBETRAIN, "wait", "--backend", backend, "--namespace", NAMESPACE, name]

        def watching(cluster: Cluster, name: str, since: float) -> bool:
            return cluster.emulator.count("watch", plural, since=since) > 0

        waiter = Waiter(cluster, wait_argv, watching, name)  # returns once it watches the job
        player.go.set()
        exited = waiter.finish()
        player.finish()
        waiter.reported_at(started)  # it saw the job Complete
        if len(cluster.emulator.names("pods", NAMESPACE)) != size.nodes:
            raise RuntimeError(f"{tag}: expected {size.nodes} pods on the emulator")
        records = cluster.emulator.requests(since=since)
        requests = Counter(f"{r.verb} {r.resource}" for r in records)
        return Sample(requests, launch_s, exited - started)
    finally:
        cluster.close()


def measure(settings: Settings) -> list[Row]:
    return [measure_backend(settings, backend) for backend in JOBS]


def measure_backend(settings: Settings, backend: str) -> Row:
    small = Size(nodes=2, run_seconds=2.0)
    big = Size(nodes=16, run_seconds=4.0) if settings.quick else Size(nodes=256, run_seconds=10.0)
    repeats = settings.repeats(2)
    samples: dict[Size, list[Sample]] = {small: [], big: []}
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as t:
        for index in range(repeats):  # interleaved, like bench.core.interleaved
            for size in (big, small):
                tag = f"{backend}-{size.nodes}-{index}"
                log(
                    f"B6: {backend}, {size.nodes} nodes, running {size.run_seconds:.0f} s "
                    f"({index + 1})"
                )
                samples[size].append(one_job(Path(t) / tag, size, tag, backend))
    ours = Stats.of([float(s.total) for s in samples[big]])
    base = Stats.of([float(s.total) for s in samples[small]])
    growth = ours.max - base.min  # the worst pairing
    met = growth <= GROWTH_LIMIT

    def kinds(size: Size) -> dict[str, int]:
        return dict(sorted(samples[size][-1].requests.items()))

    def wall(size: Size) -> str:
        launch_s = Stats.of([s.launch_s for s in samples[size]]).median
        wait_s = Stats.of([s.wait_s for s in samples[size]]).median
        return f"launch {launch_s:.2f} s + wait {wait_s:.2f} s"

    kind = BACKEND_LABELS[backend]
    return Row(
        figure=f"B6 scale: API requests of launch + wait, {big.nodes}-node {kind}",
        unit="requests",
        ours=ours,
        ours_label=f"`kubetrain launch --backend {backend} --nodes {big.nodes}` + "
        f"`kubetrain wait --backend {backend} NAME`, job running {big.run_seconds:.0f} s",
        baseline=base,
        baseline_label=f"the same two commands for a {small.nodes}-node job running "
        f"{small.run_seconds:.0f} s",
        target=f"requests({big.nodes}) ≤ requests({small.nodes}) + a constant (no per-node "
        f"or per-second growth); met if the difference is ≤ {GROWTH_LIMIT}",
        how=f"emulated API server (tests.support.KubeEmulator), a fresh one per job, "
        f"each size {repeats}× (interleaved); a stand-in controller creates the "
        f"{big.nodes} (or {small.nodes}) pods Pending when the {kind} appears, sets them all "
        f"Running once the waiter watches the job, and {big.run_seconds:.0f} s "
        f"(or {small.run_seconds:.0f} s) later terminates them and marks the job Complete "
        "(no processes run); every request both CLI processes made is counted (a watch or a "
        f"log follow counts once); difference = max(big) − min(small) = {growth:.0f}; "
        "wall (median; wait = starting `kubetrain wait` to its exit): "
        f"{big.nodes} nodes {wall(big)}, {small.nodes} nodes {wall(small)}; "
        f"{big.nodes} nodes: {kinds(big)}; {small.nodes} nodes: {kinds(small)}",
        ratio=ours.median / base.median,
        met=met,
        verdict="met" if met else f"missed: {growth:.0f} more requests (limit {GROWTH_LIMIT})",
        extra={
            "requests": {
                str(size.nodes): [dict(s.requests) for s in samples[size]] for size in (big, small)
            },
            "wall_s": {
                str(size.nodes): [{"launch": s.launch_s, "wait": s.wait_s} for s in samples[size]]
                for size in (big, small)
            },
            "run_seconds": {
                str(big.nodes): big.run_seconds,
                str(small.nodes): small.run_seconds,
            },
        },
    )
