"""No step writes into a promoted model registry version, at any depth (issue 28, hostile cases
1j-1m): a version is the folder beside a registry's ``PROMOTED`` pointer, and the output rule
(kubetrain/artifacts/output_rule.py) refuses an output that is that folder or lies anywhere
inside it (links resolved; on object storage, under any prefix that is a version, the bucket
as a registry included); promote refuses a registry that is or lies inside another registry's
version. Each refusal is one line naming the option and the registry, exit code 2, and leaves
the registry byte-identical. A folder under a ``PROMOTED`` file of other content is no
registry, and is published into."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.support.processes import kubetrain_in_process as run_cli
from tests.test_preflight_locations import run_checked

BUCKET = "kubetrain-inside-registry"


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def one_line(err: str, prog: str, *needles: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{err}"
    assert lines[0].startswith(f"kubetrain {prog}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]}"
    return lines[0]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint folder collect reads: a torch.save'd state dict an hour old."""
    import os
    import time

    folder = tmp_path_factory.mktemp("ck")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10))
    torch.save(net.state_dict(), folder / "model.pt")
    hour_ago = time.time() - 3600
    os.utime(folder / "model.pt", (hour_ago, hour_ago))
    return folder


@pytest.fixture(scope="module")
def model(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kubetrain.cli import main

    folder = tmp_path_factory.mktemp("model") / "m"
    assert main(["collect", "--checkpoint-dir", str(checkpoint), "--output", str(folder)]) == 0
    return folder


@pytest.fixture
def registry(model: Path, tmp_path: Path, capsys) -> Path:
    """A registry holding version v1 of ``model``, PROMOTED pointing at it."""
    code, _, err = run_cli(
        ["promote", "--model", model, "--registry", tmp_path / "reg", "--version", "v1"], capsys
    )
    assert code == 0, err
    return tmp_path / "reg"


def through_a_link(reg: Path) -> Path:
    (reg.parent / "alias").symlink_to(reg / "v1", target_is_directory=True)
    return reg.parent / "alias" / "sub"


#: Where an output is put -> how the refusal places it.
NESTED: dict[str, tuple[Callable[[Path], Path], str]] = {
    "the version": (lambda reg: reg / "v1", "is the version v1"),
    "inside the version": (lambda reg: reg / "v1" / "sub", "is inside the version v1"),
    "deep inside the version": (lambda reg: reg / "v1" / "a" / "b", "is inside the version v1"),
    "a respelling": (lambda reg: reg / "v1" / ".." / "v1" / "x", "is inside the version v1"),
    "through a link to the version": (through_a_link, "is inside the version v1"),
}


@pytest.mark.bad_input
@pytest.mark.parametrize("shape", NESTED.values(), ids=NESTED.keys())
@pytest.mark.parametrize("step", ["collect", "prep"])
def test_no_output_is_in_a_promoted_version(registry, checkpoint, step, shape, capsys):
    place, relation = shape
    output = place(registry)
    before = tree(registry)
    args = ["--checkpoint-dir", checkpoint] if step == "collect" else []
    code, _, err = run_cli([step, *args, "--output", output], capsys)
    assert tree(registry) == before, "the promoted version was written into"
    assert code == 2
    one_line(err, step, relation, f"of the model registry {registry.resolve()}")


@pytest.mark.bad_input
@pytest.mark.parametrize("where", [("v1",), ("v1", "sub")], ids=["the version", "inside it"])
def test_promote_makes_no_registry_in_a_promoted_version(registry, model, where, capsys):
    before = tree(registry)
    nested = registry.joinpath(*where)
    code, _, err = run_cli(
        ["promote", "--model", model, "--registry", nested, "--version", "v2"], capsys
    )
    assert tree(registry) == before
    assert nested == registry / "v1" or not nested.exists()
    assert code == 2
    one_line(err, "promote", "registry: ", "of the model registry", f"e.g. {registry}")
    # the registry itself takes the new version
    code, _, err = run_cli(
        ["promote", "--model", model, "--registry", registry, "--version", "v2"], capsys
    )
    assert code == 0, err
    assert json.loads((registry / "PROMOTED").read_text())["version"] == "v2"


@pytest.mark.bad_input
def test_run_refuses_a_registry_in_a_promoted_version_before_prep(registry, tmp_path):
    (tmp_path / "netdef.py").write_text("def build(shape, classes):\n    pass\n")
    code, stderr = run_checked(tmp_path, "--registry", registry / "v1" / "sub")
    assert code == 2
    one_line("\n".join(stderr), "run", "--registry: ", "is inside the version v1")
    assert not (tmp_path / "runs").exists()


def test_a_pointer_of_other_content_makes_no_registry(checkpoint, tmp_path, capsys):
    """PROMOTED is the registry's only when it is our pointer: a folder beside a file of that
    name with other content is an ordinary output."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "PROMOTED").write_text('{"format": "someone-else/v1"}\n')
    output = tmp_path / "notes" / "v1" / "model"
    code, _, err = run_cli(["collect", "--checkpoint-dir", checkpoint, "--output", output], capsys)
    assert code == 0, err
    assert (output / "model.json").is_file()


# --- object storage ------------------------------------------------------------------------


def bucket_snapshot(bucket: str) -> dict[str, str]:
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    return {path: hashlib.sha256(fs.cat_file(path)).hexdigest() for path in fs.find(bucket)}


@pytest.mark.bad_input
@pytest.mark.parametrize("at_root", [False, True], ids=["under-a-prefix", "the-bucket"])
def test_no_output_is_in_a_promoted_version_on_object_storage(
    s3_env: Any, model, checkpoint, at_root, request, capsys
):
    if at_root:
        bucket = f"{BUCKET}-root"
        s3_env.create_bucket(bucket)
        reg = f"s3://{bucket}"
    else:
        bucket, reg = BUCKET, f"s3://{BUCKET}/{request.node.name.replace('[', '-')[:-1]}/reg"
    code, _, err = run_cli(["promote", "--model", model, "--registry", reg, "--version", "v1"],
                           capsys)  # fmt: skip
    assert code == 0, err
    before = bucket_snapshot(bucket)
    for output in (f"{reg}/v1/sub", f"{reg}/v1/a/b/"):
        code, _, err = run_cli(["collect", "--checkpoint-dir", checkpoint, "--output", output],
                               capsys)  # fmt: skip
        assert code == 2
        one_line(err, "collect", "output: ", "is inside the version v1", f"registry {reg} ")
        code, _, err = run_cli(["promote", "--model", model, "--registry", output, "--version",
                                "v2"], capsys)  # fmt: skip
        assert code == 2
        one_line(err, "promote", "registry: ", "is inside the version v1")
    assert bucket_snapshot(bucket) == before
