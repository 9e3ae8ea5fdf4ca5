"""The evaluation report people look at: one self-contained HTML page built from the model card
and the evaluation results, with the training curves and the confusion matrix as PNG images.

The images are embedded as ``data:`` URIs so the single file renders in the KFP UI (an ``HTML``
artifact) and anywhere else it is copied; :func:`write_report` also writes them as files, and
a ``report.json`` marker by which a later report knows the folder as one it may replace. Charts
are drawn on Agg canvases owned by this module, never through pyplot's global state, so reports
can be built in any thread or process without a display.
"""

from __future__ import annotations

import base64
import html
import io
import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubetrain import storage
from kubetrain.artifacts.output_rule import REPORT, check_output
from kubetrain.storage import atomic

REPORT_FILE = "report.html"
CURVES_FILE = "training_curves.png"
CONFUSION_FILE = "confusion_matrix.png"
#: Per-epoch series of the model card's ``metrics``, plotted train against test.
CURVES = (("loss", "train_loss", "test_loss"), ("accuracy", "train_accuracy", "test_accuracy"))
#: Columns of the per-epoch table.
EPOCH_COLUMNS = (
    "epoch", "train_loss", "test_loss", "train_accuracy", "test_accuracy", "samples_per_second",
)  # fmt: skip
#: Above this many classes the confusion matrix cells carry no count (they would be unreadable).
ANNOTATE_MAX_CLASSES = 20
DPI = 100


@dataclass(frozen=True)
class Report:
    html: str
    images: dict[str, bytes]  # file name -> PNG, the same images the page embeds


def _png(figure: Any) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _series(metrics: Sequence[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(epochs, values) of one metric, skipping epochs that did not record it."""
    points = [
        (float(entry["epoch"]), float(entry[key]))
        for entry in metrics
        if isinstance(entry.get(key), int | float) and isinstance(entry.get("epoch"), int | float)
    ]
    return [epoch for epoch, _ in points], [value for _, value in points]


def training_curves_png(metrics: Sequence[Mapping[str, Any]]) -> bytes:
    """Loss and accuracy per epoch, train against test, side by side."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(10, 4), layout="constrained")
    for axes, (title, train_key, test_key) in zip(figure.subplots(1, 2), CURVES, strict=True):
        for key, label in ((train_key, "train"), (test_key, "test")):
            epochs, values = _series(metrics, key)
            if epochs:
                axes.plot(epochs, values, marker="o", markersize=3, label=label)
        axes.set(title=title, xlabel="epoch")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(alpha=0.3)
        if axes.has_data():
            axes.legend()
        else:
            axes.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=axes.transAxes)
    return _png(figure)


def confusion_matrix_png(classes: Sequence[str], matrix: Sequence[Sequence[int]]) -> bytes:
    """Counts of true (rows) against predicted (columns) classes."""
    from matplotlib.figure import Figure

    count = len(classes)
    side = min(max(4.0, 0.45 * count + 2.0), 14.0)
    figure = Figure(figsize=(side + 1.0, side), layout="constrained")
    axes = figure.subplots()
    image = axes.imshow(matrix, cmap="Blues")
    figure.colorbar(image, ax=axes, shrink=0.8)
    axes.set(
        title="confusion matrix",
        xlabel="predicted",
        ylabel="true",
        xticks=range(count),
        yticks=range(count),
    )
    axes.set_xticklabels(classes, rotation=90 if count > 10 else 0)
    axes.set_yticklabels(classes)
    if count <= ANNOTATE_MAX_CLASSES:
        peak = max((max(row) for row in matrix), default=0)
        for i, row in enumerate(matrix):
            for j, value in enumerate(row):
                color = "white" if value > peak / 2 else "black"
                axes.text(j, i, str(value), ha="center", va="center", color=color, fontsize=8)
    return _png(figure)


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str] = ()) -> str:
    def cells(tag: str, values: Sequence[Any]) -> str:
        return "".join(f"<{tag}>{html.escape(_text(v))}</{tag}>" for v in values)

    head = f"<thead><tr>{cells('th', header)}</tr></thead>" if header else ""
    body = "".join(f"<tr>{cells('th', row[:1])}{cells('td', row[1:])}</tr>" for row in rows)
    return f"<table>{head}<tbody>{body}</tbody></table>"


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, list | tuple):
        return " x ".join(map(str, value))
    return str(value)


def _image(name: str, png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'
        f"<figcaption>{html.escape(name)}</figcaption></figure>"
    )


