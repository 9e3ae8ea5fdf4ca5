"""``--launcher mpi``: the local backend's mpirun (a hostfile of this machine, the MPI plugin's
OMPI_MCA_* env, every rank under the job's ownership) and the fake Trainer's MPI path (what
kubeflow/trainer v2.3.0 ``pkg/runtime/framework/plugins/mpi/mpi.go`` builds, run for real
through that mpirun), followed by the Kubernetes backend's wait and logs through its launcher.
Real mpirun processes: 2 nodes x 1 process each."""

from __future__ import annotations

import base64
import importlib.metadata
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import CustomObjectsApi
from kubernetes.client.rest import ApiException

from kubetrain.backends.base import COMPLETE, FAILED
from kubetrain.backends.local import mpirun, supervisor
from kubetrain.backends.local.backend import LocalBackend
from kubetrain.backends.local.supervisor import with_our_interpreter
from kubetrain.backends.mpirun_report import first_failure
from kubetrain.errors import InvalidInput, KubetrainError
from kubetrain.jobspec import MPI_RUNTIME, TrainJobSpec
from tests.shared_material import SHARED, shared_file
from tests.support import objects, trainer_build
from tests.support.fake_trainer import SECRETS, FakeTrainer, mpirun_program
from tests.support.processes import process_alive

UPSTREAM_RUNTIME = SHARED / "schemas/kubeflow-trainer/runtimes/deepspeed_distributed.yaml"
#: One rank: says what mpirun gave it, fails with 3 as rank FAIL_RANK, else outlives that.
RANK_PROGRAM = """\
import os, sys, time
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
size = os.environ["OMPI_COMM_WORLD_SIZE"]
with open(f"pid-{rank}", "w") as pid:
    pid.write(str(os.getpid()))
slots = os.environ["OMPI_MCA_orte_set_default_slots"]
print(f"rank {rank} of {size} slots {slots} rsh {os.environ['OMPI_MCA_plm_rsh_args']}", flush=True)
if rank == int(os.environ.get("FAIL_RANK", "-1")):
    time.sleep(0.3)
    sys.exit(3)
time.sleep(float(os.environ.get("SLEEP", "1")))
"""


def rank_program(folder: Path) -> Path:
    program = folder / "rank.py"
    program.write_text(RANK_PROGRAM)
    return program


def mpi_spec(name: str, program: Path, **env: str) -> TrainJobSpec:
    return TrainJobSpec(
        name=name, command=("python", str(program)), num_nodes=2, launcher="mpi", env=env
    )


