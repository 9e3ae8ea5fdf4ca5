"""Issue 31 (3): the local backend plays a KubeRay RayJob for ``--launcher ray``
(``kubetrain/backends/local/ray_engine.py``): a head and one worker raylet per node, the
entrypoint submitted and followed, the Ray job's end mapped to the job's, every Ray process
stopped through the job's process tree. One real run of a user's Ray Train script in seed
004's style through launch/wait/collect/evaluate; one delete of a running Ray job; one head
that cannot start; the rest at unit level (the commands checked by Ray's own CLI parser)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from kubetrain.backends.base import COMPLETE, CREATED, FAILED, JobStatus
from kubetrain.backends.local import ray_engine
from kubetrain.backends.local.backend import LocalBackend
from kubetrain.backends.local.files import read_record, write_status
from kubetrain.backends.local.processes import JOB_ID_ENV, marked_processes, stop_job_processes
from kubetrain.errors import InvalidInput, JobNotFound
from kubetrain.jobspec import Resources, TrainJobSpec
from kubetrain.storage import atomic
from kubetrain.train.options import RAY_TRAINER_COMMAND
from tests.support import seed_ray
from tests.support.processes import run_kubetrain

pytest.importorskip("ray", reason="the local Ray engine needs kubetrain[ray]")


def ray_spec(**fields) -> TrainJobSpec:
    base = {"name": "rayjob", "command": ["python", "train.py"], "launcher": "ray"}
    return TrainJobSpec(**{**base, **fields})


def parsed_by_ray(command: list[str]) -> dict:
    """``command``'s options as `ray start`'s own click parser reads them: a misspelt flag or
    a value of the wrong type fails here, as it would on the node."""
    from ray.scripts.scripts import start

    assert command[:4] == [sys.executable, "-m", "ray.scripts.scripts", "start"], command
    return start.make_context("start", command[4:]).params


def job_processes(job_id: str, temp_dir: str) -> list[str]:
    """Every live process of the job: its identity in the environment, or its Ray temp folder
    in the command line (a process started with an empty environment)."""
    found = {proc.pid: proc for proc in marked_processes(JOB_ID_ENV, job_id)}
    for proc in psutil.process_iter(["cmdline"]):
        if temp_dir in " ".join(proc.info["cmdline"] or ()):
            found[proc.pid] = proc
    described = []
    for proc in found.values():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                described.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
        except psutil.Error:
            continue
    return described


def wait_for_no_process(job_id: str, temp_dir: str, seconds: float = 5.0) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := job_processes(job_id, temp_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


# --- unit level: the commands, the env, the end -------------------------------------------


def test_the_ray_start_commands_are_kuberays_and_rays_parser_takes_them():
    """``common/pod.go`` (v1.7.0): convertParamMap sorts the flags and writes "true" bare;
    setMissingRayStartParams adds --block, --address (workers), --dashboard-host (head),
    --metrics-export-port, --dashboard-agent-listen-port. The head takes no work (num-cpus 0);
    every port is the job's own, each node has its own temp folder."""
    spec = ray_spec(num_nodes=2, procs_per_node=3, resources_per_node=Resources(gpu=1))
    plan = ray_engine.ClusterPlan("/tmp/kt-ray-test", 1001, 1002, 1003, ((1, 2), (3, 4), (5, 6)))
    head = ray_engine.start_command(ray_engine.head_params(spec, plan), head=True)
    assert head[4:6] == ["--head", "--block"]
    flags = [word.split("=")[0] for word in head[5:]]
    assert flags == sorted(flags), "flags sorted, as convertParamMap writes them"
    params = parsed_by_ray(head)
    assert params["head"] and params["block"] and params["disable_usage_stats"]
    assert params["num_cpus"] == 0 and params["port"] == 1001
    assert (params["dashboard_port"], params["ray_client_server_port"]) == (1002, 1003)
    assert (params["dashboard_agent_listen_port"], params["metrics_export_port"]) == (1, 2)
    assert params["dashboard_host"] == "127.0.0.1" and params["temp_dir"] == plan.temp_dir
    workers = [
        parsed_by_ray(
            ray_engine.start_command(ray_engine.worker_params(spec, plan, n, "10.0.0.5"), False)
        )
        for n in range(2)
    ]
    assert [w["address"] for w in workers] == ["10.0.0.5:1001"] * 2
    assert [(w["num_cpus"], w["num_gpus"]) for w in workers] == [(3, 1)] * 2
    assert [w["dashboard_agent_listen_port"] for w in workers] == [3, 5]
    assert [w["temp_dir"] for w in workers] == [f"{plan.temp_dir}/1", f"{plan.temp_dir}/2"]
    assert not any(w["head"] for w in workers) and all(w["block"] for w in workers)
    assert "--num-gpus" not in " ".join(
        ray_engine.start_command(ray_engine.worker_params(ray_spec(), plan, 0, "h"), False)
    )


