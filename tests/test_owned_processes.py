"""Nothing a step starts outlives it (kubetrain.backends.owned_processes): a program's child
that detaches with an empty environment (no job identity), in a session of its own, or by a
double fork is still found (below its owner, a child subreaper) and stopped when the local job
ends (Complete included), on `kubetrain delete`, when `evaluate -- CMD`'s program ends, when
`evaluate` is sent SIGTERM, and when a `kubetrain run` step ends. Small shell and ``python -c``
programs: no training."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from kubetrain.backends.base import COMPLETE, FAILED
from kubetrain.backends.local.backend import LocalBackend
from kubetrain.backends.owned_processes import JOB_ID_ENV, run
from kubetrain.jobspec import TrainJobSpec
from tests.support.processes import process_alive
from tests.support.processes import run_kubetrain as kubetrain

#: How a program's child detaches, each writing the detached process's PID to $PIDFILE.
DETACHING = {
    "empty environment": 'env -i sh -c \'sleep 1000 & echo $! > "$0"\' "$PIDFILE"',
    "empty environment, own session": (
        'env -i setsid sh -c \'sleep 1000 & echo $! > "$0"\' "$PIDFILE"'
    ),
    "double fork, setsid, empty environment": (
        f"{sys.executable} -c '"
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        '        open(sys.argv[1], "w").write(str(os.getpid()))\n'
        '        os.execve("/bin/sleep", ["sleep", "1000"], {})\n'
        "    os._exit(0)\n"
        "os.wait()\n"
        '\' "$PIDFILE"'
    ),
}


def detached_pid(pidfile: Path, timeout: float = 30) -> int:
    """The PID the program's detached child wrote, once written."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pidfile.is_file() and (text := pidfile.read_text().strip()):
            return int(text)
        time.sleep(0.05)
    raise TimeoutError(f"nothing wrote {pidfile}")


