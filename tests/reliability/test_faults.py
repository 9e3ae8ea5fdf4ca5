"""Faults injected into real local jobs (real torchrun, real training): a SIGKILLed rank, a
restart after it, a cancelled wait, a disk full while collecting. Each test confirms its fault
struck, checks what the user is told, that nothing is left running and that the newest
checkpoint still verifies and loads (``injected``: tests.support.reliability_figures)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubetrain.artifacts.checkpoint import load_full_state_dict
from kubetrain.artifacts.checkpoint_manifest import latest_checkpoint
from kubetrain.backends.local.backend import LocalBackend
from tests.support.processes import (
    alive,
    descendants,
    kill,
    supervisor_pid,
    wait_for_descendants,
)
from tests.support.tiny_filesystem import (
    run_python_on_tiny_filesystem,
    tiny_filesystem_available,
)

EPOCH_LINE = re.compile(r"^epoch (\d+)/(\d+) .*test_accuracy ([0-9.]+)")
RESUMED_LINE = re.compile(r"resumed epoch (\d+) at world size")


def kubetrain(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubetrain", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def start_wait(name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kubetrain", "wait", name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def launch_training(data: Path, checkpoints: Path, epochs: int, *extra: str) -> str:
    launched = kubetrain(
        "launch",
        "--nodes",
        "2",
        "--data",
        str(data),
        "--checkpoint-dir",
        str(checkpoints),
        "--epochs",
        str(epochs),
        *extra,
    )
    assert launched.returncode == 0, launched.stderr
    return launched.stdout.strip().splitlines()[-1]


def job_processes(local_root: Path, name: str, workers_per_node: int = 1) -> dict[str, list[int]]:
    """The supervisor, each node's torchrun and its workers, once all have started."""
    supervisor = supervisor_pid(local_root / name)
    wait_for_descendants(supervisor, 2 * (1 + workers_per_node), timeout=60)
    nodes = LocalBackend().status(name).nodes
    return {
        "supervisor": [supervisor],
        "nodes": [node.pid for node in nodes],
        "workers-1": wait_for_descendants(nodes[1].pid, workers_per_node, timeout=60),
        "all": [supervisor, *descendants(supervisor)],
    }


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(0.05)


def rank0_log(local_root: Path, name: str) -> str:
    return (local_root / name / "node-0.log").read_text()


def newest_checkpoint_loads(checkpoints: Path) -> None:
    """The newest complete checkpoint verifies (every sha256) and its model loads."""
    latest = latest_checkpoint(checkpoints)
    assert latest is not None, f"no complete checkpoint in {checkpoints}"
    assert load_full_state_dict(latest, verify=True)


def checkpointed_epoch(checkpoints: Path) -> int:
    latest = latest_checkpoint(checkpoints)
    return int(Path(latest).name.split("-")[1]) if latest else 0


@pytest.mark.fault
def test_a_sigkilled_rank_fails_wait_within_10s_naming_node_and_signal(
    local_root: Path, digits_dir: Path, tmp_path: Path, figures, injected
) -> None:
    name = launch_training(digits_dir, tmp_path / "ckpt", 500)
    processes = job_processes(local_root, name)
    wait_until(lambda: checkpointed_epoch(tmp_path / "ckpt") >= 1, 60, "first checkpoint")
    waiter = start_wait(name)

    killed_at = kill(processes["workers-1"][0], signal.SIGKILL)
    wait_until(lambda: not alive(processes["workers-1"][:1]), 5, "the worker to die")
    injected.struck("rank 1's worker died of SIGKILL")
    _, stderr = waiter.communicate(timeout=60)
    failed_after = time.monotonic() - killed_at

    assert waiter.returncode == 1, stderr
    assert failed_after < 10, f"wait took {failed_after:.1f}s to report the failure"
    first_line = stderr.strip().splitlines()[-1]  # the cause, after the node's last lines
    assert "node 1 exited with code 1" in first_line, stderr
    assert "rank 1 (local rank 0) was killed by signal SIGKILL" in first_line, stderr
    wait_until(lambda: not alive(processes["all"]), 5, f"processes left: {alive(processes['all'])}")
    injected.data_intact("newest checkpoint", lambda: newest_checkpoint_loads(tmp_path / "ckpt"))
    figures.record("SIGKILLed rank: wait failed after (s)", round(failed_after, 2))


@pytest.mark.fault
def test_a_killed_rank_restarts_and_resumes_from_the_newest_checkpoint(
    local_root: Path, digits_dir: Path, tmp_path: Path, figures, injected
) -> None:
    epochs = 8
    baseline = launch_training(digits_dir, tmp_path / "baseline", epochs)
    restarted = launch_training(digits_dir, tmp_path / "ckpt", epochs, "--max-restarts", "1")
    processes = job_processes(local_root, restarted)
    wait_until(lambda: checkpointed_epoch(tmp_path / "ckpt") >= 3, 120, "epoch 3 checkpoint")
    newest_at_kill = checkpointed_epoch(tmp_path / "ckpt")
    kill(processes["workers-1"][0], signal.SIGKILL)

    for name in (restarted, baseline):
        waited = kubetrain("wait", "--quiet", name, timeout=300)
        assert waited.returncode == 0, waited.stderr

    log = rank0_log(local_root, restarted)
    assert "failed (exitcode: -9)" in (local_root / restarted / "node-1.log").read_text()
    injected.struck("rank 1's worker died of SIGKILL (torchrun saw exitcode -9)")
    resumed = [int(m.group(1)) for m in RESUMED_LINE.finditer(log)]
    assert len(resumed) == 1, log
    assert newest_at_kill <= resumed[0] < epochs  # the newest checkpoint at (or after) the kill
    after_restart = log[log.index("resumed epoch") :]
    epochs_after = [int(m.group(1)) for m in map(EPOCH_LINE.match, after_restart.splitlines()) if m]
    assert epochs_after == list(range(resumed[0] + 1, epochs + 1)), "no epoch redone or skipped"

    def final_accuracy(name: str) -> float:
        lines = [m for m in map(EPOCH_LINE.match, rank0_log(local_root, name).splitlines()) if m]
        assert int(lines[-1].group(1)) == epochs
        return float(lines[-1].group(3))

    difference = final_accuracy(restarted) - final_accuracy(baseline)
    assert abs(difference) <= 0.01
    injected.data_intact("newest checkpoint", lambda: newest_checkpoint_loads(tmp_path / "ckpt"))
    figures.record(
        "restart after a SIGKILLed rank",
        f"killed after epoch {newest_at_kill}, resumed from epoch {resumed[0]}, epochs redone 0, "
        f"accuracy {final_accuracy(restarted):.4f} vs {final_accuracy(baseline):.4f} uninterrupted",
    )


