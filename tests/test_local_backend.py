"""The local backend runs a job the way Kubeflow Trainer does: one command per node, PET_* env."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from kubetrain.backends.base import COMPLETE, FAILED, RUNNING
from kubetrain.backends.local.backend import LocalBackend
from kubetrain.errors import InvalidInput
from kubetrain.jobspec import Resources, TrainJobSpec
from kubetrain.names import derive_job_name
from tests.support.processes import process_alive, supervisor_pid
from tests.support.processes import run_kubetrain as kubetrain


def write_script(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def test_two_by_two_job_gives_a_torchrun_script_world_size_four(local_root, tmp_path):
    write_script(
        tmp_path,
        "train.py",
        """
        import os
        import torch.distributed as dist
        dist.init_process_group("gloo")
        print(f"rank {dist.get_rank()} of WORLD_SIZE {os.environ['WORLD_SIZE']} "
              f"on node {os.environ['PET_NODE_RANK']}", flush=True)
        dist.barrier()
        dist.destroy_process_group()
    """,
    )
    launched = kubetrain(
        "launch",
        "--backend",
        "local",
        "--nodes",
        "2",
        "--procs-per-node",
        "2",
        "--",
        "torchrun",
        "train.py",
        cwd=tmp_path,
    )
    assert launched.returncode == 0, launched.stderr
    name = launched.stdout.strip().splitlines()[-1]

    waited = kubetrain("wait", "--backend", "local", name, "--timeout", "90")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert f"job {name} Complete" in waited.stdout
    # wait streams node 0's log: ranks 0 and 1 run there
    assert "rank 0 of WORLD_SIZE 4 on node 0" in waited.stdout

    logs = kubetrain("logs", "--backend", "local", name)
    assert logs.returncode == 0, logs.stderr
    for rank, node in ((0, 0), (1, 0), (2, 1), (3, 1)):
        assert f"rank {rank} of WORLD_SIZE 4 on node {node}" in logs.stdout
    assert "[node-1] rank" in logs.stdout


def test_each_node_gets_exactly_the_trainer_pet_environment(local_root, tmp_path):
    backend = LocalBackend()
    script = (
        "import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
        "if k.startswith('PET_')}))"
    )
    backend.launch(
        TrainJobSpec(
            name="env-job",
            command=("python", "-c", script),
            num_nodes=3,
            procs_per_node=4,
            env={"EXTRA": "1"},
        )
    )
    status = backend.wait("env-job", timeout=60)
    assert status.state == COMPLETE
    seen = [json.loads(next(backend.logs("env-job", node=rank))) for rank in range(3)]
    ports = {env["PET_MASTER_PORT"] for env in seen}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for rank, env in enumerate(seen):
        assert set(env) == {
            "PET_NNODES",
            "PET_NPROC_PER_NODE",
            "PET_NODE_RANK",
            "PET_MASTER_ADDR",
            "PET_MASTER_PORT",
        }
        assert (
            env["PET_NNODES"],
            env["PET_NPROC_PER_NODE"],
            env["PET_NODE_RANK"],
            env["PET_MASTER_ADDR"],
        ) == ("3", "4", str(rank), "127.0.0.1")


def _threads_seen(backend: LocalBackend, name: str, nodes: int, env: dict[str, str]) -> list[str]:
    script = "import os; print(os.environ.get('OMP_NUM_THREADS', 'unset'))"
    spec = TrainJobSpec(name=name, command=("python", "-c", script), num_nodes=nodes, env=env)
    backend.launch(spec)
    assert backend.wait(name, timeout=60).state == COMPLETE
    return [next(backend.logs(name, node=rank)).strip() for rank in range(nodes)]


def test_nodes_share_the_machines_cores_unless_threads_are_set(local_root, monkeypatch):
    """Like pods with CPUs of their own: N nodes on one machine must not each take all cores."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    backend = LocalBackend()
    cores = len(os.sched_getaffinity(0))
    share = str(max(1, cores // 2))
    assert _threads_seen(backend, "share-job", 2, {}) == [share, share]
    assert _threads_seen(backend, "spec-job", 2, {"OMP_NUM_THREADS": "7"}) == ["7", "7"]
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert _threads_seen(backend, "user-job", 2, {}) == ["5", "5"]


def test_a_node_exiting_3_fails_wait_with_code_3_and_its_last_lines(local_root, tmp_path):
    write_script(
        tmp_path,
        "fail.py",
        """
        import os, sys, time
        rank = os.environ["PET_NODE_RANK"]
        for i in range(30):
            print(f"node {rank} line {i}", flush=True)
        if rank == "1":
            print("about to fail: disk on fire", flush=True)
            sys.exit(3)
        time.sleep(60)
    """,
    )
    launched = kubetrain("launch", "--nodes", "2", "--", "python", "fail.py", cwd=tmp_path)
    name = launched.stdout.strip().splitlines()[-1]
    waited = kubetrain("wait", name)
    assert waited.returncode == 3
    assert "node 1 exited with code 3" in waited.stderr
    assert "about to fail: disk on fire" in waited.stderr
    assert "node 1 line 29" in waited.stderr
    status = LocalBackend().status(name)
    assert status.state == FAILED and status.failed_rank == 1
    assert status.nodes[0].exit_code == -signal.SIGTERM, "node 0 was stopped, not left to sleep"


def test_delete_leaves_no_process_behind(local_root, tmp_path, monkeypatch):
    write_script(
        tmp_path,
        "sleepy.py",
        """
        import os, time
        with open(f"pids-{os.environ['PET_NODE_RANK']}-{os.environ['LOCAL_RANK']}", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)
    """,
    )
    backend = LocalBackend()
    monkeypatch.chdir(tmp_path)
    backend.launch(
        TrainJobSpec(
            name="sleepy", command=("torchrun", "sleepy.py"), num_nodes=2, procs_per_node=2
        )
    )
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("pids-*"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    workers = [int(p.read_text()) for p in tmp_path.glob("pids-*")]
    assert len(workers) == 4
    status = backend.status("sleepy")
    supervisor = supervisor_pid(local_root / "sleepy")
    everything = [supervisor, *workers, *(n.pid for n in status.nodes)]
    assert all(process_alive(pid) for pid in everything)

    deleted = kubetrain("delete", "--backend", "local", "sleepy")
    assert deleted.returncode == 0, deleted.stderr
    deadline = time.monotonic() + 5
    while any(process_alive(pid) for pid in everything) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in everything if process_alive(pid)] == []
    assert not (local_root / "sleepy").exists()


def test_wait_times_out_with_exit_124_and_leaves_the_job_to_delete(local_root, tmp_path):
    """Past --timeout the wait gives up, not the job: it goes on running, as a cluster job
    does (a pipeline's exit handler deletes it; under `kubetrain run` the wait stops it itself:
    tests/test_run_housekeeping.py), and the one line says how to follow or stop it;
    `kubetrain delete` then stops its whole process tree (supervisor, torchrun per node,
    their workers in sessions of their own)."""
    write_script(
        tmp_path, "sleepy.py", "import time\nprint('started', flush=True)\ntime.sleep(600)\n"
    )
    backend = LocalBackend()
    launched = kubetrain(
        "launch", "--name", "slow", "--nodes", "2", "--procs-per-node", "2", "--",
        "torchrun", "sleepy.py", cwd=tmp_path,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    job_id = json.loads((local_root / "slow" / "job.json").read_text())["id"]
    try:
        deadline = time.monotonic() + 60
        while len(job_processes(job_id)) < 5 and time.monotonic() < deadline:  # 1 + 2 + 2
            time.sleep(0.1)
        running = job_processes(job_id)
        assert len(running) >= 5
        waited = kubetrain("wait", "slow", "--timeout", "0.5")
        assert waited.returncode == 124
        (line,) = waited.stderr.splitlines()
        assert line.startswith("kubetrain wait: error: timed out after 0.5s waiting for job slow")
        assert line.endswith(
            "it goes on running: `kubetrain wait slow` follows it again, `kubetrain delete "
            "slow` stops it; raise --timeout"
        )
        assert all(process_alive(proc.pid) for proc in running)
        assert backend.status("slow").state == RUNNING
        deleted = kubetrain("delete", "slow")
        assert deleted.returncode == 0, deleted.stderr
        assert [proc.pid for proc in running if process_alive(proc.pid)] == []
        assert job_processes(job_id) == []
    finally:  # a failure above leaves no sleeper behind either
        if (local_root / "slow").exists():
            backend.delete("slow")


def job_processes(job_id: str) -> list:
    """The processes that carry the local job's identity (psutil)."""
    from kubetrain.backends.local.processes import JOB_ID_ENV, marked_processes

    return marked_processes(JOB_ID_ENV, job_id)


@pytest.mark.fault
def test_a_dead_supervisor_is_reported_not_waited_on_forever(local_root, injected):
    backend = LocalBackend()
    backend.launch(TrainJobSpec(name="orphan", command=("sleep", "30")))
    supervisor = supervisor_pid(local_root / "orphan")
    deadline = time.monotonic() + 10
    while backend.status("orphan").state != "Running" and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(supervisor, signal.SIGKILL)
    while process_alive(supervisor) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(supervisor)
    injected.struck("the supervisor died of SIGKILL")
    status = backend.wait("orphan", timeout=10)
    assert (status.state, status.reason) == (FAILED, "SupervisorLost")
    backend.delete("orphan")
    node_pid = status.nodes[0].pid
    assert not process_alive(node_pid)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "Bad_Name"}, "name"),
        ({"name": "x" * 64}, "name"),
        ({"num_nodes": 0}, "nodes"),
        ({"procs_per_node": -1}, "procs_per_node"),
        ({"command": ()}, "command"),
        ({"env": {"PET_NNODES": "4"}}, "env"),
        ({"env": {"1BAD": "x"}}, "env"),
        ({"image": "has space:1"}, "image"),
        ({"resources_per_node": Resources(memory="4 GB")}, "resources_per_node.memory"),
        ({"command": ("no-such-program-kubetrain",)}, "command"),
    ],
)
def test_bad_specs_are_refused_before_anything_is_created(local_root, change, field):
    spec = TrainJobSpec(**{"name": "ok-job", "command": ("true",), **change})
    with pytest.raises(InvalidInput) as refused:
        LocalBackend().launch(spec)
    assert refused.value.field == field
    assert not local_root.exists() or not any(local_root.iterdir())


