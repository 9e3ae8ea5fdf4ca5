"""SIGTERM during a wait: a cancelled pipeline run (KFP, Argo) stops its step's container with
SIGTERM; the wait then releases the job it follows instead of leaving it running."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
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


@contextlib.contextmanager
def sigterm_cancels() -> Iterator[CancelRequest]:
    """While inside, SIGTERM only records a request (the wait then cleans up and exits 143);
    the previous handler is restored after. Signals reach the main thread only, so elsewhere
    this installs nothing."""
    request = CancelRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def record(signum: int, _frame: Any) -> None:
        request.signum = signum

    previous = signal.signal(signal.SIGTERM, record)
    try:
        yield request
    finally:
        signal.signal(signal.SIGTERM, previous)