def test_a_plans_ports_are_distinct_and_its_temp_folder_short(tmp_path):
    plan = ray_engine.ClusterPlan.make(workers=3)
    try:
        ports = [plan.gcs_port, plan.dashboard_port, plan.client_server_port]
        ports += [port for pair in plan.node_ports for port in pair]
        assert len(ports) == len(set(ports)) == 3 + 2 * 4
        assert 10001 not in ports, "not Ray's default client server port"
        # Ray's sockets live at <temp>/<node>/session_<date>_<time>_<pid>/sockets/plasma_store
        longest = f"{plan.temp_dir}/99/session_2026-11-28_09-52-27_916925_1234567/sockets/raylet.9"
        assert len(longest) < 107, longest
        assert Path(plan.temp_dir).is_dir()
    finally:
        os.rmdir(plan.temp_dir)


def test_our_trainer_runs_by_this_interpreter_a_users_program_by_path(monkeypatch):
    """The driver runs with the raylets' PATH, the caller's: our trainer is run by this
    interpreter (with_our_interpreter), a user's ``python`` as the caller's shell finds it.
    The working folder is entered first (spec.ray_entrypoint)."""
    ours = ray_spec(command=list(RAY_TRAINER_COMMAND), args=["--epochs", "1"])
    assert ray_engine.entrypoint(ours).endswith(
        f"{sys.executable} -m kubetrain.train.ray --epochs 1"
    )
    users = ray_spec(command=["python", "my script.py"], working_dir="/tmp/a b")
    entry = ray_engine.entrypoint(users)
    assert entry.endswith("python 'my script.py'") and "'/tmp/a b'" in entry
    assert entry == users.ray_entrypoint


@pytest.mark.parametrize(
    ("ray_status", "message", "expected"),
    [
        ("SUCCEEDED", "Job finished successfully.", (COMPLETE, "Completed")),
        (
            "FAILED",
            "Job entrypoint command failed with exit code 1, last available logs (truncated "
            "to 20,000 chars):\nTraceback...\nValueError: boom",
            (FAILED, "AppFailed", "Job entrypoint command failed with exit code 1"),
        ),
        ("STOPPED", "Job was intentionally stopped.", (FAILED, "Stopped")),
    ],
)
def test_the_ray_jobs_end_is_the_jobs(ray_status, message, expected):
    """rayjob_controller.go (v1.7.0) ~340-348: FAILED is AppFailed; a STOPPED run fails here
    (it did not finish training), where KubeRay marks the RayJob Complete."""
    state, reason, said = ray_engine.outcome(ray_status, message)
    assert (state, reason) == expected[:2]
    assert "\n" not in said and said == (expected[2] if len(expected) > 2 else said)


def test_a_failed_ray_start_is_said_in_one_line(tmp_path):
    """The head's log as `ray start` writes it when the GCS port is taken (ray 2.60
    node.py _init_gcs_client): its exception, and that a port was taken."""
    log = tmp_path / ray_engine.HEAD_LOG
    log.write_text(
        "2026-11-28 09:59:29,208\tINFO scripts.py:1043 -- Local node IP: 192.0.2.2\n"
        "Traceback (most recent call last):\n"
        "RuntimeError: Failed to start GCS.  Last 1 lines of error files:\n"
        "[...] (gcs_server) grpc_server.cc:134: Check failed: server_ Failed to start the grpc "
        "server. The specified port is 58929. If the server startup error message is `Address "
        "already in use`, it indicates the server fails to start because the port is used\n"
        ".Please check /tmp/kt-ray-x/logs/gcs_server.out for details. Last connection error: "
        "None\n"
    )
    said = ray_engine.start_error(log)
    assert said.startswith("RuntimeError: Failed to start GCS. (a port it was given is in use")
    assert "ray-head.log" in said and "\n" not in said


