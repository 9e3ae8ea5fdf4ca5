"""Streaming one node's log from its pods, as `kubectl logs -f` would, but through restarts.

The follower is told about the node's newest pod as the pod watch sees it. It streams the
``node`` container's log (``follow=true``) once that container has started; when the stream
ends it decides from the pod whether that run of the container is over (terminated, restarted
or replaced by a new pod) or the connection just ended, in which case it reconnects and skips
the lines it already printed (counted per run), so no line is printed twice.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from kubernetes.client import CoreV1Api, V1Pod

from kubetrain.backends.kube_client import (
    TRANSIENT_ERRORS,
    Action,
    ApiError,
    PermissionDenied,
    RetryPolicy,
    call_with_retries,
)
from kubetrain.backends.kube_kinds import NODE
from kubetrain.backends.kube_pods import instance, started, terminated
from kubetrain.errors import KubetrainError

#: How long a stream that ended while the pod still shows its container running waits for
#: the pod watch to say why, before reconnecting.
SETTLE_SECONDS = 2.0


def split_lines(chunks: Any) -> Any:
    """Lines of a byte stream (blank lines kept), the unterminated tail last."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield line.decode(errors="replace").rstrip("\r")
    if buffer:
        yield buffer.decode(errors="replace").rstrip("\r")


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
        self._printed: dict[tuple[str, int], int] = {}
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
                    self._changed.wait(delay)
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
        response = call_with_retries(
            Action("get", "pods/log", name=name, namespace=self.namespace),
            self.core.read_namespaced_pod_log,
            name,
            self.namespace,
            container=self.container,
            follow=True,
            _preload_content=False,
            retry=self.retry,
        )
        self._response = response
        if self._halted():  # stop() came while we connected: end at once
            response.shutdown()
        try:
            skip = self._printed.get(run_key, 0)
            for count, line in enumerate(split_lines(response.stream(None, False)), start=1):
                if count > skip:
                    self._printed[run_key] = count
                    self.on_line(line)
        finally:
            self._response = None
            response.release_conn()

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
