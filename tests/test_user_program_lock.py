"""A user's program on a cluster holds its checkpoint folder's lock, as our trainer does.

On a cluster the program runs through the fixed launcher ``IN_FOLDER``
(kubetrain/render/script.py): ``python3 -c CODE FOLDER CMD...``. On node 0 it takes the
trainer's lock (``flock`` on ``FOLDER/.lock``, the holder's JSON record) and keeps it open across
``exec``, so a second job given the same folder stops at once with one line naming the first,
instead of overwriting its files. The launcher runs here as a real process (this interpreter in
place of the image's ``python3``), and through the emulated cluster, whose fake Trainer runs the
node pods' commands as local processes.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubetrain.render.script import IN_FOLDER
from tests.support.processes import process_alive

#: A program that records its arguments and working folder, then sleeps until told to stop.
SLEEPER = (
    "import json, os, sys, time\n"
    "with open(os.environ['SEEN'], 'w') as seen:\n"
    "    json.dump({'argv': sys.argv[1:], 'cwd': os.getcwd()}, seen)\n"
    "while not os.path.exists(os.environ['STOP']):\n"
    "    time.sleep(0.05)\n"
)
#: Arguments a shell would mangle, kept as given.
ODD_ARGUMENTS = ["--out", "model.pt", "two words", "$HOME", "*", "", "-m", "x;y"]


def launcher(folder: Path, *program: str) -> list[str]:
    return [sys.executable, *IN_FOLDER[1:], str(folder), *program]


def node_env(tmp_path: Path, name: str, job: str, rank: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PET_NODE_RANK", "SEEN", "STOP")}
    env.update(KUBETRAIN_JOB_NAME=job, SEEN=str(tmp_path / f"{name}.seen"))
    env["STOP"] = str(tmp_path / f"{name}.stop")
    if rank is not None:
        env["PET_NODE_RANK"] = rank
    return env


def start_sleeper(tmp_path: Path, folder: Path, name: str, rank: str | None = None):
    """The launcher running SLEEPER as job ``name``, once the program has started."""
    program = launcher(folder, sys.executable, "-c", SLEEPER, *ODD_ARGUMENTS)
    process = subprocess.Popen(program, env=node_env(tmp_path, name, name, rank))
    seen = tmp_path / f"{name}.seen"
    deadline = time.monotonic() + 30
    while not seen.exists() or not seen.read_text():
        assert process.poll() is None, f"the launcher exited with {process.returncode}"
        assert time.monotonic() < deadline, "the program did not start"
        time.sleep(0.05)
    return process


def stop(tmp_path: Path, name: str, process: subprocess.Popen) -> None:
    (tmp_path / f"{name}.stop").touch()
    assert process.wait(timeout=30) == 0


def run_launcher(tmp_path: Path, folder: Path, name: str, *program: str, rank=None, env=None):
    return subprocess.run(
        launcher(folder, *program),
        env={**node_env(tmp_path, name, name, rank), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def lock_reader():
    """Our trainer's reader of a holder record (what its refusal and launch's check print)."""
    from kubetrain.artifacts.checkpoint import _describe_holder

    return lambda folder: _describe_holder((folder / ".lock").read_bytes())


def test_a_second_job_on_the_folder_stops_in_one_line_naming_the_first(tmp_path, lock_reader):
    """The first job's program holds the lock for its life (the same PID: exec keeps it, and
    the record names it); the second stops before its program runs, in one line naming
    checkpoint_dir, the lock, the first job and the fix; the program saw its arguments and
    folder as given."""
    from kubetrain.artifacts.checkpoint import job_identity

    folder = tmp_path / "shared" / "ckpt"
    first = start_sleeper(tmp_path, folder, "first")
    try:
        record = json.loads((folder / ".lock").read_text())
        assert record["job"] == "first" and record["pid"] == first.pid
        assert set(record) == set(job_identity()), "the trainer's record, field for field"
        holder = lock_reader(folder)
        assert holder.startswith(f"job first, host {record['host']}, pid {first.pid}, since ")

        second = run_launcher(tmp_path, folder, "second", "touch", "second-ran")
        assert second.returncode != 0
        assert second.stderr.splitlines() == [
            f"kubetrain: error: checkpoint_dir: {folder} is being written by another job (its "
            f"lock {folder / '.lock'} is held by: {holder}); give each job its own "
            "--checkpoint-dir, or wait until that job ends"
        ]
        assert not (folder / "second-ran").exists()
        assert lock_reader(folder) == holder, "the refused job left the record alone"
    finally:
        stop(tmp_path, "first", first)
    seen = json.loads((tmp_path / "first.seen").read_text())
    assert seen == {"argv": ODD_ARGUMENTS, "cwd": str(folder)}


def test_a_holder_record_with_control_characters_is_still_one_line(tmp_path):
    """The record is anyone's text on a shared volume: the refusal stays one line, its
    control characters shown as '?', and a record that is not ours is said to be unknown."""
    import fcntl

    folder = tmp_path / "ckpt"
    folder.mkdir()
    record = {"job": "evil\njob\x1b[2J\x9b", "run_id": None, "host": "h", "pid": 7, "since": "s"}
    for text, holder in [
        (json.dumps(record), "job evil?job?[2J?, host h, pid 7, since s"),
        ("[" * 100_000, "a process that has not yet said who it is"),
        ('{"job": "no other field"}', "a process that has not yet said who it is"),
    ]:
        with open(folder / ".lock", "w") as lock:
            lock.write(text)
            lock.flush()
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            refused = run_launcher(tmp_path, folder, "second", "true")
        assert refused.returncode != 0
        assert len(refused.stderr.splitlines()) == 1, refused.stderr
        assert f"is held by: {holder});" in refused.stderr


def test_the_lock_is_released_when_the_program_ends(tmp_path, lock_reader):
    folder = tmp_path / "ckpt"
    first = start_sleeper(tmp_path, folder, "first")
    stop(tmp_path, "first", first)
    assert not process_alive(first.pid)
    again = start_sleeper(tmp_path, folder, "again")
    try:
        assert lock_reader(folder).startswith("job again, host ")
        assert f"pid {again.pid}," in lock_reader(folder)
    finally:
        stop(tmp_path, "again", again)


@pytest.mark.parametrize("rank", ["0", ""])
def test_node_0_locks_and_other_nodes_do_not(tmp_path, rank):
    """Every node's pod shares the folder: node 0 (PET_NODE_RANK 0, or none given) holds the
    lock, node 1 runs in the folder without it, and a second node 0 is refused."""
    folder = tmp_path / "ckpt"
    node_0 = start_sleeper(tmp_path, folder, "node-0", rank=rank)
    try:
        node_1 = run_launcher(tmp_path, folder, "node-1", "pwd", rank="1")
        assert (node_1.returncode, node_1.stdout, node_1.stderr) == (0, f"{folder}\n", "")
        again = run_launcher(tmp_path, folder, "node-0b", "pwd", rank="0")
        assert again.returncode != 0 and "is held by: job node-0," in again.stderr
    finally:
        stop(tmp_path, "node-0", node_0)


def test_our_trainers_lock_and_the_launchers_refuse_each_other(tmp_path, lock_reader, monkeypatch):
    """One lock for both: a folder our trainer's rank 0 holds refuses a user's program in the
    trainer's words, and one a user's program holds refuses our trainer and launch's check."""
    from kubetrain.artifacts.checkpoint import lock_checkpoint_dir
    from kubetrain.components.launch_trainjob.launch import check_checkpoint_lock
    from kubetrain.errors import InvalidInput

    held = tmp_path / "held-by-trainer"
    monkeypatch.setenv("KUBETRAIN_JOB_NAME", "trainer-job")
    lock = lock_checkpoint_dir(held)
    monkeypatch.delenv("KUBETRAIN_JOB_NAME")
    try:
        refused = run_launcher(tmp_path, held, "user", "true")
        assert refused.returncode != 0
        assert f"is held by: {lock_reader(held)});" in refused.stderr
        assert "job trainer-job, " in refused.stderr
    finally:
        lock.release()

    folder = tmp_path / "held-by-program"
    program = start_sleeper(tmp_path, folder, "user-job")
    try:
        with pytest.raises(InvalidInput, match=f"job user-job, .*pid {program.pid},"):
            lock_checkpoint_dir(folder)
        with pytest.raises(InvalidInput) as refused_at_launch:
            check_checkpoint_lock(str(folder))  # launch's check shows the record as written
        record = (folder / ".lock").read_text().strip()
        assert f"is held by: {record})" in str(refused_at_launch.value)
        assert f'"pid": {program.pid},' in record
    finally:
        stop(tmp_path, "user-job", program)