@pytest.mark.bad_input
def test_launch_refuses_ray_when_ray_is_not_installed(monkeypatch, local_root):
    monkeypatch.setattr("kubetrain.backends.local.backend.ray_installed", lambda: False)
    with pytest.raises(InvalidInput) as refused:
        LocalBackend().launch(ray_spec())
    assert refused.value.field == "launcher"
    assert "pip install 'kubetrain[ray]'" in str(refused.value)
    assert not local_root.exists(), "nothing made"


@pytest.mark.bad_input
def test_logs_of_another_node_are_refused_for_a_ray_job(local_root):
    """The driver's log holds every Train worker's output (Ray forwards it)."""
    job_dir = local_root / "rayjob"
    job_dir.mkdir(parents=True)
    atomic.write_json(job_dir / "job.json", {"spec": ray_spec(num_nodes=2).to_dict(), "id": "x"})
    write_status(job_dir, JobStatus(name="rayjob", state=CREATED, created_at=time.time()))
    with pytest.raises(InvalidInput) as refused:
        list(LocalBackend().logs("rayjob", node=1))
    assert refused.value.field == "--node" and "Ray job" in str(refused.value)


def deleted_at_teardown(request: pytest.FixtureRequest, name: str) -> None:
    """A job the test launched is deleted when it ends, passed or failed: its Ray cluster
    must not outlive the test."""

    def delete() -> None:
        with contextlib.suppress(JobNotFound):
            LocalBackend().delete(name)

    request.addfinalizer(delete)


def node_log_text(job_dir: Path) -> str:
    try:
        return (job_dir / "node-0.log").read_text(errors="replace")
    except FileNotFoundError:
        return ""


# --- real Ray ------------------------------------------------------------------------------


def test_a_head_that_cannot_start_fails_the_job_in_one_line(tmp_path, monkeypatch):
    """`ray start --head` fails (its temp folder is a file: Ray gives up in ~3 s, where a GCS
    port taken costs Ray's ~40 s GCS connection timeout; that case's line is
    test_a_failed_ray_start_is_said_in_one_line's, from a real run's log): the job is Failed
    (StartError) with Ray's reason in one line, said in node 0's log too; nothing is left."""
    job_id = f"test-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv(JOB_ID_ENV, job_id)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    spec = ray_spec()
    status = JobStatus(name=spec.name, state=CREATED, created_at=time.time())
    cluster = ray_engine.Cluster(job_dir, spec, str(tmp_path))
    temp_dir = cluster.plan.temp_dir
    not_a_folder = Path(temp_dir) / "file"
    not_a_folder.write_text("")
    cluster.plan = replace(cluster.plan, temp_dir=str(not_a_folder))
    try:
        state, reason, message = ray_engine.run_cluster(job_dir, spec, cluster, status, [])
    finally:
        left = stop_job_processes(job_id, 5.0)
        if cluster.head is not None:
            cluster.head.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert (state, reason) == (FAILED, "StartError"), message
    assert message.startswith("the Ray head exited with code 1: FileExistsError: "), message
    assert str(not_a_folder) in message and "\n" not in message
    assert f"kubetrain: {message}" in (job_dir / "node-0.log").read_text()
    assert not left, "the head's processes ended with it"


TINY_DRIVER = """
import time
import ray

ray.init()


@ray.remote(num_cpus=1)
class Sleeper:
    def ready(self):
        return "ready"


sleeper = Sleeper.remote()
print("driver", ray.get(sleeper.ready.remote()), flush=True)
time.sleep(600)
"""


