"""The evaluation report people look at: one self-contained HTML page built from the model card
and the evaluation results: the verdict, the run (name, date, duration, hyperparameters), the
training curves per epoch and per step, and the confusion matrix, the charts as PNG images.

The images are embedded as ``data:`` URIs so the single file renders in the KFP UI (an ``HTML``
artifact) and anywhere else it is copied; :func:`write_report` also writes them as files, and
a ``report.json`` marker recording each file's sha256, by which a later report knows the
folder as one it may replace. Charts are drawn on Agg canvases owned by this module, never
through pyplot's global state, so reports can be built in any thread or process without a
display.

The card's ``history``, ``hyperparameters`` and ``run`` are recorded by the trainer since
kubetrain's issue 18; older models and your own checkpoints have none, and no digest covers
the card, so every value read from it is checked here and a section without one says so.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubetrain import storage
from kubetrain.artifacts.output_rule import REPORT, CheckedOutput, check_output
from kubetrain.artifacts.publish import publish_verified

if TYPE_CHECKING:
    from kubetrain.components.evaluate_model.evaluate import Gate

REPORT_FILE = "report.html"
CURVES_FILE = "training_curves.png"
STEPS_FILE = "training_steps.png"
CONFUSION_FILE = "confusion_matrix.png"
#: The split each epoch was scored on: ``validation`` (datasets prepared with one), else
#: ``test`` (datasets prepared before it existed).
EPOCH_SPLITS = ("validation", "test")
#: Each split's line on the per-epoch charts: fixed, so that no split takes the gate line's
#: green or red.
SPLIT_STYLE = {
    "train": {"color": "tab:blue"},
    "validation": {"color": "tab:orange"},
    "test": {"color": "tab:purple"},
}
#: Columns of the per-epoch table; those no epoch recorded are left out.
EPOCH_COLUMNS = (
    "epoch", "train_loss", "validation_loss", "test_loss",
    "train_accuracy", "validation_accuracy", "test_accuracy", "samples_per_second",
)  # fmt: skip
#: The trainer's ``hyperparameters``, in the order the table shows them.
HYPERPARAMETERS = (
    "model", "dataset", "strategy", "optimizer", "lr", "batch_size", "grad_accum_steps",
    "clip_grad_norm", "epochs", "seed", "nodes", "procs_per_node", "world_size",
)  # fmt: skip
#: Above this many classes the confusion matrix cells carry no number (they would be unreadable).
ANNOTATE_MAX_CLASSES = 20
#: Above this many classes the raw counts are no table on the page (they stay in the metrics).
COUNTS_TABLE_MAX_CLASSES = 50
#: The per-step curves' means span this fraction of the run's steps (1/25), at least 1 step.
SMOOTHING = 25
NOT_RECORDED = "not recorded"
DPI = 100
#: Text properties for names the data gives (class names): drawn as written. matplotlib
#: otherwise reads ``$...$`` as mathtext (``$\textbf{B}$`` raised a parse error, ``$x$``
#: drew an italic x) and, with ``text.usetex`` set, hands the name to LaTeX.
PLAIN_TEXT = {"parse_math": False, "usetex": False}


@dataclass(frozen=True)
class Report:
    html: str
    images: dict[str, bytes]  # file name -> PNG, the same images the page embeds


@dataclass(frozen=True)
class Verdict:
    """The gate's outcome as the page shows it: ``metric`` was ``value``, passing when at least
    ``bound`` (a threshold) or, with ``below``, under it."""

    metric: str
    value: float
    bound: float
    below: bool
    passed: bool

    @classmethod
    def of(cls, gate: Gate, metrics: Mapping[str, float]) -> Verdict:
        below = gate.below is not None
        bound = gate.below if gate.below is not None else gate.threshold
        return cls(gate.metric, metrics[gate.metric], bound, below, gate.passes(dict(metrics)))

    @property
    def word(self) -> str:
        return "passed" if self.passed else "failed"

    def line(self) -> str:
        """E.g. ``failed: accuracy 0.9120 < threshold 0.9500``."""
        relation = "≥" if self.value >= self.bound else "<"
        name = "bound" if self.below else "threshold"
        return f"{self.word}: {self.metric} {self.value:.4f} {relation} {name} {self.bound:.4f}"


def accuracy_verdict(evaluation: Mapping[str, Any]) -> Verdict:
    """The default gate: the evaluation's accuracy against its threshold."""
    accuracy, threshold = float(evaluation["accuracy"]), float(evaluation["threshold"])
    return Verdict("accuracy", accuracy, threshold, below=False, passed=accuracy >= threshold)


