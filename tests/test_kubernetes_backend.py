"""The cluster backends against an emulated API server (real HTTP, the official client).

The cluster's behaviour (conditions, pods, logs, faults) is scripted through the emulator;
nothing of ours is mocked. End-to-end training through a fake Trainer is in
test_cluster_e2e.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kubetrain.backends.base import COMPLETE, FAILED, RUNNING, JobStatus
from kubetrain.backends.kubernetes.client import PermissionDenied, RetryPolicy
from kubetrain.backends.kubernetes.launch import TrainerNotInstalled
from kubetrain.errors import InvalidInput, KubetrainError
from kubetrain.jobspec import Initializer, RuntimeRef, TrainJobSpec
from tests.support import KubeEmulator, objects
from tests.support.emulator import resource_of

REPO = Path(__file__).resolve().parent.parent
FAST_RETRY = RetryPolicy(first_delay=0.01, max_delay=0.05)
IMAGE = "ghcr.io/example/trainer:1.0"


def make_spec(name: str = "demo", **fields: Any) -> TrainJobSpec:
    fields.setdefault("num_nodes", 2)
    return TrainJobSpec(name=name, command=("torchrun", "train.py"), image=IMAGE, **fields)


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"not true after {timeout}s: {predicate}")


class Waiter(threading.Thread):
    """backend.wait(...) in a thread, keeping the log lines, the status or the error."""

    def __init__(self, backend: Any, name: str, timeout: float | None = 30) -> None:
        super().__init__(daemon=True)
        self.backend, self.name, self.timeout = backend, name, timeout
        self.lines: list[str] = []
        self.status: JobStatus | None = None
        self.error: BaseException | None = None
        self.finished_at = 0.0

    def run(self) -> None:
        try:
            self.status = self.backend.wait(self.name, self.timeout, self.lines.append)
        except BaseException as error:
            self.error = error
        self.finished_at = time.monotonic()

    def result(self, timeout: float = 20) -> JobStatus:
        self.join(timeout)
        assert not self.is_alive(), "wait did not return"
        if self.error is not None:
            raise self.error
        assert self.status is not None
        return self.status


def watching(emulator: KubeEmulator, resource: str, since: float) -> bool:
    return emulator.count("watch", resource, since=since) > 0


def node_pod(emulator: KubeEmulator, job: str, index: int = 0, kind: str = "trainer") -> str:
    owner = emulator.get("trainjobs" if kind == "trainer" else "jobs", job)
    pod = objects.node_pod(job, index, kind=kind, image=IMAGE, owner=owner)
    return emulator.create_pod(pod)["metadata"]["name"]


def set_container(
    emulator: KubeEmulator, pod: str, state: dict, phase: str = "Running", **fields: Any
) -> None:
    emulator.set_pod_status(
        pod, objects.pod_status(phase, [objects.container_status(IMAGE, state, **fields)])
    )


def complete(emulator: KubeEmulator, job: str, resource: str = "trainjobs") -> None:
    emulator.set_conditions(resource, job, [objects.condition("Complete", reason="Done")])


# ------------------------------------------------------------------------------- waiting
def test_completion_is_noticed_from_a_watch_event_without_polling(k8s):
    emulator, backend = k8s.emulator, k8s.backend()
    backend.launch(make_spec())
    started = time.monotonic()
    waiter = Waiter(backend, "demo")
    waiter.start()
    wait_until(lambda: watching(emulator, "trainjobs", started))
    time.sleep(1.5)  # a poller would have asked again by now
    completed_at = time.monotonic()
    complete(emulator, "demo")
    status = waiter.result()
    assert status.state == COMPLETE and status.reason == "Done"
    assert waiter.finished_at - completed_at < 1.0
    traffic = {
        verb: emulator.count(verb, "trainjobs", since=started) for verb in ("get", "list", "watch")
    }
    assert traffic == {"get": 0, "list": 1, "watch": 1}, "one list, then one open watch"


@pytest.mark.fault
def test_a_410_mid_wait_does_not_lose_the_completion(k8s, injected):
    emulator, backend = k8s.emulator, k8s.backend()
    backend.launch(make_spec())
    started = time.monotonic()
    waiter = Waiter(backend, "demo")
    waiter.start()
    wait_until(lambda: watching(emulator, "trainjobs", started))
    api = emulator.api

    def expire_then_complete() -> None:
        # On the emulator's loop, at once: the completion happens while no watch is open.
        api.expire_watches()
        key = api.key(resource_of("trainjobs"), "default", "demo")
        completed = {"status": {"conditions": [objects.condition("Complete")]}}
        api.patch_object(key, completed, "", "status")

    emulator.call(expire_then_complete)
    assert waiter.result().state == COMPLETE
    assert emulator.count("list", "trainjobs", since=started) == 2, "re-listed after 410"
    injected.struck("the open watch expired (410 Gone) as the job completed")


def test_rank0_logs_follow_restarts_and_reconnects_without_repeating_lines(k8s):
    emulator, backend = k8s.emulator, k8s.backend(retry=FAST_RETRY)
    backend.launch(make_spec())
    waiter = Waiter(backend, "demo")
    waiter.start()
    other = node_pod(emulator, "demo", 1)
    pod = node_pod(emulator, "demo", 0)
    set_container(emulator, pod, objects.running())
    emulator.append_log(other, "from node 1")
    emulator.append_log(pod, ["a", "", "b"])
    wait_until(lambda: waiter.lines == ["a", "", "b"])
    emulator.interrupt_logs()  # the stream breaks; the follower reconnects
    emulator.append_log(pod, "c")
    wait_until(lambda: waiter.lines[-1:] == ["c"])
    set_container(
        emulator, pod, objects.running(), restart_count=1, last_state=objects.terminated(1)
    )
    emulator.append_log(pod, "after restart")
    wait_until(lambda: waiter.lines[-1:] == ["after restart"])
    set_container(emulator, pod, objects.terminated(0), "Succeeded", restart_count=1)
    complete(emulator, "demo")
    assert waiter.result().state == COMPLETE
    assert waiter.lines == ["a", "", "b", "c", "after restart"]


@pytest.mark.parametrize(
    ("script", "reason", "exit_code", "expected"),
    [
        (
            lambda emu, pod: (
                set_container(
                    emu,
                    pod,
                    objects.waiting("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"'),
                    "Pending",
                ),
                emu.add_event(
                    emu.get("pods", pod),
                    "Failed",
                    f'Failed to pull image "{IMAGE}": manifest unknown',
                ),
            ),
            "ImagePullBackOff",
            None,
            ["cannot pull image ghcr.io/example/trainer:1.0", "manifest unknown"],
        ),
        (
            lambda emu, pod: emu.set_pod_status(
                pod, objects.unschedulable("0/3 nodes are available: 3 Insufficient cpu.")
            ),
            "Unschedulable",
            None,
            ["cannot be scheduled", "Insufficient cpu"],
        ),
        (
            lambda emu, pod: set_container(
                emu,
                pod,
                objects.running(),
                restart_count=1,
                last_state=objects.terminated(137, "OOMKilled"),
            ),
            "OOMKilled",
            137,
            ["ran out of memory", "--memory"],
        ),
        (
            lambda emu, pod: set_container(
                emu,
                pod,
                objects.waiting("CrashLoopBackOff", "back-off 40s restarting failed container"),
                restart_count=3,
                last_state=objects.terminated(3),
            ),
            "CrashLoopBackOff",
            3,
            ["keeps crashing", "last exit code 3"],
        ),
    ],
    ids=["image-pull", "unschedulable", "oom", "crash-loop"],
)
def test_a_node_that_cannot_make_progress_fails_the_wait_early(
    k8s, script, reason, exit_code, expected
):
    emulator = k8s.emulator
    backend = k8s.backend(image_pull_grace=0.5, unschedulable_grace=0.5, retry=FAST_RETRY)
    backend.launch(make_spec())
    started = time.monotonic()
    waiter = Waiter(backend, "demo")
    waiter.start()
    pod = node_pod(emulator, "demo", 1)
    script(emulator, pod)
    status = waiter.result()
    assert waiter.finished_at - started < 5
    assert (status.state, status.reason) == (FAILED, reason)
    for text in expected:
        assert text in status.message
    assert status.failed_rank == 1
    assert status.failed_node.exit_code == exit_code
    assert "deleted TrainJob demo" in status.message
    assert emulator.get("trainjobs", "demo") is None, "released: it holds no resources"


def test_early_failure_with_on_cancel_suspend_keeps_the_job_suspended(k8s):
    emulator = k8s.emulator
    backend = k8s.backend(image_pull_grace=0.2, on_cancel="suspend")
    backend.launch(make_spec())
    waiter = Waiter(backend, "demo")
    waiter.start()
    pod = node_pod(emulator, "demo")
    set_container(emulator, pod, objects.waiting("InvalidImageName"), "Pending")
    assert waiter.result().reason == "InvalidImageName"
    assert emulator.get("trainjobs", "demo")["spec"]["suspend"] is True


@pytest.mark.fault
def test_sigterm_to_wait_deletes_the_trainjob(k8s, tmp_path, injected):
    emulator = k8s.emulator
    k8s.backend().launch(make_spec())
    kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    wait = subprocess.Popen(
        [sys.executable, "-m", "kubetrain", "wait", "--backend", "trainer", "demo"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: watching(emulator, "trainjobs", started), timeout=30)
        wait.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        wait_until(lambda: emulator.get("trainjobs", "demo") is None, timeout=5)
        assert time.monotonic() - signalled < 5
        _, stderr = wait.communicate(timeout=10)
    finally:
        wait.kill()
    assert wait.returncode == 143, stderr
    injected.struck("wait received SIGTERM")
    assert "cancelled by SIGTERM" in stderr and "deleted TrainJob demo" in stderr


def test_concurrent_waits_all_end_right(k8s):
    emulator = k8s.emulator
    names = [f"job-{i}" for i in range(20)]
    for name in names:
        k8s.backend().launch(make_spec(name))
    started = time.monotonic()
    waiters = {name: Waiter(k8s.backend(), name) for name in names}
    for waiter in waiters.values():
        waiter.start()
    wait_until(lambda: emulator.count("watch", "pods", since=started) >= len(names))
    for i, name in enumerate(names):
        if i % 2:
            emulator.set_conditions(
                "trainjobs", name, [objects.condition("Failed", message=f"failure {i}")]
            )
        else:
            complete(emulator, name)
    for i, name in enumerate(names):
        status = waiters[name].result()
        assert status.state == (FAILED if i % 2 else COMPLETE)
        assert status.message == (f"failure {i}" if i % 2 else "")


def test_timeout_exits_124(k8s):
    backend = k8s.backend()
    backend.launch(make_spec())
    with pytest.raises(KubetrainError, match="timed out after 0.5s") as timeout:
        backend.wait("demo", 0.5, None)
    assert timeout.value.exit_code == 124


def test_waiting_for_a_job_that_does_not_exist(k8s):
    with pytest.raises(KubetrainError, match="no TrainJob named 'ghost' in namespace default"):
        k8s.backend().wait("ghost", 5, None)


# ------------------------------------------------------------------------------- launch
def test_a_retried_launch_adopts_the_same_job_and_refuses_a_different_spec(k8s):
    emulator, backend = k8s.emulator, k8s.backend()
    assert backend.launch(make_spec()) == "demo"
    first = emulator.get("trainjobs", "demo")
    assert backend.launch(make_spec()) == "demo"
    assert emulator.count("create", "trainjobs") == 1
    with pytest.raises(InvalidInput) as refused:
        backend.launch(make_spec(num_nodes=4, env={"SEED": "1"}))
    message = str(refused.value)
    assert "already exists in namespace default with a different spec" in message
    assert "num_nodes: 2 -> 4" in message and "env.SEED: (unset)" in message
    assert "kubetrain delete --backend trainer --namespace default demo" in message
    assert emulator.get("trainjobs", "demo") == first


def test_launch_adopts_on_409_when_the_job_appeared_after_its_check(k8s):
    emulator, backend = k8s.emulator, k8s.backend()
    backend.launch(make_spec())
    # Our check does not see it yet (two retries of a step racing): the create answers 409.
    emulator.fail(404, verb="get", resource="trainjobs")
    assert backend.launch(make_spec()) == "demo"
    assert [r.verb for r in emulator.requests(resource="trainjobs")][-3:] == [
        "get",
        "create",
        "get",
    ]
    emulator.fail(404, verb="get", resource="trainjobs")
    with pytest.raises(InvalidInput, match="num_nodes: 2 -> 3"):
        backend.launch(make_spec(num_nodes=3))


def test_permission_errors_name_the_missing_verb_and_resource(k8s):
    emulator, backend = k8s.emulator, k8s.backend()
    emulator.fail(403, verb="create", resource="trainjobs")
    with pytest.raises(PermissionDenied) as denied:
        backend.launch(make_spec())
    message = str(denied.value)
    assert "cannot create trainjobs.trainer.kubeflow.org in namespace default" in message
    assert "verb 'create' on resource 'trainjobs'" in message
    assert "kubetrain render rbac --namespace NS | kubectl apply -f -" in message
    backend.launch(make_spec())
    emulator.fail(403, verb="list", resource="pods")
    with pytest.raises(PermissionDenied, match="verb 'list' on resource 'pods'"):
        backend.wait("demo", 10, None)


def test_no_trainer_crd_says_the_trainer_is_not_installed(tmp_path):
    with KubeEmulator() as emulator:
        from kubetrain.backends import BackendOptions
        from kubetrain.backends.kubernetes.backend import KubernetesBackend

        backend = KubernetesBackend("trainer", BackendOptions(), emulator.api_client())
        with pytest.raises(TrainerNotInstalled) as missing:
            backend.launch(make_spec())
        assert "Kubeflow Trainer is not installed" in str(missing.value)
        assert "--backend job" in str(missing.value)
        # Without the right to read CRDs, the TrainJob API itself tells.
        emulator.fail(403, verb="get", resource="customresourcedefinitions")
        with pytest.raises(TrainerNotInstalled):
            backend.launch(make_spec())
        with pytest.raises(TrainerNotInstalled):
            backend.status("demo")
        assert emulator.object_keys() == set()


def test_unknown_runtime_lists_the_existing_ones(k8s):
    k8s.emulator.create("trainingruntimes", objects.torch_runtime("team-torch", "default"))
    with pytest.raises(InvalidInput) as unknown:
        k8s.backend().launch(make_spec(runtime=RuntimeRef(name="torch-nope")))
    message = str(unknown.value)
    assert "no ClusterTrainingRuntime named 'torch-nope'" in message
    assert "ClusterTrainingRuntime torch-ddp-cpu" in message
    assert "TrainingRuntime team-torch" in message


def test_trainer_version_is_read_from_the_crd(tmp_path):
    with KubeEmulator() as emulator:
        emulator.install_trainer(version="2.1")
        from kubetrain.backends import BackendOptions
        from kubetrain.backends.kubernetes.backend import KubernetesBackend

        KubernetesBackend("trainer", BackendOptions(), emulator.api_client()).launch(make_spec())
        spec = emulator.get("trainjobs", "demo")["spec"]
        assert "podTemplateOverrides" in spec and "runtimePatches" not in spec


@pytest.mark.fault
def test_transient_failures_are_retried_and_wait_reports_the_final_state(k8s, injected):
    emulator, backend = k8s.emulator, k8s.backend(retry=FAST_RETRY)
    faults = [
        emulator.fail(500, verb="get", resource="customresourcedefinitions", times=2),
        emulator.drop(verb="create", resource="trainjobs"),
        emulator.fail(503, verb="create", resource="trainjobs"),
    ]
    backend.launch(make_spec())
    assert emulator.names("trainjobs") == {"demo"}
    faults += [
        emulator.fail(500, verb="list", resource="trainjobs", times=2),
        emulator.drop(verb="watch", resource="trainjobs", times=2),
        emulator.fail(502, verb="watch", resource="pods"),
        emulator.fail(500, verb="get", resource="pods/log"),
        emulator.drop(verb="get", resource="pods/log"),
    ]
    started = time.monotonic()
    waiter = Waiter(backend, "demo")
    waiter.start()
    pod = node_pod(emulator, "demo")
    set_container(emulator, pod, objects.running())
    emulator.append_log(pod, ["one", "two"])
    wait_until(lambda: waiter.lines == ["one", "two"])
    emulator.close_watches(abort=True)  # dropped mid-stream: resumed from the last version
    set_container(emulator, pod, objects.terminated(5), "Failed")
    emulator.set_conditions("trainjobs", "demo", [objects.condition("Failed", message="boom")])
    status = waiter.result()
    assert (status.state, status.message, status.failed_rank) == (FAILED, "boom", 0)
    assert status.failed_node.exit_code == 5
    assert waiter.lines == ["one", "two"]
    assert emulator.count("list", "trainjobs", since=started) == 3  # 2 answered 500
    assert [fault.hits for fault in faults] == [fault.times for fault in faults], "all struck"
    injected.struck(f"{sum(fault.hits for fault in faults)} failed or dropped requests")


def test_an_api_server_that_keeps_failing_gives_a_clear_error(k8s):
    emulator, backend = k8s.emulator, k8s.backend(retry=FAST_RETRY)
    emulator.fail(500, verb="get", resource="trainjobs", times=100)
    with pytest.raises(KubetrainError, match="kept failing to get trainjobs.trainer.kubeflow.org"):
        backend.status("demo")
    assert emulator.count("get", "trainjobs") == FAST_RETRY.attempts


def _bad_spec(name: str, **fields: Any) -> Callable[[], TrainJobSpec]:
    return lambda: make_spec(name, **fields)


@pytest.mark.parametrize(
    ("kind", "options", "spec", "match"),
    [
        ("trainer", {}, _bad_spec("Bad_Name"), "RFC 1035"),
        ("trainer", {}, _bad_spec("demo", env={"PET_NNODES": "3"}), "set by the Trainer"),
        ("trainer", {"namespace": "Team_A"}, _bad_spec("demo"), "not a namespace name"),
        ("trainer", {}, _bad_spec("demo", runtime=RuntimeRef(name="nope")), "no Cluster"),
        (
            "trainer",
            {"trainer_version": "2.1"},
            _bad_spec("demo", active_deadline_seconds=60),
            "needs Trainer v2.2",
        ),
        (
            "job",
            {},
            _bad_spec("demo", dataset_initializer=Initializer("hf://org/data")),
            "initializers",
        ),
        ("job", {}, _bad_spec("x" * 62), "hostnames"),
        ("trainer", {}, _bad_spec("demo", script="/no/such/train.py"), "is not a file"),
    ],
    ids=[
        "name",
        "reserved-env",
        "namespace",
        "runtime",
        "version-field",
        "job-initializer",
        "job-hostname",
        "script",
    ],
)
def test_bad_input_creates_nothing(k8s, kind, options, spec, match):
    before = k8s.emulator.object_keys()
    with pytest.raises(InvalidInput, match=match):
        k8s.backend(kind, **options).launch(spec())
    assert k8s.emulator.object_keys() == before
    assert k8s.emulator.count("create") == 0


# ----------------------------------------------------------------- status, logs, delete
def test_status_logs_and_delete_of_a_trainjob_with_a_script(k8s, tmp_path):
    emulator, backend = k8s.emulator, k8s.backend()
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    backend.launch(make_spec(script=str(script), args=(str(script),)))
    configmap = emulator.get("configmaps", "demo-script")
    assert configmap["data"] == {"train.py": "print('hi')\n"}
    assert configmap["metadata"]["uid"] and emulator.requests("create")[0].resource == "configmaps"
    assert backend.status("demo").state == "Created"
    pods = [node_pod(emulator, "demo", index) for index in (0, 1)]
    for index, pod in enumerate(pods):
        set_container(emulator, pod, objects.running())
        emulator.append_log(pod, [f"node {index} line 1", f"node {index} line 2"])
    status = backend.status("demo")
    assert status.state == RUNNING and [n.rank for n in status.nodes] == [0, 1]
    assert list(backend.logs("demo", node=1)) == ["node 1 line 1", "node 1 line 2"]
    assert list(backend.logs("demo"))[:3] == [
        "[node-0] node 0 line 1",
        "[node-0] node 0 line 2",
        "[node-1] node 1 line 1",
    ]
    backend.delete("demo")
    assert emulator.names("trainjobs") == set()
    assert emulator.names("pods") == set(), "the pods went with their TrainJob"
    assert emulator.names("configmaps") == set()
    with pytest.raises(KubetrainError, match="nothing to delete"):
        backend.delete("demo")


def test_logs_follow_prefixes_every_node_until_the_job_ends(k8s):
    emulator, backend = k8s.emulator, k8s.backend()
    backend.launch(make_spec())
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(backend.logs("demo", follow=True)))
    started = time.monotonic()
    reader.start()
    wait_until(lambda: watching(emulator, "pods", started))
    pods = [node_pod(emulator, "demo", index) for index in (0, 1)]
    for index, pod in enumerate(pods):
        set_container(emulator, pod, objects.running())
        emulator.append_log(pod, f"hello from {index}")
    wait_until(lambda: len(lines) == 2)
    for pod in pods:
        set_container(emulator, pod, objects.terminated(0), "Succeeded")
    complete(emulator, "demo")
    reader.join(20)
    assert not reader.is_alive()
    assert sorted(lines) == ["[node-0] hello from 0", "[node-1] hello from 1"]


def test_job_backend_status_and_delete_remove_job_service_and_pods(k8s):
    emulator, backend = k8s.emulator, k8s.backend("job")
    backend.launch(make_spec())
    assert emulator.names("services") == {"demo"} and emulator.names("jobs") == {"demo"}
    pod = node_pod(emulator, "demo", 0, kind="job")
    set_container(emulator, pod, objects.terminated(7), "Failed")
    emulator.patch_status(
        "jobs", "demo", {"conditions": [objects.condition("Failed", reason="BackoffLimitExceeded")]}
    )
    status = backend.status("demo")
    assert (status.state, status.reason, status.failed_rank) == (FAILED, "BackoffLimitExceeded", 0)
    assert status.failed_node.exit_code == 7
    backend.delete("demo")
    assert emulator.names("jobs") == emulator.names("services") == emulator.names("pods") == set()


def test_the_pipeline_runs_workflow_owns_the_trainjob(k8s, monkeypatch):
    emulator = k8s.emulator
    emulator.install_crd(objects.workflow_crd())
    workflow = emulator.create(
        "workflows",
        {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "run-1"}},
    )
    step = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "run-1-launch",
            "labels": {"workflows.argoproj.io/workflow": "run-1"},
        },
        "spec": {"containers": [{"name": "main", "image": "x"}]},
    }
    emulator.create_pod(step)
    # What KFP gives a step container (kubeflow/pipelines 2.17.0 backend/src/v2/compiler/
    # argocompiler/common.go); this pod has the Workflow's label, not its ownerReference.
    monkeypatch.setenv("KFP_POD_NAME", "run-1-launch")
    k8s.backend().launch(make_spec())
    (owner,) = emulator.get("trainjobs", "demo")["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Workflow",
        "run-1",
        workflow["metadata"]["uid"],
    )
    emulator.delete("workflows", "run-1")
    assert emulator.names("trainjobs") == set(), "deleting the run deletes its TrainJob"


def test_restarts_are_refused_beyond_what_the_runtime_allows(k8s):
    """A TrainJob restarts as its runtime's JobSet failurePolicy says; asking for more is an
    error before anything is created, on the trainer and the job backend alike."""
    with pytest.raises(InvalidInput, match=r"max_restarts: 2 restarts asked, but .* allows 0"):
        k8s.backend().launch(make_spec(max_restarts=2))
    runtime = objects.torch_runtime("restarting", "default")
    runtime["spec"]["template"]["spec"]["failurePolicy"] = {"maxRestarts": 3}
    k8s.emulator.create("trainingruntimes", runtime)
    with pytest.raises(InvalidInput, match="job backend cannot restart every node together"):
        k8s.backend("job").launch(make_spec(max_restarts=2))
    assert k8s.emulator.names("trainjobs") == set() and k8s.emulator.names("jobs") == set()

    allowed = make_spec(max_restarts=3, runtime=RuntimeRef("restarting", "TrainingRuntime"))
    warnings: list[str] = []
    k8s.backend(warn=warnings.append).launch(allowed)
    assert k8s.emulator.names("trainjobs") == {"demo"} and warnings == []
    fewer = make_spec("fewer", max_restarts=1, runtime=RuntimeRef("restarting", "TrainingRuntime"))
    k8s.backend(warn=warnings.append).launch(fewer)
    assert warnings == [
        "TrainingRuntime restarting restarts a failed job up to 3 times "
        "(failurePolicy.maxRestarts); --max-restarts 1 cannot lower that"
    ]
