"""The pytorchjob backend (issue 20): a Training Operator v1 PyTorchJob rendered from the job
spec, validated against the operator's release-1.9 CRD (tests/support/crds, unknown fields
rejected), and run end to end on the emulated cluster by the fake Training Operator
(tests/support/fake_training_operator.py), which plays each pod as a real process with the env
the operator injects (kubeflow/training-operator release-1.9 pkg/controller.v1/pytorch/
envvar.go, master.go)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_schemas import schema_errors
from kmock import resource
from kubeflow.training.api_client import ApiClient
from kubeflow.training.models import KubeflowOrgV1PyTorchJob

from kubetrain.backends import BACKENDS, get_backend
from kubetrain.backends.base import COMPLETE, FAILED
from kubetrain.backends.kubernetes.kinds import PYTORCHJOB
from kubetrain.backends.kubernetes.launch import TrainingOperatorNotInstalled
from kubetrain.cli import main as kubetrain_main
from kubetrain.errors import InvalidInput, KubetrainError
from kubetrain.jobspec import Initializer, Resources, Toleration, TrainJobSpec, Volume
from kubetrain.render import render_job, render_pytorchjob
from tests.support import objects
from tests.support.fake_training_operator import (
    FakeTrainingOperator,
    pytorchjob_crd,
    webhook_errors,
)
from tests.test_doctor import cluster, doctor  # noqa: F401 (cluster: the doctor tests' fixture)

REPO = Path(__file__).resolve().parent.parent
OWNER = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "run-1", "uid": "u-1"}
#: Prints what a node's process sees of the operator's env, then sleeps SLEEP_<rank> seconds
#: and exits with EXIT_<rank> (default 0).
SHOW_ENV = (
    "import os, sys, time; e = os.environ; "
    "print('rank', e['RANK'], 'world', e['WORLD_SIZE'], 'master', e['MASTER_ADDR'], "
    "'node_rank', e['PET_NODE_RANK'], 'nnodes', e['PET_NNODES'], 'nproc', "
    "e['PET_NPROC_PER_NODE']); time.sleep(float(e.get('SLEEP_' + e['RANK'], '0'))); "
    "sys.exit(int(e.get('EXIT_' + e['RANK'], '0')))"
)


def crd_schema() -> dict[str, Any]:
    (version,) = pytorchjob_crd()["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def spec(name: str = "demo", **fields: Any) -> TrainJobSpec:
    fields.setdefault("command", ("torchrun", "-m", "kubetrain.train"))
    return TrainJobSpec(name=name, **fields)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('hello')\n")
    return path


RENDERED = {
    "one-node": {},
    "four-nodes": {"num_nodes": 4, "procs_per_node": 2},
    "gpu": {"num_nodes": 2, "procs_per_node": 8,
            "resources_per_node": Resources(cpu="16", memory="64Gi", gpu=8),
            "node_selector": {"nvidia.com/gpu.product": "H100"}},
    "tolerations": {"tolerations": (Toleration(key="nvidia.com/gpu", operator="Exists",
                                               effect="NoSchedule"),)},
    "volumes-and-account": {"volumes": (Volume("shared", "kubetrain-shared", "/mnt/shared"),),
                            "service_account": "kubetrain", "storage_secret": "s3-creds",
                            "labels": {"team": "vision"}, "pod_labels": {"a": "b"}},
    "suspend-deadline-restarts": {"num_nodes": 3, "suspend": True,
                                  "active_deadline_seconds": 600, "max_restarts": 2,
                                  "env": {"NCCL_DEBUG": "INFO"}, "working_dir": "/mnt/work"},
}  # fmt: skip


@pytest.mark.parametrize("fields", RENDERED.values(), ids=RENDERED.keys())
def test_every_rendered_pytorchjob_is_valid_against_the_release_1_9_crd(fields):
    job = render_pytorchjob(spec(**fields), owner=OWNER)
    assert schema_errors(job, crd_schema()) == []
    assert webhook_errors(job) == []
    # The SDK's models read it back unchanged (nothing lost, nothing unknown to them).
    model = ApiClient().deserialize(_Body(job), "KubeflowOrgV1PyTorchJob")
    assert isinstance(model, KubeflowOrgV1PyTorchJob)
    assert ApiClient().sanitize_for_serialization(model) == job


def test_a_shipped_script_is_mounted_and_valid(script):
    configmap, job = render_job(
        spec(command=("torchrun",), args=("train.py",), script=str(script)),
        "pytorchjob",
        "default",
        "",
    )
    assert configmap["kind"] == "ConfigMap" and job["kind"] == "PyTorchJob"
    assert schema_errors(job, crd_schema()) == []
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["/workspace/train.py"]


class _Body:
    def __init__(self, value: Any) -> None:
        import json

        self.data = json.dumps(value)


def test_master_and_workers_run_container_pytorch_with_the_operators_port():
    job = render_pytorchjob(spec(num_nodes=4, procs_per_node=2))
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert {k: v["replicas"] for k, v in replicas.items()} == {"Master": 1, "Worker": 3}
    assert job["spec"]["nprocPerNode"] == "2"
    (container,) = replicas["Worker"]["template"]["spec"]["containers"]
    assert container["name"] == "pytorch"
    assert container["ports"] == [
        {"containerPort": 23456, "name": "pytorchjob-port", "protocol": "TCP"}
    ]
    assert job["spec"]["runPolicy"] == {"cleanPodPolicy": "Running"}
    assert {r["restartPolicy"] for r in replicas.values()} == {"Never"}
    one = render_pytorchjob(spec())["spec"]["pytorchReplicaSpecs"]
    assert list(one) == ["Master"], "no Worker spec for one node"


def test_every_pod_opts_out_of_istio_as_the_sdk_does():
    """A sidecar outliving `pytorch` would keep the master Running: the job never succeeds."""
    job = render_pytorchjob(TrainJobSpec(name="istio", command=("true",), num_nodes=3))
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        assert replica["template"]["metadata"]["annotations"] == {
            "sidecar.istio.io/inject": "false"
        }


def test_restarts_become_on_failure_and_a_backoff_limit_for_every_node():
    job = render_pytorchjob(spec(num_nodes=3, max_restarts=2, suspend=True))
    assert job["spec"]["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "backoffLimit": 7,
        "suspend": True,
    }
    replicas = job["spec"]["pytorchReplicaSpecs"].values()
    assert {r["restartPolicy"] for r in replicas} == {"OnFailure"}


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"name": "a" * 54, "num_nodes": 12},
         r"name: .* pod and Service a{54}-worker-10 \(64 .*use a name of at most 53"),
        ({"name": "a" * 55, "num_nodes": 2}, r"name: .*more than 63.*at most 54 characters"),
        ({"env": {"MASTER_ADDR": "x"}}, r"env: MASTER_ADDR is set by the Training Operator"),
        ({"dataset_initializer": Initializer("hf://org/set")},
         r"dataset_initializer: needs Kubeflow Trainer's initializers"),
    ],
)  # fmt: skip
def test_what_a_pytorchjob_cannot_do_is_refused_in_one_line(fields, match):
    fields = dict(fields)
    name = fields.pop("name", "demo")
    with pytest.raises(InvalidInput, match=match) as refused:
        render_pytorchjob(spec(name, **fields))
    assert "\n" not in str(refused.value)


def test_render_pytorchjob_on_the_cli_prints_the_job(capsys):
    assert kubetrain_main(["render", "pytorchjob", "--name", "cli-job", "--nodes", "2"]) == 0
    (job,) = list(yaml.safe_load_all(capsys.readouterr().out))
    assert job["kind"] == "PyTorchJob" and job["metadata"]["name"] == "cli-job"
    assert schema_errors(job, crd_schema()) == []


@pytest.mark.bad_input
def test_render_pytorchjob_refuses_another_backend(capsys):
    assert kubetrain_main(["render", "pytorchjob", "--backend", "job"]) == 2
    assert "--backend: 'job' is not a PyTorchJob" in capsys.readouterr().err


def test_the_backend_is_offered_everywhere_backends_are_listed():
    assert "pytorchjob" in BACKENDS
    assert get_backend("pytorchjob").kind is PYTORCHJOB


# ----------------------------------------------------------------- on the emulated cluster
@pytest.fixture
def operator_cluster(k8s, tmp_path, monkeypatch) -> Iterator[Any]:
    """The emulated cluster with the fake Training Operator, reached through KUBECONFIG."""
    monkeypatch.setenv("KUBECONFIG", str(k8s.emulator.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with FakeTrainingOperator(k8s.emulator, tmp_path / "nodes") as operator:
        k8s.operator = operator
        yield k8s
    assert operator.errors == []


def show_env(name: str, nodes: int = 3, **env: str) -> TrainJobSpec:
    return TrainJobSpec(
        name=name,
        command=("python", "-c", SHOW_ENV),
        num_nodes=nodes,
        procs_per_node=2,
        env=env,
    )


def test_ranks_see_the_operators_env_and_the_job_succeeds(operator_cluster):
    emulator, backend = operator_cluster.emulator, operator_cluster.backend("pytorchjob")
    # The master ends last: a finished master's job deletes the pods still running.
    assert backend.launch(show_env("envs", SLEEP_0="1")) == "envs"
    lines: list[str] = []
    status = backend.wait("envs", 60, lines.append)
    assert status.state == COMPLETE and status.reason == "PyTorchJobSucceeded"
    assert lines == ["rank 0 world 6 master 127.0.0.1 node_rank 0 nnodes 3 nproc 2"]
    assert [n.rank for n in status.nodes] == [0, 1, 2]
    # The pods carry the operator's own values (the processes get the master made local).
    worker = emulator.get("pods", "envs-worker-1")
    env = {e["name"]: e["value"] for e in worker["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "envs-master-0"
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "23456"
    assert (env["RANK"], env["PET_NODE_RANK"], env["WORLD_SIZE"]) == ("2", "2", "6")
    assert worker["metadata"]["labels"]["training.kubeflow.org/replica-type"] == "worker"
    assert emulator.names("services") >= {"envs-master-0", "envs-worker-0", "envs-worker-1"}
    logs = list(backend.logs("envs", node=2))
    assert logs == ["rank 2 world 6 master 127.0.0.1 node_rank 2 nnodes 3 nproc 2"]


@pytest.mark.fault
def test_a_failed_worker_fails_wait_with_its_reason_and_exit_code(operator_cluster, injected):
    emulator, backend = operator_cluster.emulator, operator_cluster.backend("pytorchjob")
    backend.launch(show_env("fails", nodes=2, EXIT_1="3", SLEEP_0="30"))
    status = backend.wait("fails", 60, None)
    injected.struck("worker 0 (rank 1) exited 3")
    assert status.state == FAILED and status.reason == "PyTorchJobFailed"
    assert status.message == "PyTorchJob fails is failed because 1 Worker replica(s) failed."
    assert status.failed_rank == 1 and status.failed_node.exit_code == 3
    # cleanPodPolicy Running keeps the failed pod, and its log, and stops the running master.
    deadline = time.monotonic() + 15
    while emulator.names("pods") != {"fails-worker-0"}:
        assert time.monotonic() < deadline, emulator.names("pods")
        time.sleep(0.05)


@pytest.mark.fault
def test_sigterm_to_wait_deletes_the_pytorchjob(operator_cluster, injected):
    emulator = operator_cluster.emulator
    sleeper = TrainJobSpec(name="sleeper", command=("sleep", "60"), num_nodes=2)
    operator_cluster.backend("pytorchjob").launch(sleeper)
    started = time.monotonic()
    wait = subprocess.Popen(
        [sys.executable, "-m", "kubetrain", "wait", "--backend", "pytorchjob", "sleeper"],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while emulator.count("watch", "pytorchjobs", since=started) == 0:
            assert time.monotonic() - started < 30, "wait never watched the job"
            time.sleep(0.05)
        wait.send_signal(signal.SIGTERM)
        _, stderr = wait.communicate(timeout=20)
    finally:
        wait.kill()
    assert wait.returncode == 143, stderr
    injected.struck("wait received SIGTERM")
    assert "cancelled by SIGTERM" in stderr and "deleted PyTorchJob sleeper" in stderr
    assert emulator.get("pytorchjobs", "sleeper") is None


def test_on_cancel_suspend_sets_run_policy_suspend(operator_cluster):
    emulator = operator_cluster.emulator
    backend = operator_cluster.backend("pytorchjob", on_cancel="suspend")
    backend.launch(TrainJobSpec(name="held", command=("sleep", "60"), num_nodes=2))
    assert "suspended PyTorchJob held" in backend.release("held")
    job = emulator.get("pytorchjobs", "held")
    assert job["spec"]["runPolicy"]["suspend"] is True
    assert backend.status("held").reason == "Suspended"


def test_a_retried_launch_adopts_the_job_and_refuses_a_different_spec(operator_cluster):
    emulator, backend = operator_cluster.emulator, operator_cluster.backend("pytorchjob")
    held = TrainJobSpec(name="again", command=("sleep", "60"), num_nodes=2, suspend=True)
    assert backend.launch(held) == "again"
    assert backend.launch(held) == "again"
    assert emulator.count("create", "pytorchjobs") == 1
    with pytest.raises(InvalidInput, match=r"different spec \(num_nodes: 2 -> 3\)"):
        backend.launch(TrainJobSpec(name="again", command=("sleep", "60"), num_nodes=3,
                                    suspend=True))  # fmt: skip


def test_the_pipeline_runs_workflow_owns_the_pytorchjob(operator_cluster, monkeypatch):
    monkeypatch.setenv("KUBETRAIN_OWNER_NAME", "run-7")
    monkeypatch.setenv("KUBETRAIN_OWNER_UID", "uid-7")
    backend = operator_cluster.backend("pytorchjob")
    backend.launch(TrainJobSpec(name="owned", command=("true",), suspend=True))
    (owner,) = operator_cluster.emulator.get("pytorchjobs", "owned")["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Workflow", "run-7", "uid-7")


@pytest.mark.bad_input
def test_no_operator_says_it_is_not_installed(k8s):
    with pytest.raises(TrainingOperatorNotInstalled, match="pytorchjobs.kubeflow.org CRD"):
        k8s.backend("pytorchjob").launch(TrainJobSpec(name="x", command=("true",)))
    assert k8s.emulator.count("create") == 0


def test_early_failure_from_a_pod_that_cannot_pull_its_image(operator_cluster):
    emulator = operator_cluster.emulator
    backend = operator_cluster.backend("pytorchjob", image_pull_grace=0.0)
    job = TrainJobSpec(name="pull", command=("sleep", "60"), suspend=True)
    backend.launch(job)
    from tests.support.fake_training_operator import defaulted, operator_pod

    pod = operator_pod(defaulted(emulator.get("pytorchjobs", "pull")), "Master", 0)
    emulator.create_pod(pod)
    waiting = objects.container_status("img", objects.waiting("ErrImagePull"), name="pytorch")
    emulator.set_pod_status("pull-master-0", objects.pod_status("Pending", [waiting]))
    status = backend.wait("pull", 30, None)
    assert status.state == FAILED and status.reason == "ErrImagePull"
    assert status.failed_rank == 0 and emulator.get("pytorchjobs", "pull") is None


@pytest.mark.parametrize(
    ("init_state", "phase", "reason", "said"),
    [
        (
            objects.waiting("ImagePullBackOff", "Back-off pulling image alpine:3.10"),
            "Pending",
            "ImagePullBackOff",
            "node 1's init container init-pytorch cannot pull image alpine:3.10",
        ),
        (
            objects.terminated(1),
            "Failed",
            "InitContainerFailed",
            "node 1's init container init-pytorch exited with code 1 before the node started "
            "(it waits ~200 s for the master's Service)",
        ),
    ],
)
def test_a_worker_held_back_by_the_operators_init_container_fails_early(
    operator_cluster, init_state, phase, reason, said
):
    """The operator's init-pytorch (alpine:3.10, nslookup of the master's Service, exit 1
    after 100 tries) stands before the pytorch container: its pull failure or its exit is
    the cause (wait hung on an init container's ImagePullBackOff, which it did not read)."""
    emulator = operator_cluster.emulator
    backend = operator_cluster.backend("pytorchjob", image_pull_grace=0.0)
    backend.launch(TrainJobSpec(name="init", command=("sleep", "60"), num_nodes=2, suspend=True))
    from tests.support.fake_training_operator import defaulted, operator_pod

    emulator.create_pod(operator_pod(defaulted(emulator.get("pytorchjobs", "init")), "Worker", 0))
    status = objects.pod_status(
        phase,
        [objects.container_status("img", objects.waiting("PodInitializing"), name="pytorch")],
    )
    status["initContainerStatuses"] = [
        objects.container_status("alpine:3.10", init_state, name="init-pytorch")
    ]
    emulator.set_pod_status("init-worker-0", status)
    ended = backend.wait("init", 30, None)
    assert (ended.state, ended.reason, ended.failed_rank) == (FAILED, reason, 1)
    assert said in ended.message


@pytest.mark.parametrize(
    ("decoration", "waits"),
    [
        ({"annotations": {"scheduling.k8s.io/group-name": "gang"}}, True),  # Volcano
        ({"labels": {"scheduling.x-k8s.io/pod-group": "gang"}}, True),  # scheduler-plugins
        ({}, False),
    ],
)
def test_a_pod_in_a_gang_operators_pod_group_waits_for_its_group(
    operator_cluster, monkeypatch, decoration, waits
):
    """An operator with gang scheduling on puts every pod in a PodGroup (release-1.9
    podgroup_control.go DecoratePodTemplateSpec); the group is Unschedulable until all of it
    fits, so `auto` gives it no limit, as for a Trainer gang runtime; a plain pod gets the
    default grace."""
    from kubetrain.backends.kubernetes import wait as kube_wait
    from tests.support.fake_training_operator import defaulted, operator_pod

    monkeypatch.setattr(kube_wait, "UNSCHEDULABLE_GRACE_SECONDS", 0.3)
    emulator = operator_cluster.emulator
    warnings: list[str] = []
    backend = operator_cluster.backend("pytorchjob", warn=warnings.append)
    backend.launch(TrainJobSpec(name="gang", command=("sleep", "60"), suspend=True))
    pod = operator_pod(defaulted(emulator.get("pytorchjobs", "gang")), "Master", 0)
    for field, values in decoration.items():
        pod["metadata"][field] = {**(pod["metadata"].get(field) or {}), **values}
    emulator.create_pod(pod)
    emulator.set_pod_status("gang-master-0", objects.unschedulable())
    if waits:
        with pytest.raises(KubetrainError, match="timed out after 1.5s") as timed_out:
            backend.wait("gang", 1.5, None)  # 5 x the default grace, still waiting
        assert timed_out.value.exit_code == 124
        (said,) = [w for w in warnings if "cannot be scheduled" in w]
        assert "with no time limit (its pod group is scheduled as a gang" in said
    else:
        assert backend.wait("gang", 30, None).reason == "Unschedulable"


def test_cli_launch_wait_logs_list_delete(operator_cluster, capsys):
    emulator = operator_cluster.emulator
    code = "import os, time; r = os.environ['RANK']; print('hi from', r); time.sleep(r == '0')"
    program = ["--", "python", "-c", code]
    launch = ["launch", "--backend", "pytorchjob", "--name", "cli", "--nodes", "2"]
    assert kubetrain_main([*launch, *program]) == 0
    assert kubetrain_main(["wait", "--backend", "pytorchjob", "cli"]) == 0
    out = capsys.readouterr().out
    assert "hi from 0" in out and "job cli Complete" in out
    assert kubetrain_main(["logs", "--backend", "pytorchjob", "cli"]) == 0
    assert capsys.readouterr().out.splitlines() == ["[node-0] hi from 0", "[node-1] hi from 1"]
    assert kubetrain_main(["list", "--backend", "pytorchjob"]) == 0
    assert "cli" in capsys.readouterr().out
    assert kubetrain_main(["delete", "--backend", "pytorchjob", "cli"]) == 0
    assert emulator.get("pytorchjobs", "cli") is None
    assert emulator.names("pods") == emulator.names("services") == set()


def test_pytorchjob_backend_trains_digits_through_torchrun(operator_cluster, digits_dir, tmp_path):
    """The steps' own road (launch, wait, collect, evaluate) with our image's command,
    `torchrun -m kubetrain.train`, which takes its topology from the PET_* the operator
    injects: 2 nodes x 1 process rendezvous on the master and train to >= 0.95 (the default 10
    epochs, as the trainer backend's end to end: fewer end at 0.95 or under)."""
    from kubetrain.components.collect_checkpoint.collect import collect_checkpoint
    from kubetrain.components.evaluate_model.evaluate import evaluate_model
    from kubetrain.components.launch_trainjob.launch import LaunchRequest, TrainingOptions, launch
    from kubetrain.components.wait_trainjob.wait import wait_for_job

    checkpoints = tmp_path / "checkpoints"
    training = TrainingOptions(data_dir=str(digits_dir), checkpoint_dir=str(checkpoints))
    request = LaunchRequest(training, name="digits-pt", nodes=2)
    assert launch(request, backend="pytorchjob").job_name == "digits-pt"
    job = operator_cluster.emulator.get("pytorchjobs", "digits-pt")
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    lines: list[str] = []
    result = wait_for_job("digits-pt", backend="pytorchjob", on_log_line=lines.append)
    assert result.state == "Complete"
    assert any(line.startswith("training complete") for line in lines), lines[-5:]
    collect_checkpoint(str(checkpoints), str(tmp_path / "model"))
    evaluation = evaluate_model(str(tmp_path / "model"), str(digits_dir), threshold=0.95)
    assert evaluation.accuracy >= 0.95 and evaluation.passed


def _without(schema: Any, key: str) -> Any:
    if isinstance(schema, dict):
        return {k: _without(v, key) for k, v in schema.items() if k != key}
    if isinstance(schema, list):
        return [_without(v, key) for v in schema]
    return schema


def test_doctor_finds_the_training_operator_its_release_and_image(request):
    """`kubetrain doctor --backend pytorchjob`: the v1 CRD (release 1.9's has
    runPolicy.managedBy, 1.7/1.8's do not: kubeflow/training-operator
    manifests/base/crds/kubeflow.org_pytorchjobs.yaml at v1.8.1 and v1.9.0) and the operator
    Deployment's image (label control-plane: kubeflow-training-operator, v1.9.0
    manifests/base/deployment.yaml)."""
    emulator, kubeconfig, _denied = request.getfixturevalue("cluster")
    missing = doctor(kubeconfig, "--backend", "pytorchjob")
    assert missing.returncode == 1
    assert "FAIL operator Kubeflow Training Operator is not installed" in missing.stdout
    assert "FAIL trainer" not in missing.stdout and "runtime" not in missing.stdout
    emulator.install_crd(_without(pytorchjob_crd(), "managedBy"))
    old = doctor(kubeconfig, "--backend", "pytorchjob")
    assert old.returncode == 0, old.stdout + old.stderr
    assert "PyTorchJob CRD of release 1.8 or older" in old.stdout
    emulator.delete("customresourcedefinitions", "pytorchjobs.kubeflow.org")
    emulator.install_training_operator()
    labels = {"control-plane": "kubeflow-training-operator"}
    image = "kubeflow/training-operator:v1-5170a36"
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "training-operator", "namespace": "kubeflow", "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "training-operator", "image": image}]},
            },
        },
    }
    emulator.create(resource("apps", "v1", "deployments"), deployment, "kubeflow")
    ready = doctor(kubeconfig, "--backend", "pytorchjob")
    assert ready.returncode == 0, ready.stdout + ready.stderr
    assert (
        "ok   operator Kubeflow Training Operator installed: PyTorchJob CRD of release 1.9 or "
        f"newer; its Deployment runs {image}"
    ) in ready.stdout


