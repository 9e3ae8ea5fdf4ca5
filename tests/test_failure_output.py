"""A failed job's output says each thing once: wait streams global rank 0's lines (another
rank's, where a tag says whose, stay in `kubetrain logs --all-ranks`), torchrun's
ChildFailedError traceback and report are folded to one line, and the failing rank's
traceback is shown once, then the one-line cause. Real torchrun processes, on the local
backend and through the emulated cluster (a fake Trainer runs the node pods)."""

from __future__ import annotations

import io
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubetrain.backends.torchrun_output import NodeLogView, TorchrunFolding, folded
from tests.support.processes import run_kubetrain as kubetrain

CRASH = """\
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"hello from rank {rank}", flush=True)
if rank == int(os.environ["FAIL_RANK"]):
    raise RuntimeError(f"boom on rank {rank}")
dist.all_reduce(torch.zeros(1))  # the others wait here until the failed rank's link closes
"""
#: What torchrun's boilerplate is made of (torch 2.13 errors/__init__.py, launcher/api.py).
BOILERPLATE = (
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError",
    "Root Cause (first observed failure):",
    "Failures:",
    "launcher/api.py",
    "bin/torchrun",
    "=" * 20,
)


def launch_crash(tmp_path: Path, nodes: int, procs: int, fail_rank: int, *torchrun: str) -> str:
    (tmp_path / "crash.py").write_text(CRASH)
    launched = kubetrain(
        "launch", "--backend", "local", "--nodes", str(nodes), "--procs-per-node", str(procs),
        "--env", f"FAIL_RANK={fail_rank}", "--", "torchrun", *torchrun, "crash.py",
        cwd=tmp_path,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    return launched.stdout.strip().splitlines()[-1]


def assert_no_boilerplate(text: str) -> None:
    for part in BOILERPLATE:
        assert part not in text, f"{part!r} shown:\n{text}"


@pytest.mark.parametrize(
    ("fail_rank", "tee"),
    [(1, False), (1, True), (0, False)],
    ids=["rank-1", "rank-1-tee", "rank-0"],
)
def test_wait_shows_the_failing_traceback_once_and_torchrun_report_folded(
    local_root, tmp_path, fail_rank, tee
):
    """One node, two processes: the failing rank's traceback appears once (streamed when it
    is rank 0's, after the stream when it is rank 1's), torchrun's boilerplate as one line,
    the cause last; rank 1's tagged lines (its traceback; with --tee every line) are not
    streamed, and `kubetrain logs --all-ranks` has them."""
    name = launch_crash(tmp_path, 1, 2, fail_rank, *(["--tee", "3"] if tee else []))
    waited = kubetrain("wait", "--backend", "local", name, "--timeout", "90", cwd=tmp_path)
    assert waited.returncode == 1, waited.stdout + waited.stderr
    shown = waited.stdout + waited.stderr
    tag = "[default1]:" if tee and fail_rank == 1 else ""
    exception = f"{tag}[rank{fail_rank}]: RuntimeError: boom on rank {fail_rank}"
    assert shown.splitlines().count(exception) == 1, shown
    assert shown.count("Traceback (most recent call last):") == 1 + fail_rank, (
        "the failing rank's, and rank 0's own (connection closed) when rank 1 failed"
    )
    assert_no_boilerplate(shown)
    folded_line = f"root cause: rank {fail_rank} (local rank {fail_rank}) exited with code 1"
    assert [line for line in shown.splitlines() if folded_line in line] == [
        f"torchrun: {tmp_path / 'crash.py'} FAILED; {folded_line} (ChildFailedError report "
        "folded; `kubetrain logs --raw` prints it)"
    ]
    assert not [line for line in waited.stdout.splitlines() if "rank1]:" in line]
    if tee:
        assert "[default0]:hello from rank 0" in waited.stdout
        assert "hello from rank 1" not in waited.stdout, "rank 1's print is tagged"
    error = waited.stderr.rstrip().splitlines()[-1]
    assert error.startswith("kubetrain wait: error: "), waited.stderr
    assert f"node 0 exited with code 1: [rank {fail_rank}] RuntimeError: boom" in error

    logs = kubetrain("logs", "--backend", "local", name, cwd=tmp_path)
    every_rank = kubetrain("logs", "--backend", "local", "--all-ranks", name, cwd=tmp_path)
    raw = kubetrain("logs", "--backend", "local", "--raw", name, cwd=tmp_path)
    assert logs.returncode == every_rank.returncode == raw.returncode == 0, logs.stderr
    rank_1 = "[rank1]: Traceback (most recent call last):"
    assert rank_1 not in logs.stdout and rank_1 in every_rank.stdout
    assert_no_boilerplate(every_rank.stdout)
    assert rank_1 in raw.stdout and "Root Cause (first observed failure):" in raw.stdout
    if tee:
        assert "[default1]:hello from rank 1" in every_rank.stdout
        assert "hello from rank 1" not in logs.stdout


def test_a_user_script_whose_rank_1_raises_on_node_1(local_root, tmp_path, capfd):
    """Two nodes, one process each, a plain torchrun script (not our trainer): wait streams
    node 0 (rank 0's gloo noise, its torchrun's folded report), then rank 1's traceback from
    node 1's log once (the old "last 20 lines" were torchrun's report, without it), then the
    cause. The KFP face prints the same, its cause as the CLI's `kubetrain wait: error:` line,
    which `kubetrain run` shows once, as the step's end, not also as a training line."""
    name = launch_crash(tmp_path, 2, 1, 1)
    waited = kubetrain("wait", "--backend", "local", name, "--timeout", "90", cwd=tmp_path)
    assert waited.returncode == 1, waited.stdout + waited.stderr
    shown = waited.stdout + waited.stderr
    assert shown.splitlines().count("[rank1]: RuntimeError: boom on rank 1") == 1, shown
    assert_no_boilerplate(shown)
    context = waited.stderr.splitlines()
    start = context.index("rank 1 failed on node 1:")
    assert context[start + 1] == "[rank1]: Traceback (most recent call last):"
    assert context[-1].startswith("kubetrain wait: error: job ")
    assert "node 1 exited with code 1: [rank 1] RuntimeError: boom on rank 1" in context[-1]
    assert context[start + 1 : -1] == [
        line for line in context[start + 1 : -1] if line.startswith("[rank1]: ")
    ], "the traceback alone, no report after it"

    from kubetrain.components.wait_trainjob.component import wait_trainjob

    with pytest.raises(SystemExit):
        wait_trainjob.python_func(job_name=name, backend="local")
    out, err = capfd.readouterr()
    assert (out + err).splitlines().count("[rank1]: RuntimeError: boom on rank 1") == 1
    assert_no_boilerplate(out + err)
    assert err.splitlines()[-1] == context[-1]

    from kubetrain.cli.run_output import RunOutput

    shown = io.StringIO()
    run = RunOutput(verbose=False, stream=shown, colour=False)
    run.step_started("wait-trainjob")
    for line in (out + err).splitlines():
        run.step_line(line)
    run.step_ended(succeeded=False)
    assert shown.getvalue().count("[rank 1] RuntimeError: boom on rank 1") == 1, shown.getvalue()
    assert "[rank1]: RuntimeError: boom on rank 1" in shown.getvalue()


# ------------------------------------------------------------------ the Kubernetes path


@pytest.fixture
def trainer_cluster(k8s, tmp_path, monkeypatch) -> Iterator:
    """The emulated cluster with a fake Trainer that runs the node pods as processes."""
    from tests.support.fake_trainer import FakeTrainer

    monkeypatch.setenv("KUBECONFIG", str(k8s.emulator.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with FakeTrainer(k8s.emulator, tmp_path / "nodes") as trainer:
        yield k8s
    assert trainer.errors == []


def test_a_cluster_wait_and_logs_read_pod_logs_the_same_way(trainer_cluster, tmp_path, capsys):
    """The TrainJob's node pod runs torchrun with two processes, rank 1 raises: the wait
    streams the pod's log through the same view (rank 1's lines out, the report folded),
    the error shows rank 1's traceback once; `kubetrain logs --all-ranks` has rank 1's."""
    from kubetrain.cli import main as kubetrain_main
    from kubetrain.components.launch_trainjob.launch import LaunchRequest, launch
    from kubetrain.components.wait_trainjob.wait import JobFailed, wait_for_job

    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    request = LaunchRequest(
        command=("torchrun", str(script)),
        name="crash",
        nodes=1,
        procs_per_node=2,
        env={"FAIL_RANK": "1"},
    )
    launch(request, backend="trainer")
    lines: list[str] = []
    with pytest.raises(JobFailed) as failed:
        wait_for_job("crash", backend="trainer", on_log_line=lines.append)
    assert not [line for line in lines if line.startswith("[rank1]:")], lines
    assert_no_boilerplate("\n".join(lines))
    assert any(line.startswith(f"torchrun: {script} FAILED; root cause: rank 1") for line in lines)
    context = failed.value.context_lines()
    assert context[0] == "rank 1 failed on node 0:"
    assert context[-1] == "[rank1]: RuntimeError: boom on rank 1"
    assert "[rank 1] RuntimeError: boom on rank 1" in str(failed.value)

    capsys.readouterr()
    assert kubetrain_main(["logs", "--backend", "trainer", "crash"]) == 0
    default = capsys.readouterr().out
    assert kubetrain_main(["logs", "--backend", "trainer", "--all-ranks", "crash"]) == 0
    every_rank = capsys.readouterr().out
    assert "[rank1]: RuntimeError: boom on rank 1" not in default
    assert "[rank1]: RuntimeError: boom on rank 1" in every_rank
    assert_no_boilerplate(default + every_rank)


# ------------------------------------------------------------------ the folding rule alone


REPORT = textwrap.dedent(
    """\
    torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
    ============================================================
    train.py FAILED
    ------------------------------------------------------------
    Failures:
      <NO_OTHER_FAILURES>
    ------------------------------------------------------------
    Root Cause (first observed failure):
    [0]:
      time      : 2026-11-27_18:58:14
      host      : localhost
      rank      : 3 (local_rank: 1)
      exitcode  : -9 (pid: 4661)
      error_file: <N/A>
      traceback : Signal 9 (SIGKILL) received by PID 4661
    ============================================================
    """
).splitlines()


def test_a_log_tail_that_begins_within_torchrun_traceback_is_folded_still():
    """A tail read from the end of a log (wait reads 400 lines) may begin after the first
    frames of torchrun's traceback: the ChildFailedError line alone starts the fold."""
    tail = ["    raise ChildFailedError(", *REPORT, "after"]
    assert folded(tail) == [
        "    raise ChildFailedError(",
        "torchrun: train.py FAILED; root cause: rank 3 (local rank 1) was killed by signal "
        "SIGKILL (ChildFailedError report folded; `kubetrain logs --raw` prints it)",
        "after",
    ]


def test_a_worker_untagged_traceback_passes_whole_and_a_cut_one_at_the_end():
    """An untagged traceback is held until its exception line: a worker's (one that failed
    before init_process_group) is passed on whole, one cut short by the end of the log too;
    a tagged line in between is not held up."""
    folding = TorchrunFolding()
    worker = ["Traceback (most recent call last):", '  File "t.py", line 1', "ValueError: x"]
    out = [kept for line in [worker[0], "[rank0]: hi", *worker[1:]] for kept in folding.feed(line)]
    assert out == ["[rank0]: hi", *worker]
    assert folding.feed(worker[0]) == [] and folding.feed(worker[1]) == []
    assert folding.flush() == worker[:2]


def test_rank_view_keeps_untagged_lines_and_global_rank_0():
    node_0, node_1 = NodeLogView(0), NodeLogView(1)
    for line in ("plain", "[rank0]: Traceback", "[default0]:[rank0]: x", "[default0]:hi"):
        assert node_0.feed(line) == [line]
    for line in ("[rank1]: Traceback", "[default1]:hi", "[default1]:[rank1]: x"):
        assert node_0.feed(line) == []
    assert node_1.feed("[default0]:hi") == [], "node 1's local rank 0 is not global rank 0"
    assert NodeLogView(0, all_ranks=True).feed("[rank1]: x") == ["[rank1]: x"]
