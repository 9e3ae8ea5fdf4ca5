"""A local job owns its folder and its processes (issue 14, rules 1 and 3, the stall check).

Names: every local command joins a job name to ``$KUBETRAIN_LOCAL_ROOT`` only when it is a job
name (a DNS label) that stays under the root, so no name reaches a folder outside it.
Processes: every process of a job carries the job's id in its environment, so `delete`, a
cancelled `wait`, a lost supervisor and an interrupted `kubetrain run` stop all of them
(torchrun's workers included, which run in sessions of their own), and a PID is taken for the
job's only while its create time matches. Each fault test checks, at the moment the command
returns, that nothing of the job is left running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from kubetrain.artifacts.checkpoint_manifest import latest_checkpoint
from kubetrain.backends.local.backend import LocalBackend
from kubetrain.backends.local.processes import marked_processes
from kubetrain.cli import main
from kubetrain.jobspec import TrainJobSpec
from tests.reliability.test_bad_input import assert_one_line_error, tree
from tests.reliability.test_faults import newest_checkpoint_loads, wait_until
from tests.support.processes import process_alive, supervisor_pid, wait_for_descendants

#: Marks every process a test starts (they all inherit it), to find any left behind.
TEST_MARK = "KUBETRAIN_TEST_MARK"


@pytest.fixture
def mark(monkeypatch: pytest.MonkeyPatch) -> str:
    value = uuid.uuid4().hex
    monkeypatch.setenv(TEST_MARK, value)
    return value


def left_running(mark: str) -> list[str]:
    """What is still running of the processes this test started (``mark``)."""
    return [" ".join(p.cmdline()[:4]) for p in marked_processes(TEST_MARK, mark)]


def kubetrain(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "kubetrain", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def finished(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    stdout, stderr = proc.communicate(timeout=timeout)
    return proc.returncode, stdout, stderr


def launch_training(digits_dir: Path, tmp_path: Path, epochs: int = 500) -> str:
    code, stdout, stderr = finished(
        kubetrain(
            "launch",
            "--nodes",
            "2",
            "--data",
            str(digits_dir),
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            "--epochs",
            str(epochs),
        )
    )
    assert code == 0, stderr
    return stdout.strip().splitlines()[-1]


def ignores_sigterm(pid: int) -> bool:
    """Whether ``pid`` has SIGTERM ignored (the SigIgn mask the kernel shows in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(
        next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn")), 16
    )
    return bool(mask & (1 << (signal.SIGTERM - 1)))


def first_checkpoint(checkpoints: Path) -> None:
    """Once a complete checkpoint exists: the data a fault injected after it must not lose."""
    wait_until(lambda: latest_checkpoint(checkpoints) is not None, 90, "the first checkpoint")


STUBBORN_WORKER = """
    import os, signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # slow to stop, as a worker saving state is
    open(f"worker-{os.environ['PET_NODE_RANK']}-{os.environ['LOCAL_RANK']}", "w").close()
    print("worker ready", flush=True)
    time.sleep(600)
"""


def stubborn_job(local_root: Path, tmp_path: Path, name: str) -> list[int]:
    """A 2-node x 2-process torchrun job (started from ``tmp_path``, the current folder) whose
    workers ignore SIGTERM; the PIDs of all its processes once every worker runs."""
    (tmp_path / "stubborn.py").write_text(textwrap.dedent(STUBBORN_WORKER))
    LocalBackend().launch(
        TrainJobSpec(name=name, command=("torchrun", "stubborn.py"), num_nodes=2, procs_per_node=2)
    )
    wait_until(lambda: len(list(tmp_path.glob("worker-*"))) == 4, 60, "four workers")
    supervisor = supervisor_pid(local_root / name)
    return [supervisor, *wait_for_descendants(supervisor, 6, timeout=30)]


def deleted_leaving_nothing(local_root: Path, name: str, everything: list[int], mark: str) -> None:
    """`kubetrain delete NAME` succeeds, and when it returns no process of the job or of the
    test runs and the job's folder is gone."""
    code, _, stderr = finished(kubetrain("delete", name), timeout=60)
    assert code == 0, stderr
    assert [pid for pid in everything if process_alive(pid)] == []
    assert left_running(mark) == []
    assert not (local_root / name).exists()


def stubborn_workers(everything: list[int]) -> list[int]:
    return [pid for pid in everything if process_alive(pid) and ignores_sigterm(pid)]


# ------------------------------------------------------------------ names stay under the root
def _names(outside: Path) -> list[str]:
    return ["../victim", "../../victim", str(outside), "victim/..", "sub/../../victim", ".",
            "..", "victim\n", "Victim", "victim x", "victim-link"]  # fmt: skip


@pytest.mark.bad_input
@pytest.mark.parametrize("verb", ["delete", "logs", "wait"])
@pytest.mark.parametrize("index", range(11))
def test_a_local_job_name_never_reaches_outside_the_root(
    verb: str,
    index: int,
    local_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A folder outside the root shaped like a job (status.json, job.json) is never read,
    signalled or removed, whatever the name: a path, `..`, a newline, a symlink in the root."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "status.json").write_text(json.dumps({"name": "victim", "state": "Running"}))
    (victim / "job.json").write_text("{}")
    (victim / "precious.txt").write_text("keep me\n")
    local_root.mkdir()
    (local_root / "victim-link").symlink_to(victim, target_is_directory=True)
    name = _names(victim)[index]
    before = tree(victim)

    try:
        code = main([verb, name, "--backend", "local"])
    except SystemExit as exc:
        code = exc.code
    stderr = capsys.readouterr().err

    assert code == 2, stderr
    assert_one_line_error(stderr, f"kubetrain {verb}", "name")
    assert tree(victim) == before


@pytest.mark.bad_input
def test_more_local_processes_than_the_machine_takes_are_refused(
    local_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["launch", "--backend", "local", "--nodes", "10000", "--", "true"])
    assert code == 2
    assert_one_line_error(capsys.readouterr().err, "kubetrain launch", "nodes")
    assert not local_root.exists() or not any(local_root.iterdir())


# ------------------------------------------------------------------ processes: stopped, all
@pytest.mark.fault
def test_delete_stops_workers_that_ignore_sigterm_in_sessions_of_their_own(
    local_root: Path, tmp_path: Path, mark: str, monkeypatch: pytest.MonkeyPatch, injected
) -> None:
    monkeypatch.chdir(tmp_path)
    everything = stubborn_job(local_root, tmp_path, "stubborn")
    sessions = {os.getsid(pid) for pid in everything}
    assert len(sessions) > 3, "torchrun's workers run in sessions of their own"
    assert len(stubborn_workers(everything)) == 4
    injected.struck("four workers ignore SIGTERM, each in a session of its own")

    deleted_leaving_nothing(local_root, "stubborn", everything, mark)


@pytest.mark.fault
def test_a_lost_supervisor_fails_the_job_and_its_workers_are_stopped(
    local_root: Path, tmp_path: Path, mark: str, monkeypatch: pytest.MonkeyPatch, injected
) -> None:
    monkeypatch.chdir(tmp_path)
    everything = stubborn_job(local_root, tmp_path, "orphaned")
    os.kill(everything[0], signal.SIGKILL)
    wait_until(lambda: not process_alive(everything[0]), 5, "the supervisor to die")
    injected.struck("the supervisor died of SIGKILL with its nodes running")

    code, _, stderr = finished(kubetrain("wait", "orphaned"), timeout=60)

    assert code == 1, stderr
    assert "SupervisorLost" in stderr
    assert [pid for pid in everything if process_alive(pid)] == []
    assert left_running(mark) == []


@pytest.mark.fault
def test_a_reused_supervisor_pid_is_neither_waited_on_nor_signalled(
    local_root: Path, mark: str, injected
) -> None:
    """The supervisor dies and its PID now names an unrelated process (written into the record
    here, as the kernel may hand the PID out again): wait reports the job lost at once, and
    delete leaves that process alone."""
    backend = LocalBackend()
    backend.launch(TrainJobSpec(name="reused", command=("sleep", "60")))
    wait_until(lambda: backend.status("reused").state == "Running", 30, "running")
    record = local_root / "reused" / "supervisor.json"
    identity = json.loads(record.read_text())
    os.kill(identity["pid"], signal.SIGKILL)
    wait_until(lambda: not process_alive(identity["pid"]), 5, "the supervisor to die")
    unrelated = subprocess.Popen(["sleep", "60"], env={"PATH": os.environ["PATH"]})
    record.write_text(json.dumps({**identity, "pid": unrelated.pid}))
    injected.struck("the supervisor's recorded PID now names a live, unrelated process")
    try:
        code, _, stderr = finished(kubetrain("wait", "reused"), timeout=30)
        assert code == 1 and "SupervisorLost" in stderr, stderr
        assert finished(kubetrain("delete", "reused"), timeout=30)[0] == 0
        assert unrelated.poll() is None, "an unrelated process was signalled"
    finally:
        unrelated.kill()
        unrelated.wait()
    assert left_running(mark) == []


@pytest.mark.fault
def test_a_job_with_corrupt_records_can_still_be_deleted(
    local_root: Path, tmp_path: Path, mark: str, monkeypatch: pytest.MonkeyPatch, injected
) -> None:
    monkeypatch.chdir(tmp_path)
    everything = stubborn_job(local_root, tmp_path, "corrupt")
    (local_root / "corrupt" / "status.json").write_text("{not json")
    (local_root / "corrupt" / "job.json").write_bytes(b"\x00\xff")
    with pytest.raises(ValueError):
        json.loads((local_root / "corrupt" / "status.json").read_text())
    injected.struck("the running job's status.json and job.json are corrupt")

    deleted_leaving_nothing(local_root, "corrupt", everything, mark)


@pytest.mark.fault
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_cancelled_local_wait_says_so_and_stops_every_process(
    signum: int, local_root: Path, digits_dir: Path, tmp_path: Path, mark: str, injected
) -> None:
    name = launch_training(digits_dir, tmp_path)
    waiter = kubetrain("wait", name)
    first_checkpoint(tmp_path / "ckpt")

    waiter.send_signal(signum)
    code, _, stderr = finished(waiter, timeout=30)

    assert code == 128 + signum, stderr
    injected.struck(f"wait received {signal.Signals(signum).name}")
    assert f"cancelled by {signal.Signals(signum).name}; stopped its processes" in stderr
    assert left_running(mark) == []
    assert LocalBackend().status(name).state == "Failed"
    injected.data_intact("newest checkpoint", lambda: newest_checkpoint_loads(tmp_path / "ckpt"))


@pytest.mark.fault
def test_a_stopped_rank_is_reported_as_a_stall_not_waited_on(
    local_root: Path, digits_dir: Path, tmp_path: Path, mark: str, figures, injected
) -> None:
    """SIGSTOP on rank 1's worker: rank 0 blocks in its next all-reduce and every log goes
    quiet. Without the stall check `wait` would sit out gloo's 30-minute timeout."""
    name = launch_training(digits_dir, tmp_path)
    first_checkpoint(tmp_path / "ckpt")
    node_1 = LocalBackend().status(name).nodes[1].pid
    (worker,) = wait_for_descendants(node_1, 1, timeout=30)
    waiter = kubetrain("wait", name, "--stall-timeout", "3")

    os.kill(worker, signal.SIGSTOP)
    stopped_at = time.monotonic()
    wait_until(lambda: psutil.Process(worker).status() == psutil.STATUS_STOPPED, 5, "SIGSTOP")
    injected.struck("rank 1's worker is stopped (SIGSTOP)")
    code, _, stderr = finished(waiter, timeout=60)
    reported_after = time.monotonic() - stopped_at

    assert code == 3, stderr
    assert f"job {name} stalled: no node wrote to its log for 3s" in stderr
    assert left_running(mark) == []
    assert reported_after < 3 + 10, f"reported {reported_after:.1f}s after the rank stopped"
    injected.data_intact("newest checkpoint", lambda: newest_checkpoint_loads(tmp_path / "ckpt"))
    figures.record("stopped rank (stall timeout 3 s): wait reported after (s)",
                   round(reported_after, 2))  # fmt: skip


@pytest.mark.fault
@pytest.mark.parametrize(
    ("signum", "to_group"),
    [(signal.SIGINT, True), (signal.SIGTERM, False)],
    ids=["ctrl-c", "sigterm"],
)
def test_an_interrupted_kubetrain_run_stops_its_job_and_says_so(
    signum: int, to_group: bool, local_root: Path, tmp_path: Path, mark: str, injected
) -> None:
    """Ctrl-C reaches the terminal's process group (run and its step), `kill` only run; either
    way the training job, whose processes no terminal signal reaches, is stopped too."""
    run = subprocess.Popen(
        [sys.executable, "-m", "kubetrain", "run", "--epochs", "500", "--output", "runs"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,
    )
    wait_until(lambda: len(list(local_root.glob("*/checkpoints"))) == 1, 120, "the job to start")
    (checkpoints,) = local_root.glob("*/checkpoints")
    first_checkpoint(checkpoints)

    if to_group:
        os.killpg(run.pid, signum)
    else:
        run.send_signal(signum)
    code, _, stderr = finished(run, timeout=60)

    assert code == 128 + signum, stderr[-3000:]
    injected.struck(f"kubetrain run received {signal.Signals(signum).name} while training")
    last_line = stderr.strip().splitlines()[-1]
    assert last_line.startswith(
        f"kubetrain run: error: stopped by {signal.Signals(signum).name}: stopped the running "
        "step and its training job"
    ), last_line
    assert left_running(mark) == []
    injected.data_intact("newest checkpoint", lambda: newest_checkpoint_loads(checkpoints))


# ------------------------------------------------------------------ the supervisor's record
@pytest.mark.fault
def test_a_clock_step_does_not_make_a_running_supervisor_look_lost(
    local_root: Path, monkeypatch: pytest.MonkeyPatch, injected
) -> None:
    """psutil derives create times from the boot time, which moves when the clock is stepped
    (NTP, a resumed VM): the supervisor is known by the job's id in its environment."""
    backend = LocalBackend()
    backend.launch(TrainJobSpec(name="steady", command=("sleep", "60")))
    wait_until(lambda: backend.status("steady").state == "Running", 30, "running")
    supervisor = supervisor_pid(local_root / "steady")
    before = psutil.Process(supervisor).create_time()
    stepped = psutil.Process.create_time
    monkeypatch.setattr(psutil.Process, "create_time", lambda self: stepped(self) + 3600)
    assert psutil.Process(supervisor).create_time() != before
    injected.struck("every create time moved by an hour")

    assert backend.status("steady").state == "Running"
    assert process_alive(supervisor)
    monkeypatch.undo()
    backend.delete("steady")


@pytest.mark.fault
@pytest.mark.parametrize(
    "record", ["1", '"x"', '{"pid": "x"}', '{"pid": 1}', '{"pid": -5}', "{", "[" * 100000]
)
def test_a_corrupt_supervisor_record_still_lets_the_job_be_stopped(
    record: str, local_root: Path, mark: str, injected
) -> None:
    """A record with no usable PID: the supervisor is found among the job's processes (the
    job goes on); one naming another process (PID 1): the job is lost and its processes
    stopped. Either way delete leaves nothing."""
    backend = LocalBackend()
    backend.launch(TrainJobSpec(name="scribbled", command=("sleep", "60")))
    wait_until(lambda: backend.status("scribbled").state == "Running", 30, "running")
    (local_root / "scribbled" / "supervisor.json").write_text(record)
    injected.struck(f"supervisor.json holds {record[:20]!r}")

    status = backend.status("scribbled")
    assert status.state == ("Failed" if record == '{"pid": 1}' else "Running"), status
    code, _, stderr = finished(kubetrain("delete", "scribbled"), timeout=60)
    assert code == 0, stderr
    assert left_running(mark) == []
    assert not (local_root / "scribbled").exists()


def test_a_job_launched_a_moment_ago_is_starting_not_lost(local_root: Path) -> None:
    """launch writes the job's status just before its supervisor's record: a status read in
    between is Created; a job left that way (launch died) is lost after a while."""
    job = local_root / "fresh"
    job.mkdir(parents=True)
    (job / "job.json").write_text(json.dumps({"spec": {}, "cwd": "/", "id": uuid.uuid4().hex}))
    for age, state in ((0, "Created"), (3600, "Failed")):
        created = time.time() - age
        (job / "status.json").write_text(
            json.dumps({"name": "fresh", "state": "Created", "created_at": created})
        )
        assert LocalBackend().status("fresh").state == state
