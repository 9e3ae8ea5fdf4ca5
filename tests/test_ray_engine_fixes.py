"""Issue 31's hostile review, three breaks of the local Ray engine, at unit level: env KubeRay
sets is refused by the local engine as by a RayJob (one rule, ``check_ray_env``); the driver's
exit code is node 0's, so `kubetrain wait` exits with it (``ray_job_end`` on Ray's
``JobDetails``); the driver's output is followed into node 0's log once, without the ``ray job
logs`` CLI's status block and banners (``ray_follow`` against a dashboard that answers as Ray
2.60's does). The real runs are tests/reliability/test_hostile_issue31.py's."""

from __future__ import annotations

import asyncio
import shutil
import sys
import threading
from collections.abc import Iterator

import pytest

from components.wait_trainjob.wait import JobFailed
from kubetrain.backends.base import COMPLETE, FAILED, JobStatus, NodeStatus
from kubetrain.errors import InvalidInput
from kubetrain.jobspec import TrainJobSpec
from kubetrain.render.rayjob import OPERATOR_ENV, REFUSED_ENV, check_ray_env
from tests.support.processes import kubetrain_in_process

ray = pytest.importorskip("ray", reason="the local Ray engine needs kubetrain[ray]")
web = pytest.importorskip("aiohttp.web")

from kubetrain.backends.local import ray_engine, ray_follow  # noqa: E402 - needs Ray

JOB = "rj"


# --- 1. env KubeRay sets or refuses: one rule for a RayJob and the local engine -------------


@pytest.mark.bad_input
@pytest.mark.parametrize("key", [*OPERATOR_ENV, *REFUSED_ENV])
def test_env_kuberay_sets_or_refuses_is_refused(key):
    with pytest.raises(InvalidInput, match=rf"^env: {key} ") as refused:
        check_ray_env({"A": "1", key: "x"})
    assert "\n" not in str(refused.value)


def test_other_ray_env_passes():
    check_ray_env({"RAY_AUTH_MODE": "token", "RAY_DEDUP_LOGS": "0", "KUBETRAIN_X": "1"})


@pytest.mark.bad_input
def test_a_local_ray_launch_with_ray_address_is_one_line_and_makes_nothing(local_root, capsys):
    """It was accepted: the cluster started and Ray's job CLI failed on RAY_ADDRESS=x."""
    code, out, err = kubetrain_in_process(
        ["launch", "--launcher", "ray", "--env", "RAY_ADDRESS=x", "--", "python", "x.py"], capsys
    )
    assert code == 2, (out, err)
    (line,) = err.splitlines()
    assert line.startswith("kubetrain launch: error: env: RAY_ADDRESS is set by KubeRay"), line
    assert not local_root.exists()


# --- 2. the driver's exit code is node 0's ----------------------------------------------------


def ended(ray_status: str, message: str, driver_exit_code: int | None) -> tuple[tuple, JobStatus]:
    from ray.job_submission import JobDetails, JobType
    from ray.job_submission import JobStatus as RayStatus

    info = JobDetails(
        type=JobType.SUBMISSION,
        status=RayStatus(ray_status),
        entrypoint="python train.py",
        message=message,
        driver_exit_code=driver_exit_code,
        submission_id=JOB,
    )
    status = JobStatus(name=JOB, state="Running", nodes=[NodeStatus(rank=0, pid=1)])
    return ray_engine.ray_job_end(status, info), status


def test_a_failed_drivers_exit_code_is_node_0s_and_waits():
    """Ray 2.60 job_supervisor.py JobSupervisor.run: FAILED with driver_exit_code, and a
    message going on with the driver's last lines, which node 0's log holds already."""
    message = (
        "Job entrypoint command failed with exit code 3, last available logs (truncated to "
        "20,000 chars):\nMARK\nSystemExit: 3"
    )
    end, status = ended("FAILED", message, 3)
    assert end == (FAILED, "AppFailed", "Job entrypoint command failed with exit code 3")
    assert status.failed_rank == 0 and status.nodes[0].exit_code == 3
    status.state, status.reason, status.message = end
    assert JobFailed(status, []).exit_code == 3  # was 1: node 0 held the follower's 0


def test_a_driver_killed_by_a_signal_waits_with_128_plus_it():
    end, status = ended("FAILED", "Job entrypoint command failed with exit code -9.", -9)
    status.state, status.reason, status.message = end
    assert JobFailed(status, []).exit_code == 128 + 9


