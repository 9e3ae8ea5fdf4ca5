"""Following objects with list + watch, in a thread that reports to a queue.

One ``ListWatcher`` lists once (a ``Snapshot``), then watches from that resourceVersion
(``Change`` per event) with a server-side timeout, resuming from the last resourceVersion it
saw (bookmarks included). A ``410 Gone`` (the resourceVersion was compacted) re-lists, so a
change made while no watch was open still arrives, as the new snapshot. 5xx answers and
dropped connections are retried with bounded backoff (with jitter, honouring Retry-After); a
watch that ends at once without an event is re-opened only after a growing pause, not in a
tight loop; anything else ends it with a ``Failure``. Nothing here polls: between events
the thread blocks on the open watch.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import kubernetes.watch
from kubernetes.client.rest import ApiException

from kubetrain.backends.kubernetes.client import (
    RETRIABLE_STATUSES,
    TRANSIENT_ERRORS,
    Action,
    RetryPolicy,
    api_server,
    call_with_retries,
    object_fault,
    translate,
    unreadable_answer,
)
from kubetrain.errors import KubetrainError

#: How long one watch request stays open before the server ends it and we resume.
WATCH_SECONDS = 300
#: A watch that ends sooner than this (or half its timeout) without any event ended at once.
EARLY_END_SECONDS = 1.0
#: Events that carry an object (BOOKMARK carries only a resourceVersion, ERROR a Status).
OBJECT_EVENTS = ("ADDED", "MODIFIED", "DELETED")
#: What the client raises decoding an event that is not a watch event of objects (a line
#: that is not JSON, JSON other than {"type", "object"}, a typed object without metadata):
#: kubernetes.watch.Watch.unmarshal_event decodes each line before we see it.
UNDECODABLE_EVENT = (ValueError, TypeError, KeyError, AttributeError)


@dataclass(frozen=True)
class Snapshot:
    """Everything that matches, as of one list: replaces what the consumer knew."""

    source: str
    items: list[Any]


@dataclass(frozen=True)
class Change:
    source: str
    type: str  # ADDED, MODIFIED or DELETED
    obj: Any


@dataclass(frozen=True)
class Failure:
    source: str
    error: KubetrainError


def resource_version(obj: Any) -> str | None:
    """The resourceVersion of a dict object/list or of a client model."""
    if isinstance(obj, dict):
        return (obj.get("metadata") or {}).get("resourceVersion")
    metadata = getattr(obj, "metadata", None)
    return getattr(metadata, "resource_version", None)


def items_of(listing: Any) -> list[Any]:
    return list(listing.get("items") or []) if isinstance(listing, dict) else list(listing.items)


class ListWatcher(threading.Thread):
    """List + watch ``list_fn(*args, **selectors)`` and put Snapshot/Change/Failure on
    ``events``, tagged with ``source``, until ``stop()``."""

    def __init__(
        self,
        source: str,
        events: queue.Queue,
        action: Action,
        list_fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy,
        watch_seconds: int = WATCH_SECONDS,
        **selectors: str,
    ) -> None:
        super().__init__(name=f"watch-{source}", daemon=True)
        self.source = source
        self.events = events
        self.action = action
        self.list_fn = list_fn
        self.args = args
        self.selectors = selectors
        self.retry = retry
        self.watch_seconds = watch_seconds
        self.resource_version: str | None = None
        self._stopped = threading.Event()
        self._watch: kubernetes.watch.Watch | None = None
        self._response: Any = None

    def stop(self) -> None:
        """End the thread: stop the watch and unblock its read."""
        self._stopped.set()
        if self._watch is not None:
            self._watch.stop()
        response = self._response
        if response is not None:
            try:
                response.shutdown()
            except Exception:  # already closed or released: nothing left to unblock
                pass

    def run(self) -> None:
        try:
            self._follow()
        except KubetrainError as error:
            if not self._stopped.is_set():
                self.events.put(Failure(self.source, error))
        except Exception as error:  # a bug or a surprise: report it rather than hang the wait
            if not self._stopped.is_set():
                failure = KubetrainError(
                    f"following {self.action} failed: {error!r}; run the command again, and "
                    "if it fails the same way report it as a bug in kubetrain"
                )
                self.events.put(Failure(self.source, failure))

    def _follow(self) -> None:
        delays = self.retry.delays()
        early_ends = self._early_end_delays()
        while not self._stopped.is_set():
            try:
                if self.resource_version is None:
                    self._list()
                if not self._stopped.is_set():
                    started = time.monotonic()
                    events = self._watch_once()
                    if events == 0 and time.monotonic() - started < self._early_end_seconds():
                        # Ended at once with nothing: an overloaded server or a proxy cutting
                        # watches. Re-watching at once would hammer it; back off (unbounded:
                        # the watch still works, just slowly).
                        self.retry.pause(next(early_ends), None, self._stopped.wait)
                        continue
                    early_ends = self._early_end_delays()
                delays = self.retry.delays()  # a watch that ran to its timeout is healthy
            except ApiException as exc:
                if exc.status == 410:
                    self.resource_version = None  # compacted: list again
                    continue
                if exc.status not in RETRIABLE_STATUSES:
                    raise translate(exc, self.action) from None
                self._pause(delays, exc)
            except TRANSIENT_ERRORS as exc:
                if self._stopped.is_set():
                    return
                self._pause(delays, exc)

    def _pause(self, delays: Any, exc: Exception) -> None:
        delay = next(delays, None)
        if delay is None:
            raise KubetrainError(
                f"kept failing to {self.action} ({exc}); the API server is unreachable or "
                "unhealthy: try again later"
            )
        self.retry.pause(delay, exc, self._stopped.wait)

    def _early_end_delays(self) -> Iterator[float]:
        """Backoff delays for watches that end at once: doubling up to the policy's cap."""
        delay = self.retry.first_delay
        while True:
            yield delay
            delay = min(delay * 2, self.retry.max_delay)

    def _early_end_seconds(self) -> float:
        """A watch that ends sooner than this without an event ended "at once"."""
        return min(EARLY_END_SECONDS, self.watch_seconds / 2)

    def _list(self) -> None:
        listing = call_with_retries(
            replace(self.action, verb="list"),
            self.list_fn,
            *self.args,
            retry=self.retry,
            **self.selectors,
        )
        self.resource_version = resource_version(listing)
        self.events.put(Snapshot(self.source, items_of(listing)))

    def _watch_once(self) -> int:
        """One watch request, to its end; returns how many events (bookmarks too) it had."""
        self._watch = watch = kubernetes.watch.Watch()
        stream = watch.stream(
            self._capturing(self.list_fn),
            *self.args,
            resource_version=self.resource_version,
            timeout_seconds=self.watch_seconds,
            allow_watch_bookmarks=True,
            _request_timeout=(30, self.watch_seconds + 30),
            **self.selectors,
        )
        events = 0
        while (event := self._next_event(stream)) is not None:
            events += 1
            if self._stopped.is_set():
                watch.stop()
                break
            version = resource_version(event.get("raw_object") or {})
            if version:
                self.resource_version = version
            if event["type"] in OBJECT_EVENTS:
                self.events.put(Change(self.source, event["type"], event["object"]))
        return events

    def _next_event(self, stream: Iterator[dict[str, Any]]) -> dict[str, Any] | None:
        """The stream's next event (None at its end), when it is one of a watch of objects:
        one the client cannot decode, or whose object is no object with metadata.name, is an
        ``ApiError`` naming the watch and the server."""
        try:
            event = next(stream, None)
        except UNDECODABLE_EVENT as exc:
            reason = f"an event the client cannot decode ({type(exc).__name__}: {exc})"
            raise unreadable_answer(self.action, reason, api_server(self.list_fn)) from None
        if event is not None and event["type"] in OBJECT_EVENTS:
            fault = object_fault(event["raw_object"])
            if fault:
                reason = f"its {event['type']} event's object is {fault}"
                raise unreadable_answer(self.action, reason, api_server(self.list_fn))
        return event

    def _capturing(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` that remembers the response it returns, so stop() can unblock its read; it
        keeps ``fn``'s docstring, from which Watch learns the type of the objects."""

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            self._response = response = fn(*args, **kwargs)
            if self._stopped.is_set():  # stop() came while we connected: end at once
                response.shutdown()
            return response

        return call
