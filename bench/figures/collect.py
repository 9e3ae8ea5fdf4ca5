"""B4 collect: ``kubetrain collect`` of a 1 GiB DDP checkpoint (sha256 verified while it
streams, fsynced) against ``cp`` of the same file followed by ``sync`` of the copy."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.core import PYTHON, Row, Settings, Stats, log
from tests.support.large_checkpoint import MIB, write_ddp_checkpoint
from tests.support.peak_memory import MeasuredRun, run_measuring_peak_memory

TARGET_RATIO = 0.8
PEAK_TARGET_MIB = 256.0


def _timed_measuring(argv: list[str]) -> tuple[float, MeasuredRun]:
    started = time.perf_counter()
    done = run_measuring_peak_memory(argv)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{argv} exited {done.returncode}: {done.stderr[-1500:]}")
    return seconds, done


def _flush() -> None:
    """Write back earlier runs' dirty pages, so that no run pays for another's."""
    subprocess.run(["sync"], check=True)


def measure(settings: Settings) -> list[Row]:
    size = 64 * MIB if settings.quick else 1024 * MIB
    repeats = settings.repeats(3)
    with tempfile.TemporaryDirectory(prefix="bench-collect-", dir=os.environ.get("BENCH_TMP")) as t:
        tmp = Path(t)
        if shutil.disk_usage(tmp).free < 3 * size + 512 * MIB:
            raise RuntimeError(f"B4 needs {3 * size // MIB + 512} MiB free in {tmp}")
        log(f"B4: writing a {size // MIB} MiB checkpoint")
        source = write_ddp_checkpoint(tmp / "ckpt", size, sparse=False) / "model.safetensors"
        file_bytes = source.stat().st_size
        ours_s: list[float] = []
        base_s: list[float] = []
        ours_peak: list[float] = []
        base_peak: list[float] = []
        log(f"B4: collect vs cp x{repeats}")
        for index in range(repeats):
            _flush()
            output = tmp / f"model-{index}"
            seconds, done = _timed_measuring(
                [PYTHON, "-m", "kubetrain", "collect", "--checkpoint-dir", str(tmp / "ckpt"),
                 "--output", str(output)]
            )  # fmt: skip
            ours_s.append(seconds)
            ours_peak.append(done.peak_mib)
            shutil.rmtree(output)
            _flush()
            copy = tmp / f"copy-{index}.safetensors"
            seconds, done = _timed_measuring(["cp", "--sparse=never", str(source), str(copy)])
            sync_s, _ = _timed_measuring(["sync", str(copy)])
            base_s.append(seconds + sync_s)
            base_peak.append(done.peak_mib)
            copy.unlink()
    mb = file_bytes / 1e6
    ours = Stats.of([mb / s for s in ours_s])
    base = Stats.of([mb / s for s in base_s])
    ratio = ours.median / base.median
    peak = Stats.of(ours_peak)
    speed_met = ratio >= TARGET_RATIO
    peak_met = peak.max < PEAK_TARGET_MIB
    how = (
        f"{file_bytes / MIB:.0f} MiB model.safetensors (dense, in the page cache); MB/s = bytes / "
        "wall time of the whole process (start-up included); ours verifies sha256 and fsyncs; "
        f"cp is `cp --sparse=never` then `sync FILE`; `sync` before each run; {repeats} runs each"
    )
    return [
        Row(
            figure="B4 collect: speed",
            unit="MB/s",
            ours=ours,
            ours_label="`kubetrain collect --checkpoint-dir … --output …`",
            baseline=base,
            baseline_label="`cp --sparse=never` + `sync FILE`",
            target=f"≥ {TARGET_RATIO}× of cp",
            how=how,
            ratio=ratio,
            met=speed_met,
            verdict="met" if speed_met else f"missed: {ratio:.2f}× (target {TARGET_RATIO}×)",
        ),
        Row(
            figure="B4 collect: peak memory",
            unit="MiB",
            ours=peak,
            ours_label="peak RSS of `kubetrain collect`",
            baseline=Stats.of(base_peak),
            baseline_label="peak RSS of `cp`",
            target=f"< {PEAK_TARGET_MIB:.0f} MiB",
            how="ru_maxrss of the command, read by a launcher process "
            "(tests.support.peak_memory); the worst run is checked",
            ratio=peak.median / Stats.of(base_peak).median,
            met=peak_met,
            verdict="met" if peak_met else f"missed by {peak.max - PEAK_TARGET_MIB:.0f} MiB",
        ),
    ]
