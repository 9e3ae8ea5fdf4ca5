"""The one manifest rule (kubetrain/artifacts/manifest.py) for every reader of a record that names
files, and the rule for the model code a record names.

Generated cases: each reader (a checkpoint's manifest through collect, resume and load; a
dataset's manifest through training, evaluate and on object storage; a model card through
evaluate and promote; export.json through verify_export and export_model) x each bad entry
(``../x``, ``../../etc/hostname``, ``/etc/hostname``, ``/dev/zero``, ``a/../../x``, a backslash,
a NUL, an empty or non-string name, and, where the folder is local, a link inside pointing
outside, a link to /dev/zero, a FIFO, a folder). Every digest is the planted file's own, as an
attacker who can write the folder writes it. A refusal is one line naming the entry, publishes
nothing, and ends: each test runs under an alarm, as a FIFO opened or /dev/zero hashed would
never return. The record files themselves (and LATEST) get the same shapes.

Model code: a card or manifest naming ``package.module:callable`` is refused, nothing imported
(the planted module's top-level code would create a file), unless the user names the code
(``--model-factory``, ``model_factory``), whose choice wins over the record.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from kubetrain.artifacts import checkpoint, datasets, export, model_card
from kubetrain.artifacts.checkpoint import save_checkpoint
from kubetrain.artifacts.manifest import shown
from kubetrain.artifacts.models import mlp
from kubetrain.cli import main as kubetrain_main
from kubetrain.components.collect_checkpoint.collect import collect_checkpoint
from kubetrain.errors import KubetrainError
from kubetrain.rules import STRATEGIES
from kubetrain.storage.integrity import sha256_file
from kubetrain.train.__main__ import main as train_main

SHAPE = [1, 8, 8]
#: Seconds a reader may take before it is taken to hang on a FIFO or /dev/zero.
HANG_SECONDS = 90
DUMMY_SHA256 = "0" * 64
pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.*deprecated:DeprecationWarning"),
    pytest.mark.usefixtures("no_hang"),
]


def write_checkpoint(ckpt_dir: Path, strategy: str, spec: str = "mlp") -> Path:
    """A real one-epoch checkpoint of the digits mlp, recorded as ``spec``."""
    torch.manual_seed(0)
    model = mlp(SHAPE, 10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    info = {"spec": spec, "sample_shape": SHAPE, "num_classes": 10}
    save_checkpoint(
        ckpt_dir, model, optimizer, epoch=1, step=1, strategy=strategy, model_info=info,
        metrics=[{"epoch": 1, "test_accuracy": 0.1}],
    )  # fmt: skip
    return ckpt_dir


def write_deepspeed_checkpoint(ckpt_dir: Path, data: Path, run_python) -> Path:
    """A real one-epoch ZeRO-2 checkpoint of the digits mlp, as the trainer writes it (only a
    DeepSpeed engine saves one)."""
    argv = ["-m", "kubetrain.train", "--data", data, "--checkpoint-dir", ckpt_dir,
            "--strategy", "deepspeed", "--epochs", "1", "--tensorboard-dir", ""]  # fmt: skip
    result = run_python([str(arg) for arg in argv], timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return ckpt_dir


@pytest.fixture(scope="module")
def origin(
    tmp_path_factory: pytest.TempPathFactory, digits_dir: Path, run_python
) -> dict[str, Path]:
    """What the readers read, made once: a checkpoint folder of each strategy, a collected
    model with a torch-export program (so with export.json) and the digits dataset."""
    root = tmp_path_factory.mktemp("origin")
    for strategy in STRATEGIES:
        if strategy == "deepspeed":
            write_deepspeed_checkpoint(root / f"ckpt-{strategy}", digits_dir, run_python)
        else:
            write_checkpoint(root / f"ckpt-{strategy}", strategy)
    collect_checkpoint(str(root / "ckpt-ddp"), str(root / "model"), "torch-export")
    return {
        **{f"ckpt-{strategy}": root / f"ckpt-{strategy}" for strategy in STRATEGIES},
        "model": root / "model",
        "data": digits_dir,
    }


# --- the bad entries -------------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    """One entry the rule refuses: ``plant(folder, name, outside)`` makes what it needs and
    returns the entry to record; ``by_name``: refused by its name alone (so on object storage
    too); ``json_key``: can be a JSON object's key (a string)."""

    id: str
    plant: Callable[[Path, str, Path], object]
    by_name: bool = True
    json_key: bool = True