def test_a_program_that_runs_our_trainer_is_left_to_take_its_own_lock(tmp_path):
    """``-m kubetrain.train`` under the launcher: the trainer's rank 0 locks the folder itself
    (a new descriptor, which a lock the launcher held would refuse), so the launcher takes
    none. Here the program takes the lock with the trainer's own function, in the folder."""
    takes_the_lock = (
        "from kubetrain.artifacts.checkpoint import lock_checkpoint_dir\n"
        "lock_checkpoint_dir('.')\n"
        "print('locked')\n"
    )
    program = (sys.executable, "-c", takes_the_lock, "-m", "kubetrain.train")
    ran = run_launcher(tmp_path, tmp_path / "ckpt", "ours", *program)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "locked\n", "")


#: Imported at the launcher's start (``sitecustomize``): fcntl.flock fails with FLOCK_ERRNO, as
#: on a filesystem without locks (ENOLCK: NFS without lockd; EOPNOTSUPP, ENOSYS: some FUSE).
NO_FLOCK = (
    "import errno, fcntl, os\n"
    "def flock(fd, operation):\n"
    "    code = getattr(errno, os.environ['FLOCK_ERRNO'])\n"
    "    raise OSError(code, os.strerror(code))\n"
    "fcntl.flock = flock\n"
)


