"""A failed job's error names the rank that failed first and its exception, found in the
failing node's log (torchrun's report, the rank's ``[rankN]:`` traceback), not the "connection
closed by peer" of the ranks that failed because of it.

The captured output below is torch 2.13's: the report is ``ChildFailedError.format_msg``
(``torch/distributed/elastic/multiprocessing/errors/__init__.py``), the ``[rankN]:`` prefix
the excepthook ``init_process_group`` installs (``torch/distributed/distributed_c10d.py``).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from kubetrain.backends.base import FAILED, JobStatus, NodeStatus
from kubetrain.backends.local.supervisor import name_failing_rank
from kubetrain.backends.torchrun_report import (
    RankFailure,
    first_failure,
    rank_traceback,
    root_cause,
    torchrun_failure,
)
from tests.support import objects
from tests.test_kubernetes_backend import make_spec, node_pod, set_container

GLOO_PEER_CLOSED = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
    "Connection closed by peer [127.0.0.1]:23959. This is typically caused by a remote worker "
    "crashing. Check the logs of the remote worker before reporting an error. GLHF!"
)


def report(rank: int, local_rank: int, exitcode: str, traceback: str, time: str) -> str:
    """torchrun's report (``_MSG_FORMAT_TEMPLATE``), with one other failure: local rank 1
    stopped by torchrun's SIGTERM."""
    return textwrap.dedent(
        """\
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
        ============================================================
        /tmp/crash.py FAILED
        ------------------------------------------------------------
        Failures:
        [1]:
          time      : {time}
          host      : localhost
          rank      : {other} (local_rank: 1)
          exitcode  : -15 (pid: 6373)  (SIGTERM)
          error_file: <N/A>
          traceback : Signal 15 (SIGTERM) received by PID 6373
        ------------------------------------------------------------
        Root Cause (first observed failure):
        [0]:
          time      : {time}
          host      : localhost
          rank      : {rank} (local_rank: {local_rank})
          exitcode  : {exitcode} (pid: 6371)
          error_file: {error_file}
          traceback : {traceback}
        ============================================================
        """
    ).format(
        time=time,
        other=rank + 1,
        rank=rank,
        local_rank=local_rank,
        exitcode=exitcode,
        error_file="<N/A>" if traceback.startswith("To enable") else "/tmp/t/0/error.json",
        traceback=traceback,
    )


NO_ERROR_FILE = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
TORCHRUN_OWN_TRACEBACK = """\
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
"""  # noqa: E501


def node_1_plain() -> list[str]:
    """Node 1 of a 2x2 job whose rank 2 raised without ``@record``: the exception is only in
    the log, with the ``[rank2]:`` prefix; rank 3, stopped, printed the peer's noise."""
    log = (
        textwrap.dedent(
            f"""\
            [rank2]: Traceback (most recent call last):
            [rank2]:   File "/tmp/crash.py", line 6, in <module>
            [rank2]:     raise RuntimeError("boom on rank 2")
            [rank2]: RuntimeError: boom on rank 2
            [rank3]: Traceback (most recent call last):
            [rank3]:   File "/tmp/crash.py", line 7, in <module>
            [rank3]:     dist.all_reduce(torch.zeros(1))
            [rank3]: {GLOO_PEER_CLOSED}
            W1125 06:08:36.772000 6334 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 6373 closing signal SIGTERM
            """  # noqa: E501
        )
        + TORCHRUN_OWN_TRACEBACK
        + report(2, 0, "1", NO_ERROR_FILE, "2026-11-25_06:08:36")
    )
    return log.splitlines()


def node_0_peer_closed(time: str = "2026-11-25_06:08:36") -> list[str]:
    """Node 0 of the same job: its ranks failed because rank 2's connection closed."""
    log = (
        f"[rank1]: Traceback (most recent call last):\n"
        f'[rank1]:   File "/tmp/crash.py", line 7, in <module>\n'
        f"[rank1]: {GLOO_PEER_CLOSED}\n"
        + TORCHRUN_OWN_TRACEBACK
        + report(1, 1, "1", NO_ERROR_FILE, time).replace("rank      : 2 (", "rank      : 0 (")
    )
    return log.splitlines()


