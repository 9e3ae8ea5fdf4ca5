"""B4z collect of a DeepSpeed ZeRO-3 checkpoint: peak memory and wall time of ``kubetrain
collect`` merging a real ZeRO-3 checkpoint (2 ranks, AdamW, written by DeepSpeed itself) into
one ``model.safetensors``, against DeepSpeed's own ``convert_zero_checkpoint_to_fp32_state_dict``
(``zero_to_fp32``, writing safetensors too) on the same folder, alternated. Ours maps the
files and writes tensor by tensor, so its peak should stay well under the checkpoint's size;
``zero_to_fp32`` holds the whole model."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from bench.core import PYTHON, TORCHRUN, Row, Settings, Stats, bench_env, log, run
from bench.figures.collect_dcp import collect_against
from tests.support.large_checkpoint import MIB

#: Ours must use less than this share of the checkpoint's size at its peak...
TARGET_SHARE = 0.5
#: ... and be at least this fast as zero_to_fp32 (its seconds over ours).
TARGET_SPEED = 0.8
#: ZeRO-3 on 2 ranks of a stack of square Linear layers, one AdamW step, then
#: ``engine.save_checkpoint``: fp32 master weights and Adam's two moments (12 bytes a
#: parameter) in each rank's optimizer file.
WRITE_ZERO3 = """
import sys, torch, deepspeed
from torch import nn
folder, layers, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
model = nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))
config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
          "zero_optimization": {"stage": 3}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
engine.backward(engine(torch.randn(2, width)).pow(2).mean())
engine.step()
engine.save_checkpoint(folder)
"""
ZERO_TO_FP32 = (
    "import sys; from deepspeed.utils.zero_to_fp32 import "
    "convert_zero_checkpoint_to_fp32_state_dict as convert; "
    "convert(sys.argv[1], sys.argv[2], safe_serialization=True)"
)


def _size_mib(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.rglob("*.pt")) / MIB


def measure(settings: Settings) -> list[Row]:
    # full: 8 layers of 4096² (134M parameters, ~1.5 GiB); quick: 4 of 512² (~12 MiB)
    layers, width = (4, 512) if settings.quick else (8, 4096)
    repeats = settings.repeats(2)
    with tempfile.TemporaryDirectory(prefix="bench-zero-", dir=os.environ.get("BENCH_TMP")) as t:
        tmp = Path(t)
        if shutil.disk_usage(tmp).free < (512 if settings.quick else 4096) * MIB:
            raise RuntimeError(f"B4z needs {'512 MiB' if settings.quick else '4 GiB'} in {tmp}")
        source, script = tmp / "zero", tmp / "write_zero3.py"
        script.write_text(WRITE_ZERO3)
        log(f"B4z: DeepSpeed writing a ZeRO-3 checkpoint of {layers} × Linear({width}²)")
        seconds, _ = run(
            [TORCHRUN, "--nproc-per-node", "2", str(script), str(source), str(layers),
             str(width)],
            env=bench_env(OMP_NUM_THREADS="1"), timeout=900,
        )  # fmt: skip
        size_mib = _size_mib(source)
        log(f"B4z: {size_mib:.0f} MiB in {seconds:.0f} s; collect vs zero_to_fp32 x{repeats}")
        runs = collect_against(
            source, tmp, repeats,
            lambda target: [PYTHON, "-c", ZERO_TO_FP32, str(source), str(target)], bench_env(),
        )  # fmt: skip
    how = (
        f"a ZeRO-3 checkpoint of {size_mib:.0f} MiB ({layers} × Linear({width}²), 2 ranks, one "
        f"AdamW step, written by DeepSpeed's engine.save_checkpoint under torchrun); "
        f"{repeats} runs each, alternated"
    )
    memory, ours_time = Stats.of(runs.ours_peak), Stats.of(runs.ours_s)
    base_time = Stats.of(runs.base_s)
    limit, share = TARGET_SHARE * size_mib, memory.max / size_mib
    speed = base_time.median / ours_time.median  # ours' speed as a share of zero_to_fp32's
    return [
        Row(
            figure=f"B4z collect a {size_mib:.0f} MiB ZeRO-3 checkpoint: peak memory",
            unit="MiB",
            ours=memory,
            ours_label="peak RSS of `kubetrain collect --checkpoint-dir ZERO --output …`",
            baseline=Stats.of(runs.base_peak),
            baseline_label="peak RSS of DeepSpeed's `convert_zero_checkpoint_to_fp32_state_dict`",
            target=f"< {TARGET_SHARE:g} × the checkpoint ({limit:.0f} MiB)",
            how=f"{how}; ru_maxrss of each command (tests.support.peak_memory), the worst checked",
            ratio=memory.median / Stats.of(runs.base_peak).median,
            # quick: the interpreter and torch alone outweigh a checkpoint of a few MiB
            met=None if settings.quick else share < TARGET_SHARE,
            verdict=f"{'met' if share < TARGET_SHARE else 'missed'}: {share:.2f} × the checkpoint",
            extra={"checkpoint_mib": size_mib, "share_of_checkpoint": share},
        ),
        Row(
            figure=f"B4z collect a {size_mib:.0f} MiB ZeRO-3 checkpoint: wall time",
            unit="s",
            ours=ours_time,
            ours_label="`kubetrain collect` (hashes every file, checks NaN/Inf, verifies the copy)",
            baseline=base_time,
            baseline_label="DeepSpeed's `convert_zero_checkpoint_to_fp32_state_dict`",
            target=f"speed ≥ {TARGET_SPEED:g} × zero_to_fp32's (time ≤ {1 / TARGET_SPEED:g}×)",
            how=f"{how}; whole command, imports included",
            ratio=ours_time.median / base_time.median,
            met=speed >= TARGET_SPEED,
            verdict=f"{'met' if speed >= TARGET_SPEED else 'missed'}: speed {speed:.2f}×",
            extra={"speed": speed},
        ),
    ]