def named(entry: object) -> Callable[[Path, str, Path], object]:
    def plant(folder: Path, name: str, outside: Path) -> object:
        (folder.parent / "x").write_bytes(b"a file beside the folder")  # what ../x would read
        return entry

    return plant


def shaped(make: Callable[[Path, Path], None]) -> Callable[[Path, str, Path], object]:
    """Put ``make``'s file system object at ``folder/name`` (replacing what is there)."""

    def plant(folder: Path, name: str, outside: Path) -> object:
        target = folder / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
        make(target, outside)
        return name

    return plant


BADS = [
    Bad("parent", named("../x")),
    Bad("parent-etc-hostname", named("../../etc/hostname")),
    Bad("absolute-etc-hostname", named("/etc/hostname")),
    Bad("dev-zero", named("/dev/zero")),
    Bad("climbing-through-a-folder", named("a/../../x")),
    Bad("backslash", named("a\\..\\..\\x")),
    Bad("nul", named("model\x00.safetensors")),
    Bad("empty", named("")),
    Bad("not-a-string", named(["planted"]), json_key=False),
    Bad("link-to-outside", shaped(lambda at, out: at.symlink_to(out)), by_name=False),
    Bad("link-to-dev-zero", shaped(lambda at, out: at.symlink_to("/dev/zero")), by_name=False),
    Bad("fifo", shaped(lambda at, out: os.mkfifo(at)), by_name=False),
    Bad("folder", shaped(lambda at, out: at.mkdir()), by_name=False),
]


def digest_of(folder: Path, entry: object) -> str:
    """The sha256 of what ``entry`` names if it is a readable regular file (the strong
    attacker's matching digest), else any well-formed one."""
    if not isinstance(entry, str) or not entry or "\x00" in entry:
        return DUMMY_SHA256
    path = folder / entry
    return sha256_file(path) if os.path.isfile(path) else DUMMY_SHA256


# --- the readers -----------------------------------------------------------------------------


def refusal(call: Callable[[], object]) -> tuple[int, str]:
    """A library reader's outcome as a command's: (exit code, the error line)."""
    try:
        call()
    except KubetrainError as exc:
        return exc.exit_code, f"error: {exc}\n"
    return 0, ""


@dataclass(frozen=True)
class Reader:
    """A reader of a record: the workspace it needs (``copies``: name in the workspace ->
    origin), the ``folder`` whose ``record`` is planted, ``fixed``: the file the record names
    that shaped entries replace (None: they are added under a name of their own), ``put`` the
    entry and its digest into the parsed record, and ``run`` it: (exit code, stderr)."""

    id: str
    copies: dict[str, str]
    folder: str
    record: str
    put: Callable[[dict[str, Any], object, str], None]
    run: Callable[[Path, pytest.CaptureFixture[str], dict[str, Path]], tuple[int, str]]
    fixed: str | None = None
    local: bool = True


def put_checkpoint_file(record: dict[str, Any], entry: object, digest: str) -> None:
    record["files"][entry] = digest


def put_split(record: dict[str, Any], entry: object, digest: str) -> None:
    record["splits"]["test"].update(file=entry, sha256=digest)


def put_card(record: dict[str, Any], entry: object, digest: str) -> None:
    if entry == "model.safetensors":  # a shape planted at the file the card names
        record["sha256"] = digest
    else:  # names of the source checkpoint's files, shown in reports
        record["checkpoint_files"][entry] = digest


def put_export(record: dict[str, Any], entry: object, digest: str) -> None:
    record["exports"]["torch-export"].update(file=entry, sha256=digest)


def cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str]:
    capsys.readouterr()
    code = kubetrain_main([str(arg) for arg in argv])
    return code, capsys.readouterr().err