def _number(value: Any) -> float | None:
    """A finite number read from the card, else None (the card is covered by no digest)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _records(value: Any) -> list[Mapping[str, Any]]:
    """The card's list of records (``metrics``, ``history``), its malformed entries left out."""
    return (
        [entry for entry in value if isinstance(entry, Mapping)] if isinstance(value, list) else []
    )


def _series(
    records: Sequence[Mapping[str, Any]], x: str, y: str
) -> tuple[list[float], list[float]]:
    """(x, y) of one recorded quantity, skipping records without both as finite numbers."""
    points = [(_number(entry.get(x)), _number(entry.get(y))) for entry in records]
    kept = [(a, b) for a, b in points if a is not None and b is not None]
    return [a for a, _ in kept], [b for _, b in kept]


def _png(figure: Any) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _not_recorded(axes: Any) -> None:
    axes.text(0.5, 0.5, NOT_RECORDED, ha="center", va="center", transform=axes.transAxes)


def training_curves_figure(
    metrics: Sequence[Mapping[str, Any]], verdict: Verdict, evaluated: Mapping[str, float]
) -> Any:
    """Loss and accuracy per epoch, train against the split each epoch was scored on
    (validation, or test for an older dataset), with the evaluation's score on the test split
    (``evaluated``: accuracy, loss) at the last epoch and the gate's line on the gated
    metric's chart, green when it passed, red when not."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(11, 4.2), layout="constrained")
    panels = (("loss", "cross-entropy loss"), ("accuracy", "accuracy (fraction correct)"))
    for axes, (metric, ylabel) in zip(figure.subplots(1, 2), panels, strict=True):
        last = None
        for split in ("train", *EPOCH_SPLITS):
            epochs, values = _series(metrics, "epoch", f"{split}_{metric}")
            if epochs:
                axes.plot(
                    epochs, values, marker="o", markersize=3, label=split, **SPLIT_STYLE[split]
                )
                last = max(epochs[-1], last or epochs[-1])
        axes.set(title=f"{metric} per epoch", xlabel="epoch", ylabel=ylabel)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(alpha=0.3)
        if last is None:
            _not_recorded(axes)
            continue
        axes.plot(
            [last], [evaluated[metric]], linestyle="none", marker="*", markersize=12,
            color="black", label=f"test (evaluate) {evaluated[metric]:.3f}",
        )  # fmt: skip
        if verdict.metric == metric:
            name = "bound" if verdict.below else "threshold"
            colour = "tab:green" if verdict.passed else "tab:red"
            axes.axhline(
                verdict.bound, color=colour, linestyle="--", label=f"{name} {verdict.bound:g}"
            )
        axes.legend()
    return figure


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """The mean of each ``window`` consecutive values (``len(values) - window + 1`` of them)."""
    import numpy as np

    kernel = np.ones(window) / window
    return np.convolve(np.asarray(values, dtype=np.float64), kernel, mode="valid").tolist()


def moving_rate(rates: Sequence[float], window: int) -> list[float]:
    """The throughput over each ``window`` consecutive steps: the harmonic mean of their rates,
    which is their samples over their seconds when the steps are of one size (the arithmetic
    mean is pulled up by the steps the host's clock timed as nearly instant). Rates are > 0."""
    return [1.0 / mean for mean in moving_average([1.0 / rate for rate in rates], window)]


def _smoothed(
    axes: Any, x: list[float], y: list[float], mean: list[float], window: int, colour: str
) -> None:
    """``y`` drawn faint under its ``window``-step mean ``mean`` (one point per step if 1)."""
    if window == 1:
        axes.plot(x, y, color=colour, marker=".", linewidth=1.0)
        return
    axes.plot(x, y, color=colour, alpha=0.3, linewidth=0.8, label="per step")
    axes.plot(x[window - 1 :], mean, color=colour, label=f"mean of {window} steps")
    axes.legend()


def training_steps_figure(history: Sequence[Mapping[str, Any]]) -> Any:
    """Training loss and throughput per optimizer step (the card's ``history``: rank 0's mean
    loss over each step, the job's samples/s), or None when the card records no steps.

    Single steps are noisy (small batches; on a GPU the host's clock runs ahead of the device),
    so each series is drawn faint under its mean over :data:`SMOOTHING` of the run, and the
    throughput axis stops at 1.5 times the highest mean: the spikes of steps timed as
    nearly instant run off the chart instead of flattening it."""
    from matplotlib.figure import Figure

    steps, losses = _series(history, "step", "loss")
    rate_steps, rates = _series(history, "step", "samples_per_second")
    kept = [(step, rate) for step, rate in zip(rate_steps, rates, strict=True) if rate > 0]
    rate_steps, rates = [step for step, _ in kept], [rate for _, rate in kept]
    if not steps and not rate_steps:
        return None
    figure = Figure(figsize=(11, 4.2), layout="constrained")
    loss_axes, rate_axes = figure.subplots(1, 2)
    loss_axes.set(title="training loss per step", xlabel="optimizer step", ylabel="loss (rank 0)")
    rate_axes.set(title="throughput per step", xlabel="optimizer step", ylabel="samples/s (job)")
    if steps:
        window = max(1, len(losses) // SMOOTHING)
        _smoothed(loss_axes, steps, losses, moving_average(losses, window), window, "tab:blue")
    if rate_steps:
        window = max(1, len(rates) // SMOOTHING)
        means = moving_rate(rates, window)
        _smoothed(rate_axes, rate_steps, rates, means, window, "tab:orange")
        rate_axes.set_ylim(bottom=0, top=1.5 * max(means) if window > 1 else None)
    for axes in (loss_axes, rate_axes):
        axes.grid(alpha=0.3)
        if not axes.has_data():
            _not_recorded(axes)
    return figure


def normalized_rows(matrix: Sequence[Sequence[int]]) -> list[list[float]]:
    """Each true class's row as fractions of its samples (each sums to 1), so a class's errors
    show whatever its size; a class absent from the split keeps a row of zeros."""
    rows = []
    for row in matrix:
        total = sum(row)
        rows.append([count / total if total else 0.0 for count in row])
    return rows


def _percent(fraction: float) -> str:
    """A cell's text: blank for none, ``<1%`` for an error too rare to round to a percent."""
    if fraction == 0:
        return ""
    return "<1%" if fraction < 0.005 else f"{fraction:.0%}"


def confusion_matrix_figure(classes: Sequence[str], matrix: Sequence[Sequence[int]]) -> Any:
    """True (rows) against predicted (columns) classes, each row normalised to 1, on a
    square-root colour scale so that an error of a few percent is visible beside a diagonal
    near 1; cells carry their percentage up to :data:`ANNOTATE_MAX_CLASSES` classes."""
    from matplotlib.colors import PowerNorm
    from matplotlib.figure import Figure

    count = len(classes)
    side = min(max(5.0, 0.6 * count + 2.5), 14.0)
    figure = Figure(figsize=(side + 1.2, side), layout="constrained")
    axes = figure.subplots()
    fractions = normalized_rows(matrix)
    norm = PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)
    image = axes.imshow(fractions, cmap="Blues", norm=norm)
    bar = figure.colorbar(image, ax=axes, shrink=0.8)
    bar.set_label("fraction of the true class (square-root scale)")
    axes.set(
        title="confusion matrix, rows normalised",
        xlabel="predicted class",
        ylabel="true class",
        xticks=range(count),
        yticks=range(count),
    )
    long_names = count > 10 or any(len(str(name)) > 4 for name in classes)
    axes.set_xticklabels(classes, rotation=90 if long_names else 0, **PLAIN_TEXT)
    axes.set_yticklabels(classes, **PLAIN_TEXT)
    if count <= ANNOTATE_MAX_CLASSES:
        size = 11 if count <= 12 else 9
        for i, row in enumerate(fractions):
            for j, fraction in enumerate(row):
                colour = "white" if norm(fraction) > 0.6 else "black"
                text = _percent(fraction)
                axes.text(j, i, text, ha="center", va="center", color=colour, fontsize=size)
    return figure


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, list | tuple):
        return " x ".join(map(str, value))
    return str(value)


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str] = (), css: str = "") -> str:
    def cells(tag: str, values: Sequence[Any]) -> str:
        return "".join(f"<{tag}>{html.escape(_text(v))}</{tag}>" for v in values)

    head = f"<thead><tr>{cells('th', header)}</tr></thead>" if header else ""
    body = "".join(f"<tr>{cells('th', row[:1])}{cells('td', row[1:])}</tr>" for row in rows)
    opening = f'<table class="{css}">' if css else "<table>"
    return f"{opening}{head}<tbody>{body}</tbody></table>"


