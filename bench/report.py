"""bench/results.md and bench/results.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.core import Row, Stats


def _number(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if value >= 1 else f"{value:.3f}"


def _stats(stats: Stats | None, unit: str) -> str:
    if stats is None:
        return "—"
    spread = f"{_number(stats.min)}–{_number(stats.max)}"
    return f"{_number(stats.median)} {unit} ({spread}, n={stats.n})"


def _met(row: Row) -> str:
    if row.met is None:
        return "—"
    return "yes" if row.met else f"**no**: {row.verdict}"


def markdown(rows: list[Row], machine: dict[str, Any], meta: dict[str, Any]) -> str:
    """The table: median (min–max, n runs) of ours and the baseline, ratio, target, verdict."""
    lines = [
        "| figure | ours | baseline (same run) | ratio | target | met? |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        ratio = f"{row.ratio:.2f}×" if row.ratio is not None else "—"
        lines.append(
            f"| {row.figure} | {_stats(row.ours, row.unit)} | {_stats(row.baseline, row.unit)} "
            f"| {ratio} | {row.target} | {_met(row)} |"
        )
    lines += ["", "How each figure was measured (ours / baseline):", ""]
    for row in rows:
        lines.append(f"* **{row.figure}**: {row.ours_label} / {row.baseline_label}. {row.how}.")
    lines += [
        "",
        "Values are median (min–max, n = repeated runs); ratio = ours' median / baseline's median.",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['os']}, Python "
        f"{machine['python']}, torch {machine['torch']}, kubetrain {machine['kubetrain']}. "
        f"Mode: {meta['mode']}; total bench time {meta['seconds']:.0f} s; {meta['when']}.",
    ]
    if meta.get("skipped"):
        lines += ["", "Figures skipped on this machine:", ""]
        lines += [f"* {name}: {reason}" for name, reason in meta["skipped"].items()]
    if meta.get("failures"):
        lines += ["", "Figures that could not be measured:", ""]
        lines += [f"* {name}: {reason}" for name, reason in meta["failures"].items()]
    return "\n".join(lines) + "\n"


def write(folder: Path, rows: list[Row], machine: dict[str, Any], meta: dict[str, Any]) -> str:
    text = markdown(rows, machine, meta)
    (folder / "results.md").write_text("# Benchmark results\n\n" + text)
    payload = {"machine": machine, "meta": meta, "rows": [row.as_dict() for row in rows]}
    (folder / "results.json").write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    return text