def test_an_existing_job_name_is_refused(local_root):
    backend = LocalBackend()
    backend.launch(TrainJobSpec(name="twice", command=("true",)))
    with pytest.raises(InvalidInput, match="already exists"):
        backend.launch(TrainJobSpec(name="twice", command=("true",)))
    assert backend.wait("twice", timeout=30).state == COMPLETE


def test_derived_names_are_stable_rfc1035_and_short():
    name = derive_job_name("Kubetrain-Training-2026-11-23-09-30-12-123456", "train")
    assert name == derive_job_name("Kubetrain-Training-2026-11-23-09-30-12-123456", "train")
    assert name != derive_job_name("Kubetrain-Training-2026-11-23-09-30-12-123457", "train")
    assert len(name) <= 47 and name[0].isalpha()
    TrainJobSpec(name=name, command=("true",)).validate()
    assert derive_job_name("123", "x")[0].isalpha()


def test_command_references_to_the_trainer_env_are_expanded_as_the_kubelet_does(
    local_root, tmp_path
):
    """`$(PET_MASTER_ADDR)` in a command works on a cluster (the kubelet expands it): it must
    work locally too; `$$(X)` stays literal and unknown references are left as written."""
    write_script(
        tmp_path,
        "args.py",
        """
        import sys
        print("ARGS " + " ".join(sys.argv[1:]), flush=True)
    """,
    )
    command = ["python", "args.py", "$(PET_MASTER_ADDR):$(PET_NODE_RANK)", "$$(HOME)", "$(NOPE)"]
    launched = kubetrain("launch", "--nodes", "1", "--", *command, cwd=tmp_path)
    name = launched.stdout.strip().splitlines()[-1]
    waited = kubetrain("wait", name)
    assert waited.returncode == 0, waited.stderr
    assert "ARGS 127.0.0.1:0 $(HOME) $(NOPE)" in waited.stdout