def gone_soon(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not process_alive(pid)


def kill_sleeper(pid: int) -> None:
    """Clean up after a failed check: a sleeper we planted, never another process."""
    try:
        proc = psutil.Process(pid)
        if proc.status() != psutil.STATUS_ZOMBIE and proc.name() == "sleep":
            proc.kill()
    except psutil.Error:
        pass


@pytest.fixture
def sleepers():
    planted: list[int] = []
    yield planted
    for pid in planted:
        kill_sleeper(pid)


def shell_job(name: str, script: str, nodes: int = 1) -> TrainJobSpec:
    return TrainJobSpec(name=name, command=("sh", "-c", script), num_nodes=nodes)


@pytest.mark.parametrize("how", sorted(DETACHING))
def test_a_complete_local_job_leaves_no_detached_child(
    local_root, tmp_path, monkeypatch, how, sleepers
):
    pidfile = tmp_path / "daemon.pid"
    monkeypatch.setenv("PIDFILE", str(pidfile))
    backend = LocalBackend()
    backend.launch(shell_job("detaches", f"{DETACHING[how]}; echo done"))
    status = backend.wait("detaches", timeout=60)
    sleepers.append(daemon := detached_pid(pidfile))
    assert status.state == COMPLETE, status.message
    assert not process_alive(daemon), "wait said Complete while the program's child ran on"


def test_delete_stops_a_child_started_with_an_empty_environment(
    local_root, tmp_path, monkeypatch, sleepers
):
    pidfile = tmp_path / "daemon.pid"
    monkeypatch.setenv("PIDFILE", str(pidfile))
    LocalBackend().launch(
        shell_job("keeps-running", f"{DETACHING['empty environment, own session']}; sleep 1000")
    )
    sleepers.append(daemon := detached_pid(pidfile))
    assert psutil.Process(daemon).environ().get(JOB_ID_ENV) is None  # no identity to find
    deleted = kubetrain("delete", "--backend", "local", "keeps-running")
    assert deleted.returncode == 0, deleted.stderr
    assert gone_soon(daemon)


def test_a_failed_job_stops_the_detached_child_itself_without_delete(
    local_root, tmp_path, monkeypatch, sleepers
):
    """The supervisor's own failure path (not `delete`'s sweep) leaves no process."""
    pidfile = tmp_path / "daemon.pid"
    monkeypatch.setenv("PIDFILE", str(pidfile))
    script = (
        f'if [ "$PET_NODE_RANK" = 0 ]; then {DETACHING["double fork, setsid, empty environment"]}'
        '; sleep 1000; else while [ ! -s "$PIDFILE" ]; do sleep 0.05; done; exit 1; fi'
    )
    backend = LocalBackend()
    backend.launch(shell_job("one-fails", script, nodes=2))
    status = backend.wait("one-fails", timeout=60)
    sleepers.append(daemon := detached_pid(pidfile))
    assert status.state == FAILED and status.failed_rank == 1, status.message
    assert not process_alive(daemon)


def _metrics_program(before: str) -> list[str]:
    return ["sh", "-c", f'{before}; echo \'{{"accuracy": 1}}\' > "$KUBETRAIN_METRICS_FILE"']


def test_evaluate_with_a_program_leaves_no_daemon_of_it(tmp_path, monkeypatch, sleepers):
    from kubetrain.components.evaluate_model.evaluate import Gate, evaluate_with_program

    pidfile = tmp_path / "daemon.pid"
    monkeypatch.setenv("PIDFILE", str(pidfile))
    (model := tmp_path / "model").mkdir()
    program = _metrics_program(DETACHING["empty environment, own session"])
    result = evaluate_with_program(program, str(model), "", Gate())
    sleepers.append(daemon := detached_pid(pidfile))
    assert result.passed
    assert not process_alive(daemon)


def test_sigterm_to_evaluate_stops_its_program_and_what_it_started(tmp_path, sleepers):
    """SIGTERM to the evaluate step (a cancelled run) is forwarded: the program and its
    detached child end before the step does, which exits 128+15 with one line."""
    pidfile, program_pidfile = tmp_path / "daemon.pid", tmp_path / "program.pid"
    (model := tmp_path / "model").mkdir()
    step = textwrap.dedent(f"""
        import sys
        from kubetrain.components.evaluate_model.evaluate import Gate, evaluate_with_program
        from kubetrain.errors import KubetrainError
        program = ["sh", "-c", {DETACHING["empty environment, own session"]!r}
                   + '; echo $$ > "$1"; exec sleep 1000', "sh", {str(program_pidfile)!r}]
        try:
            evaluate_with_program(program, {str(model)!r}, "", Gate())
        except KubetrainError as error:
            print(error, file=sys.stderr)
            sys.exit(error.exit_code)
    """)
    with open(tmp_path / "stderr", "w+") as stderr:  # a pipe would wait for the orphans
        evaluate = subprocess.Popen(
            [sys.executable, "-c", step], env={**os.environ, "PIDFILE": str(pidfile)}, stderr=stderr
        )
        try:
            sleepers.append(program := detached_pid(program_pidfile))
            sleepers.append(daemon := detached_pid(pidfile))
            evaluate.send_signal(signal.SIGTERM)
            evaluate.wait(timeout=15)
        finally:
            evaluate.kill()
    err = (tmp_path / "stderr").read_text()
    assert evaluate.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM: stopped your evaluation program sh" in err
    assert not process_alive(program) and not process_alive(daemon)


def test_a_run_step_leaves_no_daemon_but_the_local_job_it_launched(tmp_path, monkeypatch, sleepers):
    """`kubetrain run`'s steps run through the owned runner: a step's stray is stopped when
    the step ends; a local job its launch started (another job identity) is left to the job's
    own supervisor, and the run's exit handler."""
    from kfp.local import subprocess_task_handler

    from kubetrain.cli.run_output import RunOutput, kfp_output_shaped

    stray, job = tmp_path / "stray.pid", tmp_path / "job.pid"
    monkeypatch.setenv("PIDFILE", str(stray))
    step = (
        f"{DETACHING['empty environment, own session']} >/dev/null 2>&1; "
        f"{JOB_ID_ENV}=launched setsid sh -c 'sleep 1000 & echo $! > \"$0\"' {job} "
        ">/dev/null 2>&1; "
        "echo step-line"
    )
    view = RunOutput(verbose=False, stream=io.StringIO(), colour=False)
    view.step_started("launch-trainjob")
    with kfp_output_shaped(view):
        code = subprocess_task_handler.run_local_subprocess(["sh", "-c", step], {})
    sleepers.extend([stray_pid := detached_pid(stray), job_pid := detached_pid(job)])
    assert code == 0
    assert view.steps[-1].lines == ["step-line"]
    assert not process_alive(stray_pid)
    assert process_alive(job_pid)


# ------------------------------------------------------------------ the runner itself
def test_the_program_s_exit_code_and_signal_come_back(tmp_path):
    env = dict(os.environ)
    assert run(["sh", "-c", "exit 3"], env=env) == (3, None)
    assert run(["sh", "-c", "kill -TERM $$"], env=env) == (-signal.SIGTERM, None)
    assert run(["no-such-program-here"], env=env)[0] == 127


def test_a_program_ignoring_sigterm_is_killed_after_the_grace(tmp_path):
    """SIGTERM to the owner reaches the program; one that ignores it is SIGKILLed after the
    grace, and the owner ends as the program did."""
    from kubetrain.backends.owned_processes import start_owned

    started = tmp_path / "started"
    program = f"trap '' TERM; touch {started}; while :; do sleep 0.05; done"
    owner = start_owned(["sh", "-c", program], env=dict(os.environ), grace_seconds=0.5)
    detached_pid_written = time.monotonic() + 30
    while not started.exists() and time.monotonic() < detached_pid_written:
        time.sleep(0.05)
    sent = time.monotonic()
    owner.send_signal(signal.SIGTERM)
    assert owner.wait(timeout=10) == -signal.SIGKILL
    assert 0.4 < time.monotonic() - sent < 5
