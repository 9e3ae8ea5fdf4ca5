"""B1 pipeline overhead: ``kubetrain run`` (default: prep, launch 2 nodes x 1, wait, collect,
evaluate through KFP's local runner) against the same training started directly with
``torchrun --nproc-per-node 2 -m kubetrain.train`` on an already prepared dataset."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.core import KUBETRAIN, TORCHRUN, Row, Settings, Stats, bench_env, log
from bench.core import run as run_command
from bench.figures.throughput import prepare_digits

TARGET_EXTRA_S = 3.0


def measure(settings: Settings) -> list[Row]:
    repeats = settings.repeats(3)
    epochs = 2 if settings.quick else 10
    ours_s: list[float] = []
    base_s: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as t:
        tmp = Path(t)
        data = prepare_digits(tmp)
        env = bench_env(KUBETRAIN_LOCAL_ROOT=str(tmp / "local"))
        log(f"B1: kubetrain run vs torchrun x{repeats} ({epochs} epochs)")
        for index in range(repeats):
            ours = [
                KUBETRAIN,
                "run",
                "--epochs",
                str(epochs),
                "--output",
                str(tmp / f"run-{index}"),
            ]
            if settings.quick:  # too few epochs to pass the default threshold: exit 3
                ours += ["--threshold", "0"]
            ours_s.append(run_command(ours, env=env, cwd=tmp)[0])
            baseline = [
                TORCHRUN, "--nproc-per-node", "2", "-m", "kubetrain.train", "--data", str(data),
                "--epochs", str(epochs), "--checkpoint-dir", str(tmp / f"ckpt-{index}"),
                "--device", "cpu",
            ]  # fmt: skip
            base_s.append(run_command(baseline, env=env)[0])
    ours, base = Stats.of(ours_s), Stats.of(base_s)
    extra = ours.median - base.median
    met = extra <= TARGET_EXTRA_S
    return [
        Row(
            figure="B1 pipeline overhead",
            unit="s",
            ours=ours,
            ours_label=f"`kubetrain run --epochs {epochs}` (otherwise default: sklearn:digits, "
            "2 nodes x 1, ddp, prep → launch → wait → collect → evaluate)",
            baseline=base,
            baseline_label=f"`torchrun --nproc-per-node 2 -m kubetrain.train --epochs {epochs}` "
            "on the dataset prepared beforehand",
            target=f"ours ≤ baseline + {TARGET_EXTRA_S:.0f} s",
            how=f"wall time of each command, {repeats} runs each, alternated; overhead = "
            f"{extra:.1f} s (median difference)",
            ratio=ours.median / base.median,
            met=met,
            verdict="met"
            if met
            else f"missed by {extra - TARGET_EXTRA_S:.1f} s (overhead {extra:.1f} s)",
            extra={"overhead_s": extra},
        )
    ]