# ------------------------------------------------------------------ the local backend, units
def test_hostfile_env_and_command_follow_the_mpi_plugin(tmp_path, monkeypatch):
    """One 127.0.0.1 line with every node's slots (Open MPI refuses one host on several
    lines), the four variables the plugin sets (constants.go ~171-187), mpirun by path."""
    spec = TrainJobSpec(name="m", command=("python", "t.py"), num_nodes=2, procs_per_node=3)
    assert mpirun.hostfile_text(spec) == "127.0.0.1 slots=6\n"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    hostfile = tmp_path / "hostfile"
    assert mpirun.launcher_env(hostfile, spec) == {
        "OMPI_MCA_orte_default_hostfile": str(hostfile),
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
        "OMPI_MCA_orte_set_default_slots": "3",
        "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
    }
    assert set(mpirun.launcher_env(hostfile, spec)) == trainer_build.MPI_RESERVED_ENV
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    as_root = mpirun.launcher_env(hostfile, spec)
    assert as_root["OMPI_ALLOW_RUN_AS_ROOT"] == as_root["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    found = mpirun.mpirun_path()
    assert found is not None and found.parent == Path(sys.executable).parent.resolve()
    command = mpirun.launcher_command(found, hostfile, spec, ["python", "t.py"])
    assert command == [
        str(found), "--hostfile", str(hostfile), "-np", "6", "--bind-to", "none", "python", "t.py"
    ]  # fmt: skip
    assert with_our_interpreter(["python", "-m", "kubetrain.train", "--epochs", "1"]) == [
        sys.executable, "-m", "kubetrain.train", "--epochs", "1"
    ]  # fmt: skip


def test_each_local_mpi_job_gets_a_rendezvous_port_of_its_own(tmp_path, monkeypatch):
    """Ranks of two jobs on one machine never meet on 29500 (pods would each have a network):
    every attempt gets a fresh MASTER_PORT on 127.0.0.1; one the job sets wins."""
    monkeypatch.setenv(supervisor.JOB_ID_ENV, "job-id")
    monkeypatch.delenv("MASTER_PORT", raising=False)
    spec = TrainJobSpec(name="m", command=("python", "t.py"), launcher="mpi", procs_per_node=2)
    ports = set()
    for attempt in range(3):
        folder = tmp_path / str(attempt)
        folder.mkdir()
        ((_, env),) = supervisor.launches(folder, spec)
        assert env["MASTER_ADDR"] == "127.0.0.1"
        ports.add(env["MASTER_PORT"])
    assert len(ports) == 3 and "29500" not in ports
    (tmp_path / "own").mkdir()
    own = TrainJobSpec(**{**spec.__dict__, "env": {"MASTER_PORT": "31000"}})
    ((_, env),) = supervisor.launches(tmp_path / "own", own)
    assert env["MASTER_PORT"] == "31000"


def test_the_failed_rank_is_read_from_mpiruns_report():
    exited = """\
--------------------------------------------------------------------------
prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:

   Process name: [prterun-vm-19384@1,2]
   Exit code:    3
--------------------------------------------------------------------------"""
    found = first_failure(exited.splitlines(), procs_per_node=2)
    assert (found.rank, found.node, found.code) == (2, 1, 3)
    assert found.describe() == "rank 2 (node 1) exited with code 3"
    signalled = """\
prterun noticed that process rank 1 with PID 19551 on node
a-long-host-name exited on signal 9 (Killed)."""
    found = first_failure(signalled.splitlines(), procs_per_node=1)
    assert found.describe() == "rank 1 (node 1) was killed by signal SIGKILL"
    assert first_failure(["rank 0 of 2", "Traceback ...", "RuntimeError: x"], 1) is None


@pytest.mark.bad_input
def test_a_missing_mpirun_is_one_line_before_anything_is_made(local_root, monkeypatch):
    def not_installed(name: str) -> Any:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(InvalidInput) as refused:
        LocalBackend().launch(mpi_spec("no-mpi", Path("rank.py")))
    assert str(refused.value).count("\n") == 0
    assert "launcher" in str(refused.value)
    assert "pip install 'kubetrain[deepspeed]'" in str(refused.value)
    assert not local_root.exists()


# -------------------------------------------------------------- the local backend, for real
def test_a_failed_rank_fails_the_job_naming_it_and_delete_stops_every_rank(
    local_root, tmp_path, monkeypatch
):
    """Rank 1 (node 1) exits 3 while rank 0 still runs: mpirun stops rank 0 and exits 3, the
    job names the rank; a second job's ranks all go with `delete`."""
    monkeypatch.chdir(tmp_path)
    program = rank_program(tmp_path)
    backend = LocalBackend()
    backend.launch(mpi_spec("fails", program, FAIL_RANK="1", SLEEP="30"))
    status = backend.wait("fails", timeout=60)
    assert status.state == FAILED, status
    assert status.message == "launcher exited with code 3: rank 1 (node 1) exited with code 3"
    assert [(node.rank, node.exit_code) for node in status.nodes] == [(0, 3)]
    lines = list(backend.logs("fails"))
    assert "rank 0 of 2 slots 1 rsh -o ConnectionAttempts=10" in lines
    assert "rank 1 of 2 slots 1 rsh -o ConnectionAttempts=10" in lines
    assert (local_root / "fails" / "hostfile").read_text() == "127.0.0.1 slots=2\n"
    with pytest.raises(InvalidInput, match="--node"):
        list(backend.logs("fails", node=1))

    for pid in tmp_path.glob("pid-*"):
        pid.unlink()
    backend.launch(mpi_spec("sleeps", program, SLEEP="60"))
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("pid-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    ranks = [int(p.read_text()) for p in tmp_path.glob("pid-*")]
    launcher = backend.status("sleeps").nodes[0].pid
    assert len(ranks) == 2 and all(process_alive(pid) for pid in [launcher, *ranks])
    backend.delete("sleeps")
    assert [pid for pid in [launcher, *ranks] if process_alive(pid)] == []


# ------------------------------------------------------- the fake Trainer's MPI build, units
def upstream_runtime() -> dict[str, Any]:
    return yaml.safe_load(shared_file(UPSTREAM_RUNTIME, "the MPI plugin's build").read_text())


def mpi_trainjob(name: str, nodes: int, command: list[str], **trainer: Any) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": "default", "uid": "u1"},
        "spec": {
            "runtimeRef": {"name": MPI_RUNTIME, "kind": "ClusterTrainingRuntime"},
            "trainer": {"numNodes": nodes, "command": command, **trainer},
        },
    }


def test_the_mpi_plugins_objects_for_upstreams_deepspeed_runtime():
    """mpi_test.go's expectations: the launcher's node container gets the hostfile mount and
    the four variables, both jobs the ssh Secret; hosts in replicatedJobs order (node, then
    launcher under runLauncherAsNode), node pods numNodes - 1; without runLauncherAsNode the
    launcher is no host and the node job has numNodes pods."""
    runtime = upstream_runtime()
    built = trainer_build.build(mpi_trainjob("ds", 3, ["mpirun"], numProcPerNode=2), runtime)
    mpi = built.mpi
    assert (built.replicated_job, built.num_nodes, mpi.node_count) == ("launcher", 1, 2)
    assert mpi.hostfile == (
        "ds-node-0-0.ds slots=2\nds-node-0-1.ds slots=2\nds-launcher-0-0.ds slots=2\n"
    )
    env = {e["name"]: e["value"] for e in built.container["env"]}
    assert env == {
        "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
        "OMPI_MCA_orte_set_default_slots": "2",
        "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
    }
    mounts = {m["name"]: m["mountPath"] for m in built.container["volumeMounts"]}
    assert mounts == {"mpi-ssh-auth": "/home/mpiuser/.ssh", "mpi-hostfile": "/etc/mpi"}
    node_container = mpi.node_pod_spec["containers"][0]
    assert [m["name"] for m in node_container["volumeMounts"]] == ["mpi-ssh-auth"]
    assert "env" not in node_container or not node_container["env"]
    assert mpi.secret["type"] == "kubernetes.io/ssh-auth" and mpi.secret["immutable"] is True
    assert mpi.secret["metadata"]["name"] == "ds-mpi-ssh-auth"
    assert mpi.config_map["metadata"]["name"] == "ds-mpi-hostfile"
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(
        base64.b64decode(mpi.secret["data"]["ssh-privatekey"]), None
    )
    public = serialization.load_ssh_public_key(
        base64.b64decode(mpi.secret["data"]["ssh-publickey"])
    )
    assert private.curve.name == "secp521r1"
    assert private.public_key().public_numbers() == public.public_numbers()

    two = trainer_build.build(mpi_trainjob("ds", 2, ["mpirun"]), runtime).mpi
    assert two.hostfile == "ds-node-0-0.ds slots=1\nds-launcher-0-0.ds slots=1\n"
    runtime["spec"]["mlPolicy"]["mpi"]["runLauncherAsNode"] = False
    apart = trainer_build.build(mpi_trainjob("ds", 2, ["mpirun"]), runtime).mpi
    assert apart.hostfile == "ds-node-0-0.ds slots=1\nds-node-0-1.ds slots=1\n"


def test_the_launchers_mpirun_maps_to_one_ranks_program():
    line = "mpirun --hostfile /etc/mpi/hostfile -np 4 --bind-to none -x A=1 python -m m --x 1"
    assert mpirun_program(line.split()) == (["python", "-m", "m", "--x", "1"], 4, {"A": "1"})
    assert mpirun_program(["mpirun", "--mca", "btl", "tcp,self", "python", "t.py"]) == (
        ["python", "t.py"],
        None,
        {"OMPI_MCA_btl": "tcp,self"},
    )
    for line in (["python", "t.py"], ["mpirun", "--hostfile", "h"], ["mpirun", "-q", "p"]):
        with pytest.raises(ValueError):
            mpirun_program(line)


# ------------------------------------------------- the fake Trainer and the wait, for real
@pytest.fixture
def cluster(k8s, tmp_path, monkeypatch):
    shipped = objects.shipped_runtime(MPI_RUNTIME)
    assert shipped is not None, f"runtimes/{MPI_RUNTIME}.yaml is not shipped"
    k8s.emulator.create("clustertrainingruntimes", shipped)
    monkeypatch.chdir(tmp_path)  # the ranks run in the launch folder, as their pid files
    with FakeTrainer(k8s.emulator, tmp_path / "nodes") as trainer:
        yield k8s
    assert trainer.errors == []


def create_trainjob(k8s, body: dict[str, Any]) -> dict[str, Any]:
    body = {**body, "metadata": {"name": body["metadata"]["name"]}}
    return CustomObjectsApi(k8s.api_client).create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", body
    )


