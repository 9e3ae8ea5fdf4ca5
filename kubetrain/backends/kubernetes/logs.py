"""Streaming one node's log from its pods, as `kubectl logs -f` would, but through restarts.

The follower is told about the node's newest pod as the pod watch sees it. It streams the
``node`` container's log (``follow=true``, ``timestamps=true``) once that container has
started; when the stream ends it decides from the pod whether that run of the container is
over (terminated, restarted or replaced by a new pod) or the connection just ended, in which
case it reconnects with ``sinceTime`` = the last timestamp it printed and drops what it
already printed by timestamp (not by counting lines: after the kubelet rotates the log file a
re-read starts at the new file, and a count would skip lines never seen). Timestamps are
stripped before lines are passed on.
"""

from __future__ import annotations

import datetime
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.client import CoreV1Api, V1Pod

from kubetrain.backends.kubernetes.client import (
    TRANSIENT_ERRORS,
    Action,
    ApiError,
    PermissionDenied,
    RetryPolicy,
    call_with_retries,
)
from kubetrain.backends.kubernetes.kinds import NODE
from kubetrain.backends.kubernetes.pods import instance, started, terminated
from kubetrain.errors import InvalidInput, KubetrainError

#: How long a stream that ended while the pod still shows its container running waits for
#: the pod watch to say why, before reconnecting.
SETTLE_SECONDS = 2.0


class LineSplitter:
    """Lines of a byte stream fed in chunks (blank lines kept, a trailing "\r" dropped).

    Linear in the stream: each chunk is searched for newlines once and each byte copied into
    one line once, however long a line grows without a newline (progress bars redrawn with
    "\r"); ``scanned`` and ``copied`` count those bytes."""

    def __init__(self) -> None:
        self._pending: list[bytes] = []  # the unterminated line so far, as chunks
        self.scanned = 0
        self.copied = 0

    def feed(self, chunk: bytes) -> list[str]:
        self.scanned += len(chunk)
        pieces = chunk.split(b"\n")
        if len(pieces) == 1:
            if chunk:
                self._pending.append(chunk)
            return []
        lines = [b"".join([*self._pending, pieces[0]]), *pieces[1:-1]]
        self._pending = [pieces[-1]] if pieces[-1] else []
        self.copied += sum(len(line) for line in lines)
        return [_text(line) for line in lines]

    def flush(self) -> list[str]:
        """The unterminated tail, if any."""
        if not self._pending:
            return []
        tail = b"".join(self._pending)
        self._pending = []
        self.copied += len(tail)
        return [_text(tail)]


def check_node(node: int | None, count: int, job: str) -> None:
    """``--node`` names one of the job's ``count`` nodes: a node the job does not have would
    get no pod, and a follower waiting for its pod would wait in silence."""
    if node is not None and not 0 <= node < count:
        raise InvalidInput(
            "--node",
            f"job {job} has {count} node(s), so no node {node}",
            f"give 0 to {count - 1}, or leave --node out for every node",
        )


def _text(line: bytes) -> str:
    return line.decode(errors="replace").rstrip("\r")


def split_lines(chunks: Any, splitter: LineSplitter | None = None) -> Any:
    """Lines of a byte stream (blank lines kept), the unterminated tail last."""
    splitter = splitter or LineSplitter()
    for chunk in chunks:
        yield from splitter.feed(chunk)
    yield from splitter.flush()


#: The kubelet's ``timestamps=true`` prefix: RFC 3339 with nanoseconds (RFC3339NanoFixed).
_STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")


def parse_stamp(text: str) -> int | None:
    """Nanoseconds since the epoch of a kubelet log timestamp; None if it is not one."""
    match = _STAMP.fullmatch(text)
    if match is None:
        return None
    zone = "+00:00" if match[3] == "Z" else match[3]
    seconds = datetime.datetime.fromisoformat(match[1] + zone).timestamp()
    return int(seconds) * 1_000_000_000 + int((match[2] or "0").ljust(9, "0"))


