"""The runtime's own restarts: a node that fails is run again by the kubelet (restartPolicy
OnFailure, JobSet's default), by the Job controller (a new pod, within backoffLimit) or by
JobSet (every node, within failurePolicy.maxRestarts), so the wait fails early on an
out-of-memory kill only when none of them will; and a validating webhook's denial is reported
as what it says, not as a missing permission."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubetrain.backends.base import COMPLETE, FAILED
from kubetrain.backends.kubernetes.client import AdmissionDenied, RetryPolicy
from kubetrain.backends.kubernetes.objects import KubeObjects
from kubetrain.cli import main as kubetrain_main
from kubetrain.jobspec import RuntimeRef, TrainJobSpec
from tests.support import objects
from tests.support.fake_trainer import FakeTrainer

FAST_RETRY = RetryPolicy(attempts=2, first_delay=0.01)
#: Node 1 fails its first run (``CRASH``); every node's later runs succeed. Node 0 outlives
#: node 1's first run, so that the run fails as a whole (the local supervisor stops it).
FLAKY = """\
import os, pathlib, signal, sys, time
rank = os.environ["PET_NODE_RANK"]
marker = pathlib.Path({marker!r})
print("run on node", rank, flush=True)
if rank == "1" and not marker.exists():
    marker.touch()
    {crash}