def pods_of(k8s, job: str, replicated_job: str) -> list[dict[str, Any]]:
    return [
        pod
        for pod in k8s.emulator.list("pods")
        if pod["metadata"]["labels"].get(objects.JOBSET_NAME) == job
        and pod["metadata"]["labels"].get(objects.REPLICATED_JOB) == replicated_job
    ]


def test_an_mpi_trainjob_runs_its_launcher_for_real_and_the_wait_follows_it(cluster, tmp_path):
    """The plugin's Secret and hostfile ConfigMap, node pods Running before and while the
    launcher runs, the launcher's log is mpirun's (every rank's lines), the job Complete when
    the launcher is; then a failing rank: Failed, the wait names the rank from mpirun's
    report, and the node pods are gone with the finished JobSet."""
    program = rank_program(tmp_path)
    command = ["mpirun", "--hostfile", "/etc/mpi/hostfile", "-np", "2", "python", str(program)]
    create_trainjob(cluster, mpi_trainjob("mpi-ok", 2, command))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        launchers = pods_of(cluster, "mpi-ok", "launcher")
        if launchers and launchers[0].get("status", {}).get("phase") == "Running":
            break
        time.sleep(0.05)
    (node,) = pods_of(cluster, "mpi-ok", "node")
    assert node["status"]["phase"] == "Running"
    assert int(node["metadata"]["resourceVersion"]) < int(
        launchers[0]["metadata"]["resourceVersion"]
    ), "the launcher is made once the node pods are ready (dependsOn)"
    config_map = cluster.emulator.get("configmaps", "mpi-ok-mpi-hostfile")
    assert config_map["data"] == {
        "hostfile": "mpi-ok-node-0-0.mpi-ok slots=1\nmpi-ok-launcher-0-0.mpi-ok slots=1\n"
    }
    secret = cluster.emulator.get(SECRETS, "mpi-ok-mpi-ssh-auth")
    assert secret["type"] == "kubernetes.io/ssh-auth"
    assert set(secret["data"]) == {"ssh-privatekey", "ssh-publickey"}

    backend = cluster.backend()
    lines: list[str] = []
    status = backend.wait("mpi-ok", 60, lines.append)
    assert status.state == COMPLETE, status
    assert "rank 0 of 2 slots 1 rsh -o ConnectionAttempts=10" in lines
    assert "rank 1 of 2 slots 1 rsh -o ConnectionAttempts=10" in lines
    assert [n.exit_code for n in status.nodes] == [0]
    followed = list(backend.logs("mpi-ok", follow=True))
    assert any(
        line.endswith("rank 1 of 2 slots 1 rsh -o ConnectionAttempts=10") for line in followed
    )
    assert pods_of(cluster, "mpi-ok", "node") == []
    # Status and logs read the launcher too: its pod is the job's one node.
    assert [n.exit_code for n in backend.status("mpi-ok").nodes] == [0]
    assert "rank 1 of 2 slots 1 rsh -o ConnectionAttempts=10" in list(backend.logs("mpi-ok"))
    with pytest.raises(KubetrainError, match="node 1"):
        list(backend.logs("mpi-ok", node=1))

    failing = mpi_trainjob("mpi-bad", 2, command)
    failing["spec"]["trainer"]["env"] = [
        {"name": "FAIL_RANK", "value": "1"},
        {"name": "SLEEP", "value": "30"},
    ]
    create_trainjob(cluster, failing)
    status = backend.wait("mpi-bad", 60, None)
    assert status.state == FAILED, status
    assert status.message.endswith("; rank 1 (node 1) exited with code 3"), status.message
    assert [n.exit_code for n in status.nodes] == [3]
    (launcher,) = pods_of(cluster, "mpi-bad", "launcher")
    assert launcher["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    condition = cluster.emulator.get("trainjobs", "mpi-bad")["status"]["conditions"][-1]
    assert condition["type"] == "Failed" and "mpi-bad-launcher-0" in condition["message"]


@pytest.mark.bad_input
def test_the_webhook_refuses_a_trainjob_setting_the_reserved_openmpi_env(cluster):
    """mpi.go Validate: MPIReservedEnvNames in spec.trainer.env are refused (403)."""
    body = mpi_trainjob("reserved", 2, ["mpirun", "python", "t.py"])
    body["spec"]["trainer"]["env"] = [
        {"name": "OMPI_MCA_plm_rsh_args", "value": "-p 22"},
        {"name": "OMPI_MCA_orte_set_default_slots", "value": "4"},
        {"name": "OMPI_MCA_btl", "value": "tcp"},  # not reserved
    ]
    with pytest.raises(ApiException) as denied:
        create_trainjob(cluster, body)
    assert denied.value.status == 403
    assert (
        "must not have reserved envs, invalid envs configured: "
        "[OMPI_MCA_orte_set_default_slots OMPI_MCA_plm_rsh_args]" in denied.value.body
    )
    assert cluster.emulator.get("trainjobs", "reserved") is None


def test_users_openmpi_env_is_allowed_on_a_torch_runtime(cluster):
    """The refusal is the MPI plugin's: a torch runtime's TrainJob may set these names."""
    body = mpi_trainjob("torchy", 1, ["python", "-c", "pass"])
    body["spec"]["runtimeRef"]["name"] = objects.DEFAULT_RUNTIME
    body["spec"]["trainer"]["env"] = [{"name": "OMPI_MCA_plm_rsh_args", "value": "x"}]
    create_trainjob(cluster, body)
    assert cluster.backend().wait("torchy", 60, None).state == COMPLETE
