"""Elastic jobs on the local backend (issue 30, item 2): `--nodes MIN:MAX` runs one torchrun per
node in a c10d rendezvous with the env a PyTorchJob's elasticPolicy gives its Workers; a node
that dies is lost, not a failed job, and is started again to rejoin, within --max-restarts;
the job fails when fewer than MIN nodes remain, and succeeds when the nodes left finish."""

from __future__ import annotations

import io
import json
import re
import signal
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from kubetrain.artifacts.checkpoint_manifest import (
    checkpoint_name,
    is_complete,
    latest_name,
    verify_checkpoint,
)
from kubetrain.backends.base import COMPLETE, FAILED, JobRow
from kubetrain.backends.local.backend import MAX_PROCESSES_ENV, LocalBackend
from kubetrain.backends.local.listing import list_local_jobs
from kubetrain.backends.local.processes import JOB_ID_ENV, marked_processes
from kubetrain.cli.jobs import job_table
from kubetrain.components._shared.progress_display import LIVE, PLAIN, ProgressDisplay
from kubetrain.errors import InvalidInput
from kubetrain.jobspec import TrainJobSpec
from kubetrain.progress import Progress, format_record, parse_membership
from tests.support.processes import kubetrain_in_process

#: A node's script learns whether it is node 0 from the rendezvous host flag it is given.
IS_NODE_0 = "'is_host=1' in os.environ['PET_RDZV_CONF']"


def write_script(folder: Path, body: str) -> Path:
    path = folder / "node.py"
    path.write_text(textwrap.dedent(body))
    return path


def notices(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("kubetrain: node")]


def test_each_node_gets_the_elastic_env_of_a_pytorchjob_worker(local_root, tmp_path, capsys):
    """elastic.go's PET_* (NNODES MIN:MAX, c10d, the endpoint, MAX_RESTARTS), the job's name
    as the rendezvous id, node 0 alone hosting the store, torch's shared-store opt-out; no
    PET_NODE_RANK or PET_MASTER_* (c10d ranks the nodes itself)."""
    script = (
        "import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
        "if k.startswith(('PET_', 'TORCH_DISABLE'))}))"
    )
    spec = TrainJobSpec(
        name="elastic-env",
        command=("python", "-c", script),
        num_nodes=2,
        min_nodes=1,
        procs_per_node=3,
        max_restarts=2,
    )
    backend = LocalBackend()
    backend.launch(spec)
    status = backend.wait("elastic-env", timeout=60)
    assert (status.state, status.message) == (COMPLETE, "2 of 1..2 nodes exited with code 0")
    assert status.membership == "2 of 1..2 nodes"
    seen = [json.loads(next(backend.logs("elastic-env", node=rank))) for rank in range(2)]
    endpoints = {env.pop("PET_RDZV_ENDPOINT") for env in seen}
    assert len(endpoints) == 1 and re.fullmatch(r"127\.0\.0\.1:\d+", endpoints.pop())
    confs = [dict(kv.split("=") for kv in env.pop("PET_RDZV_CONF").split(",")) for env in seen]
    assert [conf.pop("is_host") for conf in confs] == ["1", "0"]
    assert confs[0] == confs[1] and set(confs[0]) == {
        "last_call_timeout",
        "keep_alive_interval",
        "keep_alive_max_attempt",
    }
    for env in seen:
        assert env == {
            "PET_NNODES": "1:2",
            "PET_NPROC_PER_NODE": "3",
            "PET_RDZV_BACKEND": "c10d",
            "PET_RDZV_ID": "elastic-env",
            "PET_MAX_RESTARTS": "2",
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        }