time.sleep(1.5)
"""


def flaky_script(tmp_path: Path, crash: str) -> Path:
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY.format(marker=str(tmp_path / "crashed-once"), crash=crash))
    return script


def runtime(name: str, *, failure_policy: dict | None = None, never: bool = False) -> dict:
    """A runtime like the Trainer's torch-distributed (no restartPolicy, no backoffLimit, no
    failurePolicy), or with ``never`` like ours (restartPolicy Never, backoffLimit 0)."""
    body = objects.torch_runtime(name)
    jobset = body["spec"]["template"]["spec"]
    if failure_policy is not None:
        jobset["failurePolicy"] = failure_policy
    if never:
        node_job = jobset["replicatedJobs"][0]["template"]["spec"]
        node_job["backoffLimit"] = 0
        node_job["template"]["spec"]["restartPolicy"] = "Never"
    return body


@pytest.fixture
def cluster(k8s, tmp_path, monkeypatch) -> Iterator[Any]:
    monkeypatch.setenv("KUBECONFIG", str(k8s.emulator.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with FakeTrainer(k8s.emulator, tmp_path / "nodes") as trainer:
        yield k8s
    assert trainer.errors == []


def node_pods(k8s, job: str) -> list[dict[str, Any]]:
    return sorted(
        (
            p
            for p in k8s.emulator.list("pods")
            if p["metadata"]["labels"].get(objects.JOBSET_NAME) == job
        ),
        key=lambda p: p["metadata"]["labels"][objects.COMPLETION_INDEX],
    )


def test_max_restarts_on_the_trainer_backend_restarts_every_node_and_completes(
    cluster, tmp_path, capsys
):
    """`--max-restarts 1` on a runtime whose JobSet allows one restart: node 1's first run
    fails its Job (backoffLimit 0), JobSet makes every pod again (restart-attempt 1), and the
    second run completes."""
    cluster.emulator.create(
        "clustertrainingruntimes",
        runtime("restarting", failure_policy={"maxRestarts": 1}, never=True),
    )
    script = flaky_script(tmp_path, "sys.exit(1)")
    launch = ["launch", "--backend", "trainer", "--runtime", "restarting", "--nodes", "2"]
    assert (
        kubetrain_main(
            [*launch, "--max-restarts", "1", "--name", "flaky", "--", "python", str(script)]
        )
        == 0
    )
    capsys.readouterr()
    assert kubetrain_main(["wait", "--backend", "trainer", "--timeout", "90", "flaky"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("job flaky Complete")
    pods = node_pods(cluster, "flaky")
    assert [p["metadata"]["labels"][objects.RESTART_ATTEMPT] for p in pods] == ["1", "1"]
    assert [p["status"]["phase"] for p in pods] == ["Succeeded", "Succeeded"]
    condition = cluster.emulator.get("trainjobs", "flaky")["status"]["conditions"][-1]
    assert (condition["type"], condition["reason"]) == ("Complete", "AllJobsCompleted")


def test_an_oom_killed_node_under_the_upstream_runtime_is_restarted_not_failed_early(
    cluster, tmp_path
):
    """torch-distributed sets no restartPolicy (JobSet defaults it to OnFailure) and no
    backoffLimit (6): the kubelet restarts an OOMKilled node in place, so the wait says so and
    goes on, and the job completes."""
    cluster.emulator.create("clustertrainingruntimes", runtime("upstream"))
    script = flaky_script(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)")
    spec = TrainJobSpec(
        name="oom", command=("python", str(script)), num_nodes=2, runtime=RuntimeRef("upstream")
    )
    warnings: list[str] = []
    backend = cluster.backend(warn=warnings.append, retry=FAST_RETRY)
    backend.launch(spec)
    status = backend.wait("oom", 90, None)
    assert status.state == COMPLETE, status
    said = [w for w in warnings if "OOMKilled" in w]
    assert len(said) == 1, warnings
    assert re.fullmatch(
        r"kubetrain: node 1 ran out of memory \(OOMKilled, exit code 137\); give it more with "
        r"--memory or lower the batch size; the kubelet restarts it in place \(restart [12] of "
        r"6, the Job's backoffLimit, counted over every node\)",
        said[0],
    ), said
    node_1 = node_pods(cluster, "oom")[1]
    assert node_1["spec"]["restartPolicy"] == "OnFailure"
    container = node_1["status"]["containerStatuses"][0]
    assert container["restartCount"] == 1
    assert container["lastState"]["terminated"]["reason"] == "OOMKilled"


# ---------------------------------------------------- the wait's rule, on pods set by hand
def waiting_wait(k8s, runtime_body: dict, pod_labels: dict[str, str] | None = None):
    """Launch on ``runtime_body``, OOM-kill node 1's pod (restartPolicy as the runtime says),
    and return the wait's thread and the warnings it said."""
    import threading

    k8s.emulator.create("clustertrainingruntimes", runtime_body)
    name = runtime_body["metadata"]["name"]
    warnings: list[str] = []
    backend = k8s.backend(warn=warnings.append, retry=FAST_RETRY)
    backend.launch(
        TrainJobSpec(name="demo", command=("true",), num_nodes=2, runtime=RuntimeRef(name))
    )
    result: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: result.update(status=backend.wait("demo", 30, None)), daemon=True
    )
    thread.start()
    node_job = runtime_body["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    policy = node_job["template"]["spec"].get("restartPolicy", "OnFailure")
    pod = objects.node_pod("demo", 1, owner=k8s.emulator.get("trainjobs", "demo"))
    pod["spec"]["restartPolicy"] = policy
    pod["metadata"]["labels"].update(pod_labels or {})
    created = k8s.emulator.create_pod(pod)["metadata"]["name"]
    phase = "Failed" if policy == "Never" else "Running"
    status = objects.container_status(objects.DEFAULT_IMAGE, objects.terminated(137, "OOMKilled"))
    k8s.emulator.set_pod_status(created, objects.pod_status(phase, [status]))
    return thread, result, warnings


def test_a_job_that_replaces_failed_pods_is_not_failed_early(k8s):
    """restartPolicy Never with backoffLimit 2: the Job controller makes a new pod for the
    failed index (job_controller.go: fails only once failed pods exceed backoffLimit)."""
    body = runtime("replacing", never=True)
    body["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] = 2
    thread, result, warnings = waiting_wait(k8s, body)
    time.sleep(1.5)
    assert thread.is_alive(), result
    assert any("the Job controller replaces the pod (failure 1 of 2" in w for w in warnings), (
        warnings
    )
    k8s.emulator.set_conditions(
        "trainjobs", "demo", [objects.condition("Failed", reason="FailedJobs")]
    )
    thread.join(10)
    assert result["status"].reason == "FailedJobs"


def test_an_oom_kill_after_the_last_jobset_restart_fails_the_wait_early(k8s):
    """failurePolicy.maxRestarts 1 and the pods already of restart-attempt 1: no restart can
    come (failure_policy.go restartJobSetActionApplier), so the OOM kill ends the wait."""
    body = runtime("restarted", failure_policy={"maxRestarts": 1}, never=True)
    thread, result, warnings = waiting_wait(k8s, body, {objects.RESTART_ATTEMPT: "1"})
    thread.join(15)
    assert not thread.is_alive()
    status = result["status"]
    assert (status.state, status.reason) == (FAILED, "OOMKilled")
    assert not [w for w in warnings if "restarts" in w and "OOMKilled" in w]


# -------------------------------------------------------------------------- webhook denial
def test_a_webhook_denial_is_reported_as_its_message_not_as_missing_rbac(k8s, tmp_path):
    """A validating webhook's 403 (controller-runtime Denied; apiserver ToStatusErr) names what
    the object holds: the error says the webhook's words, not a verb the ServiceAccount lacks."""
    trainjob = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "reserved", "namespace": "default"},
        "spec": {
            "runtimeRef": {"name": "torch-ddp-cpu"},
            "trainer": {"env": [{"name": "PET_NNODES", "value": "3"}]},
        },
    }
    with FakeTrainer(k8s.emulator, tmp_path / "nodes"):
        with pytest.raises(AdmissionDenied) as denied:
            KubeObjects(k8s.api_client, FAST_RETRY).create(trainjob)
    message = str(denied.value)
    assert message.startswith(
        "the cluster refused to create trainjobs.trainer.kubeflow.org reserved in namespace "
        'default: admission webhook "validator.trainjob.trainer.kubeflow.org" denied the '
        "request: spec.trainer.env: Invalid value"
    ), message
    assert "must not have reserved envs, invalid envs configured: [PET_NNODES]" in message
    assert "permission denied" not in message and "render rbac" not in message
    assert (denied.value.status, denied.value.reason) == (403, "Forbidden")
    assert denied.value.details == {}
