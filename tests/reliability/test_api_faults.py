"""An unreliable API server under 20 concurrent waits: 500s, dropped connections, a 410 and
watches closed mid-run, all at once. Every wait must still report its job's real end."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from kubetrain.backends.base import COMPLETE, FAILED, JobStatus
from kubetrain.backends.kubernetes.client import RetryPolicy
from kubetrain.jobspec import TrainJobSpec
from tests.support import objects

FAST_RETRY = RetryPolicy(first_delay=0.01, max_delay=0.05)
JOBS = 20


@pytest.mark.fault
def test_twenty_waits_through_500s_drops_410_and_closed_watches_all_end_right(
    k8s, figures, injected
):
    emulator = k8s.emulator
    names = [f"job-{i}" for i in range(JOBS)]
    for name in names:
        k8s.backend().launch(
            TrainJobSpec(name=name, command=("torchrun", "train.py"), image="example/t:1")
        )
    faults = [
        emulator.fail(500, verb="list", resource="trainjobs", times=10),
        emulator.fail(503, verb="watch", resource="pods", times=5),
        emulator.drop(verb="watch", resource="trainjobs", times=10),
        emulator.drop(verb="list", resource="pods", times=5),
    ]
    started = time.monotonic()

    def wait(name: str) -> JobStatus:
        return k8s.backend(retry=FAST_RETRY).wait(name, 60, None)

    with ThreadPoolExecutor(max_workers=JOBS) as pool:
        waits = {name: pool.submit(wait, name) for name in names}
        deadline = time.monotonic() + 30
        while emulator.count("watch", "trainjobs", since=started) < JOBS:
            assert time.monotonic() < deadline, "the waits did not all start watching"
            time.sleep(0.02)
        emulator.expire_watches()  # 410 Gone: every wait must re-list
        for i, name in enumerate(names[: JOBS // 2]):
            finish(emulator, name, i)
        emulator.close_watches(abort=True)  # connections cut mid-stream
        for i, name in enumerate(names[JOBS // 2 :], start=JOBS // 2):
            finish(emulator, name, i)
        statuses = {name: future.result(timeout=60) for name, future in waits.items()}

    for i, name in enumerate(names):
        status = statuses[name]
        assert status.state == (FAILED if i % 2 else COMPLETE), name
        assert status.message == (f"failure {i}" if i % 2 else "")
    assert [fault.hits for fault in faults] == [fault.times for fault in faults], "all struck"
    injected.struck(f"{sum(f.hits for f in faults)} failed requests, a 410, cut watches")
    figures.record(
        "20 concurrent waits through 500/503s, drops, 410, closed watches",
        f"20 of 20 right after {sum(f.hits for f in faults)} failed requests, "
        f"{round(time.monotonic() - started, 2)} s",
    )


def finish(emulator, name: str, i: int) -> None:
    if i % 2:
        emulator.set_conditions(
            "trainjobs", name, [objects.condition("Failed", message=f"failure {i}")]
        )
    else:
        emulator.set_conditions("trainjobs", name, [objects.condition("Complete")])