@pytest.mark.parametrize("errno_name", ["ENOLCK", "EOPNOTSUPP", "ENOSYS"])
def test_a_filesystem_without_locks_runs_the_program_unlocked(tmp_path, errno_name):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(NO_FLOCK)
    env = {"PYTHONPATH": str(tmp_path / "site"), "FLOCK_ERRNO": errno_name}
    ran = run_launcher(tmp_path, tmp_path / "ckpt", "nolock", "pwd", env=env)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, f"{tmp_path / 'ckpt'}\n", "")
    assert (tmp_path / "ckpt" / ".lock").read_bytes() == b"", "no holder claimed"

    env["FLOCK_ERRNO"] = "EIO"  # any other failure: one line, the program not run
    failed = run_launcher(tmp_path, tmp_path / "ckpt", "nolock", "pwd", env=env)
    assert failed.returncode != 0 and failed.stdout == ""
    assert failed.stderr.splitlines() == [
        f"kubetrain: error: checkpoint_dir: cannot lock {tmp_path / 'ckpt' / '.lock'} "
        f"({os.strerror(errno.EIO)}); check the volume that holds it"
    ]


def test_a_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    ran = run_launcher(tmp_path, tmp_path / "file" / "ckpt", "bad", "true")
    assert ran.returncode != 0
    assert ran.stderr.splitlines() == [
        f"kubetrain: error: checkpoint_dir: cannot make or enter {tmp_path / 'file' / 'ckpt'} "
        "(Not a directory); give a folder this job can write"
    ]


# ------------------------------------------------------------------ through the emulated cluster


@pytest.fixture
def trainer_cluster(k8s, tmp_path, monkeypatch):
    """The emulated cluster with a fake Trainer that runs the node pods' commands (here the
    launcher) as local processes."""
    from tests.support.fake_trainer import FakeTrainer

    monkeypatch.setenv("KUBECONFIG", str(k8s.emulator.write_kubeconfig(tmp_path / "kubeconfig")))
    with FakeTrainer(k8s.emulator, tmp_path / "nodes") as trainer:
        yield k8s
    assert trainer.errors == []


def test_a_second_trainjob_on_the_folder_fails_its_wait_naming_the_lock(
    trainer_cluster, tmp_path, capsys, lock_reader
):
    """Two `kubetrain launch --backend trainer` jobs of a user's program given one
    --checkpoint-dir on the shared volume (which this step does not mount, so launch cannot
    look): the first's node 0 holds the lock, the second's stops, and its wait fails with the
    launcher's line."""
    from kubetrain.cli import main as kubetrain_main

    folder = tmp_path / "shared" / "checkpoints" / "ours"
    stop_file = tmp_path / "stop"
    sleeper = f"import os, time\nwhile not os.path.exists({str(stop_file)!r}): time.sleep(0.05)\n"
    for name in ("first", "second"):
        launched = kubetrain_main(
            ["launch", "--backend", "trainer", "--name", name, "--checkpoint-dir", str(folder),
             "--", sys.executable, "-c", sleeper]
        )  # fmt: skip
        assert launched == 0, capsys.readouterr().err
        deadline = time.monotonic() + 60
        while name == "first" and b'"job": "first"' not in _read(folder / ".lock"):
            assert time.monotonic() < deadline, "the first job's node 0 took no lock"
            time.sleep(0.05)
    capsys.readouterr()
    try:
        assert kubetrain_main(["wait", "--backend", "trainer", "second", "--timeout", "60"]) != 0
        shown = capsys.readouterr()
        refusal = [line for line in shown.out.splitlines() if "checkpoint_dir" in line]
        assert refusal == [
            f"kubetrain: error: checkpoint_dir: {folder} is being written by another job (its "
            f"lock {folder / '.lock'} is held by: {lock_reader(folder)}); give each job its own "
            "--checkpoint-dir, or wait until that job ends"
        ], shown.out
        assert "is held by: job first, " in refusal[0]
        assert shown.err.splitlines()[-1].startswith("kubetrain wait: error: job second failed")
    finally:
        stop_file.touch()
    assert kubetrain_main(["wait", "--backend", "trainer", "first", "--timeout", "60"]) == 0


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""
