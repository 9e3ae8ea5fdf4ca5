"""Elastic jobs on the pytorchjob backend (issue 30 (3)): ``--nodes MIN:MAX`` rendered as a
Training Operator v1.9 PyTorchJob with ``elasticPolicy`` and Worker replicas only, valid
against the release-1.9 CRD, the operator's webhook and the kubeflow-training SDK's models;
the fake Training Operator (tests/support/fake_training_operator.py) plays it as upstream does
(kubeflow/training-operator v1.9.0 ``pytorch_defaults.go`` ``setElasticPolicy``,
``pytorchjob_webhook.go`` ``validateSpec``, ``elastic.go`` ``Generate``,
``pytorchjob_controller.go`` ``UpdateJobStatus``) with real processes, so a node SIGKILLed
mid-training on the emulator is survived: the kubelet restarts it in place, it rejoins, and
our trainer resumes from its newest checkpoint."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_schemas import schema_errors
from kubeflow.training.api_client import ApiClient

from kubetrain.backends.base import COMPLETE
from kubetrain.cli import main as kubetrain_main
from kubetrain.errors import InvalidInput
from kubetrain.jobspec import TrainJobSpec
from kubetrain.render import render_pytorchjob
from tests.support.fake_training_operator import (
    defaulted,
    operator_env,
    operator_pod,
    webhook_errors,
)
from tests.test_pytorchjob import _Body, crd_schema, operator_cluster  # noqa: F401 (fixture)


def elastic(name: str = "el", nodes: tuple[int, int] = (1, 4), **fields: Any) -> TrainJobSpec:
    fields.setdefault("command", ("torchrun", "-m", "kubetrain.train"))
    fields.setdefault("max_restarts", 2)
    return TrainJobSpec(name=name, min_nodes=nodes[0], num_nodes=nodes[1], **fields)


def assert_valid(job: dict[str, Any]) -> None:
    """The release-1.9 CRD (unknown fields refused), the operator's webhook, and the SDK's
    models reading it back unchanged."""
    assert schema_errors(job, crd_schema()) == []
    assert webhook_errors(job) == []
    model = ApiClient().deserialize(_Body(job), "KubeflowOrgV1PyTorchJob")
    assert ApiClient().sanitize_for_serialization(model) == job


# ------------------------------------------------------------------------------- render
def test_an_elastic_job_renders_as_the_upstream_elastic_examples():
    """Worker replicas only (MAX), OnFailure, elasticPolicy min/max/c10d/maxRestarts,
    nprocPerNode (not the deprecated elasticPolicy.nProcPerNode), a backoffLimit of
    max_restarts x MAX + 1 (each node may be lost max_restarts times), torch's opt-out of the
    shared rendezvous store in the container env."""
    job = render_pytorchjob(elastic(procs_per_node=2))
    assert_valid(job)
    spec = job["spec"]
    assert spec["elasticPolicy"] == {
        "minReplicas": 1,
        "maxReplicas": 4,
        "rdzvBackend": "c10d",
        "maxRestarts": 2,
    }
    assert spec["nprocPerNode"] == "2"
    assert list(spec["pytorchReplicaSpecs"]) == ["Worker"]
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    assert (worker["replicas"], worker["restartPolicy"]) == (4, "OnFailure")
    assert spec["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 9}
    (container,) = worker["template"]["spec"]["containers"]
    env = {var["name"]: var["value"] for var in container["env"]}
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    # A fixed-size job keeps its Master and gets neither.
    fixed = render_pytorchjob(TrainJobSpec(name="fixed", command=("true",), num_nodes=4))
    assert set(fixed["spec"]["pytorchReplicaSpecs"]) == {"Master", "Worker"}
    assert "elasticPolicy" not in fixed["spec"]


def test_render_pytorchjob_nodes_1_4_on_the_cli_is_valid(capsys):
    argv = ["render", "pytorchjob", "--name", "cli-el", "--nodes", "1:4", "--max-restarts", "3"]
    assert kubetrain_main(argv) == 0
    (job,) = list(yaml.safe_load_all(capsys.readouterr().out))
    assert_valid(job)
    assert job["spec"]["elasticPolicy"]["minReplicas"] == 1
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 4


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("name", "fields", "match"),
    [
        ("a" * 54, {"nodes": (1, 11)},
         r"name: .* pod and Service a{54}-worker-10 \(64 .*use a name of at most 53"),
        ("el", {"env": {"PET_RDZV_ENDPOINT": "x:1"}},
         r"env: PET_RDZV_ENDPOINT is set by the Training Operator itself in an elastic"),
    ],
)  # fmt: skip
def test_what_an_elastic_pytorchjob_cannot_do_is_refused_in_one_line(name, fields, match):
    """Worker-only naming: the last pod is <job>-worker-<MAX-1> (no master to shift it)."""
    with pytest.raises(InvalidInput, match=match) as refused:
        render_pytorchjob(elastic(name, **fields))
    assert "\n" not in str(refused.value)
    assert render_pytorchjob(elastic("a" * 53, (1, 11)))["metadata"]["name"] == "a" * 53


# ------------------------------------------------------------------------ the fake's rules
def _job(policy: dict[str, Any], workers: int | None = 3, **spec: Any) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "pytorch", "image": "img"}]}}
    replicas = {} if workers is None else {"Worker": {"replicas": workers, "template": template}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "el", "namespace": "default", "uid": "u"},
        "spec": {"elasticPolicy": policy, "pytorchReplicaSpecs": replicas, **spec},
    }


@pytest.mark.parametrize(
    ("policy", "bounds", "nproc"),
    [
        ({"minReplicas": 1, "maxReplicas": 4}, (1, 4), "auto"),
        ({"maxReplicas": 4}, (4, 4), "auto"),
        ({"minReplicas": 2}, (2, 2), "auto"),
        ({}, (3, 3), "auto"),
        ({"nProcPerNode": 2}, (3, 3), None),
    ],
)
def test_the_fake_defaults_an_elastic_policy_as_set_elastic_policy_does(policy, bounds, nproc):
    """pytorch_defaults.go setElasticPolicy (a missing bound is the other, both the Worker
    replicas when neither) and setDefaultNprocPerNode (no "auto" beside nProcPerNode)."""
    spec = defaulted(_job(policy))["spec"]
    assert (spec["elasticPolicy"]["minReplicas"], spec["elasticPolicy"]["maxReplicas"]) == bounds
    assert spec.get("nprocPerNode") == nproc


def test_the_fake_webhook_applies_the_elastic_rules():
    """pytorchjob_webhook.go validateSpec: a Worker spec is required, and the deprecated
    elasticPolicy.nProcPerNode is forbidden beside nprocPerNode."""
    assert webhook_errors(_job({"minReplicas": 1}, workers=3)) == []
    assert webhook_errors(_job({}, workers=None)) == [
        "spec.pytorchReplicaSpecs[Worker]: Required value: must be configured if elastic "
        "policy is used"
    ]
    assert webhook_errors(_job({"nProcPerNode": 2}, nprocPerNode="2")) == [
        "spec.elasticPolicy.nProcPerNode: Forbidden: must not be used with spec.nprocPerNode"
    ]


def test_the_fake_sets_the_elastic_env_as_elastic_go_does():
    """envvar.go setPodEnv with no Master: no MASTER_*/RANK/WORLD_SIZE/PET_NODE_RANK, no
    init-pytorch; elastic.go Generate: endpoint <job>-worker-0:<Worker port>, backend, the
    "MIN:MAX" PET_NNODES, PET_MAX_RESTARTS, in that order."""
    job = defaulted(render_pytorchjob(elastic(procs_per_node=2)))
    job["metadata"]["uid"] = "u-1"
    assert operator_env(job, "Worker", 2) == [
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "PET_NPROC_PER_NODE", "value": "2"},
        {"name": "PET_RDZV_ENDPOINT", "value": "el-worker-0:23456"},
        {"name": "PET_RDZV_BACKEND", "value": "c10d"},
        {"name": "PET_NNODES", "value": "1:4"},
        {"name": "PET_MAX_RESTARTS", "value": "2"},
    ]
    assert "initContainers" not in operator_pod(job, "Worker", 1)["spec"]
    policy = job["spec"]["elasticPolicy"]
    policy.update(rdzvHost="store", rdzvPort=2379, rdzvId="r", rdzvConf=[
        {"key": "join_timeout", "value": "60"}, {"key": "read_timeout", "value": "9"}])  # fmt: skip
    assert [var for var in operator_env(job, "Worker", 0) if var["name"] != "PYTHONUNBUFFERED"][
        1:
    ] == [
        {"name": "PET_RDZV_ENDPOINT", "value": "store:2379"},
        {"name": "PET_RDZV_BACKEND", "value": "c10d"},
        {"name": "PET_NNODES", "value": "1:4"},
        {"name": "PET_MAX_RESTARTS", "value": "2"},
        {"name": "PET_RDZV_ID", "value": "r"},
        {"name": "PET_RDZV_CONF", "value": "join_timeout=60,read_timeout=9"},
    ]


#: Prints what a node's process sees of the rendezvous env, then sleeps SLEEP_HOST seconds on
#: the node that hosts the rendezvous store (worker-0), SLEEP_OTHER on the others.
SHOW_RDZV = (
    "import os, time; e = os.environ; "
    "print('endpoint', e['PET_RDZV_ENDPOINT'], 'conf', e['PET_RDZV_CONF'], 'nnodes', "
    "e['PET_NNODES'], 'RANK' in e); "
    "host = e['PET_RDZV_CONF'].endswith('is_host=1'); "
    "time.sleep(float(e['SLEEP_HOST' if host else 'SLEEP_OTHER']))"
)


@pytest.mark.fault
def test_an_elastic_job_ends_when_a_worker_succeeds_and_wait_says_a_lost_node(
    operator_cluster,  # noqa: F811 (the fixture)
    injected,
):
    """On the emulator, through the real client: each worker's process gets the endpoint made
    local and is_host=1 on worker-0 only; worker 1 SIGKILLed is restarted in place
    (restartCount 1) and wait says the node was lost; worker-0 exiting 0 ends the job
    Succeeded (no Master, an elasticPolicy: any worker, UpdateJobStatus ~404-418), and
    cleanPodPolicy Running stops worker 1. Worker i is node i: node 0's log is streamed."""
    emulator, operator = operator_cluster.emulator, operator_cluster.operator
    warnings: list[str] = []
    backend = operator_cluster.backend("pytorchjob", warn=warnings.append)
    env = {"SLEEP_HOST": "3", "SLEEP_OTHER": "60"}
    sleepers = elastic("sleepers", (1, 2), command=("python", "-c", SHOW_RDZV), env=env)
    backend.launch(sleepers)
    _wait_for(lambda: _running(operator, "sleepers", 2))
    # killed once it has printed what it got (a loaded machine may start python slowly)
    _wait_for(lambda: any(log.read_text() for log in operator.root.glob("*/sleepers-worker-1.log")))
    operator.kill_node("sleepers", "sleepers-worker-1")
    injected.struck("worker-1's process SIGKILLed")
    _wait_for(lambda: _restarts(emulator, "sleepers-worker-1") == 1)
    assert backend.status("sleepers").membership == "2 of 1..2 nodes"
    assert [(row.name, row.nodes) for row in backend.list_jobs()] == [("sleepers", "1..2")]
    lines: list[str] = []
    status = backend.wait("sleepers", 60, lines.append)
    assert (status.state, status.reason) == (COMPLETE, "PyTorchJobSucceeded")
    assert status.message == "PyTorchJob default/sleepers successfully completed."
    assert status.node_range == "1..2"
    assert (status.nodes[0].rank, status.nodes[0].log) == (0, "sleepers-worker-0")
    assert list(backend.logs("sleepers", node=0)) == lines
    assert backend.status("sleepers").state == COMPLETE
    port = lines[0].split()[1].rpartition(":")[2]
    assert lines == [f"endpoint 127.0.0.1:{port} conf is_host=1 nnodes 1:2 False"]
    (worker_1,) = operator.root.glob("*/sleepers-worker-1.log")  # both of its runs
    assert worker_1.read_text().splitlines() == 2 * [
        f"endpoint 127.0.0.1:{port} conf is_host=0 nnodes 1:2 False"
    ]
    assert [w for w in warnings if "node 1" in w] == [
        "kubetrain: node 1 lost (exit code 137); continuing with 1 of 1..2 nodes; the kubelet "
        "restarts it in place (restart 1 of 5, the PyTorchJob's runPolicy.backoffLimit, counted "
        "over every node) to rejoin",
        "kubetrain: node 1 running again (its container's restart 1); 2 of 1..2 nodes once it "
        "rejoins the rendezvous",
    ]
    assert not [w for w in warnings if "keeps crashing" in w]
    pod = emulator.get("pods", "sleepers-worker-0")
    env_names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
    assert "PET_NODE_RANK" not in env_names and "PET_RDZV_ENDPOINT" in env_names
    _wait_for(lambda: emulator.names("pods") == {"sleepers-worker-0"})
    backend.delete("sleepers")
    assert emulator.get("pytorchjobs", "sleepers") is None