def train(
    capsys: pytest.CaptureFixture[str], data: Path, ckpt_dir: Path, strategy: str = "ddp"
) -> tuple[int, str]:
    """The trainer resuming (a deepspeed checkpoint with strategy deepspeed, the one that may)."""
    capsys.readouterr()
    argv = ["--data", data, "--checkpoint-dir", ckpt_dir, "--epochs", "2", "--device", "cpu"]
    argv += ["--strategy", "deepspeed" if strategy == "deepspeed" else "ddp"]
    code = train_main([str(arg) for arg in argv])
    return code, capsys.readouterr().err


def on_object_storage(ws: Path) -> tuple[int, str]:
    """The planted dataset uploaded to fsspec's memory filesystem, then one split loaded."""
    import fsspec

    url = f"memory://manifest-rule-{uuid.uuid4().hex}/data"
    fs = fsspec.filesystem("memory")
    for path in (ws / "data").iterdir():
        fs.pipe_file(f"{url}/{path.name}", path.read_bytes())
    try:
        return refusal(lambda: datasets.load_split(url, "test"))
    finally:
        fs.rm(url.removeprefix("memory://").split("/")[0], recursive=True)


CKPT = "ckpt/epoch-000001"
READERS = [
    *(
        Reader(
            f"checkpoint manifest via collect ({strategy})", {"ckpt": f"ckpt-{strategy}"}, CKPT,
            "manifest.json", put_checkpoint_file,
            lambda ws, capsys, o: cli(
                capsys, "collect", "--checkpoint-dir", ws / "ckpt", "--output", ws / "out"
            ),
        )  # fmt: skip
        for strategy in STRATEGIES
    ),
    *(
        Reader(
            f"checkpoint manifest via resume ({strategy})", {"ckpt": f"ckpt-{strategy}"}, CKPT,
            "manifest.json", put_checkpoint_file,
            lambda ws, capsys, o, written_by=strategy: train(
                capsys, o["data"], ws / "ckpt", written_by
            ),
        )  # fmt: skip
        for strategy in STRATEGIES
    ),
    Reader(
        "checkpoint manifest via load_model", {"ckpt": "ckpt-fsdp"}, CKPT, "manifest.json",
        put_checkpoint_file,
        lambda ws, capsys, o: refusal(lambda: checkpoint.load_model(ws / CKPT)),
    ),
    Reader(
        "dataset manifest via training", {"data": "data"}, "data", "manifest.json", put_split,
        lambda ws, capsys, o: train(capsys, ws / "data", ws / "new-ckpt"),
    ),
    Reader(
        "dataset manifest via evaluate", {"data": "data", "model": "model"}, "data",
        "manifest.json", put_split,
        lambda ws, capsys, o: cli(
            capsys, "evaluate", "--model", ws / "model", "--data", ws / "data",
            "--threshold", "0", "--report", ws / "report",
        ),
    ),
    Reader(
        "dataset manifest on object storage", {"data": "data"}, "data", "manifest.json",
        put_split, lambda ws, capsys, o: on_object_storage(ws), local=False,
    ),
    Reader(
        "model card via evaluate", {"data": "data", "model": "model"}, "model", "model.json",
        put_card,
        lambda ws, capsys, o: cli(
            capsys, "evaluate", "--model", ws / "model", "--data", ws / "data",
            "--threshold", "0", "--report", ws / "report",
        ),
        fixed="model.safetensors",
    ),
    Reader(
        "model card via promote", {"model": "model"}, "model", "model.json", put_card,
        lambda ws, capsys, o: cli(
            capsys, "promote", "--model", ws / "model", "--registry", ws / "registry",
            "--version", "v1",
        ),
        fixed="model.safetensors",
    ),
    Reader(
        "export.json via verify_export", {"model": "model"}, "model", "export.json", put_export,
        lambda ws, capsys, o: refusal(lambda: export.verify_export(ws / "model")),
    ),
    Reader(
        "export.json via export_model", {"model": "model"}, "model", "export.json", put_export,
        lambda ws, capsys, o: refusal(lambda: export.export_model(ws / "model", "torchscript")),
    ),
]  # fmt: skip


def applies(reader: Reader, bad: Bad) -> bool:
    """Shaped entries need a local folder; a record whose names are JSON keys (a checkpoint's
    files, a card's checkpoint files) cannot hold a non-string one."""
    if not bad.by_name and not reader.local:
        return False
    keyed = reader.put in (put_checkpoint_file, put_card)
    return bad.json_key or not keyed


