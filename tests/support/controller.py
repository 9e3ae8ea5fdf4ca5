"""What the fake controllers (``FakeTrainer``, ``FakeTrainingOperator``) share: a thread that
applies the emulator's events to their runs, and their admission webhook, both only while the
controller is started (``with controller:``)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

from tests.support.emulator import KubeEmulator


class Run(Protocol):
    def stop(self) -> None: ...


class FakeController:
    """Subclasses start the thread (``start``: subscribe, add the webhook, start it) and say
    what an event does; ``stop`` ends all of it and every run."""

    emulator: KubeEmulator
    webhook: bool
    runs: dict[Any, Run]
    _events: queue.Queue
    _thread: threading.Thread
    _unsubscribe: Callable[[], None] | None
    _validate: Callable[..., Any]

    def start(self) -> FakeController:
        raise NotImplementedError

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self.webhook:
            self.emulator.call(self.emulator.api.admission.remove, self._validate)
        self._events.put(None)
        self._thread.join(timeout=30)
        for run in list(self.runs.values()):
            run.stop()

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
