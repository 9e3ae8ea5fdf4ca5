"""The one output rule (kubetrain/artifacts/output_rule.py), for every step that publishes a folder.

Generated cases: each publishing step (collect --output, prep --output, evaluate --report, the
dataset staging copy) x each output shape the rule refuses (an existing file, a folder of other
content, a folder whose marker file is garbage or another kind's, every spelling of an input
path, a folder inside an input, a folder holding an input, symbolic links to them). A refusal
is one line naming the option, exit code 2, and leaves the workspace byte-identical. The same
on object storage (moto). Accepted: a missing or empty folder, an earlier output of the same
kind (replaced), a folder beside an input whose name starts like it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kubetrain.artifacts.output_rule import DATASET, MODEL, REPORT, OutputKind, is_output_of
from kubetrain.cli import main
from kubetrain.errors import KubetrainError

KINDS = (DATASET, MODEL, REPORT)
MODEL_INFO = {"spec": "mlp", "sample_shape": [1, 8, 8], "num_classes": 10}


# --- what the steps read -------------------------------------------------------------------


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory, digits_dir: Path) -> dict[str, Path]:
    """One of each input, made once: a checkpoint folder, a collected model, a dataset and a
    prep source folder (data.npz); each test copies them into its own workspace."""
    import torch

    from kubetrain.artifacts.checkpoint import save_checkpoint
    from kubetrain.artifacts.models import build_model
    from kubetrain.components.collect_checkpoint.collect import collect_checkpoint

    root = tmp_path_factory.mktemp("origin")
    torch.manual_seed(0)
    model = build_model("mlp", [1, 8, 8], 10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    save_checkpoint(
        root / "ckpt", model, optimizer, epoch=1, step=1, strategy="ddp",
        model_info=MODEL_INFO, metrics=[{"epoch": 1, "test_accuracy": 0.1}],
    )  # fmt: skip
    (root / "ckpt" / ".lock").unlink(missing_ok=True)
    collect_checkpoint(str(root / "ckpt"), str(root / "model"))
    source = root / "source"
    source.mkdir()
    rng = np.random.default_rng(0)
    np.savez(source / "data.npz", x=rng.normal(size=(60, 4)), y=np.arange(60) % 3)
    return {"ckpt": root / "ckpt", "model": root / "model", "data": digits_dir, "source": source}


@dataclass(frozen=True)
class Step:
    """A step that publishes a folder: its refusal's prefix and field, what it publishes, and
    its inputs (the refusal's name for each -> the origin it is copied from)."""

    name: str
    command: str
    field: str
    kind: OutputKind
    inputs: dict[str, str]
    run: Callable[[dict[str, Path], str], int]
    #: False where an identical earlier output is reused rather than published again
    replaces: bool = True


def _collect(inputs: dict[str, Path], output: str) -> int:
    return main(["collect", "--checkpoint-dir", str(inputs["checkpoint_dir"]), "--output", output])


def _prep(inputs: dict[str, Path], output: str) -> int:
    return main(["prep", "--source", str(inputs["source"]), "--output", output])


def _evaluate(inputs: dict[str, Path], output: str) -> int:
    model, data = str(inputs["model"]), str(inputs["data"])
    return main(
        ["evaluate", "--model", model, "--data", data, "--threshold", "0", "--report", output]
    )


def _stage(inputs: dict[str, Path], output: str) -> int:
    """The launch step's copy of the dataset onto the shared volume, as the CLI reports it."""
    from kubetrain.components.launch_trainjob.staging import stage_dataset

    try:
        stage_dataset(str(inputs["data"]), output)
    except KubetrainError as exc:
        print(f"kubetrain launch: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


STEPS = (
    Step("collect", "collect", "output", MODEL, {"checkpoint_dir": "ckpt"}, _collect),
    Step("prep", "prep", "output_dir", DATASET, {"source": "source"}, _prep),
    Step("evaluate", "evaluate", "report", REPORT, {"model": "model", "data": "data"}, _evaluate),
    Step("stage", "launch", "data_dir", DATASET, {"data": "data"}, _stage, replaces=False),
)


@dataclass
class Workspace:
    root: Path
    inputs: dict[str, Path]


def workspace(step: Step, tmp_path: Path, origin: dict[str, Path]) -> Workspace:
    root = tmp_path / "ws"
    root.mkdir()
    inputs = {}
    for name, source in step.inputs.items():
        inputs[name] = root / name
        shutil.copytree(origin[source], inputs[name], symlinks=True)
    return Workspace(root, inputs)


def snapshot(root: Path) -> dict[str, Any]:
    """Every entry under ``root``: a file's sha256, a link's target, a folder's presence."""
    entries: dict[str, Any] = {}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder, name)
            key = path.relative_to(root).as_posix()
            if path.is_symlink():
                entries[key] = ("link", os.readlink(path))
            elif path.is_dir():
                entries[key] = "folder"
            else:
                entries[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return entries


def marker_of(kind: OutputKind) -> bytes:
    return json.dumps({"format": kind.format}).encode()


def plant_marker(folder: Path, kind: OutputKind) -> None:
    """Make ``folder`` look like an earlier output of ``kind``, so that only the containment
    rule can refuse it."""
    (folder / kind.marker).write_bytes(marker_of(kind))


# --- the output shapes the rule refuses ------------------------------------------------------

Shape = Callable[[Workspace, Step], str]


def existing_file(ws: Workspace, step: Step) -> str:
    (ws.root / "taken.txt").write_bytes(b"someone's notes\n")
    return str(ws.root / "taken.txt")


def foreign_folder(ws: Workspace, step: Step) -> str:
    (ws.root / "notes").mkdir()
    (ws.root / "notes" / "keep.txt").write_bytes(b"keep me\n")
    return str(ws.root / "notes")


def foreign_marker(content: bytes) -> Shape:
    """A folder holding a file named like the step's marker whose content is not the marker."""

    def shape(ws: Workspace, step: Step) -> str:
        folder = ws.root / "foreign"
        folder.mkdir()
        (folder / step.kind.marker).write_bytes(content)
        (folder / "keep.txt").write_bytes(b"keep me\n")
        return str(folder)

    return shape


def other_kinds_output(ws: Workspace, step: Step) -> str:
    """A folder that is an earlier output of another kind (a dataset is not a report)."""
    folder = ws.root / "other-kind"
    folder.mkdir()
    for kind in KINDS:
        if kind.marker != step.kind.marker:
            plant_marker(folder, kind)
    (folder / step.kind.marker).write_bytes(b'{"format": "kubetrain.other/v1"}')
    return str(folder)


SPELLINGS: dict[str, Callable[[Path], str]] = {
    "plain": str,
    "trailing slash": lambda p: f"{p}/",
    "dot": lambda p: f"{p}/.",
    "dot-dot": lambda p: f"{p}/../{p.name}",
    "file URL": lambda p: f"file://{p}",
}


def same_as_input(input_name: str, spelling: str) -> Shape:
    def shape(ws: Workspace, step: Step) -> str:
        plant_marker(ws.inputs[input_name], step.kind)
        return SPELLINGS[spelling](ws.inputs[input_name])

    return shape


def link_to_input(input_name: str) -> Shape:
    def shape(ws: Workspace, step: Step) -> str:
        plant_marker(ws.inputs[input_name], step.kind)
        (ws.root / "alias").symlink_to(ws.inputs[input_name], target_is_directory=True)
        return str(ws.root / "alias")

    return shape


def inside_input(input_name: str, depth: int) -> Shape:
    def shape(ws: Workspace, step: Step) -> str:
        return str(ws.inputs[input_name].joinpath(*["published"] * depth))

    return shape


def inside_input_through_a_link(input_name: str) -> Shape:
    def shape(ws: Workspace, step: Step) -> str:
        (ws.root / "alias").symlink_to(ws.inputs[input_name], target_is_directory=True)
        return str(ws.root / "alias" / "published")

    return shape


def holding_input(through_link: bool) -> Shape:
    """A folder that holds the inputs (the workspace), made an earlier output of the step's
    kind so that only the containment rule can refuse it."""

    def shape(ws: Workspace, step: Step) -> str:
        plant_marker(ws.root, step.kind)
        if not through_link:
            return str(ws.root)
        (ws.root.parent / "alias").symlink_to(ws.root, target_is_directory=True)
        return str(ws.root.parent / "alias")

    return shape


def refusals_for(step: Step) -> Iterator[Any]:
    shapes: dict[str, Shape] = {
        "existing file": existing_file,
        "foreign non-empty folder": foreign_folder,
        "another kind's output": other_kinds_output,
    }
    foreign_contents = {
        "empty": b"", "garbage": b"\x00\xffnot json", "a list": b"[]", "no format": b"{}",
        "an older format": b'{"format": "kubetrain.dataset/v0"}',
        "format null": b'{"format": null}',
    }  # fmt: skip
    for label, content in foreign_contents.items():
        shapes[f"{step.kind.marker} {label}"] = foreign_marker(content)
    for input_name in step.inputs:
        for spelling in SPELLINGS:
            shapes[f"== {input_name} ({spelling})"] = same_as_input(input_name, spelling)
        shapes[f"link to {input_name}"] = link_to_input(input_name)
        for depth in (1, 3):
            shapes[f"inside {input_name} (depth {depth})"] = inside_input(input_name, depth)
        shapes[f"inside {input_name} through a link"] = inside_input_through_a_link(input_name)
    shapes["holds the inputs"] = holding_input(through_link=False)
    shapes["holds the inputs through a link"] = holding_input(through_link=True)
    for label, shape in shapes.items():
        yield pytest.param(step, shape, id=f"{step.name}: {label}")


def assert_one_line_refusal(code: int, err: str, step: Step) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"kubetrain {step.command}: error: {step.field}: "), err
    assert "; " in lines[0], "the line says what to do"


@pytest.mark.bad_input
@pytest.mark.parametrize(("step", "shape"), [c for s in STEPS for c in refusals_for(s)])
def test_an_output_the_rule_forbids_is_refused_and_nothing_changes(
    step: Step, shape: Shape, tmp_path: Path, origin: dict[str, Path], capsys
) -> None:
    ws = workspace(step, tmp_path, origin)
    output = shape(ws, step)
    before = snapshot(tmp_path)
    capsys.readouterr()
    code = step.run(ws.inputs, output)
    assert_one_line_refusal(code, capsys.readouterr().err, step)
    assert snapshot(tmp_path) == before


# --- what the rule accepts -------------------------------------------------------------------


def _empty_folder(ws: Workspace, step: Step) -> str:
    (ws.root / "empty").mkdir()
    return str(ws.root / "empty")


ACCEPTED: dict[str, Callable[[Workspace, Step], str]] = {
    "missing folder": lambda ws, step: str(ws.root / "new" / "deeper" / "out"),
    "missing folder as a file URL": lambda ws, step: f"file://{ws.root / 'new' / 'out'}",
    "empty folder": _empty_folder,
    "beside an input, named like it": lambda ws, step: f"{next(iter(ws.inputs.values()))}-2",
}


@pytest.mark.parametrize("where", ACCEPTED.values(), ids=ACCEPTED.keys())
@pytest.mark.parametrize("step", STEPS, ids=[s.name for s in STEPS])
def test_an_allowed_output_is_published_and_an_earlier_one_replaced(
    step: Step, where: Callable[[Workspace, Step], str], tmp_path: Path, origin, capsys
) -> None:
    from kubetrain import storage

    ws = workspace(step, tmp_path, origin)
    spelled = where(ws, step)
    output = storage.local_path(spelled)
    inputs_before = {name: snapshot(path) for name, path in ws.inputs.items()}
    assert step.run(ws.inputs, spelled) == 0, capsys.readouterr().err
    assert is_output_of(output, step.kind)
    first = snapshot(output)
    (output / "left-by-the-earlier-run.txt").write_bytes(b"x")  # an earlier output, changed
    assert step.run(ws.inputs, spelled) == 0, capsys.readouterr().err
    assert is_output_of(output, step.kind)
    if step.replaces:
        assert set(snapshot(output)) == set(first), "the earlier output was replaced whole"
    assert {name: snapshot(path) for name, path in ws.inputs.items()} == inputs_before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ws"], "nothing published elsewhere"


def test_the_rule_knows_each_kind_by_the_marker_its_step_writes(origin: dict[str, Path]) -> None:
    from kubetrain.artifacts.datasets import FORMAT as DATASET_FORMAT

    assert DATASET.format == DATASET_FORMAT
    assert is_output_of(origin["data"], DATASET) and not is_output_of(origin["data"], MODEL)
    assert is_output_of(origin["model"], MODEL) and not is_output_of(origin["model"], DATASET)
    assert not is_output_of(origin["ckpt"], MODEL)


# --- object storage --------------------------------------------------------------------------

BUCKET = "kubetrain-output-rule"


def bucket_snapshot() -> dict[str, str]:
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    return {path: hashlib.sha256(fs.cat_file(path)).hexdigest() for path in fs.find(BUCKET)}


def put(url: str, data: bytes) -> None:
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.pipe_file(url.removeprefix("s3://"), data)
    fs.invalidate_cache()


@pytest.fixture
def s3_checkpoint(s3_env: Any, origin: dict[str, Path], request: pytest.FixtureRequest) -> str:
    """The origin checkpoint uploaded under a prefix of its own (the manifest last)."""
    from kubetrain import storage

    url = f"s3://{BUCKET}/{request.node.name.replace('[', '-').rstrip(']')}/ckpt"
    for path in sorted(origin["ckpt"].rglob("*"), key=lambda p: p.name == "manifest.json"):
        if path.is_file():
            relative = path.relative_to(origin["ckpt"]).as_posix()
            storage.write_bytes(f"{url}/{relative}", path.read_bytes())
    return url


S3_REFUSALS: dict[str, Callable[[str], str]] = {
    "an existing object": lambda ckpt: (put(f"{ckpt}-out", b"x"), f"{ckpt}-out")[1],
    "a prefix of other objects": lambda ckpt: (put(f"{ckpt}-out/a.txt", b"x"), f"{ckpt}-out")[1],
    "a garbage model.json": lambda ckpt: (put(f"{ckpt}-out/model.json", b"{]"), f"{ckpt}-out")[1],
    "another kind's marker": lambda ckpt: (
        put(f"{ckpt}-out/model.json", marker_of(DATASET)),
        f"{ckpt}-out",
    )[1],
    "== the checkpoint": lambda ckpt: (put(f"{ckpt}/model.json", marker_of(MODEL)), ckpt)[1],
    "== the checkpoint, trailing slash": lambda ckpt: (
        put(f"{ckpt}/model.json", marker_of(MODEL)),
        f"{ckpt}/",
    )[1],
    "inside the checkpoint": lambda ckpt: f"{ckpt}/model",
    "holding the checkpoint": lambda ckpt: (
        put(f"{ckpt.rsplit('/', 1)[0]}/model.json", marker_of(MODEL)),
        ckpt.rsplit("/", 1)[0],
    )[1],
}


@pytest.mark.bad_input
@pytest.mark.parametrize("shape", S3_REFUSALS.values(), ids=S3_REFUSALS.keys())
def test_an_object_storage_output_the_rule_forbids_is_refused(
    shape: Callable[[str], str], s3_checkpoint: str, capsys
) -> None:
    output = shape(s3_checkpoint)
    before = bucket_snapshot()
    capsys.readouterr()
    code = main(["collect", "--checkpoint-dir", s3_checkpoint, "--output", output])
    assert_one_line_refusal(code, capsys.readouterr().err, STEPS[0])
    assert bucket_snapshot() == before


@pytest.mark.bad_input
def test_prep_to_an_object_storage_prefix_of_other_objects_is_refused(
    s3_checkpoint: str, tmp_path: Path, capsys
) -> None:
    """prep publishes datasets on object storage too: a prefix holding other objects is kept."""
    put(f"{s3_checkpoint}-out/notes.txt", b"x")
    before = bucket_snapshot()
    code = main(["prep", "--source", "sklearn:iris", "--output", f"{s3_checkpoint}-out"])
    assert_one_line_refusal(code, capsys.readouterr().err, STEPS[1])
    assert bucket_snapshot() == before


def test_an_earlier_model_on_object_storage_is_replaced(s3_checkpoint: str, capsys) -> None:
    output = f"{s3_checkpoint}-model"
    for _ in range(2):
        code = main(["collect", "--checkpoint-dir", s3_checkpoint, "--output", output])
        assert code == 0, capsys.readouterr().err
        assert is_output_of(output, MODEL)


# --- promote: versions are added inside the registry, never replaced -------------------------

PROMOTE_REFUSALS: dict[str, Callable[[Path, Path], str]] = {
    "registry == model": lambda ws, model: str(model),
    "registry == model (trailing slash)": lambda ws, model: f"{model}/",
    "registry inside the model": lambda ws, model: str(model / "registry"),
    "registry is a link to the model": lambda ws, model: (
        (ws / "alias").symlink_to(model, target_is_directory=True),
        str(ws / "alias"),
    )[1],
}


@pytest.mark.bad_input
@pytest.mark.parametrize("registry", PROMOTE_REFUSALS.values(), ids=PROMOTE_REFUSALS.keys())
def test_a_registry_in_the_model_folder_is_refused(
    registry: Callable[[Path, Path], str], tmp_path: Path, origin: dict[str, Path], capsys
) -> None:
    model = tmp_path / "model"
    shutil.copytree(origin["model"], model)
    chosen = registry(tmp_path, model)
    before = snapshot(tmp_path)
    code = main(["promote", "--model", str(model), "--registry", chosen, "--version", "v1"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("kubetrain promote: error: registry: "), err
    assert snapshot(tmp_path) == before


def test_a_registry_may_hold_the_model_it_promotes(
    tmp_path: Path, origin: dict[str, Path], capsys
) -> None:
    registry = tmp_path / "registry"
    for model, version in (
        (origin["model"], "v1"),
        (registry / "v1", "v2"),
        (registry / "v1", "v1"),
    ):
        code = main(
            ["promote", "--model", str(model), "--registry", str(registry), "--version", version]
        )
        assert code == 0, capsys.readouterr().err
    assert is_output_of(registry / "v2", MODEL)
