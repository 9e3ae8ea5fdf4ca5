"""Container logs as the kubelet serves them through ``pods/log``.

Each container has a list of instances (a restart starts a new one, ``previous=true`` reads
the one before); an instance holds timestamped lines and ends when its container terminates,
which is also when a ``follow=true`` stream of it ends.

As the kubelet does (kubernetes pkg/kubelet/kuberuntime/logs/logs.go, commit 04791b49:
``NewLogOptions`` and ``logWriter.write``): ``sinceTime``/``sinceSeconds`` keep lines whose
timestamp is not before the later of the two; ``timestamps=true`` prefixes each line with its
RFC3339NanoFixed time and a space; only the current log file is read, so lines rotated out
(``rotate``) are served by no new request, while a follow stream already open goes on into
the new file.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

LogKey = tuple[str, str, str]  # namespace, pod, container


@dataclass
class LogInstance:
    lines: list[tuple[float, str]] = field(default_factory=list)
    terminated: bool = False
    #: How many of the first lines are in rotated files, which the kubelet no longer reads.
    rotated: int = 0

    @property
    def current(self) -> list[tuple[float, str]]:
        return self.lines[self.rotated :]


@dataclass(frozen=True)
class LogQuery:
    """The query parameters of a ``pods/log`` request that change what is returned."""

    tail_lines: int | None = None
    since_seconds: float | None = None
    since_time: float | None = None
    timestamps: bool = False

    @classmethod
    def from_params(cls, params: dict[str, str]) -> LogQuery:
        tail = params.get("tailLines")
        since = params.get("sinceSeconds")
        since_time = params.get("sinceTime")
        return cls(
            tail_lines=int(tail) if tail else None,
            since_seconds=float(since) if since else None,
            since_time=parse_rfc3339(since_time) if since_time else None,
            timestamps=params.get("timestamps", "").lower() in ("1", "t", "true"),
        )

    def select(self, lines: list[tuple[float, str]]) -> list[tuple[float, str]]:
        cutoffs = [
            *([time.time() - self.since_seconds] if self.since_seconds is not None else []),
            *([self.since_time] if self.since_time is not None else []),
        ]
        if cutoffs:
            cutoff = max(cutoffs)  # the later of the two, as NewLogOptions picks
            lines = [entry for entry in lines if entry[0] >= cutoff]
        if self.tail_lines is not None:
            lines = lines[-self.tail_lines :] if self.tail_lines else []
        return lines

    def render(self, entry: tuple[float, str]) -> bytes:
        stamp, text = entry
        if self.timestamps:
            iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp))
            text = f"{iso}.{int(stamp % 1 * 1e9):09d}Z {text}"
        return f"{text}\n".encode()


def parse_rfc3339(text: str) -> float:
    """A ``sinceTime`` query parameter (metav1.Time: RFC 3339, fractional seconds allowed)."""
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ValueError(f'parsing time "{text}" as RFC3339') from None


class PodLogStore:
    """All container logs of the emulated cluster; lives on the emulator's event loop."""

    def __init__(self) -> None:
        self._logs: dict[LogKey, list[LogInstance]] = {}
        self._tick = asyncio.Event()
        self._epoch = 0

    def _changed(self) -> None:
        self._tick.set()
        self._tick = asyncio.Event()

    def instances(self, key: LogKey) -> list[LogInstance]:
        return self._logs.get(key, [])

    def append(self, key: LogKey, lines: list[str]) -> None:
        """Write lines to the current instance (starting the first one if needed)."""
        instances = self._logs.setdefault(key, [])
        if not instances or instances[-1].terminated:
            instances.append(LogInstance())
        now = time.time()
        instances[-1].lines.extend((now, line) for line in lines)
        self._changed()

    def start(self, key: LogKey) -> None:
        """A (re)started container: a new instance, unless the current one is still empty; the
        run before it has ended (its follow streams end)."""
        instances = self._logs.setdefault(key, [])
        if not instances or instances[-1].terminated or instances[-1].lines:
            if instances:
                instances[-1].terminated = True
            instances.append(LogInstance())
        self._changed()

    def terminate(self, key: LogKey) -> None:
        instances = self._logs.setdefault(key, [])
        if not instances:
            instances.append(LogInstance())
        instances[-1].terminated = True
        self._changed()

    def rotate(self, key: LogKey) -> None:
        """The kubelet rotated the current instance's log file: what it holds so far is no
        longer served to new requests (open follow streams go on)."""
        instances = self._logs.get(key) or []
        if instances:
            instances[-1].rotated = len(instances[-1].lines)

    def interrupt(self) -> None:
        """End every follow stream now, as if the connection to the kubelet broke."""
        self._epoch += 1
        self._changed()

    def forget_pod(self, namespace: str, pod: str) -> None:
        """A deleted pod: its logs go, and streams following them end."""
        for key in [key for key in self._logs if key[:2] == (namespace, pod)]:
            for instance in self._logs.pop(key):
                instance.terminated = True
        self._changed()

    def read(self, key: LogKey, query: LogQuery, previous: bool = False) -> bytes:
        instances = self.instances(key)
        index = -2 if previous else -1
        if len(instances) < (2 if previous else 1):
            return b""
        return b"".join(query.render(entry) for entry in query.select(instances[index].current))

    async def follow(
        self, key: LogKey, query: LogQuery, disconnected: Callable[[], bool]
    ) -> AsyncIterator[bytes]:
        """Stream the current instance: what it holds now, then new lines until it ends."""
        yield b""  # send the headers at once, as the kubelet does
        epoch = self._epoch
        instances = self.instances(key)
        if not instances:
            self.start(key)
            instances = self.instances(key)
        instance = instances[-1]
        selected = query.select(instance.current)
        sent = len(instance.lines)
        for entry in selected:
            yield query.render(entry)
        while True:
            tick = self._tick
            if sent < len(instance.lines):
                chunk = instance.lines[sent:]
                sent += len(chunk)
                yield b"".join(query.render(entry) for entry in chunk)
                continue
            if instance.terminated or disconnected() or epoch != self._epoch:
                return
            try:
                await asyncio.wait_for(tick.wait(), timeout=0.5)
            except asyncio.TimeoutError:
                pass