def test_plain_traceback_form_names_the_rank_and_its_prefixed_exception():
    failure = torchrun_failure(node_1_plain())
    assert failure == RankFailure(2, 0, 1, "2026-11-25_06:08:36", "RuntimeError: boom on rank 2")
    assert failure.describe() == "[rank 2] RuntimeError: boom on rank 2"
    assert root_cause(node_1_plain()) == "rank 2 (local rank 0) exited with code 1"


def test_report_with_an_error_file_gives_the_exception_of_its_traceback():
    """With ``@record`` the report carries the worker's traceback, indented two more (torch
    2.13 ``_format_failure``), and nothing else in the log is needed."""
    traceback = textwrap.dedent(
        """\
        Traceback (most recent call last):
            File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367, in wrapper
              return f(*args, **kwargs)
            File "/tmp/crash_rec.py", line 9, in main
              raise RuntimeError("boom on rank 2")
          RuntimeError: boom on rank 2
          """  # noqa: E501
    ).rstrip("\n")
    lines = report(2, 0, "1", traceback, "2026-11-25_06:09:28").splitlines()
    assert torchrun_failure(lines).describe() == "[rank 2] RuntimeError: boom on rank 2"


def test_one_line_error_file_and_signals_are_named_as_they_are():
    ours = "kubetrain.train: error: --data: no dataset at /data (give a prepared dataset)"
    assert torchrun_failure(report(1, 0, "1", ours, "t").splitlines()).describe() == (
        f"[rank 1] {ours}"
    )
    killed = report(1, 0, "-9", "Signal 9 (SIGKILL) received by PID 7", "t").splitlines()
    assert torchrun_failure(killed).describe() == "[rank 1] was killed by signal SIGKILL"
    assert torchrun_failure(["no report here"]) is None


def test_a_worker_that_failed_before_joining_the_group_is_found_in_plain_traceback_lines():
    """No ``[rankN]:`` prefix before ``init_process_group``; torchrun's own traceback (its
    ChildFailedError) is never taken for the worker's."""
    worker = textwrap.dedent(
        """\
        Traceback (most recent call last):
          File "/tmp/train.py", line 1, in <module>
            import missing_module
        ModuleNotFoundError: No module named 'missing_module'
        """
    )
    log = worker + TORCHRUN_OWN_TRACEBACK + report(0, 0, "1", NO_ERROR_FILE, "t")
    assert torchrun_failure(log.splitlines()).describe() == (
        "[rank 0] ModuleNotFoundError: No module named 'missing_module'"
    )


def test_the_failing_rank_traceback_is_taken_whole_with_tee_and_chained():
    """``rank_traceback``: the rank the report names, under torchrun ``--tee`` among its
    local rank's lines (``[default0]:[rank2]: ...``), a chained exception from its first
    traceback; untagged, the worker's and never torchrun's own."""
    chained = [
        "Traceback (most recent call last):",
        '  File "/tmp/crash.py", line 6, in <module>',
        "KeyError: 'lr'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "/tmp/crash.py", line 8, in <module>',
        "RuntimeError: boom on rank 2",
    ]
    tee = [f"[default0]:[rank2]: {line}" if line else "[default0]:" for line in chained]
    log = [*tee, "[default1]:[rank3]: RuntimeError: peer", *TORCHRUN_OWN_TRACEBACK.splitlines()]
    log += report(2, 0, "1", NO_ERROR_FILE, "t").splitlines()
    assert rank_traceback(log) == [line for line in tee if line != "[default0]:"]
    assert torchrun_failure(log).describe() == "[rank 2] RuntimeError: boom on rank 2"
    untagged = [*chained, *TORCHRUN_OWN_TRACEBACK.splitlines()]
    untagged += report(2, 0, "1", NO_ERROR_FILE, "t").splitlines()
    assert rank_traceback(untagged) == chained
    killed = TORCHRUN_OWN_TRACEBACK + report(2, 0, "-9", "Signal 9 (SIGKILL)", "t")
    assert rank_traceback(killed.splitlines()) == []