def test_a_lost_node_is_started_again_then_left_out_and_the_others_complete(
    local_root, tmp_path, capsys
):
    """Node 1 fails at every start: it is started again once (--max-restarts 1), then the job
    goes on with node 0 (MIN 1), which completes it: the job is Complete (the operator's
    elastic rule: a Worker succeeded)."""
    node_0_log = local_root / "lossy" / "node-0.log"
    write_script(
        tmp_path,
        f"""
        import os, sys, time
        if not {IS_NODE_0}:
            sys.exit(3)
        deadline = time.monotonic() + 30
        while "no restarts left" not in open({str(node_0_log)!r}).read():
            assert time.monotonic() < deadline, "node 1 was not given up"
            time.sleep(0.05)
        print("node 0 finished", flush=True)
    """,
    )
    launched = kubetrain_in_process(
        ["launch", "--nodes", "1:2", "--max-restarts", "1", "--name", "lossy", "--", "python",
         str(tmp_path / "node.py")],
        capsys,
    )  # fmt: skip
    assert launched[0] == 0, launched
    code, out, err = kubetrain_in_process(["wait", "lossy", "--timeout", "60"], capsys)
    assert code == 0, out + err
    assert notices(out) == [
        "kubetrain: node 1 lost (exit code 3); continuing with 1 of 1..2 nodes; starting it "
        "again to rejoin (restart 1 of 1)",
        # no torchrun: no rendezvous to wait for, so it is back as it starts
        "kubetrain: node 1 rejoined; 2 of 1..2 nodes",
        "kubetrain: node 1 lost (exit code 3); continuing with 1 of 1..2 nodes (no restarts left)",
    ]
    assert "node 0 finished" in out
    assert out.splitlines()[-1].startswith("job lossy Complete after ")
    assert out.splitlines()[-1].endswith("s (1 of 1..2 nodes)")
    status = LocalBackend().status("lossy")
    assert status.message == "1 of 1..2 nodes exited with code 0, 1 restart(s) of lost nodes"
    assert [node.exit_code for node in status.nodes] == [0, 3]
    assert job_table(list_local_jobs(), io.StringIO()).splitlines()[1].split()[-1] == "1..2"


def test_a_node_still_rejoining_when_the_job_finishes_is_stopped(local_root, tmp_path, capsys):
    """Node 1 is started again after its loss but has not rejoined (its program, named torchrun,
    started no workers: its rendezvous never completed) when node 0 exits 0: it has nothing
    left to join, so it is stopped, and the job is Complete at once instead of waiting on it."""
    node_0_log, marker = local_root / "late" / "node-0.log", tmp_path / "failed-once"
    write_script(
        tmp_path,
        f"""
        import os, pathlib, sys, time
        if not {IS_NODE_0}:
            if not pathlib.Path({str(marker)!r}).exists():
                pathlib.Path({str(marker)!r}).touch()
                sys.exit(3)
            time.sleep(60)
        while "starting it again" not in open({str(node_0_log)!r}).read():
            time.sleep(0.05)
    """,
    )
    fake_torchrun = tmp_path / "torchrun"
    fake_torchrun.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp_path / 'node.py'}\n")
    fake_torchrun.chmod(0o755)
    spec = replace(one_to_two_nodes("late", tmp_path), command=(str(fake_torchrun),))
    backend = LocalBackend()
    backend.launch(spec)
    started = time.monotonic()
    status = backend.wait("late", timeout=60)
    assert time.monotonic() - started < 30, "node 1 was waited on"
    assert status.state == COMPLETE
    assert notices(node_0_log.read_text())[-1] == (
        "kubetrain: node 1 stopped: the job finished before it rejoined"
    )
    assert [node.exit_code for node in status.nodes] == [0, -signal.SIGTERM]


