"""``python -m bench [--quick] [--only B5,B1b,…]``: measure every figure, write the results."""

from __future__ import annotations

import argparse
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from bench.core import FigureSkipped, Row, Settings, log
from bench.figures import (
    collect,
    collect_dcp,
    collect_zero,
    launch,
    pipeline,
    scale,
    startup,
    throughput,
    throughput_gpu,
    wait,
)
from bench.machine import machine_info
from bench.report import write

QUICK_DIR = Path(tempfile.gettempdir()) / "kubetrain-bench-quick"
FIGURES: dict[str, Callable[[Settings], list[Row]]] = {
    "B5": startup.measure,
    "B1b": launch.measure,
    "B3": throughput.measure,
    "B3g": throughput_gpu.measure,
    "B4": collect.measure,
    "B4d": collect_dcp.measure,
    "B4z": collect_zero.measure,
    "B1": pipeline.measure,
    "B2": wait.measure,
    "B6": scale.measure,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="each figure once, tiny sizes (a smoke check)"
    )
    parser.add_argument("--only", help=f"comma-separated figures out of {', '.join(FIGURES)}")
    parser.add_argument(
        "--output-dir", type=Path,
        help="where results.md and results.json go; default bench/ (--quick: a temp folder)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    chosen = args.only.split(",") if args.only else list(FIGURES)
    unknown = [name for name in chosen if name not in FIGURES]
    if unknown:
        parser.error(f"unknown figures {unknown}; choose from {list(FIGURES)}")
    settings = Settings(quick=args.quick)
    started = time.perf_counter()
    rows: list[Row] = []
    failures: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for name in chosen:
        figure_started = time.perf_counter()
        try:
            rows += FIGURES[name](settings)
        except FigureSkipped as reason:
            skipped[name] = str(reason)
            log(f"{name}: skipped: {reason}")
        except Exception as error:  # one broken figure must not lose the others
            traceback.print_exc()
            failures[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
        log(f"{name}: {time.perf_counter() - figure_started:.0f} s")
    meta = {
        "mode": "quick (smoke: 1 run, tiny sizes)" if settings.quick else "full",
        "seconds": time.perf_counter() - started,
        "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "failures": failures,
        "skipped": skipped,
    }
    output_dir = args.output_dir or (QUICK_DIR if settings.quick else Path(__file__).parent)
    output_dir.mkdir(parents=True, exist_ok=True)
    print(write(output_dir, rows, machine_info(), meta))
    log(f"wrote {output_dir / 'results.md'} and results.json")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
