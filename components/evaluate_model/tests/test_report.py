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

from kubetrain.components.evaluate_model.report import build_report, write_report

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
    assert "below threshold" in report.html


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