def test_a_node_lost_below_min_fails_the_job_with_the_reason(local_root, tmp_path, capsys):
    """MIN 2: node 1's first loss is recovered (started again), its second leaves 1 node,
    fewer than MIN, with no restart left: the job fails at once, with the lost node's code,
    and node 0 is stopped."""
    write_script(
        tmp_path,
        f"""
        import os, sys, time
        if not {IS_NODE_0}:
            sys.exit(3)
        time.sleep(60)
    """,
    )
    started = time.monotonic()
    assert kubetrain_in_process(
        ["launch", "--nodes", "2:2", "--max-restarts", "1", "--name", "short", "--", "python",
         str(tmp_path / "node.py")],
        capsys,
    )[0] == 0  # fmt: skip
    code, out, err = kubetrain_in_process(["wait", "short", "--timeout", "60"], capsys)
    assert time.monotonic() - started < 30, "node 0 was left to sleep"
    assert code == 3, out + err
    reason = (
        "node 1 lost (exit code 3): 1 of 2..2 nodes left, fewer than MIN 2; no restarts left "
        "(1 of 1 used)"
    )
    assert f"job short failed (NodeLost): {reason}" in err
    assert notices(out) == [
        "kubetrain: node 1 lost (exit code 3); 1 of 2..2 nodes left, fewer than MIN 2; "
        "starting it again to rejoin (restart 1 of 1)",
        "kubetrain: node 1 rejoined; 2 of 2..2 nodes",
        f"kubetrain: {reason}",
    ]
    status = LocalBackend().status("short")
    assert (status.state, status.failed_rank, status.membership) == (
        FAILED,
        1,
        "1 of 2..2 nodes",
    )


def test_deleting_an_elastic_job_stops_every_node(local_root, tmp_path):
    write_script(tmp_path, "import time; time.sleep(60)")
    spec = one_to_two_nodes("doomed", tmp_path)
    backend = LocalBackend()
    backend.launch(spec)
    job_id = json.loads((local_root / "doomed" / "job.json").read_text())["id"]
    deadline = time.monotonic() + 60
    while len(job_processes(job_id)) < 3:  # the supervisor and 2 nodes
        assert time.monotonic() < deadline, job_processes(job_id)
        time.sleep(0.05)
    backend.delete("doomed")
    assert job_processes(job_id) == [] and not (local_root / "doomed").exists()


def one_to_two_nodes(name: str, tmp_path: Path) -> TrainJobSpec:
    """A 1:2 job of ``tmp_path/node.py`` (``write_script``), one restart."""
    return TrainJobSpec(
        name=name,
        command=("python", str(tmp_path / "node.py")),
        num_nodes=2,
        min_nodes=1,
        max_restarts=1,
    )


def job_processes(job_id: str) -> list[psutil.Process]:
    return marked_processes(JOB_ID_ENV, job_id)


def test_an_elastic_job_over_the_process_cap_names_its_max(local_root, monkeypatch):
    monkeypatch.setenv(MAX_PROCESSES_ENV, "4")
    spec = TrainJobSpec(
        name="big", command=("python", "-V"), num_nodes=5, min_nodes=1, max_restarts=3
    )
    with pytest.raises(InvalidInput, match=r"MAX 5 of 1:5 node\(s\) x 1 process\(es\) = 5"):
        LocalBackend().check_launch(spec)
    assert not local_root.exists()


def test_membership_notices_are_read_and_kept_on_the_live_bar():
    line = "kubetrain: node 1 lost (killed by SIGKILL); continuing with 1 of 1..2 nodes"
    assert parse_membership(line) == "1 of 1..2 nodes"
    assert parse_membership("kubetrain: node 1 rejoined; 2 of 1..2 nodes") == "2 of 1..2 nodes"
    assert parse_membership("my program: 1 of 1..2 nodes") is None  # not a notice
    assert parse_membership("kubetrain: restart 1 of 3") is None

    record = format_record(Progress(2, 3, 10, 90, 100, 0.5, 1000.0, 4.0))

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    with ProgressDisplay(screen, LIVE) as display:
        display.feed(record)
        display.feed(line)
        assert display.membership == "1 of 1..2 nodes"
        display.feed(record)
    assert line in screen.getvalue()
    assert "1 of 1..2 nodes" in screen.getvalue().replace(line, "")  # on the bar too
    plain = io.StringIO()
    with ProgressDisplay(plain, PLAIN) as display:
        display.feed(line)
    assert plain.getvalue() == line + "\n"


