"""Files still being written are never taken (issue 28): HF shards only with their index, and
naming exactly the shards there; a file only once its size and modification time held still for
the grace and no process holds it open for writing (a file preallocated to its full size and
written in place keeps its size; a writer pausing longer than a glance keeps its time).

Each writer here overwrites, in place, a safetensors file of the same shapes: half-way, the
file is a valid safetensors file holding half of each model, what collect used to publish."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save, save_file
from test_collect_formats import assert_published, trained_state, write_hf_sharded

from kubetrain.components.collect_checkpoint.collect import collect_checkpoint
from kubetrain.errors import IntegrityError
from kubetrain.storage import settled

OLD, NEW = trained_state(seed=1), trained_state(seed=2)


def age(path: Path, seconds_ago: float) -> None:
    when = time.time() - seconds_ago
    os.utime(path, (when, when))


def two_epochs(ckpt: Path) -> tuple[Path, bytes]:
    """``model_epoch_1.safetensors`` (complete, a while ago) and ``model_epoch_2.safetensors``
    holding the old model, about to be overwritten in place with the new one's bytes."""
    ckpt.mkdir()
    save_file(OLD, str(ckpt / "model_epoch_1.safetensors"))
    age(ckpt / "model_epoch_1.safetensors", 600)
    target = ckpt / "model_epoch_2.safetensors"
    save_file(OLD, str(target))
    new = save(NEW)
    old = target.read_bytes()
    header = 8 + int.from_bytes(new[:8], "little")
    assert len(new) == len(old) and new[:header] == old[:header]  # the same layout
    return target, new


def overwrite(path: Path, data: bytes, start: int, end: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(start)
        handle.write(data[start:end])


# --- a writer holding the file open ------------------------------------------------------------

WRITER = """
import os, sys
path, data = sys.argv[1], open(sys.argv[2], "rb").read()
half = len(data) // 2
with open(path, "r+b") as handle:
    os.ftruncate(handle.fileno(), len(data))  # preallocated: its size holds from the start
    handle.write(data[:half])
    handle.flush()
    print("half", flush=True)
    sys.stdin.readline()  # a pause between tensors, as long as the test wants
    handle.write(data[half:])
print("done", flush=True)
"""


@pytest.mark.fault
def test_a_preallocated_file_held_open_by_its_writer_is_not_taken(tmp_path, injected) -> None:
    ckpt = tmp_path / "ckpt"
    target, new = two_epochs(ckpt)
    (tmp_path / "new.bin").write_bytes(new)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target), str(tmp_path / "new.bin")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert writer.stdout.readline() == "half\n"
        size = target.stat().st_size
        assert size == len(new) and target.read_bytes() != new  # full size, half written
        injected.struck(f"model_epoch_2.safetensors half-written in place by {writer.pid}")
        card = collect_checkpoint(str(ckpt), str(tmp_path / "model")).card
        assert card["source_file"] == "model_epoch_1.safetensors"
        injected.data_intact(
            "the published model", lambda: assert_published(tmp_path / "model", OLD)
        )
        with pytest.raises(IntegrityError) as refused:
            collect_checkpoint(str(ckpt), str(tmp_path / "named"), checkpoint_file=target.name)
        assert (
            f"{target} is still being written (model_epoch_2.safetensors is open for writing "
            f"by process {writer.pid})" in str(refused.value)
        )
        assert not (tmp_path / "named").exists()
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.stdout.readline() == "done\n"
    finally:
        writer.stdin.close()
        writer.wait(timeout=30)
    named = collect_checkpoint(str(ckpt), str(tmp_path / "named"), checkpoint_file=target.name)
    assert named.card["source_file"] == target.name
    assert_published(tmp_path / "named", NEW)


def test_a_file_a_process_maps_writable_is_open_for_writing(tmp_path) -> None:
    """A writer that maps the file (``mmap``, shared and writable) and closed its descriptor."""
    import mmap

    path = tmp_path / "mapped.bin"
    path.write_bytes(bytes(4096))
    with open(path, "r+b") as handle:
        mapped = mmap.mmap(handle.fileno(), 4096)
    try:
        assert settled.writers_of([path]) == {path: os.getpid()}
    finally:
        mapped.close()
    assert settled.writers_of([path]) == {}
    with open(path, "rb"):
        assert settled.writers_of([path]) == {}  # read only: no writer


# --- a writer pausing longer than a glance ---------------------------------------------------