def test_the_rank_that_failed_by_itself_is_chosen_over_the_peers_it_took_down():
    """Node 0's report (rank 1, connection closed by peer) is as early as node 1's, and node
    0 may well exit first: the cause is rank 2's own exception."""
    node, failure = first_failure({0: node_0_peer_closed(), 1: node_1_plain()})
    assert (node, failure.describe()) == (1, "[rank 2] RuntimeError: boom on rank 2")
    # A node stopped before its torchrun could report still names its rank's exception.
    no_report = [line for line in node_1_plain() if line.startswith("[rank")]
    node, failure = first_failure({0: node_0_peer_closed(), 1: no_report})
    assert (node, failure.describe()) == (1, "[rank 2] RuntimeError: boom on rank 2")
    # Only the peers' noise: that is what there is to say.
    node, failure = first_failure({0: node_0_peer_closed()})
    assert (node, failure.rank, failure.consequence) == (0, 1, True)


def test_a_node_stopped_after_its_own_rank_failed_exits_1_not_with_our_sigterm(tmp_path):
    """Node 0 exited first on a peer's going away; the supervisor then stopped node 1 with
    SIGTERM, but node 1's rank 2 had failed by itself: the job fails with torchrun's code 1
    (wait's exit code), not 143 for a signal we sent."""
    (tmp_path / "node-0.log").write_text("\n".join(node_0_peer_closed()) + "\n")
    (tmp_path / "node-1.log").write_text("\n".join(node_1_plain()) + "\n")
    nodes = [NodeStatus(rank=0, exit_code=1), NodeStatus(rank=1, exit_code=-signal.SIGTERM)]
    status = JobStatus(name="job", state=FAILED, nodes=nodes, failed_rank=0)

    message = name_failing_rank(tmp_path, status, [0, 0])

    assert message == "node 1 exited with code 1: [rank 2] RuntimeError: boom on rank 2"
    assert (status.failed_rank, status.failed_node.exit_code) == (1, 1)


def test_the_local_job_fails_on_the_node_whose_rank_failed_first_in_this_attempt(tmp_path):
    """Node 0 exited first (the supervisor's pick), but node 1's rank 2 failed first; a report
    left in a node's log by an earlier attempt (before a restart) is not read."""
    (tmp_path / "node-0.log").write_text("\n".join(node_0_peer_closed()) + "\n")
    (tmp_path / "node-1.log").write_text("\n".join(node_1_plain()) + "\n")
    nodes = [NodeStatus(rank=0, exit_code=1), NodeStatus(rank=1, exit_code=1)]
    status = JobStatus(name="job", state=FAILED, nodes=nodes, failed_rank=0)

    message = name_failing_rank(tmp_path, status, [0, 0])

    assert message == "node 1 exited with code 1: [rank 2] RuntimeError: boom on rank 2"
    assert status.failed_rank == 1
    # This attempt: node 1 was stopped before it said anything; only node 0's peer noise
    # is new, so the node that exited first stays the cause.
    status.failed_rank = 0
    this_attempt = [0, (tmp_path / "node-1.log").stat().st_size]
    assert name_failing_rank(tmp_path, status, this_attempt) == ""
    assert status.failed_rank == 0


CRASH_ON_RANK_2 = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 2:
    raise RuntimeError("boom on rank 2")
