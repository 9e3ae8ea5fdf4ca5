"""The cluster backend's fragile mechanisms, each against the emulated API server through the
official client: log splitting in linear work, log resume by timestamp across a rotation,
Retry-After and jitter, a watch that ends at once, a DELETE whose answer was lost, and the
stall check."""

from __future__ import annotations

import calendar
import random
import threading
import time
from typing import Any

import pytest

from kubetrain.backends.kubernetes.logs import LineSplitter, parse_stamp, since_time, split_lines
from tests.support import objects

IMAGE = "ghcr.io/example/trainer:1.0"


def wait_until(predicate, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"not true after {timeout}s: {predicate}")


# ------------------------------------------------------------------ splitting, linear work
def chunkings(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    chunks, at = [], 0
    while at < len(data):
        size = rng.choice([1, 2, 7, 64, 4096])
        chunks.append(data[at : at + size])
        at += size
    return chunks


STREAMS = {
    "progress-bar": b"".join(b"%d%%\r" % (i % 100) for i in range(2000)) + b"done\n",
    "blank-lines": b"a\n\n\nb\r\n\n",
    "no-newline": b"x" * 5000,
    "crlf-and-utf8": "é\r\nü\nlast".encode(),
    "newline-only": b"\n" * 50,
}


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("stream", STREAMS.values(), ids=STREAMS)
def test_lines_are_the_same_however_the_stream_is_chunked(stream, seed):
    expected = [line.decode(errors="replace").rstrip("\r") for line in stream.split(b"\n")]
    if expected[-1] == "":
        expected.pop()
    assert list(split_lines(chunkings(stream, seed))) == expected


@pytest.mark.parametrize("chunk", [1, 512, 4096])
def test_unterminated_output_is_scanned_and_copied_once(chunk):
    """2 MiB of "\\r" progress with no newline: each byte is searched and copied once (the
    old buffer-concatenation rescanned the whole pending line for every chunk)."""
    data = b"step 123/456 loss 0.1234\r" * (2 * 1024 * 1024 // 25)
    chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    splitter = LineSplitter()
    lines = list(split_lines(chunks, splitter))
    assert len(lines) == 1 and len(lines[0]) == len(data) - 1
    assert splitter.scanned == len(data)
    assert splitter.copied == len(data)


def test_a_kubelet_timestamp_parses_to_nanoseconds_and_resumes_from_its_second():
    stamp = parse_stamp("2026-11-24T19:30:05.000000042Z")
    assert stamp == calendar.timegm((2026, 11, 24, 19, 30, 5)) * 1_000_000_000 + 42
    assert since_time(stamp) == "2026-11-24T19:30:05Z"
    assert parse_stamp("hello") is None


# --------------------------------------------------------------- log resume by timestamp
def running_node_pod(emulator, job: str, index: int = 0) -> str:
    owner = emulator.get("trainjobs", job)
    pod = objects.node_pod(job, index, kind="trainer", image=IMAGE, owner=owner)
    name = emulator.create_pod(pod)["metadata"]["name"]
    emulator.set_pod_status(
        name, objects.pod_status("Running", [objects.container_status(IMAGE, objects.running())])
    )
    return name


def launch(k8s, name: str = "demo", **options) -> Any:
    from kubetrain.jobspec import TrainJobSpec

    backend = k8s.backend(**options)
    backend.launch(TrainJobSpec(name=name, command=("torchrun", "t.py"), image=IMAGE))
    return backend


class Waiter(threading.Thread):
    def __init__(self, backend: Any, name: str, **keywords: Any) -> None:
        super().__init__(daemon=True)
        self.backend, self.name, self.keywords = backend, name, keywords
        self.lines: list[str] = []
        self.status = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.status = self.backend.wait(self.name, 30, self.lines.append, **self.keywords)
        except BaseException as error:
            self.error = error

    def result(self, timeout: float = 20) -> Any:
        self.join(timeout)
        assert not self.is_alive(), "wait did not return"
        if self.error is not None:
            raise self.error
        return self.status


def complete(emulator, job: str, pod: str | None = None) -> None:
    if pod is not None:  # its container ends first, so the log follower ends at once
        status = objects.container_status(IMAGE, objects.terminated(0))
        emulator.set_pod_status(pod, objects.pod_status("Succeeded", [status]))
    emulator.set_conditions("trainjobs", job, [objects.condition("Complete")])


@pytest.mark.fault
@pytest.mark.parametrize("rotate", [False, True], ids=["reconnect", "rotated-then-reconnect"])
def test_log_resume_after_a_rotation_loses_and_repeats_no_line(k8s, rotate, injected):
    from kubetrain.backends.kubernetes.client import RetryPolicy

    emulator = k8s.emulator
    backend = launch(k8s, retry=RetryPolicy(first_delay=0.01, max_delay=0.05))
    waiter = Waiter(backend, "demo")
    waiter.start()
    pod = running_node_pod(emulator, "demo")
    emulator.append_log(pod, ["one", "two", "two"])  # one timestamp for all three
    wait_until(lambda: waiter.lines == ["one", "two", "two"])
    before = emulator.count("get", "pods/log")
    if rotate:
        emulator.rotate_log(pod)
    emulator.interrupt_logs()
    wait_until(lambda: emulator.count("get", "pods/log") > before)  # reconnected
    injected.struck("the log stream was cut" + (" after the kubelet rotated it" if rotate else ""))
    emulator.append_log(pod, ["three", "four"])
    wait_until(lambda: waiter.lines[-1:] == ["four"])
    complete(emulator, "demo", pod)
    waiter.result()
    assert waiter.lines == ["one", "two", "two", "three", "four"]
    resumed = emulator.requests("get", "pods/log")[-1]
    assert resumed.params.get("sinceTime"), "resumed from the last timestamp"
    assert resumed.params.get("timestamps") in ("true", "True")


# ------------------------------------------------------------ Retry-After, jitter, backoff
class Pauses:
    """A RetryPolicy's ``sleep`` that records each pause and waits only a token 5 ms."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)
        time.sleep(0.005)


@pytest.mark.fault
@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("server_seconds", [0, 3, 7])
def test_retry_after_is_honoured_with_jitter_on_top(k8s, status, server_seconds, injected):
    from kubetrain.backends.kubernetes.client import RetryPolicy

    backend = launch(k8s)
    pauses = Pauses()
    policy = RetryPolicy(first_delay=0.5, max_delay=8.0, sleep=pauses)
    fault = k8s.emulator.fail_with_retry_after(
        status, server_seconds, verb="get", resource="trainjobs", times=3
    )
    status_now = k8s.backend(retry=policy).status("demo")
    assert status_now.name == "demo"
    assert fault.hits == 3, "the fault struck three times"
    injected.struck(f"three {status} answers with Retry-After")
    assert len(pauses.seconds) == 3
    for pause, delay in zip(pauses.seconds, [0.5, 1.0, 2.0], strict=True):
        assert server_seconds <= pause <= server_seconds + delay * policy.jitter
    del backend


def test_pauses_without_retry_after_are_jittered_below_the_backoff_delay():
    from kubetrain.backends.kubernetes.client import RetryPolicy

    policy = RetryPolicy(first_delay=1.0, max_delay=8.0, rng=random.Random(7))
    for delay in policy.delays():
        pauses = [policy.pause_seconds(delay) for _ in range(200)]
        assert all(delay * (1 - policy.jitter) <= p <= delay for p in pauses)
        assert len(set(pauses)) > 100, "spread, not one value every client shares"


@pytest.mark.fault
def test_a_watch_that_ends_at_once_is_reopened_after_growing_pauses(k8s, injected):
    """Every watch of the job ends at once with no event: each re-watch comes after a pause,
    and the pauses double up to the cap (counted, not timed)."""
    from kubetrain.backends.base import COMPLETE
    from kubetrain.backends.kubernetes.client import RetryPolicy

    emulator = k8s.emulator
    launch(k8s)
    pauses = Pauses()
    policy = RetryPolicy(first_delay=0.5, max_delay=4.0, jitter=0.0, sleep=pauses)
    empty = 12
    fault = emulator.end_watches_at_once(resource="trainjobs", times=empty)
    waiter = Waiter(k8s.backend(retry=policy), "demo")
    waiter.start()
    wait_until(lambda: fault.hits == empty)
    wait_until(lambda: emulator.count("watch", "trainjobs") > empty)  # a real watch is open
    complete(emulator, "demo")
    assert waiter.result().state == COMPLETE
    assert pauses.seconds[:empty] == [0.5, 1.0, 2.0] + [4.0] * (empty - 3)
    assert emulator.count("watch", "trainjobs") == empty + 1
    injected.struck(f"{empty} watches ended at once without an event")


# ------------------------------------------------------------- a DELETE whose answer is lost
@pytest.mark.fault
@pytest.mark.parametrize("kind", ["trainer", "job"])
def test_a_delete_that_succeeded_before_the_connection_dropped_is_a_success(k8s, kind, injected):
    from kubetrain.backends.kubernetes.client import RetryPolicy
    from kubetrain.jobspec import TrainJobSpec

    emulator = k8s.emulator
    backend = k8s.backend(kind, retry=RetryPolicy(first_delay=0.01, max_delay=0.05))
    backend.launch(TrainJobSpec(name="demo", command=("torchrun", "t.py"), image=IMAGE))
    resource = "trainjobs" if kind == "trainer" else "jobs"
    assert emulator.get(resource, "demo") is not None
    fault = emulator.drop_after_processing(verb="delete", resource=resource)
    backend.delete("demo")  # no "not found": the first attempt did it
    assert fault.hits == 1
    injected.struck("the DELETE's answer was lost after the server deleted the object")
    assert emulator.get(resource, "demo") is None
    deletes = emulator.requests("delete", resource, name="demo")
    assert len(deletes) == 2, "deleted, answer lost, retried: 404"


# -------------------------------------------------------------------------- the stall check
@pytest.mark.fault
@pytest.mark.parametrize("on_cancel", ["delete", "suspend"])
def test_a_running_job_that_logs_nothing_is_reported_stalled_and_stopped(k8s, on_cancel, injected):
    from kubetrain.errors import JobStalled

    emulator = k8s.emulator
    launch(k8s)
    waiter = Waiter(k8s.backend(on_cancel=on_cancel), "demo", stall_timeout=1.0)
    waiter.start()
    pod = running_node_pod(emulator, "demo")
    emulator.append_log(pod, "epoch 1 started")  # then nothing: a hung rank
    injected.struck("rank 0 went silent while running")
    with pytest.raises(JobStalled) as stalled:
        waiter.result()
    assert stalled.value.exit_code == 3
    assert "no log line from rank 0 for 1s" in str(stalled.value)
    assert waiter.lines == ["epoch 1 started"]
    job = emulator.get("trainjobs", "demo")
    if on_cancel == "delete":
        assert job is None and "deleted TrainJob demo" in str(stalled.value)
    else:
        assert job["spec"]["suspend"] is True and "suspended" in str(stalled.value)


@pytest.mark.parametrize("log_lines", [True, False], ids=["logging", "no-log-callback"])
def test_a_job_that_keeps_logging_or_is_pending_is_not_stalled(k8s, log_lines):
    """Pending time does not count, and each rank-0 line restarts the clock; the stall check
    follows rank 0's log even when the caller wants no lines."""
    from kubetrain.backends.base import COMPLETE

    emulator = k8s.emulator
    launch(k8s)
    backend = k8s.backend()
    stall = 1.0
    result: dict[str, Any] = {}

    def wait() -> None:
        try:
            consumer = [].append if log_lines else None
            result["status"] = backend.wait("demo", 30, consumer, stall_timeout=stall)
        except BaseException as error:
            result["error"] = error

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    owner = emulator.get("trainjobs", "demo")
    pod = emulator.create_pod(objects.node_pod("demo", 0, kind="trainer", image=IMAGE, owner=owner))
    name = pod["metadata"]["name"]
    time.sleep(stall * 1.5)  # pending longer than the stall timeout: must not count
    assert "error" not in result
    emulator.set_pod_status(
        name, objects.pod_status("Running", [objects.container_status(IMAGE, objects.running())])
    )
    for step in range(8):  # a line every 0.15 s, for longer than the stall timeout
        emulator.append_log(name, f"step {step}")
        time.sleep(0.15)
    assert "error" not in result, result.get("error")
    complete(emulator, "demo", name)
    thread.join(20)
    assert result.get("status") is not None and result["status"].state == COMPLETE


# ------------------------------------------------- the emulated kubelet's log options
def read_log(k8s, pod: str, **query: str) -> list[str]:
    response = k8s.api_client.call_api(
        "/api/v1/namespaces/{namespace}/pods/{name}/log",
        "GET",
        {"namespace": "default", "name": pod},
        [("container", "node"), *query.items()],
        {"Accept": "text/plain"},
        response_type="str",
        auth_settings=["BearerToken"],
        _return_http_data_only=True,
        _preload_content=False,
    )
    return response.data.decode().splitlines()


def test_the_emulated_kubelet_serves_since_time_and_rotation_like_the_kubelet(k8s):
    """kubelet kuberuntime/logs/logs.go: RFC3339Nano prefix with timestamps=true; lines not
    before sinceTime are kept; a rotated file is no longer read."""
    emulator = k8s.emulator
    launch(k8s)
    pod = running_node_pod(emulator, "demo")
    emulator.append_log(pod, ["old"])
    time.sleep(1.1)  # the next line's second differs from the first one's
    emulator.append_log(pod, ["new"])
    stamped = read_log(k8s, pod, timestamps="true")
    assert [line.split(" ", 1)[1] for line in stamped] == ["old", "new"]
    stamps = [parse_stamp(line.split(" ", 1)[0]) for line in stamped]
    assert all(stamps) and stamps[0] < stamps[1]
    assert read_log(k8s, pod, sinceTime=since_time(stamps[1])) == ["new"], "inclusive"
    assert read_log(k8s, pod, sinceTime=since_time(stamps[0])) == ["old", "new"]
    emulator.rotate_log(pod)
    emulator.append_log(pod, ["after rotation"])
    assert read_log(k8s, pod) == ["after rotation"]


def test_the_emulated_api_server_refuses_a_since_time_that_is_not_rfc3339(k8s):
    from kubernetes.client.rest import ApiException

    launch(k8s)
    pod = running_node_pod(k8s.emulator, "demo")
    with pytest.raises(ApiException) as refused:
        read_log(k8s, pod, sinceTime="yesterday")
    assert refused.value.status == 400


@pytest.mark.fault
def test_a_log_that_cannot_be_read_is_not_taken_for_a_stall(k8s, injected):
    """No permission on pods/log: the follower gives up (with a warning), and the stall
    check does not delete a healthy job for the silence it cannot hear."""
    from kubetrain.backends.base import COMPLETE

    emulator = k8s.emulator
    launch(k8s)
    refused = emulator.fail(403, verb="get", resource="pods/log", times=1000)
    warnings: list[str] = []
    waiter = Waiter(k8s.backend(warn=warnings.append), "demo", stall_timeout=0.3)
    waiter.start()
    pod = running_node_pod(emulator, "demo")
    wait_until(lambda: refused.hits > 0 and warnings)
    injected.struck("pods/log answered 403")
    time.sleep(1.0)  # three stall timeouts of a running job with no readable log
    assert waiter.is_alive(), waiter.error
    complete(emulator, "demo", pod)
    assert waiter.result().state == COMPLETE
    assert emulator.get("trainjobs", "demo") is not None
