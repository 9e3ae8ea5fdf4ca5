"""SIGTERM or SIGINT during a wait: a cancelled pipeline run (KFP, Argo) stops its step's
container with SIGTERM, a person at a terminal presses Ctrl-C (SIGINT); the wait then releases
the job it follows instead of leaving it running, and says so."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


class Cancelled(Exception):
    """The wait was cancelled by a signal (a cancelled pipeline run sends SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class CancelRequest:
    signum: int | None = None


#: The signals that cancel a wait.
CANCEL_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def signals_cancel() -> Iterator[CancelRequest]:
    """While inside, SIGTERM or SIGINT only records a request (the wait then cleans up and
    exits 128+N: 143 or 130)."""
    request = CancelRequest()

    def record(signum: int, _frame: Any) -> None:
        request.signum = signum

    with handling_cancel_signals(record):
        yield request


@contextlib.contextmanager
def handling_cancel_signals(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT go to ``handler``; the previous handlers are restored
    after. Signals reach the main thread only, so elsewhere this installs nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in CANCEL_SIGNALS}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