def test_stopping_a_running_ray_job_leaves_no_ray_process(tmp_path, local_root, request):
    """Raylets, GCS, dashboard and its agents, the job supervisor, the driver and a worker
    actor: none is left 5 s after a `kubetrain wait` is cancelled by Ctrl-C (SIGINT; as
    `kubetrain run`'s Ctrl-C stops its wait step), nor once `kubetrain delete` returns; no
    `ray stop` ran (other jobs' Ray is untouched)."""
    (tmp_path / "driver.py").write_text(TINY_DRIVER)
    launched = run_kubetrain(
        "launch", "--backend", "local", "--launcher", "ray", "--name", "ray-delete",
        "--", "python", "driver.py", cwd=tmp_path,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    job_dir = local_root / "ray-delete"
    deleted_at_teardown(request, "ray-delete")
    job_id = read_record(job_dir / "job.json")["id"]
    deadline = time.monotonic() + 240
    while "driver ready" not in node_log_text(job_dir):
        assert time.monotonic() < deadline, node_log_text(job_dir)[-3000:]
        status = LocalBackend().status("ray-delete")
        assert status.state != FAILED, status
        time.sleep(0.5)
    temp_dir = read_record(job_dir / ray_engine.RECORD)["temp_dir"]
    running = job_processes(job_id, temp_dir)
    names = " ".join(running)
    for part in ("raylet", "gcs_server", "dashboard", "driver.py", "Sleeper"):
        assert part in names, (part, running)
    waiting = subprocess.Popen(
        [sys.executable, "-m", "kubetrain", "wait", "--backend", "local", "ray-delete"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert waiting.stdout.readline().startswith("kubetrain: starting a Ray cluster")  # following
    waiting.send_signal(signal.SIGINT)
    _, stderr = waiting.communicate(timeout=30)
    assert waiting.returncode == 128 + signal.SIGINT, stderr
    assert "cancelled by SIGINT; stopped its processes" in stderr
    assert not wait_for_no_process(job_id, temp_dir, 5.0)
    assert LocalBackend().status("ray-delete").state == FAILED
    deleted = run_kubetrain("delete", "--backend", "local", "ray-delete")
    assert deleted.returncode == 0, deleted.stderr
    assert not wait_for_no_process(job_id, temp_dir, 1.0)
    assert not job_dir.exists() and not Path(temp_dir).exists()


def test_a_users_ray_train_script_trains_collects_and_evaluates(
    tmp_path, local_root, digits_dir, request
):
    """Seed 004's Ray Train script on one worker node (two are `kubetrain run --launcher ray`'s,
    tests/test_ray_run.py): launch, wait (the driver's lines streamed), collect the checkpoint
    Ray recorded last, evaluate >= 0.9; the cluster gone."""
    project = tmp_path / "project"
    seed_ray.write_program(project, num_workers=1)
    checkpoints = tmp_path / "checkpoints"
    launched = run_kubetrain(
        "launch", "--backend", "local", "--launcher", "ray", "--nodes", "1",
        "--name", "ray-seed", "--data", str(digits_dir), "--checkpoint-dir", str(checkpoints),
        "--", "python", "train.py", cwd=project,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    job_dir = local_root / "ray-seed"
    deleted_at_teardown(request, "ray-seed")
    job_id = read_record(job_dir / "job.json")["id"]
    waited = run_kubetrain("wait", "--backend", "local", "ray-seed", "--timeout", "400",
                           timeout=420)  # fmt: skip
    temp_dir = read_record(job_dir / ray_engine.RECORD)["temp_dir"]
    assert waited.returncode == 0, waited.stdout[-3000:] + waited.stderr[-3000:]
    assert "cli.py" not in waited.stdout and "sdk.py" not in waited.stdout  # no Ray CLI banners
    assert (
        "kubetrain: Ray job ray-seed SUCCEEDED (Completed): Job finished successfully."
        in waited.stdout
    )
    assert LocalBackend().status("ray-seed").nodes[0].exit_code == 0
    assert f"epoch {seed_ray.EPOCHS} loss" in waited.stdout
    assert "Ray cluster up in" in waited.stdout
    assert not wait_for_no_process(job_id, temp_dir), "the cluster ends with the job"
    assert not Path(temp_dir).exists()
    run = checkpoints / seed_ray.RUN_NAME
    kept = [path.name for path in run.glob("checkpoint_*") if path.is_dir()]
    assert len(kept) == seed_ray.KEEP, kept
    model = tmp_path / "model"
    collected = run_kubetrain(
        "collect", "--checkpoint-dir", str(checkpoints), "--output", str(model),
        "--model-factory", "netdef:build", "--data", str(digits_dir), cwd=project,
    )  # fmt: skip
    assert collected.returncode == 0, collected.stderr
    assert f"{max(kept)}/model.pt" in collected.stdout
    evaluated = run_kubetrain(
        "evaluate", "--model", str(model), "--data", str(digits_dir),
        "--model-factory", "netdef:build", "--threshold", "0.9", cwd=project,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
    assert "passed" in evaluated.stdout
