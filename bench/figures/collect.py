"""B4 collect: ``kubetrain collect`` of a 1 GiB DDP checkpoint (sha256 verified while it
streams, fsynced) against ``cp`` of the same file followed by ``sync`` of the copy."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
from pathlib import Path

from bench.core import PYTHON, Row, Settings, Stats, log
from kubetrain.checkpoint_manifest import FORMAT, LATEST, MANIFEST, checkpoint_name
from kubetrain.integrity import sha256_file
from kubetrain.testing.peak_memory import MeasuredRun, run_measuring_peak_memory

MIB = 1024**2
TARGET_RATIO = 0.8
PEAK_TARGET_MIB = 256.0


def write_dense_safetensors(path: Path, tensor_bytes: int) -> None:
    """One float32 tensor of ``tensor_bytes``, written in full (no holes, so that ``cp`` cannot
    skip them): a random 16 MiB block repeated."""
    entry = {"dtype": "F32", "shape": [tensor_bytes // 4], "data_offsets": [0, tensor_bytes]}
    header = json.dumps({"weight": entry}).encode()
    header += b" " * (-len(header) % 8)
    block = os.urandom(16 * MIB)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(header)) + header)
        for offset in range(0, tensor_bytes, len(block)):
            out.write(block[: tensor_bytes - offset])


def write_ddp_checkpoint(checkpoint_dir: Path, tensor_bytes: int) -> Path:
    """A complete one-epoch DDP checkpoint (model, optimizer stub, manifest, LATEST)."""
    folder = checkpoint_dir / checkpoint_name(1)
    folder.mkdir(parents=True)
    write_dense_safetensors(folder / "model.safetensors", tensor_bytes)
    (folder / "optimizer.pt").write_bytes(b"not read by collect")
    manifest = {
        "format": FORMAT, "epoch": 1, "step": 1, "world_size": 1, "strategy": "ddp",
        "model": {"spec": "mlp", "sample_shape": [1, 8, 8], "num_classes": 10}, "metrics": [],
        "files": {name: sha256_file(folder / name)
                  for name in ("model.safetensors", "optimizer.pt")},
    }  # fmt: skip
    (folder / MANIFEST).write_text(json.dumps(manifest))
    (checkpoint_dir / LATEST).write_text(folder.name + "\n")
    return folder / "model.safetensors"


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
        source = write_ddp_checkpoint(tmp / "ckpt", size)
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
            "(kubetrain.testing.peak_memory); the worst run is checked",
            ratio=peak.median / Stats.of(base_peak).median,
            met=peak_met,
            verdict="met" if peak_met else f"missed by {peak.max - PEAK_TARGET_MIB:.0f} MiB",
        ),
    ]
