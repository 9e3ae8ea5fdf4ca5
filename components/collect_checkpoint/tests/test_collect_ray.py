"""Issue 31 (5): collect takes a Ray Train script's checkpoint from the run's storage folder as
Ray 2.60 writes it (``checkpoint_<time>/`` folders and ``checkpoint_manager_snapshot.json``,
``ray/train/v2/_internal/execution/checkpoint/checkpoint_manager.py``): the newest by Ray's own
record (its ``latest_checkpoint_result``, what ``Result.from_path(...).checkpoint`` returns), never
a folder the record does not name (a report that did not finish). The record below is the shape
a real 2-worker ``TorchTrainer`` run of ray 2.60.0 wrote here (its metrics shortened)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from test_collect_formats import (
    STATE,
    assert_published,
    collect_cli,
    nothing_published,
    refused_in_one_line,
)

from kubetrain.artifacts.checkpoint_formats.ray_train import RAY_RECORD

FIRST, SECOND, UNRECORDED = (
    "checkpoint_2026-11-28_07-58-50.232524",
    "checkpoint_2026-11-28_07-58-50.260098",
    "checkpoint_2026-11-28_07-58-51.001234",
)


def shifted(by: float) -> dict[str, torch.Tensor]:
    """STATE with every floating tensor moved by ``by``: each checkpoint its own weights."""
    return {k: v + by if v.is_floating_point() else v.clone() for k, v in STATE.items()}


def ray_record(reported: list[str], latest: str | None) -> dict:
    """``checkpoint_manager_snapshot.json`` as CheckpointManager._save_state writes it."""

    def result(name: str) -> dict:
        return {"version": 0, "checkpoint_dir_name": name, "metrics": {"loss": 0.1}}

    return {
        "ray_version": "2.60.0",
        "checkpoint_results": [result(name) for name in reported],
        "checkpoint_report_indices": list(range(len(reported))),
        "latest_checkpoint_result": result(latest) if latest else None,
        "pending_training_results": [],
        "pending_validation_specs": [],
        "current_report_index": len(reported),
        "validated_checkpoint_dir_names": [],
        "timed_out_validation_checkpoint_dir_names": [],
        "failed_validation_checkpoint_dir_names": [],
    }


def ray_run(
    root: Path, checkpoints: dict[str, dict[str, torch.Tensor]], record: dict | str | None
) -> Path:
    """A run's storage folder (``<storage_path>/<run name>``): each checkpoint's ``model.pt``
    as rank 0 saved it, the record (JSON, or raw text), all an hour old (settled)."""
    run = root / "results" / "digits"
    for name, state in checkpoints.items():
        (run / name).mkdir(parents=True)
        torch.save(state, run / name / "model.pt")
    (run / ".validate_storage_marker").touch()
    if record is not None:
        text = record if isinstance(record, str) else json.dumps(record)
        (run / RAY_RECORD).write_text(text)
    old = time.time() - 3600
    for path in root.rglob("*"):
        os.utime(path, (old, old))
    return root / "results"


def test_the_latest_recorded_checkpoint_is_taken_not_an_unrecorded_newer_one(tmp_path, capsys):
    results = ray_run(
        tmp_path,
        {FIRST: shifted(1), SECOND: shifted(2), UNRECORDED: shifted(3)},
        ray_record([FIRST, SECOND], SECOND),
    )
    code, _, err = collect_cli(capsys, results, tmp_path / "model")
    assert code == 0, err
    card = assert_published(tmp_path / "model", shifted(2))
    assert card["source_file"].endswith(f"digits/{SECOND}/model.pt"), card


def test_rays_record_orders_the_checkpoints_not_their_names(tmp_path, capsys):
    """Reported second, named first: the record's latest wins over the name's numbers."""
    results = ray_run(
        tmp_path, {FIRST: shifted(1), SECOND: shifted(2)}, ray_record([SECOND, FIRST], FIRST)
    )
    code, _, err = collect_cli(capsys, results, tmp_path / "model")
    assert code == 0, err
    assert_published(tmp_path / "model", shifted(1))


def test_a_checkpoint_saved_as_safetensors_is_taken_too(tmp_path, capsys):
    results = ray_run(tmp_path, {FIRST: shifted(1)}, ray_record([FIRST, SECOND], SECOND))
    (results / "digits" / SECOND).mkdir()
    save_file(shifted(2), str(results / "digits" / SECOND / "model.safetensors"))
    code, _, err = collect_cli(capsys, results, tmp_path / "model")
    assert code == 0, err
    assert_published(tmp_path / "model", shifted(2))


def test_only_unrecorded_checkpoints_are_nothing_to_collect(tmp_path, capsys):
    results = ray_run(tmp_path, {UNRECORDED: shifted(3)}, ray_record([], None))
    code, _, err = collect_cli(capsys, results, tmp_path / "model")
    refused_in_one_line(code, err, "holds no checkpoint", "not in Ray's record")
    nothing_published(tmp_path / "model")


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "record",
    [
        "{not json",
        json.dumps({"checkpoint_results": "all"}),
        json.dumps({"latest_checkpoint_result": None}),
        json.dumps(ray_record(["../../elsewhere"], None)),
        json.dumps(ray_record(["model_weights"], None)),
    ],
    ids=["not-json", "results-not-a-list", "no-results", "outside-the-run", "not-a-checkpoint"],
)
def test_a_record_that_is_not_rays_is_refused_in_one_line(tmp_path, capsys, record):
    results = ray_run(tmp_path, {FIRST: shifted(1)}, record)
    code, _, err = collect_cli(capsys, results, tmp_path / "model")
    refused_in_one_line(code, err, RAY_RECORD, "is not Ray Train's checkpoint record")
    nothing_published(tmp_path / "model")


def test_without_a_record_the_names_rank_the_checkpoints_as_before(tmp_path, capsys):
    """A run folder without Ray's record (Train v1, or copied without it): the newest name."""
    results = ray_run(tmp_path, {FIRST: shifted(1), SECOND: shifted(2)}, None)
    code, _, err = collect_cli(capsys, results, tmp_path / "model")
    assert code == 0, err
    assert_published(tmp_path / "model", shifted(2))


def test_our_trainers_checkpoints_reported_to_ray_are_collected_by_their_manifest(
    trained_checkpoints, tmp_path, capsys
):
    """`python -m kubetrain.train.ray` reports each epoch folder to Ray as
    ``ray-train/checkpoint_epoch-N_<time>`` (a manifest inside): collect pointed at Ray's run
    folder takes the one Ray's record names latest and verifies it by its manifest, as it does
    under CHECKPOINT_DIR (before: a folder holding a manifest was passed over, nothing found)."""
    import shutil

    ours = trained_checkpoints["ddp"]
    run = tmp_path / "ray-train"
    names = {}
    for epoch in (1, 2):
        names[epoch] = f"checkpoint_epoch-{epoch:06d}_2026-11-28_10-0{epoch}-00.000000"
        shutil.copytree(ours / f"epoch-{epoch:06d}", run / names[epoch])
    (run / RAY_RECORD).write_text(json.dumps(ray_record([names[2], names[1]], names[1])))
    code, out, err = collect_cli(capsys, run, tmp_path / "out")
    assert code == 0, err
    assert out.startswith(f"collected epoch 1 step 45 (ddp, world size 1) from {run / names[1]}")
    # the same model as collecting epoch 1 from our own layout
    code, _, err = collect_cli(capsys, ours, tmp_path / "mine", "--checkpoint-file", "epoch-000001")
    assert code == 0, err
    mine = (tmp_path / "mine" / "model.safetensors").read_bytes()
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == mine