def _image(name: str, png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'
        f"<figcaption>{html.escape(name)}</figcaption></figure>"
    )


def _missing(what: str) -> str:
    return f'<p class="missing">{html.escape(what)}: {NOT_RECORDED}.</p>'


#: A training time above this (30 years) is a hand-edited card, not a run: not shown.
MAX_RECORDED_SECONDS = 1e9


def _duration(seconds: float) -> str:
    """``42.1 s``, ``3 min 07 s``, ``2 h 05 min 09 s``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min {secs:02d} s" if hours else f"{minutes} min {secs:02d} s"


def _date(text: Any) -> str | None:
    """An ISO-8601 time from the card, shown in UTC to the minute; None if it is none (or
    absent: ``None``)."""
    try:
        moment = datetime.fromisoformat(str(text))
        if moment.tzinfo is not None:
            moment = moment.astimezone(timezone.utc)  # overflows at year 1 or 9999
    except (ValueError, OverflowError):
        return None
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def run_rows(card: Mapping[str, Any], name: str) -> list[tuple[str, str]]:
    """The run's name (the card's ``run.job``, else ``name``: the model folder's), when it
    started and finished (``run.started_at``; ``run.updated_at``, the last checkpoint's save,
    else a date that is now, the evaluation's) and its training time."""
    run = card.get("run") if isinstance(card.get("run"), Mapping) else {}
    job = run.get("job") if isinstance(run.get("job"), str) and run.get("job") else None
    trained, started = _date(run.get("updated_at")), _date(run.get("started_at"))
    seconds = _number(run.get("seconds"))
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return [
        ("run", job or name or "unknown"),
        *((("started", started),) if started else ()),
        (
            ("finished", trained)
            if trained
            else ("date", f"{now} (evaluated; the card records no run)")
        ),
        (
            "training time",
            _duration(seconds)
            if seconds is not None and 0 <= seconds < MAX_RECORDED_SECONDS
            else NOT_RECORDED,
        ),
    ]


def _hyperparameter(value: Any) -> str:
    """Floats as written (``0.0003``, ``1e-05``), not rounded to the tables' 4 decimals."""
    return f"{value:g}" if isinstance(value, float) else _text(value)


def hyperparameter_rows(card: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The card's ``hyperparameters`` in :data:`HYPERPARAMETERS` order (then any others), with
    nodes × processes per node on one row; empty when the card records none."""
    recorded = card.get("hyperparameters")
    if not isinstance(recorded, Mapping) or not recorded:
        return []
    values = dict(recorded)
    layout = ("nodes", "procs_per_node", "world_size")
    rows = []
    for key in (*HYPERPARAMETERS, *sorted(set(values) - set(HYPERPARAMETERS))):
        if key not in values or key in layout:
            continue
        rows.append((key, _hyperparameter(values[key])))
    if all(key in values for key in layout):
        shown = (
            f"{values['nodes']} × {values['procs_per_node']} (world size {values['world_size']})"
        )
        rows.append(("nodes × processes per node", shown))
    else:
        rows += [(key, _hyperparameter(values[key])) for key in layout if key in values]
    return rows


def model_card_rows(card: Mapping[str, Any], dataset: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """What identifies the model: where its data came from, how it was trained, its digest."""
    spec = card.get("model", {})
    final = (_records(card.get("metrics")) or [{}])[-1]
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


def epoch_rows(metrics: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """The per-epoch table: the :data:`EPOCH_COLUMNS` some epoch recorded, and its rows."""
    columns = [key for key in EPOCH_COLUMNS if any(key in entry for entry in metrics)]
    return columns, [[entry.get(key, "") for key in columns] for entry in metrics]


def report_title(card: Mapping[str, Any], name: str, verdict: Verdict) -> str:
    """E.g. ``kubetrain model report: digits-ddp: passed (accuracy 0.969)``."""
    run_name = run_rows(card, name)[0][1]
    outcome = f"{verdict.word} ({verdict.metric} {verdict.value:.3f})"
    return f"kubetrain model report: {run_name}: {outcome}"


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1200px; }
table { border-collapse: collapse; margin-bottom: 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
td { font-family: ui-monospace, monospace; }
table.counts td { text-align: right; }
img { max-width: 100%; }
.verdict { font-size: 1.4em; font-weight: bold; padding: 0.5em 0.8em; border-radius: 6px;
  color: #fff; display: inline-block; }
.verdict.passed { background: #1a7f37; }
.verdict.failed { background: #cf222e; }
.missing { color: #666; font-style: italic; }
"""


def _page(title: str, verdict: Verdict, body: str) -> str:
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="verdict {verdict.word}">{html.escape(verdict.line())}</p>
{body}
</body></html>
"""


def _run_sections(card: Mapping[str, Any], name: str) -> str:
    hyperparameters = hyperparameter_rows(card)
    return f"<h2>Run</h2>\n{_table(run_rows(card, name))}\n<h2>Hyperparameters</h2>\n" + (
        _table(hyperparameters) if hyperparameters else _missing("hyperparameters")
    )


def build_report(
    card: Mapping[str, Any],
    evaluation: Mapping[str, Any],
    dataset: Mapping[str, Any],
    verdict: Verdict | None = None,
    name: str = "",
) -> Report:
    """The page for ``card`` (``model.json``), ``evaluation`` (the metrics the evaluate step
    writes) and ``dataset`` (the evaluated dataset's manifest). ``verdict``: the gate's outcome
    (default: accuracy against the evaluation's threshold); ``name``: the run's name when the
    card records none (the model folder's)."""
    verdict = verdict or accuracy_verdict(evaluation)
    evaluated = {"accuracy": float(evaluation["accuracy"]), "loss": float(evaluation["loss"])}
    metrics = _records(card.get("metrics"))
    classes, matrix = evaluation["classes"], evaluation["confusion_matrix"]
    images = {
        CURVES_FILE: _png(training_curves_figure(metrics, verdict, evaluated)),
        CONFUSION_FILE: _png(confusion_matrix_figure(classes, matrix)),
    }
    steps = training_steps_figure(_records(card.get("history")))
    if steps is not None:
        images[STEPS_FILE] = _png(steps)
    summary = [
        ("accuracy", evaluation["accuracy"]),
        ("loss", evaluation["loss"]),
        ("test samples", evaluation["samples"]),
        ("verdict", verdict.line()),
    ]
    per_class = zip(classes, evaluation["precision"], evaluation["recall"], strict=True)
    if len(classes) <= COUNTS_TABLE_MAX_CLASSES:
        counts = _table(
            [[label, *row] for label, row in zip(classes, matrix, strict=True)],
            ("true \\ predicted", *classes),
            css="counts",
        )
    else:
        counts = f"<p>{len(classes)} classes: the counts are in the metrics JSON.</p>"
    steps_view = (
        _image(STEPS_FILE, images[STEPS_FILE], "training loss and throughput per optimizer step")
        if STEPS_FILE in images
        else _missing("per-step loss and throughput")
    )
    columns, epochs = epoch_rows(metrics)
    title = report_title(card, name, verdict)
    body = f"""<h2>Evaluation on the test split</h2>
{_table(summary)}
{_run_sections(card, name)}
<h2>Training curves per epoch</h2>
{_image(CURVES_FILE, images[CURVES_FILE], "loss and accuracy per epoch")}
<h2>Training per step</h2>
{steps_view}
<h2>Confusion matrix</h2>
{_image(CONFUSION_FILE, images[CONFUSION_FILE], "test split, rows normalised")}
<h3>Counts (rows: true class, columns: predicted)</h3>
{counts}
<h2>Per class</h2>
{_table(list(per_class), ("class", "precision", "recall"))}
<h2>Model card</h2>
{_table(model_card_rows(card, dataset))}
<h2>Per epoch</h2>
{_table(epochs, columns) if epochs else _missing("per-epoch metrics")}"""
    return Report(html=_page(title, verdict, body), images=images)


def metrics_report(
    card: Mapping[str, Any], metrics: Mapping[str, float], verdict: Verdict, name: str = ""
) -> Report:
    """The page for a model your own evaluation program scored: the verdict, its metrics, the
    run and the model card (no charts: the curves and confusion matrix are our evaluation's)."""
    title = report_title(card, name, verdict)
    body = f"""<h2>Metrics (your evaluation program)</h2>
{_table(sorted(metrics.items()), ("metric", "value"))}
{_run_sections(card, name)}
<h2>Model card</h2>
{_table(model_card_rows(card, {}))}"""
    return Report(html=_page(title, verdict, body), images={})


def check_report_dir(
    directory: str | Path, inputs: Mapping[str, str | Path] | None = None
) -> CheckedOutput:
    """Refuse a report folder the one output rule forbids (an existing file, a folder with
    content that is no earlier report, the model or data folder or a folder inside or around
    them: ``inputs`` maps their option names to them); call it before the evaluation."""
    return check_output(directory, "report", REPORT, inputs)


def write_report(
    report: Report, directory: str | Path, inputs: Mapping[str, str | Path] | None = None
) -> Path:
    """Publish ``report.html``, its PNGs and the ``report.json`` marker (which records each
    file's sha256) as the folder ``directory``, all or nothing (built in a staging folder
    beside it, then renamed) by the one road
    (:func:`kubetrain.artifacts.publish.publish_verified`), after :func:`check_report_dir`;
    returns the HTML file's path."""
    output = check_report_dir(directory, inputs)
    directory = storage.local_path(directory, "report")  # a file:// URL names a local folder
    contents = {REPORT_FILE: report.html.encode("utf-8"), **report.images}
    written = {name: hashlib.sha256(data).hexdigest() for name, data in contents.items()}
    staged = storage.staging_dir(directory)
    try:
        marker = {
            "format": REPORT.format,
            "files": [REPORT_FILE, *sorted(report.images)],
            "sha256": written,
        }
        (staged / REPORT.marker).write_text(json.dumps(marker, indent=2) + "\n")
        for name, data in contents.items():
            (staged / name).write_bytes(data)
        publish_verified(staged, output, written)
    except BaseException:
        storage.discard_staging(staged)
        raise
    return directory / REPORT_FILE