def test_list_shows_an_elastic_jobs_range():
    rows = [JobRow("a", "Running", 5, "1 of 1..2"), JobRow("b", "Complete", 5, 2)]
    table = job_table(rows, io.StringIO()).splitlines()
    assert table[1].split()[-3:] == ["1", "of", "1..2"] and table[2].split()[-1] == "2"


# ------------------------------------------------------------- the DONE-WHEN run: our trainer
def kill_tree(pid: int) -> list[int]:
    """SIGKILL a node's torchrun and its workers (in sessions of their own): a lost node."""
    node = psutil.Process(pid)
    tree = [node, *node.children(recursive=True)]
    for proc in tree:
        proc.kill()
    return [proc.pid for proc in tree]


def test_a_trainer_job_that_loses_node_1_mid_epoch_completes_with_every_checkpoint(
    local_root, tmp_path, digits_dir, capsys
):
    """`--nodes 1:2 --max-restarts 3`: node 1's whole process tree is SIGKILLed in epoch 2
    (epoch 1's checkpoint written); node 0 goes on, node 1 is started again and rejoins
    (which needs ``jobspec.ELASTIC_NODE_ENV``: without it the rejoining node waits for the
    store address node 0 never publishes again, and node 0 fails with DistStoreError), the
    trainer resumes from epoch 1, and the job completes: every epoch's checkpoint verifies,
    and the collected model scores >= 0.95 with `kubetrain evaluate`."""
    checkpoints = tmp_path / "checkpoints"
    launched = kubetrain_in_process(
        ["launch", "--backend", "local", "--nodes", "1:2", "--max-restarts", "3", "--name",
         "elastic", "--", "torchrun", "-m", "kubetrain.train", "--data", str(digits_dir),
         "--epochs", "3", "--batch-size", "2", "--keep-checkpoints", "0",
         "--checkpoint-dir", str(checkpoints)],
        capsys,
    )  # fmt: skip
    assert launched[0] == 0, launched
    backend = LocalBackend()
    deadline = time.monotonic() + 60
    while not is_complete(checkpoints / checkpoint_name(1)):
        assert time.monotonic() < deadline and not backend.status("elastic").finished
        time.sleep(0.02)
    kill_tree(backend.status("elastic").nodes[1].pid)
    while "node 1 lost" not in (local_root / "elastic" / "node-0.log").read_text():
        time.sleep(0.02)
    running = job_table(list_local_jobs(), io.StringIO()).splitlines()[1]
    assert re.search(r"Running .* [012] of 1\.\.2$", running), running

    code, out, err = kubetrain_in_process(["wait", "elastic", "--timeout", "120"], capsys)
    assert code == 0, out + err
    assert notices(out)[:2] == [
        "kubetrain: node 1 lost (killed by SIGKILL); continuing with 1 of 1..2 nodes; starting "
        "it again to rejoin (restart 1 of 3)",
        "kubetrain: node 1 rejoined; 2 of 1..2 nodes",
    ], out
    # Killed before epoch 2's checkpoint: the trainer went on from epoch 1's.
    assert re.search(r"^resumed epoch 1 at world size [12]\b", out, re.MULTILINE), out
    assert out.splitlines()[-1].endswith("s (2 of 1..2 nodes)")
    assert latest_name(checkpoints) == checkpoint_name(3)
    for epoch in (1, 2, 3):
        verify_checkpoint(checkpoints / checkpoint_name(epoch))

    model = tmp_path / "model"
    collected = kubetrain_in_process(
        ["collect", "--checkpoint-dir", str(checkpoints), "--output", str(model), "--export",
         "none"],
        capsys,
    )  # fmt: skip
    assert collected[0] == 0, collected
    metrics = tmp_path / "metrics.json"
    code, out, err = kubetrain_in_process(
        ["evaluate", "--model", model, "--data", digits_dir, "--threshold", "0.95",
         "--metrics-output", metrics],
        capsys,
    )  # fmt: skip
    assert code == 0, out + err  # 3 below the threshold
    assert json.loads(metrics.read_text())["accuracy"] >= 0.95
