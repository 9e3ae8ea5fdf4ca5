"""B1b local launch: a trivial 2-node x 1-process gloo program, launched and waited for with
our local backend, against one plain ``torchrun --nproc-per-node 2`` of the same script."""

from __future__ import annotations

import tempfile
import time
import uuid

from bench.core import BASELINES, KUBETRAIN, TORCHRUN, Row, Settings, bench_env, interleaved, log
from bench.core import run as run_command

TARGET_RATIO = 1.2
SCRIPT = str(BASELINES / "trivial_allreduce.py")


def _ours(root: str) -> float:
    """``kubetrain launch`` then ``kubetrain wait``, each a fresh CLI process, timed together."""
    env = bench_env(KUBETRAIN_LOCAL_ROOT=root)
    name = f"bench-{uuid.uuid4().hex[:8]}"
    local = ["--backend", "local"]
    started = time.perf_counter()
    run_command(
        [KUBETRAIN, "launch", *local, "--nodes", "2", "--procs-per-node", "1", "--name", name,
         "--", "torchrun", SCRIPT],
        env=env,
    )  # fmt: skip
    run_command([KUBETRAIN, "wait", *local, "--quiet", name], env=env)
    seconds = time.perf_counter() - started
    run_command([KUBETRAIN, "delete", *local, name], env=env)
    return seconds


def _baseline() -> float:
    return run_command([TORCHRUN, "--nproc-per-node", "2", SCRIPT])[0]


def measure(settings: Settings) -> list[Row]:
    repeats = settings.repeats(7)
    log(f"B1b: local launch vs torchrun x{repeats}")
    with tempfile.TemporaryDirectory(prefix="bench-local-") as root:
        ours, base = interleaved(repeats, lambda: _ours(root), _baseline)
    ratio = ours.median / base.median
    met = ratio <= TARGET_RATIO
    return [
        Row(
            figure="B1b local launch",
            unit="s",
            ours=ours,
            ours_label="`kubetrain launch --backend local --nodes 2 --procs-per-node 1 -- "
            "torchrun trivial_allreduce.py` + `kubetrain wait`",
            baseline=base,
            baseline_label="`torchrun --nproc-per-node 2 trivial_allreduce.py`",
            target=f"≤ {TARGET_RATIO}×",
            how=f"wall time from launch to wait's return (two CLI processes) vs torchrun's; "
            f"{ours.n} runs each, alternated",
            ratio=ratio,
            met=met,
            verdict="met" if met else f"missed: {ratio:.2f}× (target {TARGET_RATIO}×)",
        )
    ]
