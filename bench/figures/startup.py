"""B5 start-up: cold processes for ``kubetrain --help``, ``import kubetrain`` and compiling
every component and both pipelines, against the bare interpreter's start-up as the floor."""

from __future__ import annotations

import tempfile

from bench.core import KUBETRAIN, PYTHON, Row, Settings, Stats, interleaved, log, timed

HELP_TARGET_S = 0.5
COMPILE_TARGET_S = 3.0


def _row(
    figure: str,
    ours_label: str,
    base_label: str,
    stats: tuple[Stats, Stats],
    target_s: float | None,
) -> Row:
    ours, base = stats
    row = Row(
        figure=figure,
        unit="s",
        ours=ours,
        ours_label=ours_label,
        baseline=base,
        baseline_label=base_label,
        target=f"≤ {target_s} s" if target_s is not None else "none (reported)",
        how=f"wall time of a fresh process, {ours.n} runs alternated with the baseline, "
        "warm file cache",
        ratio=ours.median / base.median,
    )
    if target_s is not None:
        row.met = ours.median <= target_s
        row.verdict = "met" if row.met else f"missed by {ours.median - target_s:.2f} s"
    return row


def measure(settings: Settings) -> list[Row]:
    repeats = settings.repeats(7)
    floor = [PYTHON, "-c", "pass"]
    log(f"B5: kubetrain --help x{repeats}")
    help_stats = interleaved(repeats, lambda: timed([KUBETRAIN, "--help"]), lambda: timed(floor))
    log(f"B5: import kubetrain x{repeats}")
    import_stats = interleaved(
        repeats, lambda: timed([PYTHON, "-c", "import kubetrain"]), lambda: timed(floor)
    )

    def compile_once() -> float:
        with tempfile.TemporaryDirectory(prefix="bench-compile-") as out:
            return timed([KUBETRAIN, "compile", "--output-dir", out])

    compile_floor = [PYTHON, "-c", "import hera.workflows, kfp.compiler"]
    compile_repeats = settings.repeats(5)
    log(f"B5: kubetrain compile x{compile_repeats}")
    compile_stats = interleaved(compile_repeats, compile_once, lambda: timed(compile_floor))
    return [
        _row("B5 start-up: help", "`kubetrain --help`", "`python -c pass`", help_stats,
             HELP_TARGET_S),
        _row("B5 start-up: import", "`python -c 'import kubetrain'`", "`python -c pass`",
             import_stats, None),
        _row("B5 start-up: compile", "`kubetrain compile --output-dir TMP` (6 components, KFP "
             "pipeline, 2 Argo workflows)", "`python -c 'import hera.workflows, kfp.compiler'`",
             compile_stats, COMPILE_TARGET_S),
    ]  # fmt: skip