def _running(operator: Any, job: str, nodes: int) -> bool:
    """Whether every one of the job's ``nodes`` pods has its process started."""
    run = operator.runs.get(("default", job))
    started = [node for node in run.nodes if node.process is not None] if run else []
    return len(started) == nodes


def _restarts(emulator: Any, pod: str) -> int | None:
    """The pod's container's restartCount once it runs again, else None."""
    statuses = ((emulator.get("pods", pod) or {}).get("status") or {}).get("containerStatuses")
    running = statuses and "running" in statuses[0]["state"]
    return statuses[0]["restartCount"] if running else None


def _wait_for(condition: Any, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# --------------------------------------------------------------------- DONE WHEN, for real
#: torchrun's c10d rendezvous takes a node for dead once keep_alive_interval x
#: keep_alive_max_attempt seconds pass without its heartbeat (5 x 3 by default: torch
#: ``dynamic_rendezvous.py`` ``create_handler``), and the next round opens only then; 1 x 2 here
#: keeps the test short.
FAST_DEATH = "keep_alive_interval=1,keep_alive_max_attempt=2"


@pytest.mark.fault
def test_our_trainer_survives_a_lost_node_of_an_elastic_pytorchjob(
    operator_cluster,  # noqa: F811 (the fixture)
    digits_dir,
    tmp_path,
    capsys,
    injected,
):
    """`kubetrain launch --backend pytorchjob --nodes 1:2 --max-restarts 3` of our trainer on
    the emulator (2 worker pods, each a real `torchrun -m kubetrain.train` with the elastic
    env), then worker-1's whole process tree SIGKILLed once a checkpoint exists: worker-0's
    torchrun restarts its workers, the kubelet (the fake) restarts worker-1's container in
    place, and the two meet again in the next rendezvous round (full at MAX at once), resume
    from the newest checkpoint and finish. `kubetrain wait` exits 0 on the operator's Succeeded
    condition and says the node was lost; the collected model's accuracy on the held-out
    test split (evaluate_model, 360 digits) is >= 0.95; no checkpoint is lost: the one that
    existed at the kill verifies, the run resumed at or after it, and the final checkpoint's
    metrics hold every epoch once."""
    from kubetrain.artifacts.checkpoint_manifest import (
        latest_checkpoint,
        read_manifest,
        verify_checkpoint,
    )
    from kubetrain.components.collect_checkpoint.collect import collect_checkpoint
    from kubetrain.components.evaluate_model.evaluate import evaluate_model

    operator = operator_cluster.operator
    checkpoints = tmp_path / "checkpoints"
    launch = ["launch", "--backend", "pytorchjob", "--name", "elastic-pt", "--nodes", "1:2",
              "--max-restarts", "3", "--data", str(digits_dir), "--checkpoint-dir",
              str(checkpoints), "--env", f"PET_RDZV_CONF={FAST_DEATH}"]  # fmt: skip
    assert kubetrain_main(launch) == 0
    at_kill: dict[str, Any] = {}  # the newest checkpoint, verified, and the pids killed

    def lose_node_1() -> None:
        _wait_for(lambda: latest_checkpoint(checkpoints) is not None, 120)
        at_kill["manifest"] = verify_checkpoint(latest_checkpoint(checkpoints))
        at_kill["pids"] = operator.kill_node("elastic-pt", "elastic-pt-worker-1")

    killer = threading.Thread(target=lose_node_1, daemon=True)
    killer.start()
    assert kubetrain_main(["wait", "--backend", "pytorchjob", "elastic-pt"]) == 0
    killer.join(5)
    out, err = capsys.readouterr()
    assert len(at_kill["pids"]) >= 2, "the agent and its worker"
    injected.struck(f"worker-1's torchrun and its worker SIGKILLed (pids {at_kill['pids']})")
    assert "kubetrain: node 1 lost (exit code 137); continuing with 1 of 1..2 nodes" in err, err
    assert "kubetrain: node 1 running again (its container's restart 1)" in err
    # The nodes in it at the end: worker-1 may be stopped by cleanPodPolicy before it exits 0.
    assert re.search(r"^job elastic-pt Complete after [\d.]+s \([12] of 1\.\.2 nodes\)$", out, re.M)
    before = at_kill["manifest"]
    resumed = [line for line in out.splitlines() if line.startswith("resumed epoch ")]
    assert resumed, out[-2000:]
    assert int(resumed[-1].split()[2]) >= before["epoch"]
    final = Path(latest_checkpoint(checkpoints))
    manifest = injected.data_intact("the final checkpoint", lambda: verify_checkpoint(final))
    assert manifest["epoch"] == 10
    assert [record["epoch"] for record in manifest["metrics"]] == list(range(1, 11))
    kept = sorted(checkpoints.glob("epoch-*"))
    assert [path.name for path in kept] == ["epoch-000008", "epoch-000009", "epoch-000010"]
    assert all(read_manifest(path) == verify_checkpoint(path) for path in kept)
    collect_checkpoint(str(checkpoints), str(tmp_path / "model"))
    evaluation = evaluate_model(str(tmp_path / "model"), str(digits_dir), threshold=0.95)
    assert evaluation.accuracy >= 0.95 and evaluation.passed
