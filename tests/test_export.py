"""Exports of a collected model reload to programs that compute what the eager model does, and a
changed export file is refused before it is loaded."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest
import torch

from kubetrain.artifacts.checkpoint import save_checkpoint
from kubetrain.artifacts.export import EXPORT_CARD, export_model, verify_export
from kubetrain.artifacts.model_card import load_model
from kubetrain.artifacts.models import build_model
from kubetrain.components.collect_checkpoint.collect import collect_checkpoint
from kubetrain.errors import IntegrityError, InvalidInput
from kubetrain.storage.integrity import sha256_file

SHAPE = [1, 8, 8]
# torch.jit is deprecated by PyTorch; the torchscript kind exists for servers that still need it
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*deprecated:DeprecationWarning")


def collected(root: Path, spec: str) -> Path:
    """A collected model folder of an untrained ``spec`` model (collect needs no training)."""
    torch.manual_seed(0)
    model = build_model(spec, SHAPE, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    save_checkpoint(
        root / "ckpt",
        model,
        optimizer,
        epoch=1,
        step=1,
        strategy="ddp",
        model_info={"spec": spec, "sample_shape": SHAPE, "num_classes": 10},
        metrics=[],
    )
    collect_checkpoint(str(root / "ckpt"), str(root / "model"))
    return root / "model"


@pytest.fixture(scope="module", params=["mlp", "cnn"])
def model_dir(request, tmp_path_factory) -> Path:
    return collected(tmp_path_factory.mktemp(request.param), request.param)


def load(path: Path) -> torch.nn.Module:
    if path.suffix == ".pt2":
        return torch.export.load(str(path)).module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.load(str(path))


@pytest.mark.parametrize("kind", ["torch-export", "torchscript"])
def test_export_reloads_and_matches_the_eager_model(model_dir, kind):
    path = export_model(model_dir, kind)
    assert path.parent == model_dir
    assert path.name == {"torch-export": "model.pt2", "torchscript": "model.torchscript.pt"}[kind]
    record = json.loads((model_dir / EXPORT_CARD).read_text())["exports"][kind]
    assert record["sha256"] == sha256_file(path) and record["file"] == path.name
    assert record["model_sha256"] == json.loads((model_dir / "model.json").read_text())["sha256"]
    eager, _card = load_model(model_dir)
    batch = torch.randn(5, *SHAPE)  # another batch size than the one traced: batch is dynamic
    with torch.no_grad():
        torch.testing.assert_close(load(path)(batch), eager(batch))
    assert verify_export(model_dir, kind) == path
    assert not [p for p in model_dir.iterdir() if p.name.startswith(".")], "no temp file left"


def test_both_kinds_are_recorded_and_torch_export_is_preferred(tmp_path):
    model_dir = collected(tmp_path, "mlp")
    export_model(model_dir, "torchscript")
    assert verify_export(model_dir).name == "model.torchscript.pt"
    export_model(model_dir, "torch-export")
    assert verify_export(model_dir).name == "model.pt2"
    assert set(json.loads((model_dir / EXPORT_CARD).read_text())["exports"]) == {
        "torch-export",
        "torchscript",
    }


@pytest.mark.parametrize("kind", ["torch-export", "torchscript"])
def test_a_tampered_export_is_refused_by_its_sha256(tmp_path, kind):
    model_dir = collected(tmp_path, "mlp")
    path = export_model(model_dir, kind)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="sha256"):
        verify_export(model_dir, kind)


def test_an_export_of_another_model_is_refused(tmp_path):
    model_dir = collected(tmp_path / "a", "mlp")
    export_model(model_dir)
    other = collected(tmp_path / "b", "cnn")
    for name in ("model.json", "model.safetensors"):
        (model_dir / name).write_bytes((other / name).read_bytes())
    with pytest.raises(IntegrityError, match="another model"):
        verify_export(model_dir)


def test_a_program_that_computes_something_else_is_not_published(tmp_path, monkeypatch):
    import kubetrain.artifacts.export as export

    model_dir = collected(tmp_path, "mlp")
    real = export._serialize

    def skewed(model: torch.nn.Module, kind, sample: torch.Tensor) -> bytes:
        other = copy.deepcopy(model)  # a program whose weights differ from the eager model's
        with torch.no_grad():
            other[-1].bias.add_(1.0)
        return real(other, kind, sample)

    monkeypatch.setattr(export, "_serialize", skewed)
    with pytest.raises(IntegrityError, match="does not compute what the model does"):
        export_model(model_dir)
    assert not (model_dir / "model.pt2").exists() and not (model_dir / EXPORT_CARD).exists()


def test_bad_input_is_refused(tmp_path):
    model_dir = collected(tmp_path, "mlp")
    with pytest.raises(InvalidInput, match="sample"):
        export_model(model_dir, sample=torch.randn(1, *SHAPE))
    with pytest.raises(InvalidInput, match="sample"):
        export_model(model_dir, sample=torch.randn(4, 3, 8, 8))
    with pytest.raises(InvalidInput, match="kind"):
        export_model(model_dir, "onnx")  # type: ignore[arg-type]
    with pytest.raises(IntegrityError, match="export it first"):
        verify_export(model_dir)


def test_concurrent_weights_only_loads_leave_the_environment_as_it_was(monkeypatch):
    """The forced weights-only setting is process-wide: threads loading at once must not
    leave it set (or unset) when they are done, whatever order they finish in."""
    import os
    import threading
    import time

    from kubetrain.artifacts.export import _weights_only_torch_load

    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", raising=False)
    monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", raising=False)
    seen: list[str | None] = []

    def load(delay: float) -> None:
        with _weights_only_torch_load():
            seen.append(os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD"))
            time.sleep(delay)

    threads = []
    for index in range(4):  # each enters while the one before is still inside
        threads.append(threading.Thread(target=load, args=(0.05 - 0.01 * index,)))
        threads[-1].start()
        time.sleep(0.01)
    for thread in threads:
        thread.join()
    assert seen == ["1"] * 4
    assert "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ
