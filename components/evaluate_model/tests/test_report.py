"""The evaluation report: one HTML page with embedded PNG charts and the model card, published
whole by the CLI and as the KFP component's HTML artifact."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from kubetrain.components.evaluate_model.evaluate import Gate
from kubetrain.components.evaluate_model.report import (
    CONFUSION_FILE,
    CURVES_FILE,
    DPI,
    STEPS_FILE,
    Verdict,
    accuracy_verdict,
    build_report,
    confusion_matrix_figure,
    metrics_report,
    moving_average,
    moving_rate,
    normalized_rows,
    training_curves_figure,
    training_steps_figure,
    write_report,
)

IMG = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
SHA = "ab" * 32


def synthetic_card(epochs: int = 3) -> dict:
    return {
        "format": "kubetrain.model/v1",
        "epoch": epochs,
        "step": 10 * epochs,
        "world_size": 4,
        "strategy": "fsdp",
        "model": {"spec": "cnn", "sample_shape": [1, 8, 8], "num_classes": 3},
        "metrics": [
            {
                "epoch": e,
                "step": 10 * e,
                "train_loss": 1.0 / e,
                "test_loss": 1.2 / e,
                "train_accuracy": 1 - 0.5 / e,
                "test_accuracy": 1 - 0.6 / e,
                "samples_per_second": 1000.0,
            }
            for e in range(1, epochs + 1)
        ],
        "sha256": SHA,
        "source_checkpoint": "/ckpt/epoch-000003",
    }


def synthetic_evaluation(classes: list[str]) -> dict:
    n = len(classes)
    return {
        "accuracy": 0.9,
        "loss": 0.3,
        "classes": classes,
        "precision": [0.9] * n,
        "recall": [0.8] * n,
        "confusion_matrix": [[5 if i == j else 1 for j in range(n)] for i in range(n)],
        "samples": 5 * n + n * (n - 1),
        "threshold": 0.95,
        "passed": False,
    }


def embedded_pngs(page: str) -> list[np.ndarray]:
    return [imread(io.BytesIO(base64.b64decode(data)), format="png") for data in IMG.findall(page)]


def test_page_embeds_valid_pngs_and_the_model_card():
    report = build_report(
        synthetic_card(), synthetic_evaluation(["a", "b", "c"]), {"source": "sklearn:digits"}
    )
    images = embedded_pngs(report.html)
    assert len(images) == 2
    for image in images:
        height, width = image.shape[:2]
        assert 200 <= height <= 2000 and 300 <= width <= 2000
    assert sorted(report.images) == ["confusion_matrix.png", "training_curves.png"]
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") for png in report.images.values())
    card_table = report.html.split("<h2>Model card</h2>", 1)[1]
    for expected in (SHA, "fsdp", "sklearn:digits", "cnn", "1 x 8 x 8", "world size"):
        assert expected in card_table
    assert '<p class="verdict failed">failed: accuracy 0.9000 &lt; threshold 0.9500</p>' in (
        report.html
    )


def test_text_is_escaped():
    evil = "<script>alert(1)</script>"
    evaluation = synthetic_evaluation([evil, "b&c", '"q"'])
    report = build_report(synthetic_card(), evaluation, {"source": evil})
    assert "<script>" not in report.html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in report.html
    assert "b&amp;c" in report.html and "&quot;q&quot;" in report.html


def test_a_card_without_per_epoch_metrics_still_gets_both_charts():
    card = {**synthetic_card(), "metrics": []}
    report = build_report(card, synthetic_evaluation([str(i) for i in range(30)]), {})
    assert len(embedded_pngs(report.html)) == 2
    assert "unknown" in report.html  # no dataset source


def test_write_report_publishes_the_folder_whole(tmp_path):
    report = build_report(synthetic_card(), synthetic_evaluation(["a", "b"]), {"source": "x"})
    html = write_report(report, tmp_path / "report")
    assert html == tmp_path / "report" / "report.html"
    assert sorted(p.name for p in html.parent.iterdir()) == [
        "confusion_matrix.png",
        "report.html",
        "report.json",
        "training_curves.png",
    ]
    assert (html.parent / "training_curves.png").read_bytes() == report.images[
        "training_curves.png"
    ]
    write_report(report, tmp_path / "report")  # replaces an earlier report
    assert [p.name for p in tmp_path.iterdir()] == ["report"], "no staging folder is left"


def test_a_failed_write_leaves_no_report(tmp_path, monkeypatch):
    report = build_report(synthetic_card(), synthetic_evaluation(["a", "b"]), {"source": "x"})

    def broken(self: Path, data: bytes) -> int:
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_bytes", broken)
    with pytest.raises(OSError, match="disk full"):
        write_report(report, tmp_path / "report")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ what an ML engineer reads
HYPERPARAMETERS = {
    "model": "cnn",
    "dataset": "/data/digits",
    "strategy": "ddp",
    "optimizer": "adamw",
    "lr": 0.0003,
    "batch_size": 64,
    "grad_accum_steps": 2,
    "clip_grad_norm": 1.0,
    "epochs": 4,
    "seed": 1234,
    "nodes": 2,
    "procs_per_node": 4,
    "world_size": 8,
}


def recorded_card(epochs: int = 4, steps_per_epoch: int = 50) -> dict:
    """A card with what the trainer records since issue 18: per-epoch validation metrics, the
    per-step ``history``, the ``hyperparameters`` and the ``run``."""
    card = synthetic_card(epochs)
    card["metrics"] = [
        {
            "epoch": e,
            "step": steps_per_epoch * e,
            "train_loss": 1.0 / e,
            "validation_loss": 1.2 / e,
            "train_accuracy": 1 - 0.5 / e,
            "validation_accuracy": 1 - 0.6 / e,
            "samples_per_second": 1000.0,
        }
        for e in range(1, epochs + 1)
    ]
    rng = np.random.default_rng(0)
    card["history"] = [
        {
            "step": step,
            "epoch": (step - 1) // steps_per_epoch + 1,
            "loss": float(2.0 / step**0.5 + rng.normal(0, 0.05)),
            "samples_per_second": float(900 + rng.normal(0, 30)),
        }
        for step in range(1, epochs * steps_per_epoch + 1)
    ]
    card["hyperparameters"] = dict(HYPERPARAMETERS)
    card["run"] = {
        "job": "digits-ddp-7f3a",
        "started_at": "2026-11-25T07:08:00+00:00",
        "updated_at": "2026-11-25T07:10:05+00:00",
        "seconds": 125.4,
    }
    return card


EVALUATED = {"accuracy": 0.97, "loss": 0.1}


def passing(classes: list[str]) -> dict:
    return {**synthetic_evaluation(classes), "accuracy": 0.97, "passed": True}


def test_every_embedded_image_decodes_and_is_a_drawing():
    """Each PNG of the page decodes, has a readable size and is no blank canvas."""
    report = build_report(recorded_card(), passing([str(i) for i in range(10)]), {"source": "x"})
    images = embedded_pngs(report.html)
    assert len(images) == 3
    assert sorted(report.images) == [CONFUSION_FILE, CURVES_FILE, STEPS_FILE]
    for image in images:
        height, width = image.shape[:2]
        assert 300 <= height <= 2000 and 500 <= width <= 2000
        pixels = image[..., :3].reshape(-1, 3)
        assert pixels.std() > 0.05, "a blank image"
        colours = np.unique(pixels[::7].round(2), axis=0)
        assert len(colours) > 20, "too few colours for a chart"


def test_the_page_is_self_contained():
    page = build_report(recorded_card(), passing(["a", "b"]), {"source": "x"}).html
    assert not re.findall(r'(?:src|href)="(?!data:)', page)
    assert "http://" not in page and "https://" not in page


def test_the_verdict_leads_the_page_in_green_or_red():
    passed = build_report(recorded_card(), passing(["a", "b"]), {}).html
    failed = build_report(recorded_card(), synthetic_evaluation(["a", "b"]), {}).html
    head = passed.split("<h2>", 1)[0]
    assert '<p class="verdict passed">passed: accuracy 0.9700 ≥ threshold 0.9500</p>' in head
    assert (
        '<p class="verdict failed">failed: accuracy 0.9000 &lt; threshold 0.9500</p>'
        in (failed.split("<h2>", 1)[0])
    )
    assert ".verdict.passed { background: #1a7f37; }" in passed
    assert ".verdict.failed { background: #cf222e; }" in passed
    assert "<title>kubetrain model report: digits-ddp-7f3a: passed (accuracy 0.970)</title>" in (
        passed
    )


def test_a_loss_gate_is_the_verdict_and_its_line_is_on_the_loss_chart():
    verdict = Verdict.of(Gate("loss", below=0.2), {"accuracy": 0.97, "loss": 0.3})
    assert verdict.line() == "failed: loss 0.3000 ≥ bound 0.2000"
    figure = training_curves_figure(recorded_card()["metrics"], verdict, EVALUATED)
    loss_axes, accuracy_axes = figure.axes
    assert [line.get_label() for line in loss_axes.get_lines()][-1] == "bound 0.2"
    assert all(
        not line.get_label().startswith(("bound", "threshold"))
        for line in (accuracy_axes.get_lines())
    )


def test_every_chart_has_axis_labels_and_the_accuracy_chart_the_threshold():
    card = recorded_card()
    verdict = accuracy_verdict(passing(["a"]))
    figures = [
        training_curves_figure(card["metrics"], verdict, EVALUATED),
        training_steps_figure(card["history"]),
        confusion_matrix_figure(["a", "b"], [[3, 1], [0, 4]]),
    ]
    for figure in figures:
        for axes in figure.axes:
            if axes.get_label() == "<colorbar>":
                assert axes.get_ylabel(), "the colour scale is labelled"
                continue
            assert axes.get_xlabel() and axes.get_ylabel(), axes.get_title()
    accuracy_axes = figures[0].axes[1]
    threshold = [line for line in accuracy_axes.get_lines() if line.get_label() == "threshold 0.95"]
    assert len(threshold) == 1 and list(threshold[0].get_ydata()) == [0.95, 0.95]
    labels = [line.get_label() for line in accuracy_axes.get_lines()]
    assert labels == ["train", "validation", "test (evaluate) 0.970", "threshold 0.95"]
    star = accuracy_axes.get_lines()[2]
    assert list(star.get_xdata()) == [4] and list(star.get_ydata()) == [0.97], "at the last epoch"


def test_rows_are_normalised_so_that_errors_show_whatever_the_class_size():
    matrix = [[90, 10, 0], [1, 1, 0], [0, 0, 0]]
    rows = normalized_rows(matrix)
    assert rows[0] == pytest.approx([0.9, 0.1, 0.0]) and rows[1] == pytest.approx([0.5, 0.5, 0])
    assert rows[2] == [0.0, 0.0, 0.0], "a class absent from the split stays zeros"
    figure = confusion_matrix_figure(["a", "b", "c"], matrix)
    plotted = figure.axes[0].get_images()[0].get_array()
    assert plotted.sum(axis=1).tolist() == pytest.approx([1.0, 1.0, 0.0])


def test_ten_classes_are_legible_and_their_counts_kept():
    classes = [str(i) for i in range(10)]
    evaluation = passing(classes)
    figure = confusion_matrix_figure(classes, evaluation["confusion_matrix"])
    width, height = figure.get_size_inches() * DPI
    assert width >= 700 and height >= 600
    texts = figure.axes[0].texts
    assert len(texts) == 100 and min(text.get_fontsize() for text in texts) >= 10
    assert {text.get_text() for text in texts} == {"36%", "7%"}  # 5 of 14, 1 of 14
    page = build_report(recorded_card(), evaluation, {}).html
    counts = page.split('<table class="counts">', 1)[1].split("</table>", 1)[0]
    assert counts.count("<tr>") == 11 and counts.count("<td>5</td>") == 10


def test_rare_errors_are_not_rounded_away():
    figure = confusion_matrix_figure(["a", "b"], [[999, 1], [0, 10]])
    assert [text.get_text() for text in figure.axes[0].texts] == ["100%", "<1%", "", "100%"]


def test_the_run_and_its_hyperparameters_appear():
    page = build_report(recorded_card(), passing(["a", "b"]), {}).html
    run = page.split("<h2>Run</h2>", 1)[1].split("<h2>", 1)[0]
    for expected in (
        "<th>run</th><td>digits-ddp-7f3a</td>",
        "<th>started</th><td>2026-11-25 07:08 UTC</td>",
        "<th>finished</th><td>2026-11-25 07:10 UTC</td>",
        "2 min 05 s",
    ):
        assert expected in run, run
    table = page.split("<h2>Hyperparameters</h2>", 1)[1].split("<h2>", 1)[0]
    for key in ("lr", "batch_size", "optimizer", "seed", "grad_accum_steps", "clip_grad_norm"):
        assert f"<th>{key}</th>" in table
    for value in ("0.0003", "64", "adamw", "1234", "/data/digits", "2 × 4 (world size 8)"):
        assert f"<td>{value}</td>" in table


def test_per_step_curves_plot_the_history():
    figure = training_steps_figure(recorded_card(epochs=2, steps_per_epoch=100)["history"])
    loss_axes, rate_axes = figure.axes
    raw, mean = loss_axes.get_lines()
    assert list(raw.get_xdata()) == list(range(1, 201)) and mean.get_label() == "mean of 8 steps"
    assert len(mean.get_xdata()) == len(mean.get_ydata()) == 193
    raw_rate, mean_rate = rate_axes.get_lines()
    assert len(raw_rate.get_xdata()) == 200 and len(mean_rate.get_xdata()) == 193
    assert rate_axes.get_ylim()[1] == pytest.approx(1.5 * max(mean_rate.get_ydata()))
    assert moving_average([1.0, 2.0, 3.0, 4.0], 2) == [1.5, 2.5, 3.5]


def test_throughput_is_averaged_as_samples_over_seconds():
    """Two steps of 100 samples, 1 s and 0.001 s: 200 samples in 1.001 s, not 50,050/s."""
    assert moving_rate([100.0, 100_000.0], 2) == pytest.approx([200 / 1.001])


def test_a_few_steps_are_drawn_one_point_each():
    history = [{"step": s, "loss": 1.0 / s, "samples_per_second": 50.0} for s in range(1, 6)]
    loss_axes, rate_axes = training_steps_figure(history).axes
    assert [len(axes.get_lines()) for axes in (loss_axes, rate_axes)] == [1, 1]
    assert training_steps_figure([{"step": 1, "samples_per_second": 0.0}]) is None


def test_a_card_from_before_the_records_renders_with_what_it_has():
    """An older model (test_* epoch keys, no history, hyperparameters or run) still renders:
    the missing sections say so, its epochs are labelled test, the run is the folder's name."""
    card = synthetic_card()
    report = build_report(card, passing(["a", "b"]), {}, name="my-model")
    assert sorted(report.images) == [CONFUSION_FILE, CURVES_FILE]
    assert all(image.std() > 0.05 for image in embedded_pngs(report.html))
    page = report.html
    assert "hyperparameters: not recorded." in page
    assert "per-step loss and throughput: not recorded." in page
    assert "<title>kubetrain model report: my-model: passed" in page
    assert "(evaluated; the card records no run)" in page and "<td>not recorded</td>" in page
    figure = training_curves_figure(card["metrics"], accuracy_verdict(passing(["a"])), EVALUATED)
    assert [line.get_label() for line in figure.axes[1].get_lines()] == [
        "train",
        "test",
        "test (evaluate) 0.970",
        "threshold 0.95",
    ]
    epochs = page.split("<h2>Per epoch</h2>", 1)[1]
    assert "<th>test_accuracy</th>" in epochs and "validation" not in epochs


