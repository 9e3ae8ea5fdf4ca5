"""Local launches at once (issue 28, races): the check that no live job uses a checkpoint
folder and the job's creation are one step across processes, under an ``flock`` on the
local jobs' root (``launch.one_local_launch_at_a_time``). Three launches on one folder
started three jobs when they checked before any of them had created its record."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubetrain.backends.local.backend import LocalBackend
from kubetrain.components.launch_trainjob import launch as launch_module
from tests.reliability.test_bad_input import assert_one_line_error
from tests.support.processes import kubetrain_in_process

SLEEPER = (sys.executable, "-c", "import time; time.sleep(30)")


@contextlib.contextmanager
def root_locked(root: Path) -> Iterator[None]:
    """The lock a launch holds from its check until its job's record exists, taken here."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


def launch_process(name: str, checkpoint_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "kubetrain", "launch", "--name", name, "--nodes", "1",
         "--checkpoint-dir", str(checkpoint_dir), "--", *SLEEPER],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip


def job_record(root: Path, name: str, state: str, checkpoint_dir: Path) -> None:
    """A job folder as ``LocalBackend.launch`` writes it, before its supervisor starts."""
    job_dir = root / name
    job_dir.mkdir(parents=True)
    spec = {"name": name, "env": {launch_module.CHECKPOINT_DIR_ENV: str(checkpoint_dir)}}
    (job_dir / "job.json").write_text(json.dumps({"spec": spec, "cwd": "/", "id": name}))
    status = {"name": name, "state": state, "created_at": time.time()}
    (job_dir / "status.json").write_text(json.dumps(status))


@pytest.fixture
def jobs(local_root: Path) -> Iterator[Path]:
    yield local_root
    backend = LocalBackend()
    for job_dir in local_root.iterdir() if local_root.exists() else []:
        with contextlib.suppress(Exception):
            backend.delete(job_dir.name)


def test_launches_at_once_on_one_folder_start_one_job(jobs, tmp_path):
    """Held at the lock, none creates a job; let go, they go one at a time, so the second
    and third find the first live (Created or Running) and stop in one line naming it."""
    folder = tmp_path / "ck"
    with root_locked(jobs):
        procs = [launch_process(f"race-{i}", folder) for i in range(3)]
        time.sleep(2.0)
        assert [p.poll() for p in procs] == [None] * 3, "a launch did not wait for the lock"
        assert sorted(p.name for p in jobs.iterdir()) == [], "a job was created meanwhile"
    results = [(p.wait(60), *p.communicate()) for p in procs]
    started = [f"race-{i}" for i, (code, _, _) in enumerate(results) if code == 0]
    assert len(started) == 1, results
    for code, _out, err in results:
        if code != 0:
            assert code == 2, err
            line = assert_one_line_error(err, "kubetrain launch", "checkpoint_dir")
            assert f"live job {started[0]} (" in line
    assert sorted(p.name for p in jobs.iterdir()) == started


def test_the_job_keeps_no_hold_on_the_launch_lock(jobs, tmp_path, capsys):
    """The supervisor and nodes outlive the launch: inheriting its lock, a running job would
    hold up every later launch until it ended."""
    code, _out, err = kubetrain_in_process(
        ["launch", "--name", "running", "--nodes", 1, "--checkpoint-dir", tmp_path / "ck",
         "--", *SLEEPER], capsys)  # fmt: skip
    assert code == 0, err
    with root_locked(jobs):
        pass  # taken at once, without waiting
    code, _out, err = kubetrain_in_process(
        ["launch", "--name", "next", "--nodes", 1, "--checkpoint-dir", tmp_path / "other",
         "--", *SLEEPER], capsys)  # fmt: skip
    assert code == 0, err


def test_a_launch_held_up_too_long_says_so_in_one_line(jobs, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(launch_module, "LAUNCH_LOCK_SECONDS", 0.5)
    with root_locked(jobs):
        started = time.monotonic()
        code, _out, err = kubetrain_in_process(
            ["launch", "--name", "late", "--nodes", 1, "--", *SLEEPER], capsys
        )
        assert time.monotonic() - started < 10
    assert code == 1
    (line,) = [line for line in err.splitlines() if line.strip()]
    assert line.startswith("kubetrain launch: error: another `kubetrain launch` has held the ")
    assert str(jobs) in line and "launch again" in line
    assert list(jobs.iterdir()) == []


def test_a_job_just_created_counts_as_live_and_a_finished_one_does_not(jobs, tmp_path, capsys):
    """A record of state Created with no supervisor yet (the moment after creation) holds its
    folder; a finished job's does not, and a job folder with a status.json of the wrong
    shape neither breaks the check nor holds anything."""
    folder = tmp_path / "ck"
    job_record(jobs, "done", "Complete", folder)
    (jobs / "odd").mkdir()
    (jobs / "odd" / "status.json").write_text("[]")
    code, _out, err = kubetrain_in_process(
        ["launch", "--name", "now", "--nodes", 1, "--checkpoint-dir", folder, "--", *SLEEPER],
        capsys,
    )
    assert code == 0, err
    LocalBackend().delete("now")
    job_record(jobs, "fresh", "Created", folder)
    code, _out, err = kubetrain_in_process(
        ["launch", "--name", "late", "--nodes", 1, "--checkpoint-dir", folder / "sub", "--",
         *SLEEPER], capsys)  # fmt: skip
    assert code == 2
    line = assert_one_line_error(err, "kubetrain launch", "checkpoint_dir")
    assert "live job fresh (Created)" in line
    assert not (jobs / "late").exists()
