"""B3 training throughput: ``python -m kubetrain.train`` against the seed-style loop
(bench/baselines/seed_style_train.py), both DDP over 2 CPU processes under torchrun."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from bench.core import BASELINES, KUBETRAIN, TORCHRUN, Row, Settings, interleaved, log
from bench.core import run as run_command

TARGET_RATIO = 1.5
RATE = re.compile(r"^epoch (\d+)/\d+ .*samples/s ([0-9.]+)", re.MULTILINE)


def prepare_digits(folder: Path) -> Path:
    """``kubetrain prep --source sklearn:digits`` into ``folder/digits``."""
    data = folder / "digits"
    run_command([KUBETRAIN, "prep", "--source", "sklearn:digits", "--output", str(data)])
    return data


def steady_rate(stdout: str) -> float:
    """Samples/s over every epoch but the first (warm-up): total samples over total time,
    i.e. the harmonic mean of the per-epoch rates, each epoch having the same samples."""
    rates = [float(rate) for epoch, rate in RATE.findall(stdout) if int(epoch) > 1]
    if not rates:
        raise ValueError(f"no per-epoch samples/s after epoch 1 in:\n{stdout[-2000:]}")
    return len(rates) / sum(1 / rate for rate in rates)


def measure(settings: Settings) -> list[Row]:
    repeats = settings.repeats(5)
    epochs = 3 if settings.quick else 12
    torchrun = [TORCHRUN, "--nproc-per-node", "2"]
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        data = prepare_digits(Path(tmp))
        common = ["--data", str(data), "--epochs", str(epochs), "--batch-size", "32"]

        def ours() -> float:
            with tempfile.TemporaryDirectory(dir=tmp) as ckpt:
                out = run_command(
                    [*torchrun, "-m", "kubetrain.train", *common, "--checkpoint-dir", ckpt,
                     "--checkpoint-every", str(epochs), "--resume", "never", "--device", "cpu"]
                )[1].stdout  # fmt: skip
            return steady_rate(out)

        def baseline() -> float:
            script = str(BASELINES / "seed_style_train.py")
            return steady_rate(run_command([*torchrun, script, *common])[1].stdout)

        log(f"B3: training throughput x{repeats} ({epochs} epochs each)")
        ours_stats, base_stats = interleaved(repeats, ours, baseline)
    ratio = ours_stats.median / base_stats.median
    met = ratio >= TARGET_RATIO
    return [
        Row(
            figure="B3 training throughput (CPU)",
            unit="samples/s",
            ours=ours_stats,
            ours_label="`torchrun --nproc-per-node 2 -m kubetrain.train` (DDP, mlp, batch 32)",
            baseline=base_stats,
            baseline_label="`torchrun --nproc-per-node 2 bench/baselines/seed_style_train.py` "
            "(per-sample Dataset, default DataLoader)",
            target=f"≥ {TARGET_RATIO}×",
            how=f"sklearn:digits (1437 train samples), world size 2, {epochs} epochs per run; "
            "each run's figure is total samples / training-loop time over epochs 2..N; "
            f"{ours_stats.n} runs each, alternated",
            ratio=ratio,
            met=met,
            verdict="met" if met else f"missed: {ratio:.2f}× (target {TARGET_RATIO}×)",
        )
    ]