def test_every_spec_field_survives_the_job_record() -> None:
    """The supervisor rebuilds the spec from job.json: a field from_dict forgot (working_dir
    once) would silently fall back to its default."""
    import dataclasses

    from kubetrain.jobspec import (
        Initializer,
        Resources,
        RuntimeRef,
        Toleration,
        TrainJobSpec,
        Volume,
    )

    spec = TrainJobSpec(
        name="every-field", command=("python",), args=("train.py",), image="ghcr.io/a/b:1",
        env={"A": "1"}, num_nodes=3, min_nodes=2, procs_per_node=2,
        resources_per_node=Resources(cpu="2", memory="1Gi", gpu=1),
        runtime=RuntimeRef(name="rt", kind="TrainingRuntime"),
        volumes=(Volume(name="v", claim_name="c", mount_path="/m", read_only=True),),
        labels={"l": "1"}, pod_labels={"p": "1"}, node_selector={"n": "1"},
        tolerations=(Toleration(key="k", operator="Exists", effect="NoSchedule"),),
        service_account="sa", storage_secret="s", suspend=True, max_restarts=2,
        active_deadline_seconds=60, dataset_initializer=Initializer("s3://d", "ds"),
        model_initializer=Initializer("hf://m", "ms"), script="train.py", working_dir="/w",
        launcher="mpi",
    )  # fmt: skip
    defaults = TrainJobSpec(name="x", command=("y",))
    unset = [
        f.name
        for f in dataclasses.fields(spec)
        if getattr(spec, f.name) == getattr(defaults, f.name) and f.name != "name"
    ]
    assert unset == [], "give every field a non-default value here"
    assert TrainJobSpec.from_dict(spec.to_dict()) == spec
