"""Atomic publishing: modes from the umask for every publisher, and a folder replaced in place
never missing for a reader."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from kubetrain import storage
from kubetrain.artifacts.models import build_model
from kubetrain.storage import atomic

UMASKS = (0o022, 0o077, 0o002)


@pytest.fixture(params=UMASKS, ids=lambda mask: f"umask-{mask:03o}")
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def assert_modes_follow_umask(root: Path, mask: int) -> None:
    """Every folder under ``root`` (itself included) is 0777 & ~umask, every file 0666 & ~umask,
    as ``mkdir``/``open`` would make them: another uid on a shared volume may read them."""
    entries = [root, *root.rglob("*")] if root.is_dir() else [root]
    assert len(entries) > 0
    for path in entries:
        mode = stat.S_IMODE(path.lstat().st_mode)
        expected = (0o777 if path.is_dir() else 0o666) & ~mask
        assert mode == expected, f"{path} has mode {mode:o}, the umask gives {expected:o}"


def _publish_file(tmp: Path) -> Path:
    atomic.write_text(tmp / "pointer", "epoch-000001\n")
    return tmp / "pointer"


def _publish_folder(tmp: Path) -> Path:
    staged = atomic.staging_dir(tmp / "out")
    (staged / "sub").mkdir()
    (staged / "sub" / "a.bin").write_bytes(b"a")
    return atomic.publish_dir(staged, tmp / "out")


def _publish_folder_over_an_old_one(tmp: Path) -> Path:
    _publish_folder(tmp)
    return _publish_folder(tmp)


def _storage_folder(tmp: Path) -> Path:
    staged = storage.staging_dir(tmp / "out")
    (staged / "manifest.json").write_text("{}")
    return Path(storage.publish_dir(staged, tmp / "out", "manifest.json"))


def _checkpoint(tmp: Path) -> Path:
    from kubetrain.artifacts.checkpoint import lock_checkpoint_dir, save_checkpoint

    model = build_model("mlp", [1, 8, 8], 10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    lock = lock_checkpoint_dir(tmp / "ckpt")
    info = {"spec": "mlp", "sample_shape": [1, 8, 8], "num_classes": 10}
    save_checkpoint(
        tmp / "ckpt", model, optimizer, epoch=1, step=1, strategy="ddp", model_info=info, metrics=[]
    )
    assert lock is not None
    lock.release()
    return tmp / "ckpt"


def _dataset(tmp: Path) -> Path:
    from kubetrain.artifacts.datasets import write_dataset

    x, y = np.zeros((4, 1, 2, 2), np.float32), np.array([0, 1, 0, 1])
    write_dataset(tmp / "data", {"train": (x, y), "test": (x, y)}, ["a", "b"], [0.0], [1.0], {})
    return tmp / "data"


def _staged_dataset(tmp: Path) -> Path:
    from kubetrain.components.launch_trainjob.staging import stage_dataset

    source = _dataset(tmp)
    stage_dataset(str(source), str(tmp / "shared" / "data"))
    return tmp / "shared"


def _report(tmp: Path) -> Path:
    from kubetrain.components.evaluate_model.report import Report, write_report

    write_report(Report(html="<html></html>", images={"a.png": b"png"}), tmp / "report")
    return tmp / "report"


def _collected_and_promoted(tmp: Path) -> Path:
    from kubetrain.components.collect_checkpoint.collect import collect_checkpoint
    from kubetrain.components.promote_model.promote import promote_model

    collect_checkpoint(str(_checkpoint(tmp)), str(tmp / "model"))
    promote_model(str(tmp / "model"), str(tmp / "registry"), "v1")
    return tmp


PUBLISHERS: dict[str, Callable[[Path], Path]] = {
    "atomic.write_text": _publish_file,
    "atomic.publish_dir": _publish_folder,
    "atomic.publish_dir over an old folder": _publish_folder_over_an_old_one,
    "storage.publish_dir": _storage_folder,
    "checkpoint (LATEST, epoch folder, lock)": _checkpoint,
    "dataset": _dataset,
    "dataset staging copy": _staged_dataset,
    "report": _report,
    "collect + promote (model, registry version, PROMOTED)": _collected_and_promoted,
}


@pytest.mark.parametrize("publish", PUBLISHERS.values(), ids=PUBLISHERS.keys())
def test_published_files_and_folders_take_their_mode_from_the_umask(
    tmp_path: Path, umask: int, publish: Callable[[Path], Path]
) -> None:
    work = tmp_path / "work"  # made under the umask (pytest makes tmp_path 0700)
    work.mkdir()
    published = publish(work)
    assert_modes_follow_umask(published, umask)


def test_the_umask_is_read_without_changing_it(umask: int) -> None:
    assert atomic.current_umask() == umask
    assert os.umask(umask) == umask  # unchanged by the read


# --- replacing a folder in place -------------------------------------------------------------

_READER = textwrap.dedent(
    """
    import json, os, sys
    target, stop = sys.argv[1], sys.argv[2]
    checks = misses = 0
    print("polling", flush=True)
    while not os.path.exists(stop):
        checks += 1
        if not os.path.isdir(target):
            misses += 1
    print(json.dumps({"checks": checks, "misses": misses}), flush=True)
    """
)


def test_a_folder_replaced_in_place_is_never_missing_for_a_reader(tmp_path: Path) -> None:
    """A reader process polls the target while it is replaced again and again: with the swap
    (renameat2 RENAME_EXCHANGE) it sees the old or the new folder every time, never none."""
    probe = [tmp_path / "probe-a", tmp_path / "probe-b"]
    for folder in probe:
        folder.mkdir()
    if not atomic.exchange(*probe):
        pytest.skip("this filesystem cannot swap folders; publish_dir renames twice here")
    for folder in probe:
        folder.rmdir()
    target, stop = tmp_path / "model", tmp_path / "stop"

    def publish(generation: int) -> None:
        staged = atomic.staging_dir(target)
        (staged / "payload").write_text(str(generation))
        atomic.publish_dir(staged, target)

    publish(0)
    reader = subprocess.Popen(
        [sys.executable, "-c", _READER, str(target), str(stop)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "polling"
        replacements = 0
        while replacements < 300:
            publish(replacements + 1)
            replacements += 1
        stop.touch()
        outcome = json.loads(reader.stdout.readline())
    finally:
        stop.touch()
        reader.wait(timeout=60)
    assert outcome["checks"] > 0, "the reader polled while the folder was replaced"
    assert outcome["misses"] == 0, f"the target was missing {outcome['misses']} times"
    assert (target / "payload").read_text() == "300"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "stop"], "nothing left over"


def test_without_renameat2_publish_dir_falls_back_to_two_renames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(atomic, "_renameat2", None)
    assert atomic.exchange(tmp_path, tmp_path) is False
    for generation in range(2):
        staged = atomic.staging_dir(tmp_path / "out")
        (staged / "payload").write_text(str(generation))
        atomic.publish_dir(staged, tmp_path / "out")
    assert (tmp_path / "out" / "payload").read_text() == "1"
    assert [p.name for p in tmp_path.iterdir()] == ["out"], "the retired folder was removed"


def test_exchange_swaps_two_folders(tmp_path: Path) -> None:
    if atomic._renameat2 is None:
        pytest.skip("no renameat2 in this C library")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "from-a").touch()
    assert atomic.exchange(tmp_path / "a", tmp_path / "b") is True
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["from-a"]
    assert list((tmp_path / "a").iterdir()) == []
