"""An owner (kubetrain.backends.owned_processes.start_owned/run) never outlives the process
that started it: SIGKILLed, that process can forward nothing, so the kernel tells the owner
(prctl PR_SET_PDEATHSIG) and the owner stops its program's whole tree as on a forwarded
SIGTERM. A parent that ended before the owner asked the kernel is seen by its PID; the end of
only the parent's thread that started the owner stops nothing. Real processes, no training."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil

from kubetrain.backends.owned_processes import start_owned
from tests.support.processes import process_alive

#: A program that starts a child (which writes its PID) and sleeps; the child sleeps too.
PROGRAM_WITH_A_CHILD = textwrap.dedent(
    """
    import subprocess, sys, time
    subprocess.Popen(["/bin/sh", "-c", 'echo $$ > "$0"; exec sleep 60', sys.argv[1]])
    time.sleep(60)
    """
)


def written_pid(path: Path, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and (text := path.read_text().strip()):
            return int(text)
        time.sleep(0.05)
    raise TimeoutError(f"nothing wrote {path}")


def gone_within(pids: list[int], seconds: float) -> list[int]:
    """Those of ``pids`` still running after ``seconds``."""
    deadline = time.monotonic() + seconds
    while (running := [p for p in pids if process_alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return running


def kill_if_running(pids: list[int]) -> None:
    """Clean up after a failed check: only the processes this test started."""
    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            continue


def test_a_sigkilled_parent_s_owner_stops_the_program_and_its_child(tmp_path):
    (tmp_path / "program.py").write_text(PROGRAM_WITH_A_CHILD)
    parent_script = textwrap.dedent(
        f"""
        import os, sys, time
        from kubetrain.backends.owned_processes import start_owned
        owner = start_owned([sys.executable, {str(tmp_path / "program.py")!r},
                             {str(tmp_path / "child.pid")!r}], env=dict(os.environ))
        print(owner.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_script], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    owner = int(parent.stdout.readline())
    child = written_pid(tmp_path / "child.pid")
    program = [p.pid for p in psutil.Process(owner).children()]
    everything = [owner, *program, child]
    try:
        parent.kill()
        parent.wait(10)
        assert gone_within(everything, 5) == [], "the owner's tree outlived its parent"
    finally:
        kill_if_running(everything)


def test_an_owner_whose_parent_ended_before_it_looked_starts_nothing(tmp_path):
    """The parent named on the owner's command line is not its parent any more (it ended
    before the owner asked the kernel to be told, and the owner was re-parented): the owner
    exits as on SIGTERM, and the program never runs."""
    started = tmp_path / "started"
    ended = subprocess.Popen(["true"])
    ended.wait()  # the parent the owner is told of, gone
    owner = subprocess.run(
        [sys.executable, "-m", "kubetrain.backends.owned_processes", "--grace", "1",
         "--parent", str(ended.pid), "--", "touch", str(started)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert owner.returncode == 128 + signal.SIGTERM, owner.stderr
    assert not started.exists()


def test_the_end_of_the_parent_s_thread_that_started_the_owner_stops_nothing(tmp_path):
    """The kernel signals an owner when the parent's *thread* that forked it ends (prctl(2));
    the parent goes on, so the program must too, and SIGTERM still stops it."""
    pidfile = tmp_path / "program.pid"
    started: list[subprocess.Popen] = []

    def start_then_end_once_the_program_runs() -> None:
        """Ends after the owner asked the kernel (it starts its program after): a thread
        that ended before would leave the owner re-parented to a live thread, told nothing."""
        started.append(
            start_owned(
                ["sh", "-c", 'echo $$ > "$0"; exec sleep 60', str(pidfile)],
                env=dict(os.environ),
                grace_seconds=1,
            )  # fmt: skip
        )
        written_pid(pidfile)

    starter = threading.Thread(target=start_then_end_once_the_program_runs)
    starter.start()
    starter.join()
    owner = started[0]
    program = written_pid(pidfile)
    try:
        time.sleep(1.0)  # the owner's signal handler has long run by now
        assert owner.poll() is None and process_alive(program), "stopped by a thread's end"
        owner.send_signal(signal.SIGTERM)
        assert owner.wait(10) == -signal.SIGTERM
        assert gone_within([program], 5) == []
    finally:
        kill_if_running([owner.pid, program])
