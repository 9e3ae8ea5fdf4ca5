"""Shared pieces of the benchmarks: timed subprocesses, summary statistics, result rows."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PYTHON = sys.executable
KUBETRAIN = str(BIN / "kubetrain")
TORCHRUN = str(BIN / "torchrun")
BASELINES = Path(__file__).resolve().parent / "baselines"


@dataclass(frozen=True)
class Settings:
    """How hard to measure: ``quick`` runs every figure once with tiny sizes (a smoke check)."""

    quick: bool = False

    def repeats(self, full: int) -> int:
        return 1 if self.quick else full


@dataclass(frozen=True)
class Stats:
    """Median, min and max of ``n`` repeated measurements."""

    median: float
    min: float
    max: float
    n: int
    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        if not values:
            raise ValueError("no measurements")
        return cls(statistics.median(values), min(values), max(values), len(values), tuple(values))


@dataclass
class Row:
    """One line of the results table."""

    figure: str
    unit: str
    ours: Stats
    ours_label: str
    baseline: Stats | None
    baseline_label: str
    target: str
    how: str
    ratio: float | None = None
    met: bool | None = None
    verdict: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class CommandFailed(RuntimeError):
    pass


class FigureSkipped(Exception):
    """A figure this machine cannot measure (B3g without a GPU); the message says why."""


def bench_env(**extra: str) -> dict[str, str]:
    """This environment with the venv's scripts first on PATH and quiet, unbuffered Python."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float = 600,
) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Run ``argv`` (no shell); return its wall time in seconds and the finished process."""
    started = time.perf_counter()
    done = subprocess.run(
        list(argv),
        env=dict(env) if env is not None else bench_env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        tail = (done.stdout[-1500:] + "\n" + done.stderr[-1500:]).strip()
        raise CommandFailed(f"{' '.join(argv)} exited {done.returncode}:\n{tail}")
    return seconds, done


def timed(argv: Sequence[str], **kwargs: Any) -> float:
    """Wall time of one successful run of ``argv``."""
    return run(argv, **kwargs)[0]


def interleaved(
    repeats: int, ours: Callable[[], float], baseline: Callable[[], float]
) -> tuple[Stats, Stats]:
    """Alternate ours and the baseline, so that drift in the machine's load hits both alike."""
    ours_values: list[float] = []
    base_values: list[float] = []
    for _ in range(repeats):
        ours_values.append(ours())
        base_values.append(baseline())
    return Stats.of(ours_values), Stats.of(base_values)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