def test_malformed_records_in_a_card_are_left_out_not_a_crash():
    """The card is covered by no digest: whatever its new keys hold, the page renders."""
    card = {
        **synthetic_card(),
        "history": [
            {"step": 1, "loss": float("nan")},
            "junk",
            {"step": True, "loss": 1.0},
            {"step": 2, "loss": "1.0"},
        ],
        "hyperparameters": ["lr", 0.1],
        "run": {"job": 7, "updated_at": "yesterday", "seconds": -3},
    }
    report = build_report(card, passing(["a", "b"]), {}, name="folder")
    assert STEPS_FILE not in report.images
    assert "hyperparameters: not recorded." in report.html
    assert "kubetrain model report: folder:" in report.html
    for broken in ({**card, "history": "junk", "run": "junk", "metrics": "junk"}, {}):
        build_report(broken, passing(["a"]), {})
    # times that overflow when shown in UTC, and a duration no run takes, are not recorded
    for updated_at in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"):
        odd = {
            **card,
            "run": {"updated_at": updated_at, "started_at": updated_at, "seconds": 1e300},
        }
        page = build_report(odd, passing(["a"]), {}).html
        assert "0001-01-01" not in page and "9999-12-31" not in page


def test_your_programs_report_carries_the_verdict_and_the_run():
    gate = Gate("f1", 0.8)
    page = metrics_report(recorded_card(), {"f1": 0.75}, Verdict.of(gate, {"f1": 0.75})).html
    assert '<p class="verdict failed">failed: f1 0.7500 &lt; threshold 0.8000</p>' in page
    assert "digits-ddp-7f3a" in page and "<td>adamw</td>" in page