def model_card_rows(card: Mapping[str, Any], dataset: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """What identifies the model: where its data came from, how it was trained, its digest."""
    spec = card.get("model", {})
    final = (card.get("metrics") or [{}])[-1]
    rows: list[tuple[str, Any]] = [
        ("dataset source", dataset.get("source", "unknown")),
        ("strategy", card.get("strategy", "unknown")),
    ]
    if "nodes" in card:
        rows.append(("nodes", card["nodes"]))
    rows += [
        ("world size", card.get("world_size", "unknown")),
        ("epochs", card.get("epoch", "unknown")),
        ("steps", card.get("step", "unknown")),
        *((f"final {key}", final[key]) for key in sorted(final) if key not in ("epoch", "step")),
        ("model spec", spec.get("spec", "unknown")),
        ("sample shape", spec.get("sample_shape", "unknown")),
        ("classes", spec.get("num_classes", "unknown")),
        ("model sha256", card.get("sha256", "unknown")),
        ("source checkpoint", card.get("source_checkpoint", "unknown")),
    ]
    return rows


def build_report(
    card: Mapping[str, Any], evaluation: Mapping[str, Any], dataset: Mapping[str, Any]
) -> Report:
    """The page for ``card`` (``model.json``), ``evaluation`` (the metrics the evaluate step
    writes, ``passed`` included) and ``dataset`` (the evaluated dataset's manifest)."""
    images = {
        CURVES_FILE: training_curves_png(card.get("metrics", [])),
        CONFUSION_FILE: confusion_matrix_png(evaluation["classes"], evaluation["confusion_matrix"]),
    }
    verdict = "passed" if evaluation["passed"] else "below threshold"
    summary = [
        ("accuracy", evaluation["accuracy"]),
        ("threshold", evaluation["threshold"]),
        ("verdict", verdict),
        ("loss", evaluation["loss"]),
        ("test samples", evaluation["samples"]),
    ]
    per_class = zip(
        evaluation["classes"], evaluation["precision"], evaluation["recall"], strict=True
    )
    epochs = [[entry.get(key, "") for key in EPOCH_COLUMNS] for entry in card.get("metrics", [])]
    title = f"kubetrain model report: accuracy {evaluation['accuracy']:.3f}, {verdict}"
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }}
td {{ font-family: ui-monospace, monospace; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<h2>Evaluation</h2>
{_table(summary)}
<h2>Training curves</h2>
{_image(CURVES_FILE, images[CURVES_FILE], "loss and accuracy per epoch, train and test")}
<h2>Confusion matrix</h2>
{_image(CONFUSION_FILE, images[CONFUSION_FILE], "confusion matrix on the test split")}
<h2>Per class</h2>
{_table(list(per_class), ("class", "precision", "recall"))}
<h2>Model card</h2>
{_table(model_card_rows(card, dataset))}
<h2>Per epoch</h2>
{_table(epochs, EPOCH_COLUMNS)}
</body></html>
"""
    return Report(html=page, images=images)


def metrics_report(
    card: Mapping[str, Any], metrics: Mapping[str, float], gate: str, passed: bool
) -> Report:
    """The page for a model your own evaluation program scored: its metrics, the gate and the
    model card (no curves or confusion matrix: those are our evaluation's)."""
    verdict = "passed" if passed else "not passed"
    title = f"kubetrain model report: {gate}, {verdict}"
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title></head><body>
<h1>{html.escape(title)}</h1>
<h2>Metrics (your evaluation program)</h2>
{_table(sorted(metrics.items()), ("metric", "value"))}
<h2>Model card</h2>
{_table(model_card_rows(card, {}))}
</body></html>
"""
    return Report(html=page, images={})


def check_report_dir(directory: str | Path, inputs: Mapping[str, str | Path] | None = None) -> None:
    """Refuse a report folder the one output rule forbids (an existing file, a folder with
    content that is no earlier report, the model or data folder or a folder inside or around
    them: ``inputs`` maps their option names to them); call it before the evaluation."""
    check_output(directory, "report", REPORT, inputs)


def write_report(
    report: Report, directory: str | Path, inputs: Mapping[str, str | Path] | None = None
) -> Path:
    """Publish ``report.html``, its PNGs and the ``report.json`` marker as the folder
    ``directory``, all or nothing (built in a staging folder beside it, then renamed), after
    :func:`check_report_dir`; returns the HTML file's path."""
    check_report_dir(directory, inputs)
    directory = storage.local_path(directory, "report")  # a file:// URL names a local folder
    staged = atomic.staging_dir(directory)
    try:
        marker = {"format": REPORT.format, "files": [REPORT_FILE, *sorted(report.images)]}
        (staged / REPORT.marker).write_text(json.dumps(marker, indent=2) + "\n")
        (staged / REPORT_FILE).write_text(report.html, encoding="utf-8")
        for name, png in report.images.items():
            (staged / name).write_bytes(png)
        final = atomic.publish_dir(staged, directory)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return final / REPORT_FILE
