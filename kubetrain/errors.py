"""Errors a user can act on: each one names what is wrong and how to fix it."""

from __future__ import annotations


class KubetrainError(Exception):
    """A failure reported to the user as one line; ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InvalidInput(KubetrainError):
    """Bad input, refused before anything is created."""

    exit_code = 2

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        super().__init__(f"{field}: {problem}; {fix}")


class JobNotFound(KubetrainError):
    """No job of that name on the backend (``kubetrain delete --ignore-not-found`` accepts it)."""


class JobStalled(KubetrainError):
    """A running job made no progress (no log line, no checkpoint) for ``--stall-timeout``
    seconds: a stopped or hung rank, reported instead of waiting out torch's 30-minute
    collective timeout. The job was stopped as a cancelled wait stops it."""

    exit_code = 3


class IntegrityError(KubetrainError):
    """Stored data (a dataset or a checkpoint) is missing, incomplete or corrupt."""


def refusal_reason(exc: BaseException) -> str:
    """One short line of why a load failed: for ``torch.load(weights_only=True)`` the line that
    names what it refused (its message is otherwise a page of advice, including to turn the
    check off), else the error's own text on one line."""
    import re

    text = str(exc)
    refused = re.search(r"WeightsUnpickler error:\s*(.+?)\.?(?: was not|$)", text, re.M)
    return refused[1] if refused else " ".join(text.split())[:200] or type(exc).__name__