CASES = [
    pytest.param(reader, bad, id=f"{reader.id}: {bad.id}")
    for reader in READERS
    for bad in BADS
    if applies(reader, bad)
]


def workspace(tmp_path: Path, reader: Reader, origin: dict[str, Path]) -> Path:
    ws = tmp_path / "ws"
    for name, source in reader.copies.items():
        shutil.copytree(origin[source], ws / name, symlinks=True)
    return ws


def snapshot(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (links, FIFOs and the trainer's lock file aside) with
    its bytes: what a refused reader must leave as it was."""
    files = {}
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            if name != ".lock" and stat.S_ISREG(path.lstat().st_mode):
                files[str(path.relative_to(root))] = path.read_bytes()
    return files


def plant(ws: Path, reader: Reader, bad: Bad, outside: Path) -> object:
    folder = ws / reader.folder
    entry = bad.plant(folder, reader.fixed or "planted", outside)
    record_path = folder / reader.record
    record = json.loads(record_path.read_text())
    reader.put(record, entry, digest_of(folder, entry))
    record_path.write_text(json.dumps(record))
    return entry


def assert_one_line_naming(code: int, err: str, entry: object) -> None:
    lines = err.strip().splitlines()
    assert code == 1, err
    assert len(lines) == 1 and "error: " in lines[0] and "Traceback" not in err, err
    assert shown(entry) in lines[0], f"the line does not name {shown(entry)}: {err}"
    assert "; " in lines[0], "the line says what to do"


@pytest.mark.bad_input
@pytest.mark.security
@pytest.mark.parametrize(("reader", "bad"), CASES)
def test_a_bad_entry_is_refused_in_one_line_and_nothing_is_published(
    reader: Reader, bad: Bad, tmp_path: Path, origin: dict[str, Path], capsys
) -> None:
    ws = workspace(tmp_path, reader, origin)
    outside = tmp_path / "secret.txt"
    outside.write_bytes(b"a file outside every folder the step reads")
    entry = plant(ws, reader, bad, outside)
    before = snapshot(ws)
    code, err = reader.run(ws, capsys, origin)
    assert_one_line_naming(code, err, entry)
    assert snapshot(ws) == before
    assert not {"out", "report", "registry"} & {p.name for p in ws.iterdir()}


def test_the_readers_accept_their_records_as_written(
    tmp_path: Path, origin: dict[str, Path], capsys
) -> None:
    """Without this, a reader refusing everything would pass the cases above."""
    ws = tmp_path / "ws"
    for name in ("ckpt-fsdp", "model", "data"):
        shutil.copytree(origin[name], ws / name)
    code, err = cli(capsys, "collect", "--checkpoint-dir", ws / "ckpt-fsdp", "--output", ws / "c")
    assert code == 0, err
    checkpoint.load_model(ws / "ckpt-fsdp" / "epoch-000001")
    checkpoint.verify_checkpoint(origin["ckpt-deepspeed"] / "epoch-000001")
    datasets.load_split(ws / "data", "test")
    export.verify_export(ws / "model")
    code, err = cli(
        capsys, "evaluate", "--model", ws / "model", "--data", ws / "data", "--threshold", "0"
    )
    assert code == 0, err
    code, err = cli(
        capsys, "promote", "--model", ws / "model", "--registry", ws / "r", "--version", "v1"
    )
    assert code == 0, err


# --- the records themselves ------------------------------------------------------------------

RECORD_SHAPES = {
    "fifo": lambda at, copy: os.mkfifo(at),
    "link-to-dev-zero": lambda at, copy: at.symlink_to("/dev/zero"),
    "link-to-a-copy-outside": lambda at, copy: at.symlink_to(copy),
    "folder": lambda at, copy: at.mkdir(),
}
RECORD_READERS = {
    "checkpoint manifest.json": (
        "ckpt-ddp", "epoch-000001/manifest.json",
        lambda ws: checkpoint.read_manifest(ws / "epoch-000001"),
    ),
    "dataset manifest.json": ("data", "manifest.json", lambda ws: datasets.read_manifest(ws)),
    "model.json": ("model", "model.json", lambda ws: model_card.read_model_card(ws)),
    "export.json": ("model", "export.json", lambda ws: export.verify_export(ws)),
}  # fmt: skip


@pytest.mark.bad_input
@pytest.mark.security
@pytest.mark.parametrize("shape", RECORD_SHAPES.values(), ids=RECORD_SHAPES.keys())
@pytest.mark.parametrize(
    ("source", "record", "read"), RECORD_READERS.values(), ids=RECORD_READERS.keys()
)
def test_a_record_that_is_no_regular_file_inside_is_refused_unread(
    source: str, record: str, read: Callable[[Path], object], shape, tmp_path, origin
) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(origin[source], ws)
    copy = tmp_path / "copy.json"
    shutil.move(ws / record, copy)
    shape(ws / record, copy)
    code, err = refusal(lambda: read(ws))
    assert_one_line_naming(code, err, Path(record).name)


@pytest.mark.security
@pytest.mark.parametrize("shape", RECORD_SHAPES.values(), ids=RECORD_SHAPES.keys())
def test_a_latest_pointer_that_is_no_regular_file_is_not_read(shape, tmp_path, origin) -> None:
    """LATEST only points: one that cannot be read is passed over for the newest folder."""
    ws = tmp_path / "ckpt"
    shutil.copytree(origin["ckpt-ddp"], ws)
    copy = tmp_path / "LATEST"
    shutil.move(ws / "LATEST", copy)
    shape(ws / "LATEST", copy)
    assert checkpoint.latest_checkpoint(ws) == ws / "epoch-000001"


# --- model code a record names ---------------------------------------------------------------


@dataclass(frozen=True)
class CustomCode:
    """A module whose import creates ``marker``; ``spec`` builds the digits mlp."""

    spec: str
    module: str
    marker: Path

    def imported(self) -> bool:
        return self.marker.exists() or self.module in sys.modules


@pytest.fixture
def custom_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CustomCode]:
    module = f"planted_model_{uuid.uuid4().hex[:12]}"
    marker = tmp_path / "the planted module ran"
    code = tmp_path / "code"
    code.mkdir()
    (code / f"{module}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\n"
        "from kubetrain.artifacts.models import mlp as build\n"
    )
    monkeypatch.syspath_prepend(str(code))
    yield CustomCode(f"{module}:build", module, marker)
    sys.modules.pop(module, None)


@pytest.fixture
def custom_model(tmp_path: Path, custom_code: CustomCode) -> dict[str, Path]:
    """A checkpoint and a collected model (collect without export imports nothing) whose
    records name the custom code."""
    ckpt = write_checkpoint(tmp_path / "ckpt", "ddp", spec=custom_code.spec)
    collect_checkpoint(str(ckpt), str(tmp_path / "model"))
    assert not custom_code.imported()
    return {"ckpt": ckpt, "model": tmp_path / "model"}


def evaluate_argv(model: Path, data: Path, *extra: object) -> list[object]:
    return ["evaluate", "--model", model, "--data", data, "--threshold", "0", *extra]


FACES = {
    "evaluate": lambda m, data, capsys, out: cli(
        capsys, *evaluate_argv(m["model"], data, "--report", out)
    ),
    "collect --export": lambda m, data, capsys, out: cli(
        capsys, "collect", "--checkpoint-dir", m["ckpt"], "--output", out,
        "--export", "torch-export",
    ),
    "model_card.load_model": lambda m, data, capsys, out: refusal(
        lambda: model_card.load_model(m["model"])
    ),
    "checkpoint.load_model": lambda m, data, capsys, out: refusal(
        lambda: checkpoint.load_model(m["ckpt"] / "epoch-000001")
    ),
    "export_model": lambda m, data, capsys, out: refusal(
        lambda: export.export_model(m["model"], "torchscript")
    ),
}  # fmt: skip


@pytest.mark.security
@pytest.mark.parametrize("face", FACES.values(), ids=FACES.keys())
def test_custom_code_only_a_record_names_is_refused_unimported(
    face, custom_model, custom_code, digits_dir, tmp_path, capsys
) -> None:
    before = snapshot(tmp_path)
    code, err = face(custom_model, digits_dir, capsys, tmp_path / "out")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "model_factory: " in lines[0] and f"--model-factory {custom_code.spec!r}" in lines[0]
    assert not custom_code.imported(), "the module a record names was imported"
    assert not (tmp_path / "out").exists() and snapshot(tmp_path) == before


@pytest.mark.security
def test_custom_code_passed_explicitly_is_used(
    custom_model, custom_code, digits_dir, tmp_path, capsys
) -> None:
    spec = custom_code.spec
    code, err = cli(
        capsys, *evaluate_argv(custom_model["model"], digits_dir, "--model-factory", spec)
    )
    assert code == 0, err
    assert custom_code.marker.exists()  # the user's choice: its code ran
    code, err = cli(
        capsys, "collect", "--checkpoint-dir", custom_model["ckpt"], "--output", tmp_path / "out",
        "--export", "torch-export", "--model-factory", spec,
    )  # fmt: skip
    assert code == 0, err
    export.verify_export(tmp_path / "out", model_factory=spec)
    checkpoint.load_model(custom_model["ckpt"] / "epoch-000001", model_factory=spec)


@pytest.mark.security
def test_the_users_model_factory_wins_over_the_card(
    custom_model, custom_code, digits_dir, capsys
) -> None:
    """The planted module builds an mlp; naming ``mlp`` loads the weights without it."""
    argv = evaluate_argv(custom_model["model"], digits_dir, "--model-factory", "mlp")
    code, err = cli(capsys, *argv)
    assert code == 0, err
    assert not custom_code.imported()


def test_every_face_of_the_steps_takes_the_model_factory() -> None:
    """The CLI, the KFP component and the Argo template reach the same function's parameter."""
    import inspect

    from kubetrain.components.collect_checkpoint.component import collect_checkpoint as kfp_c
    from kubetrain.components.collect_checkpoint.template import collect_checkpoint_template
    from kubetrain.components.evaluate_model.component import evaluate_model as kfp_e
    from kubetrain.components.evaluate_model.template import evaluate_model_template

    for component in (kfp_c, kfp_e):
        assert inspect.signature(component.python_func).parameters["model_factory"].default == ""
    for template in (collect_checkpoint_template(), evaluate_model_template()):
        args = template.args
        at = args.index("--model-factory")
        assert args[at + 1] == "{{inputs.parameters.model_factory}}"
        defaults = {p.name: getattr(p, "default", None) for p in template.inputs}
        assert defaults["model_factory"] == ""


@pytest.mark.security
@pytest.mark.parametrize("source", ["fifo", "/dev/zero", "link-to-dev-zero"])
def test_the_streaming_copy_refuses_a_source_that_is_no_regular_file(source, tmp_path) -> None:
    """The copy collect streams a model file with: a FIFO would block it, /dev/zero never end."""
    from kubetrain.errors import IntegrityError
    from kubetrain.storage.verified_copy import copy_verified

    if source == "fifo":
        os.mkfifo(tmp_path / "fifo")
    elif source == "link-to-dev-zero":
        (tmp_path / source).symlink_to("/dev/zero")
    path = source if source.startswith("/") else str(tmp_path / source)
    with pytest.raises(IntegrityError, match="not a regular file"):
        copy_verified(path, str(tmp_path / "copy"), expected_sha256=DUMMY_SHA256)
    assert not (tmp_path / "copy").exists()


@pytest.mark.security
def test_staging_a_dataset_copies_only_what_its_manifest_lists(
    digits_dir: Path, tmp_path: Path
) -> None:
    """Beside the listed files, a link to /dev/zero and a FIFO: launch's copy onto the shared
    volume opens neither (a whole-folder copy would hang on both) and publishes only the
    manifest and its splits."""
    from kubetrain.components.launch_trainjob.staging import stage_dataset

    source = tmp_path / "data"
    shutil.copytree(digits_dir, source)
    (source / "zero.bin").symlink_to("/dev/zero")
    os.mkfifo(source / "pipe")
    staged = Path(stage_dataset(str(source), str(tmp_path / "shared" / "data")))

    listed = {
        "manifest.json",
        *(s["file"] for s in datasets.read_manifest(source)["splits"].values()),
    }
    assert {p.name for p in staged.iterdir()} == listed
    assert datasets.load_split(staged, "test")
