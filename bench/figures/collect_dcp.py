"""B4d collect of a DCP (FSDP) checkpoint: peak memory of ``kubetrain collect`` turning a
``torch.distributed.checkpoint`` folder into ``model.safetensors``, against torch's own
consolidation tool (``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``) on the same
folder. Ours reads and writes tensor by tensor in batches, so its peak should stay well under
the checkpoint's size; torch's loads the whole model first."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.core import PYTHON, Row, Settings, Stats, log
from tests.support.large_checkpoint import MIB
from tests.support.peak_memory import run_measuring_peak_memory

#: Ours must use less than this share of the checkpoint's size at its peak.
TARGET_SHARE = 0.5
#: Writes a DCP checkpoint of SIZE MiB as a model of 64 MiB float32 tensors, under "model".
WRITE_DCP = """
import sys, torch, torch.distributed.checkpoint as dcp
folder, mib = sys.argv[1], int(sys.argv[2])
tensor_mib = min(64, mib)
model = {f"layer{i}.weight": torch.randn(tensor_mib * 2**20 // 4) for i in range(mib // tensor_mib)}
dcp.save({"model": model, "step": 1}, checkpoint_id=folder, no_dist=True)
"""
TORCH_CONSOLIDATE = (
    "import sys; from torch.distributed.checkpoint.format_utils import dcp_to_torch_save; "
    "dcp_to_torch_save(sys.argv[1], sys.argv[2])"
)


def measured(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one command, which must succeed."""
    started = time.perf_counter()
    done = run_measuring_peak_memory(argv, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{argv} exited {done.returncode}: {done.stderr[-1500:]}")
    return time.perf_counter() - started, done.peak_mib


@dataclass
class Alternated:
    """Seconds and peak RSS (MiB) of each run of ours and of the baseline."""

    ours_s: list[float] = field(default_factory=list)
    ours_peak: list[float] = field(default_factory=list)
    base_s: list[float] = field(default_factory=list)
    base_peak: list[float] = field(default_factory=list)


def collect_against(
    source: Path,
    tmp: Path,
    repeats: int,
    baseline: Callable[[Path], list[str]],
    env: dict[str, str] | None = None,
) -> Alternated:
    """``kubetrain collect`` of ``source`` and the ``baseline`` command (given the path it
    writes) alternated ``repeats`` times, each output removed before the next run."""
    runs = Alternated()
    for index in range(repeats):
        output = tmp / f"model-{index}"
        seconds, peak = measured(
            [PYTHON, "-m", "kubetrain", "collect", "--checkpoint-dir", str(source),
             "--output", str(output)], env,
        )  # fmt: skip
        runs.ours_s.append(seconds)
        runs.ours_peak.append(peak)
        shutil.rmtree(output)
        target = tmp / f"baseline-{index}"
        seconds, peak = measured(baseline(target), env)
        runs.base_s.append(seconds)
        runs.base_peak.append(peak)
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    return runs


def measure(settings: Settings) -> list[Row]:
    size_mib = 128 if settings.quick else 2048
    repeats = settings.repeats(2)
    with tempfile.TemporaryDirectory(prefix="bench-dcp-", dir=os.environ.get("BENCH_TMP")) as t:
        tmp = Path(t)
        if shutil.disk_usage(tmp).free < 3 * size_mib * MIB + 512 * MIB:
            raise RuntimeError(f"B4d needs {3 * size_mib + 512} MiB free in {tmp}")
        log(f"B4d: writing a {size_mib} MiB DCP checkpoint")
        source = tmp / "dcp"
        subprocess.run([PYTHON, "-c", WRITE_DCP, str(source), str(size_mib)], check=True)
        log(f"B4d: collect vs dcp_to_torch_save x{repeats}")
        runs = collect_against(
            source, tmp, repeats, lambda target: [PYTHON, "-c", TORCH_CONSOLIDATE, str(source),
                                                  str(target)],
        )  # fmt: skip
    ours = Stats.of(runs.ours_peak)
    base = Stats.of(runs.base_peak)
    limit = TARGET_SHARE * size_mib
    met = ours.max < limit
    return [
        Row(
            figure=f"B4d collect a {size_mib} MiB DCP checkpoint: peak memory",
            unit="MiB",
            ours=ours,
            ours_label="peak RSS of `kubetrain collect --checkpoint-dir DCP --output …`",
            baseline=base,
            baseline_label="peak RSS of torch's `dcp_to_torch_save(DCP, FILE)`",
            target=f"< {TARGET_SHARE:g} × the checkpoint ({limit:.0f} MiB)",
            how=(
                f"a DCP folder of {size_mib} MiB (float32 tensors of ≤ 64 MiB under `model`, "
                f"written by `dcp.save`); ru_maxrss of each command (tests.support.peak_memory); "
                f"{repeats} runs each, the worst checked; wall: ours "
                f"{Stats.of(runs.ours_s).median:.1f} s, torch {Stats.of(runs.base_s).median:.1f} s "
                "(median)"
            ),
            ratio=ours.median / base.median,
            met=met,
            verdict="met" if met else f"missed: {ours.max:.0f} MiB ≥ {limit:.0f} MiB",
        )
    ]