def test_a_succeeded_driver_is_node_0_exiting_0():
    end, status = ended("SUCCEEDED", "Job finished successfully.", 0)
    assert end[0] == COMPLETE and status.failed_rank is None and status.nodes[0].exit_code == 0


def test_a_stopped_ray_job_has_no_driver_code_and_fails_with_1():
    end, status = ended("STOPPED", "Job was intentionally stopped.", None)
    assert end[:2] == (FAILED, "Stopped") and status.nodes[0].exit_code is None
    status.state, status.reason, status.message = end
    assert JobFailed(status, []).exit_code == 1


# --- 3. the driver's lines once, nothing of Ray's client -------------------------------------

CHUNKS = ["Running entrypoint for job rj: python train.py\n", "uni ünï 漢\nMARK-ONCE\n", "end\n"]


class Dashboard:
    """The two routes of Ray 2.60's dashboard the follower uses (``dashboard/modules/job/
    job_head.py``: ``get_version`` answers /api/version with the VersionResponse fields;
    ``tail_job_logs`` sends the driver's log as text messages on a WebSocket and closes it
    when the job ends). ``drop``: the connection is lost mid-log instead (a head gone)."""

    def __init__(self, drop: bool = False) -> None:
        self.drop = drop
        self.loop = asyncio.new_event_loop()
        self.port = 0

    async def version(self, request):
        answer = {"version": "4", "ray_version": ray.__version__, "ray_commit": "x",
                  "session_name": "s"}  # fmt: skip
        return web.json_response(answer)

    async def tail(self, request):
        assert request.match_info["job"] == JOB
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        for chunk in CHUNKS:
            await socket.send_str(chunk)
        if self.drop:
            request.transport.close()
        else:
            await socket.close()
        return socket

    async def serve(self) -> None:
        app = web.Application()
        app.router.add_get("/api/version", self.version)
        app.router.add_get("/api/jobs/{job}/logs/tail", self.tail)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    def __enter__(self) -> str:
        started = threading.Event()

        def run() -> None:
            self.loop.run_until_complete(self.serve())
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(10)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def dashboard() -> Iterator[str]:
    with Dashboard() as url:
        yield url


def test_the_follower_writes_the_drivers_lines_once_and_nothing_else(dashboard, capfd):
    """The `ray job logs --follow` CLI it replaces then printed Ray's status block, which for a
    failed job repeats the driver's last lines, and banners (SUCC cli.py, Job '...' failed)."""
    assert ray_follow.main([dashboard, JOB]) == 0
    out, err = capfd.readouterr()
    assert out == "".join(CHUNKS)
    assert "sdk.py" not in out  # Ray's client's INFO "WebSocket closed" goes to stderr


def test_a_follower_that_loses_the_log_says_so_in_one_line(capfd):
    with Dashboard(drop=True) as url:
        assert ray_follow.main([url, JOB]) == 1
    out, _ = capfd.readouterr()
    said = out.removeprefix("".join(CHUNKS))
    assert said.startswith("kubetrain: cannot follow the Ray job's log: RuntimeError: ")
    assert said.count("\n") == 1 and "Traceback" not in out


def test_the_followers_stderr_is_kept_apart_from_node_0s_log(tmp_path):
    """Node 0's log gets the follower's stdout only; Ray's client logs to stderr (its INFO
    "WebSocket closed for job ..." was in the wait stream), kept in a file of its own."""
    spec = TrainJobSpec(name=JOB, command=["python", "x.py"], launcher="ray")
    cluster = ray_engine.Cluster(tmp_path, spec, str(tmp_path))
    shutil.rmtree(cluster.plan.temp_dir)  # no Ray runs here
    speaks = "import sys; print('driver'); print('INFO sdk.py', file=sys.stderr)"
    log, errors = tmp_path / "node-0.log", tmp_path / ray_engine.FOLLOWER_LOG
    assert cluster.start([sys.executable, "-c", speaks], {}, log, errors=errors).wait() == 0
    assert log.read_text() == "driver\n" and errors.read_text() == "INFO sdk.py\n"


def test_a_traceback_as_rays_message_is_said_by_its_exception():
    """Ray's message for an entrypoint it could not start is a traceback: the job's message is
    its last line, the exception, not 'Traceback (most recent call last):'."""
    message = (
        'Traceback (most recent call last):\n  File "job_supervisor.py", line 1, in run\n'
        "FileNotFoundError: [Errno 2] No such file or directory: 'nope'"
    )
    assert ray_engine.outcome("FAILED", message) == (
        "Failed",
        "AppFailed",
        "FileNotFoundError: [Errno 2] No such file or directory: 'nope'",
    )