@pytest.mark.fault
def test_sigterm_to_a_local_wait_stops_every_process_within_5s(
    local_root: Path, digits_dir: Path, tmp_path: Path, figures, injected
) -> None:
    name = launch_training(digits_dir, tmp_path / "ckpt", 500)
    processes = job_processes(local_root, name)
    waiter = start_wait(name)
    wait_until(lambda: checkpointed_epoch(tmp_path / "ckpt") >= 1, 60, "first checkpoint")

    sent_at = kill(waiter.pid, signal.SIGTERM)
    wait_until(lambda: not alive(processes["all"]), 30, "every process of the job to end")
    gone_after = time.monotonic() - sent_at
    _, stderr = waiter.communicate(timeout=30)

    assert waiter.returncode == 128 + signal.SIGTERM, stderr
    injected.struck("wait received SIGTERM and exited 143")
    assert gone_after <= 5, f"the job's processes ran {gone_after:.2f}s after the SIGTERM"
    assert "cancelled by SIGTERM; stopped its processes" in stderr
    assert LocalBackend().status(name).state == "Failed"
    injected.data_intact("newest checkpoint", lambda: newest_checkpoint_loads(tmp_path / "ckpt"))
    figures.record("SIGTERM to a local wait: every process gone after (s)", round(gone_after, 2))


def test_four_pipeline_runs_at_once_share_nothing_by_accident(
    local_root: Path, tmp_path: Path, figures
) -> None:
    """Four `kubetrain run` on one machine, one output folder and one local job root: each
    gets its own run folder, job, free port and model (the jobs kept, to be looked at). One
    node each: a one-node torchrun still serves its rendezvous on the job's port."""
    output = tmp_path / "runs"
    command = [sys.executable, "-m", "kubetrain", "run", "--output", str(output), "--nodes", "1"]
    runs = [
        subprocess.Popen(
            [*command, "--epochs", "1", "--threshold", "0.5", "--seed", str(seed), "--keep-job"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for seed in range(4)
    ]
    started = time.monotonic()
    results = [run.communicate(timeout=600) for run in runs]
    figures.record("4 concurrent `kubetrain run`: all done after (s)",
                   round(time.monotonic() - started, 1))  # fmt: skip

    for run, (stdout, stderr) in zip(runs, results, strict=True):
        assert run.returncode == 0, stdout[-2000:] + stderr[-2000:]
    models = {re.search(r"^model\s+(\S+)", out, re.MULTILINE).group(1) for out, _ in results}
    assert len(models) == 4 and all((Path(m) / "model.safetensors").is_file() for m in models)
    jobs = sorted(local_root.iterdir())
    assert len(jobs) == 4
    for job in jobs:
        assert LocalBackend().status(job.name).state == "Complete"
        assert "training complete" in (job / "node-0.log").read_text()
    runs_dirs = {d.name for d in output.iterdir() if d.is_dir() and d.name != "registry"}
    assert len(runs_dirs) == 4
    # each run promoted its own version into the shared registry, none overwrote another's
    assert len([v for v in (output / "registry").iterdir() if v.is_dir()]) == 4


@pytest.mark.fault
def test_no_space_left_while_collecting_is_a_clear_error_and_publishes_nothing(
    trained_checkpoints: dict[str, Path], tmp_path: Path, injected
) -> None:
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    if not tiny_filesystem_available(mount_point):
        pytest.skip("cannot mount a tmpfs in a user namespace here (unshare -Urm)")
    ckpt = trained_checkpoints["ddp"]
    model_bytes = (Path(latest_checkpoint(ckpt)) / "model.safetensors").stat().st_size
    listing = "import os, sys; print(sorted(os.listdir(sys.argv[1])))"
    collect = [
        "-c",
        "import subprocess, sys; "
        "code = subprocess.run([sys.executable, '-m', 'kubetrain', *sys.argv[1:-1]]).returncode; "
        f"subprocess.run([sys.executable, '-c', {listing!r}, sys.argv[-1]]); sys.exit(code)",
        "collect",
        "--checkpoint-dir",
        str(ckpt),
        "--output",
        str(mount_point / "model"),
        str(mount_point),
    ]
    run = run_python_on_tiny_filesystem(mount_point, f"{model_bytes // 2}", collect)

    assert run.returncode != 0
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr
    assert "no space left" in lines[0].lower() and "nothing was published" in lines[0], lines[0]
    injected.struck("the filesystem ran out of space mid-copy")
    assert run.stdout.strip().splitlines()[-1] == "[]", "no model folder, no staging debris"
    injected.data_intact("the collected checkpoint", lambda: newest_checkpoint_loads(ckpt))