def since_time(stamp: int) -> str:
    """``sinceTime`` for a resume from ``stamp``: RFC 3339 in whole seconds, rounded down (the
    API server passes metav1.Time on to the kubelet in seconds), so the line at ``stamp``
    comes again and is dropped by timestamp."""
    moment = datetime.datetime.fromtimestamp(stamp // 1_000_000_000, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Printed:
    """Where one run of a container's log was printed up to: the newest timestamp printed
    and how many lines carried exactly that timestamp (lines may share one)."""

    stamp: int | None = None
    at_stamp: int = 0

    def admit(self, stamp: int, repeat: int) -> bool:
        """Whether the ``repeat``-th line (from 1) of this stream at ``stamp`` is new."""
        if self.stamp is not None and stamp < self.stamp:
            return False
        if stamp == self.stamp:
            if repeat <= self.at_stamp:
                return False
            self.at_stamp = repeat
            return True
        self.stamp, self.at_stamp = stamp, 1
        return True


class LogFollower(threading.Thread):
    """Follows the ``node`` container of the pod given to ``update()``; ``finish()`` lets it
    print what is left and end."""

    def __init__(
        self,
        core: CoreV1Api,
        namespace: str,
        on_line: Callable[[str], None],
        *,
        retry: RetryPolicy,
        container: str = NODE,
        warn: Callable[[str], None] = lambda text: print(text, file=sys.stderr),
    ) -> None:
        super().__init__(name="log-follower", daemon=True)
        self.core = core
        self.namespace = namespace
        self.on_line = on_line
        self.retry = retry
        self.container = container
        self.warn = warn
        self._pod: V1Pod | None = None
        self._changed = threading.Condition()
        self._final = False
        self._stopped = False
        self._printed: dict[tuple[str, int], Printed] = {}
        self._done: set[tuple[str, int]] = set()
        self._refused: str | None = None  # resourceVersion of a pod whose log was refused
        self._response: Any = None

    # ------------------------------------------------------------ from the wait thread
    def update(self, pod: V1Pod | None) -> None:
        with self._changed:
            self._pod = pod
            self._changed.notify_all()

    def finish(self, timeout: float) -> None:
        """Print what the node's container has left, then end (or give up after timeout)."""
        with self._changed:
            self._final = True
            self._changed.notify_all()
        if self.is_alive():
            self.join(timeout)
        self.stop()

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        response = self._response
        if response is not None:
            try:
                response.shutdown()
            except Exception:  # already released: nothing to unblock
                pass

    # ------------------------------------------------------------------ the thread
    def run(self) -> None:
        delays = self.retry.delays()
        while True:
            pod = self._next_pod()
            if pod is None:
                return
            run_key = instance(pod)
            try:
                self._stream(pod, run_key)
                delays = self.retry.delays()
            except PermissionDenied as error:
                self.warn(f"kubetrain: cannot stream logs: {error}")
                return
            except ApiError as error:
                if error.status in (400, 404):  # not started yet, or gone: wait for news
                    self._refused = pod.metadata.resource_version
                    continue
                self.warn(f"kubetrain: stopped streaming logs: {error}")
                return
            except (KubetrainError, *TRANSIENT_ERRORS) as error:
                if self._halted():
                    return
                delay = next(delays, None)
                if delay is None:
                    self.warn(f"kubetrain: stopped streaming logs: {error}")
                    return
                with self._changed:
                    self.retry.pause(delay, error, self._changed.wait)
                continue
            self._settle(pod, run_key)

    def _halted(self) -> bool:
        with self._changed:
            return self._stopped

    def _next_pod(self) -> V1Pod | None:
        """The pod whose log to stream next; None when there is nothing more to do."""
        with self._changed:
            while not self._stopped:
                pod = self._pod
                ready = (
                    pod is not None
                    and started(pod)
                    and instance(pod) not in self._done
                    and pod.metadata.resource_version != self._refused
                )
                if ready:
                    return pod
                if self._final:
                    return None
                self._changed.wait(1.0)
            return None

    def _stream(self, pod: V1Pod, run_key: tuple[str, int]) -> None:
        name = pod.metadata.name
        printed = self._printed.setdefault(run_key, Printed())
        query: list[tuple[str, Any]] = [
            ("container", self.container),
            ("follow", True),
            ("timestamps", True),
        ]
        if printed.stamp is not None:
            query.append(("sinceTime", since_time(printed.stamp)))
        response = call_with_retries(
            Action("get", "pods/log", name=name, namespace=self.namespace),
            self._open_log,
            name,
            query,
            retry=self.retry,
        )
        self._response = response
        if self._halted():  # stop() came while we connected: end at once
            response.shutdown()
        try:
            stream_stamp, repeat = None, 0  # timestamps only grow within one stream
            for line in split_lines(response.stream(None, False)):
                stamp_text, _, text = line.partition(" ")
                stamp = parse_stamp(stamp_text)
                if stamp is None:  # not prefixed (a server without timestamps): pass it on
                    self.on_line(line)
                    continue
                stream_stamp, repeat = stamp, (repeat + 1 if stamp == stream_stamp else 1)
                if printed.admit(stamp, repeat):
                    self.on_line(text)
        finally:
            self._response = None
            response.release_conn()

    def _open_log(self, name: str, query: list[tuple[str, Any]]) -> Any:
        """GET pods/log with ``sinceTime``, which the generated client does not offer (it
        knows ``sinceSeconds`` only, relative to the kubelet's clock)."""
        client = self.core.api_client
        return client.call_api(
            "/api/v1/namespaces/{namespace}/pods/{name}/log",
            "GET",
            {"namespace": self.namespace, "name": name},
            query,
            {"Accept": "text/plain"},
            response_type="str",
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=False,
        )

    def _settle(self, pod: V1Pod, run_key: tuple[str, int]) -> None:
        """After a stream ended: mark that run done if the pod says it is over; else give the
        pod watch a moment to catch up (the next loop reconnects if it still runs)."""
        with self._changed:
            current = self._pod
            if current is pod or (current is not None and instance(current) == run_key):
                if not (current and terminated(current)):
                    self._changed.wait(SETTLE_SECONDS)
                    current = self._pod
            if current is None or instance(current) != run_key or terminated(current):
                self._done.add(run_key)
