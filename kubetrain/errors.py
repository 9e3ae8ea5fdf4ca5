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


class IntegrityError(KubetrainError):
    """Stored data (a dataset or a checkpoint) is missing, incomplete or corrupt."""