dist.all_reduce(torch.zeros(1))  # the others block here until rank 2's connection closes
"""


def test_wait_on_a_two_by_two_job_names_rank_2_and_its_exception(local_root, tmp_path, capfd):
    """Real torchrun processes, 2 nodes x 2: rank 2 (node 1) raises while the others wait in
    an all_reduce; the wait error leads with rank 2's exception, not node 0's gloo noise."""
    (tmp_path / "crash.py").write_text(CRASH_ON_RANK_2)

    def kubetrain(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "kubetrain", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
        )

    launched = kubetrain(
        "launch", "--backend", "local", "--nodes", "2", "--procs-per-node", "2",
        "--", "torchrun", "crash.py",
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    name = launched.stdout.strip().splitlines()[-1]

    waited = kubetrain("wait", "--backend", "local", name, "--timeout", "90")
    assert waited.returncode == 1, waited.stdout + waited.stderr
    error = waited.stderr[waited.stderr.index("kubetrain wait: error:") :]
    cause = error.split(";")[0]
    assert "node 1 exited with code 1: [rank 2] RuntimeError: boom on rank 2" in cause, error
    assert "closed by peer" not in error, error
    assert waited.stderr.rstrip().splitlines()[-1] == error.rstrip(), "the cause comes last"
    before = waited.stderr[: waited.stderr.index(error)]
    assert "rank 2 failed on node 1:\n[rank2]: Traceback (most recent call last):" in before

    # The KFP face: `kubetrain run` takes a failed step's cause from its last line (it read
    # the "=====" closing torchrun's report when the node's tail came after the cause).
    from kubetrain.cli.run_output import Step
    from kubetrain.components.wait_trainjob.component import wait_trainjob

    with pytest.raises(SystemExit) as exited:
        wait_trainjob.python_func(job_name=name, backend="local")
    assert exited.value.code == 1
    step = Step("wait-trainjob", 0.0, capfd.readouterr().err.splitlines())
    assert "[rank 2] RuntimeError: boom on rank 2" in step.cause(), step.lines[-3:]


def test_in_the_same_second_the_node_that_failed_comes_before_the_one_stopped(k8s):
    """Node 1 exited 3 and the JobSet's SIGTERM ended node 0 (143) within the same second
    (finish times have whole seconds): the failing node is 1 and wait exits 3 (it took node 0
    by its index under load, and exited 143)."""
    backend = k8s.backend()
    backend.launch(make_spec(num_nodes=2))
    for index, code in ((0, 143), (1, 3)):
        ended = objects.terminated(code)
        ended["terminated"]["finishedAt"] = "2026-11-26T08:40:01Z"
        set_container(k8s.emulator, node_pod(k8s.emulator, "demo", index), ended, "Failed")
    failed = objects.condition("Failed", reason="JobSetFailed", message="jobset failed")
    k8s.emulator.set_conditions("trainjobs", "demo", [failed])

    status = backend.wait("demo", 30, None)

    assert (status.failed_rank, status.failed_node.exit_code) == (1, 3)


def test_a_cluster_wait_names_the_rank_that_failed_first_from_the_failed_nodes_logs(k8s):
    """Over HTTP against the emulator: both node containers ended in the same second (node
    0 taken first by finish time), the Trainer's Failed condition says only that the JobSet
    failed; the wait reads the failed nodes' log tails and names node 1's rank 2."""
    backend = k8s.backend()
    backend.launch(make_spec(num_nodes=2))
    logs = {0: node_0_peer_closed(), 1: node_1_plain()}
    for index, lines in logs.items():
        pod = node_pod(k8s.emulator, "demo", index)
        k8s.emulator.append_log(pod, lines)
        set_container(k8s.emulator, pod, objects.terminated(1), "Failed")
    failed = objects.condition("Failed", reason="JobSetFailed", message="jobset failed")
    k8s.emulator.set_conditions("trainjobs", "demo", [failed])

    status = backend.wait("demo", 30, None)

    assert status.message == "jobset failed; [rank 2] RuntimeError: boom on rank 2"
    assert (status.failed_rank, status.failed_node.exit_code) == (1, 1)


def test_a_crash_looping_node_is_reported_with_its_rank_exception(k8s):
    """A node that keeps crashing ends the wait early (``fail_early``), its pods released: the
    tail kept must reach the rank's traceback, ~55 lines before the end of torchrun's report,
    or the exception cannot be named once the pod is gone."""
    from kubetrain.components.wait_trainjob.wait import (
        CAUSE_LOG_LINES,
        JobFailed,
        last_log_lines,
    )

    backend = k8s.backend()
    backend.launch(make_spec(num_nodes=2))
    pod = node_pod(k8s.emulator, "demo", 1)
    k8s.emulator.append_log(pod, node_1_plain())
    set_container(
        k8s.emulator,
        pod,
        objects.waiting("CrashLoopBackOff", "back-off 40s restarting failed container"),
        restart_count=3,
        last_state=objects.terminated(1),
    )
    status = backend.wait("demo", 30, None)
    error = str(JobFailed(status, last_log_lines(backend, status, CAUSE_LOG_LINES)))

    assert "keeps crashing" in error
    assert "[rank 2] RuntimeError: boom on rank 2" in error
    assert k8s.emulator.get("trainjobs", "demo") is None, "released, its pods gone"