@pytest.mark.fault
def test_a_file_whose_time_moves_within_the_grace_is_not_taken(
    tmp_path, injected, monkeypatch
) -> None:
    """Same size throughout, no descriptor held between writes: the second half lands 0.8 s
    after the first, after the glance collect used to take (0.25 s) but within the grace."""
    monkeypatch.setattr(settled, "GRACE_SECONDS", 1.5, raising=False)
    ckpt = tmp_path / "ckpt"
    target, new = two_epochs(ckpt)
    half = len(new) // 2
    overwrite(target, new, 0, half)
    rest = threading.Timer(0.8, overwrite, (target, new, half, len(new)))
    rest.start()
    try:
        card = collect_checkpoint(str(ckpt), str(tmp_path / "model")).card
    finally:
        rest.join()
    assert target.read_bytes() == new
    injected.struck("model_epoch_2.safetensors' second half written 0.8 s after its first")
    assert card["source_file"] == "model_epoch_1.safetensors"
    injected.data_intact("the published model", lambda: assert_published(tmp_path / "model", OLD))
    named = collect_checkpoint(str(ckpt), str(tmp_path / "named"), checkpoint_file=target.name)
    assert_published(tmp_path / "named", NEW)
    assert named.card["source_file"] == target.name


def test_the_grace_is_waited_only_for_a_file_modified_within_it(tmp_path) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(b"x")
    age(path, 60)
    started = time.monotonic()
    assert settled.unsettled([path], grace=5.0) is None
    assert time.monotonic() - started < 1.0
    path.write_bytes(b"y")
    started = time.monotonic()
    assert settled.unsettled([path], grace=0.5) is None
    assert 0.3 < time.monotonic() - started < 2.0
    path.write_bytes(b"w")
    moved = threading.Timer(0.2, path.write_bytes, (b"z",))
    moved.start()
    assert settled.unsettled([path], grace=0.6) == (
        "model.pt changed (size or modification time) within 0.6 s"
    )
    moved.join()


# --- Hugging Face shards and their index --------------------------------------------------------


def test_hf_shards_without_their_index_are_not_a_model(tmp_path) -> None:
    """save_pretrained writes every shard, then the index: shards without it are a save still
    under way, and each shard alone is half of the model."""
    ckpt = tmp_path / "ckpt"
    write_hf_sharded(ckpt / "checkpoint-100", OLD, ".safetensors")
    for path in (ckpt / "checkpoint-100").iterdir():
        age(path, 600)
    write_hf_sharded(ckpt / "checkpoint-200", NEW, ".safetensors")
    (ckpt / "checkpoint-200" / "model.safetensors.index.json").unlink()
    card = collect_checkpoint(str(ckpt), str(tmp_path / "model")).card
    assert card["source_file"] == "checkpoint-100/model.safetensors.index.json"
    assert_published(tmp_path / "model", OLD)

    shard = "checkpoint-200/model-00001-of-00002.safetensors"
    with pytest.raises(IntegrityError) as refused:
        collect_checkpoint(str(ckpt), str(tmp_path / "named"), checkpoint_file=shard)
    assert (
        "is one shard of an HF sharded checkpoint whose index model.safetensors.index.json is "
        "not there yet" in str(refused.value)
    )
    assert "then name checkpoint-200/model.safetensors.index.json" in str(refused.value)
    assert not (tmp_path / "named").exists()

    only = tmp_path / "only"
    (ckpt / "checkpoint-200").rename(only)
    with pytest.raises(IntegrityError) as refused:
        collect_checkpoint(str(only), str(tmp_path / "none"))
    assert (
        "still being written: 'model-00001-of-00002.safetensors' (an HF shard without its "
        "index model.safetensors.index.json: wait for the save to write it)" in str(refused.value)
    )
    assert not (tmp_path / "none").exists()


def index_of(folder: Path) -> dict:
    return json.loads((folder / "model.safetensors.index.json").read_text())


def test_an_index_names_exactly_the_shards_there(tmp_path) -> None:
    """A shard the index leaves out (another save's) and an index naming two shards of a set of
    three are refused, naming the shard; the model would be published without its tensors."""
    stale = tmp_path / "stale"
    write_hf_sharded(stale, NEW, ".safetensors")
    save_file({"extra": torch.zeros(2)}, str(stale / "model-00003-of-00003.safetensors"))
    with pytest.raises(IntegrityError, match=r"holds shard 'model-00003-of-00003.safetensors', "
                       r"which model.safetensors.index.json does not name"):  # fmt: skip
        collect_checkpoint(str(stale), str(tmp_path / "m1"))
    assert not (tmp_path / "m1").exists()

    short = tmp_path / "short"
    write_hf_sharded(short, NEW, ".safetensors")
    index = index_of(short)
    renamed = {}
    for part in ("00001", "00002"):
        old_name = f"model-{part}-of-00002.safetensors"
        renamed[old_name] = f"model-{part}-of-00003.safetensors"
        (short / old_name).rename(short / renamed[old_name])
    index["weight_map"] = {k: renamed[v] for k, v in index["weight_map"].items()}
    (short / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(IntegrityError, match=r"names 2 shards of a set of 3 \(not shard 3\)"):
        collect_checkpoint(str(short), str(tmp_path / "m2"))
    assert not (tmp_path / "m2").exists()