def test_a_job_past_its_active_deadline_fails_and_wait_says_so(operator_cluster):
    """--active-deadline-seconds becomes runPolicy.activeDeadlineSeconds; the operator fails
    the job past it and cleanPodPolicy Running stops the pods still running."""
    emulator, backend = operator_cluster.emulator, operator_cluster.backend("pytorchjob")
    slow = show_env("slow", 2, SLEEP_0="60", SLEEP_1="60")
    backend.launch(dataclasses.replace(slow, active_deadline_seconds=2))
    assert emulator.get("pytorchjobs", "slow")["spec"]["runPolicy"]["activeDeadlineSeconds"] == 2
    status = backend.wait("slow", 30, None)
    assert (status.state, status.reason) == (FAILED, "PyTorchJobFailed")
    assert "active longer than specified deadline" in status.message
    deadline = time.monotonic() + 15
    while emulator.names("pods"):
        assert time.monotonic() < deadline, emulator.names("pods")
        time.sleep(0.05)


@pytest.mark.fault
def test_restarts_run_out_at_the_backoff_limit_and_wait_says_so(operator_cluster, injected):
    """max_restarts 1 on 2 nodes: OnFailure restarts the failing worker in place; the
    operator fails the job once the pods' restarts add up to backoffLimit 3 (pkg/core/job.go
    PastBackoffLimit) and deletes every pod (pkg/controller.v1/common/job.go ReconcileJobs)."""
    emulator, backend = operator_cluster.emulator, operator_cluster.backend("pytorchjob")
    flaky = dataclasses.replace(show_env("flaky", 2, EXIT_1="3", SLEEP_0="30"), max_restarts=1)
    backend.launch(flaky)
    assert emulator.get("pytorchjobs", "flaky")["spec"]["runPolicy"]["backoffLimit"] == 3
    status = backend.wait("flaky", 60, None)
    injected.struck("worker 0 failed 3 times")
    assert status.state == FAILED and status.reason == "PyTorchJobFailed"
    assert status.message.startswith(
        "Job flaky has failed because it has reached the specified backoff limit"
    )
    job = emulator.get("pytorchjobs", "flaky")
    conditions = {c["type"]: c["status"] for c in job["status"]["conditions"]}
    assert conditions["Failed"] == "True"
    deadline = time.monotonic() + 15
    while emulator.names("pods"):
        assert time.monotonic() < deadline, emulator.names("pods")
        time.sleep(0.05)


def test_the_kubeflow_training_sdk_reads_our_pytorchjob_and_its_outcome(operator_cluster):
    """kubeflow-training 1.9's own TrainingClient, over HTTP: it parses the PyTorchJob we
    created, finds its master pod by the operator's labels, and reads the outcome our wait
    reports (its is_job_succeeded reads the Succeeded condition)."""
    from kubeflow.training import TrainingClient

    backend = operator_cluster.backend("pytorchjob")
    backend.launch(show_env("sdk", 2, SLEEP_0="1"))
    assert backend.wait("sdk", 60, None).state == COMPLETE
    sdk = TrainingClient(config_file=os.environ["KUBECONFIG"], namespace="default")
    job = sdk.get_job("sdk", job_kind="PyTorchJob")
    assert isinstance(job, KubeflowOrgV1PyTorchJob)
    assert job.spec.pytorch_replica_specs["Worker"].replicas == 1
    assert job.spec.nproc_per_node == "2"
    assert [j.metadata.name for j in sdk.list_jobs(job_kind="PyTorchJob")] == ["sdk"]
    assert sdk.is_job_succeeded("sdk", job_kind="PyTorchJob")
    assert sdk.get_job_pod_names("sdk", is_master=True) == ["sdk-master-0"]
