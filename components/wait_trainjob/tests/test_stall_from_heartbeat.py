"""wait's default stall timeout comes from what the job says (issue 28: a hung rank was
reported only after 30 minutes although our trainer logs a heartbeat a minute): after a
progress record promising its next line within ``heartbeat_seconds``, a silence of
HEARTBEATS_MISSED times that (at least MIN_DERIVED_STALL_SECONDS) is a stall; a job without
such records keeps DEFAULT_STALL_TIMEOUT_SECONDS, and an explicit --stall-timeout wins."""

from __future__ import annotations

import time

import pytest

from kubetrain.backends.local.backend import LocalBackend
from kubetrain.components.wait_trainjob import wait
from kubetrain.components.wait_trainjob.wait import (
    DEFAULT_STALL_TIMEOUT_SECONDS,
    StallLimit,
    stall_timeout,
    wait_for_job,
)
from kubetrain.errors import InvalidInput, JobStalled, KubetrainError
from kubetrain.jobspec import TrainJobSpec
from kubetrain.progress import Progress, format_record


def record(heartbeat: float | None, batch: int = 3) -> str:
    return format_record(Progress(1, 2, batch, 10, 3, 0.5, 100.0, 60.0, heartbeat))


@pytest.fixture
def backend(tmp_path, monkeypatch) -> LocalBackend:
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(tmp_path / "jobs"))
    return LocalBackend()


def launch_hanging(backend: LocalBackend, name: str, first_line: str) -> None:
    """A job that prints one line and then hangs (a rank stuck in a collective)."""
    script = f"import time; print({first_line!r}, flush=True); time.sleep(120)"
    backend.launch(TrainJobSpec(name=name, command=("python", "-c", script)))


def test_a_hung_job_is_reported_after_its_heartbeats_are_missed(backend, monkeypatch) -> None:
    """A record promising a line within 0.2 s, then nothing: stalled after 5 × 0.2 s (the
    floor, two minutes on a cluster, lowered here to keep the test short)."""
    monkeypatch.setattr(wait, "MIN_DERIVED_STALL_SECONDS", 0.5)
    launch_hanging(backend, "hung", "[default0]:" + record(0.2))
    started = time.monotonic()
    with pytest.raises(JobStalled) as stalled:
        wait_for_job("hung", backend="local", on_log_line=None)
    elapsed = time.monotonic() - started
    assert "no node wrote to its log for 1s while running" in str(stalled.value)
    assert elapsed < 15, elapsed  # about 1 s after its line; the job takes a second to start
    assert backend.status("hung").finished, "the stalled job was stopped"


@pytest.mark.parametrize(
    ("first_line", "limit"),
    [
        ("epoch 1/2 loss 0.5", "auto"),  # a program of its own: no record
        (record(None, batch=10), "auto"),  # an epoch's last batch: validation comes next
        (record(0.2), "0"),  # an explicit 0: never
        (record(0.2), "30"),  # an explicit limit wins over the heartbeat
    ],
)
def test_without_a_promise_or_with_an_explicit_limit_it_is_not_stalled_then(
    backend, monkeypatch, first_line: str, limit: str
) -> None:
    monkeypatch.setattr(wait, "MIN_DERIVED_STALL_SECONDS", 0.5)
    launch_hanging(backend, "quiet", first_line)
    try:
        with pytest.raises(KubetrainError) as ended:
            wait_for_job(
                "quiet",
                backend="local",
                timeout_seconds=4,
                on_log_line=None,
                stall_timeout_seconds=limit,
            )
        assert ended.value.exit_code == 124, str(ended.value)  # timed out, not stalled
    finally:
        backend.delete("quiet")


def test_the_limit_follows_rank_0s_last_line() -> None:
    limit = StallLimit()
    assert limit() == DEFAULT_STALL_TIMEOUT_SECONDS
    limit.feed(record(60.0))
    assert limit() == 300.0  # our trainer's heartbeat: 5 minutes instead of 30
    limit.feed(record(1.0))
    assert limit() == 120.0  # never under two minutes
    limit.feed("checkpoint saved: /ckpt/epoch-000001")
    assert limit() == DEFAULT_STALL_TIMEOUT_SECONDS
    explicit = StallLimit(45.0)
    explicit.feed(record(60.0))
    assert explicit() == 45.0 and StallLimit(0.0)() is None


@pytest.mark.bad_input
@pytest.mark.parametrize("text", ["soon", "-1", "nan", "inf"])
def test_a_bad_stall_timeout_is_one_line(text: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        stall_timeout(text)
    assert refused.value.field == "stall_timeout" and "use auto" in str(refused.value)


def test_on_a_cluster_the_heartbeat_in_rank_0s_pod_log_sets_the_limit(k8s, monkeypatch) -> None:
    """The same rule through the Kubernetes backend: rank 0's pod log, read over the API of the
    emulated server, holds a record promising a line within 0.2 s, then nothing."""
    from tests.test_kube_mechanisms import Waiter, launch, running_node_pod

    monkeypatch.setattr(wait, "MIN_DERIVED_STALL_SECONDS", 0.5)
    launch(k8s)
    limit = StallLimit()
    backend = k8s.backend()
    waiter = Waiter(backend, "demo", stall_timeout=limit)
    waiter.lines = _Feeding(limit)
    waiter.start()
    pod = running_node_pod(k8s.emulator, "demo")
    k8s.emulator.append_log(pod, record(0.2))
    with pytest.raises(JobStalled) as stalled:
        waiter.result()
    assert "no log line from rank 0 for 1s" in str(stalled.value)


class _Feeding(list):
    """The lines a waiter keeps, each also fed to the stall limit (as wait_for_job does)."""

    def __init__(self, limit: StallLimit) -> None:
        super().__init__()
        self.limit = limit

    def append(self, line: str) -> None:
        self.limit.feed(line)
        super().append(line)
