"""The format IDs written into every record kubetrain publishes are part of the on-disk
contract: a folder written by an earlier version must still be read (resume, collect, promote,
the output rule). Moving modules must never change them, so they are pinned here."""

from __future__ import annotations

from kubetrain.artifacts import checkpoint_manifest, datasets, export, model_card, output_rule
from kubetrain.components.promote_model import promote

PINNED = {
    "dataset": (datasets.FORMAT, "kubetrain.dataset/v1"),
    "checkpoint": (checkpoint_manifest.FORMAT, "kubetrain.checkpoint/v1"),
    "model card": (model_card.MODEL_FORMAT, "kubetrain.model/v1"),
    "export": (export.EXPORT_FORMAT, "kubetrain.export/v1"),
    "promoted pointer": (promote.POINTER_FORMAT, "kubetrain.promoted/v1"),
    "output rule: dataset": (output_rule.DATASET.format, "kubetrain.dataset/v1"),
    "output rule: report": (output_rule.REPORT.format, "kubetrain.report/v1"),
}


def test_format_ids_are_unchanged() -> None:
    changed = {what: now for what, (now, pinned) in PINNED.items() if now != pinned}
    assert changed == {}
