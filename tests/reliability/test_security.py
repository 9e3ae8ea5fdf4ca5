"""Security: planted pickles never run, no shell ever parses a parameter, RBAC without
wildcards, non-root images and pods, and secret values never leave the environment they were
given in.

The planted files assume the strong attacker: one who can write a checkpoint or model folder
can rewrite its manifest too, so every planted file gets a matching sha256 and what is tested
is the loader itself (safetensors, ``weights_only``, restricted unpicklers), not the checksum.
"""

from __future__ import annotations

import ast
import io
import json
import os
import pickle
import re
import shutil
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes.client
import numpy as np
import pytest
import torch
import yaml

from kubetrain.artifacts.checkpoint import save_checkpoint
from kubetrain.artifacts.models import build_model
from kubetrain.cli import main as kubetrain_main
from kubetrain.storage.integrity import sha256_file
from kubetrain.train.__main__ import main as train_main
from tests.support.argo_server import ArgoServer
from tests.support.objects import torch_runtime

REPO = Path(__file__).resolve().parents[2]
MODEL_INFO = {"spec": "mlp", "sample_shape": [1, 8, 8], "num_classes": 10}  # the digits model
# torch.jit is deprecated by PyTorch; Hera 7.1 serializes with pydantic's deprecated .json().
pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.*deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The `json` method is deprecated"),
]


# --- 1. planted pickles are refused unread ---------------------------------------------------


class RunsCode:
    """Unpickling this creates ``marker``: the code a malicious pickle runs, made visible."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def raw_pickle(marker: Path) -> bytes:
    return pickle.dumps(RunsCode(marker), protocol=2)  # protocol 2: TorchScript's too


def torch_pickle(marker: Path) -> bytes:
    """The payload in ``torch.save``'s zip format, as ``.pt`` files and DCP shards hold it."""
    buffer = io.BytesIO()
    torch.save({"state": RunsCode(marker)}, buffer)
    return buffer.getvalue()


def test_the_planted_payloads_run_code_when_unpickled_unsafely(tmp_path: Path) -> None:
    """Without this, a test below could pass because its payload is inert."""
    pickle.loads(raw_pickle(tmp_path / "raw"))
    torch.load(io.BytesIO(torch_pickle(tmp_path / "zip")), weights_only=False)
    assert (tmp_path / "raw").exists() and (tmp_path / "zip").exists()


def plant(folder: Path, relative: str, data: bytes, manifest: str, key: str) -> Path:
    """Write ``data`` as ``folder/relative`` and record its sha256 where the manifest keeps it."""
    target = folder / relative
    target.write_bytes(data)
    record = json.loads((folder / manifest).read_text())
    if key == "files":
        record["files"][relative] = sha256_file(target)
    else:
        record[key] = sha256_file(target)
    (folder / manifest).write_text(json.dumps(record))
    return target


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A real ddp and fsdp checkpoint folder (CKPT_DIR) of the digits model, written once."""
    root = tmp_path_factory.mktemp("checkpoints")
    folders = {}
    for strategy in ("ddp", "fsdp"):
        torch.manual_seed(0)
        model = build_model("mlp", [1, 8, 8], 10)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        torch.nn.functional.cross_entropy(
            model(torch.randn(4, 1, 8, 8)), torch.tensor([0, 1, 2, 3])
        ).backward()
        optimizer.step()
        save_checkpoint(
            root / strategy,
            model,
            optimizer,
            epoch=1,
            step=1,
            strategy=strategy,
            model_info=MODEL_INFO,
            metrics=[{"epoch": 1}],
        )
        folders[strategy] = root / strategy
    return folders


@pytest.fixture(scope="module")
def collected(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A collected model with both exports, as `kubetrain collect --export` publishes it."""
    from kubetrain.artifacts.export import export_model
    from kubetrain.components.collect_checkpoint.collect import collect_checkpoint

    model_dir = tmp_path_factory.mktemp("collected") / "model"
    collect_checkpoint(str(checkpoints["ddp"]), str(model_dir), "torch-export")
    export_model(model_dir, "torchscript")
    return model_dir


def copy_checkpoint(checkpoints: dict[str, Path], strategy: str, tmp_path: Path) -> Path:
    """A copy of CKPT_DIR; returns its epoch folder, where files are planted."""
    shutil.copytree(checkpoints[strategy], tmp_path / "ckpt")
    return tmp_path / "ckpt" / "epoch-000001"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`kubetrain ARGS` as a step runs it; (exit code, stdout, stderr)."""
    code = kubetrain_main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def resume(capsys: pytest.CaptureFixture[str], ckpt_dir: Path, digits: Path) -> tuple[int, str]:
    """`python -m kubetrain.train` resuming from ``ckpt_dir``: (exit code, stderr)."""
    code = train_main(
        ["--data", str(digits), "--checkpoint-dir", str(ckpt_dir), "--epochs", "2"]
        + ["--device", "cpu"]
    )
    return code, capsys.readouterr().err


def refused(code: int, err: str, named: Path | str, marker: Path) -> None:
    """The step failed with one clear line naming the planted file, which never ran."""
    assert not marker.exists(), "the planted pickle ran"
    assert code == 1, err
    assert str(named) in err and "error:" in err and "Traceback" not in err, err


@pytest.mark.security
@pytest.mark.parametrize(
    ("strategy", "relative", "payload"),
    [("ddp", "model.safetensors", raw_pickle), ("fsdp", "dcp/.metadata", raw_pickle)],
)
def test_collect_refuses_a_planted_checkpoint_file(
    checkpoints, tmp_path, capsys, strategy, relative, payload
) -> None:
    epoch = copy_checkpoint(checkpoints, strategy, tmp_path)
    marker = tmp_path / "ran"
    planted = plant(epoch, relative, payload(marker), "manifest.json", "files")
    code, _, err = cli(
        capsys, "collect", "--checkpoint-dir", str(epoch.parent), "--output", str(tmp_path / "m")
    )
    refused(code, err, planted, marker)
    assert not (tmp_path / "m").exists()


@pytest.mark.security
@pytest.mark.parametrize(
    ("strategy", "relative", "payload"),
    [
        ("ddp", "optimizer.pt", torch_pickle),
        ("ddp", "optimizer.pt", raw_pickle),
        ("ddp", "model.safetensors", raw_pickle),
        ("fsdp", "dcp/.metadata", raw_pickle),
    ],
)
def test_resume_refuses_a_planted_checkpoint_file(
    checkpoints, digits_dir, tmp_path, capsys, strategy, relative, payload
) -> None:
    epoch = copy_checkpoint(checkpoints, strategy, tmp_path)
    marker = tmp_path / "ran"
    planted = plant(epoch, relative, payload(marker), "manifest.json", "files")
    code, err = resume(capsys, epoch.parent, digits_dir)
    refused(code, err, planted, marker)


def plant_bytes_entry(epoch: Path, marker: Path) -> str:
    """Well-formed DCP metadata (only allowed classes) marking a model tensor as a bytes entry
    that points at a planted pickle: DCP's default planner would
    ``torch.load(weights_only=False)`` it. Returns the entry's name."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        MetadataIndex,
        TensorStorageMetadata,
    )

    payload = torch_pickle(marker)
    plant(epoch, "dcp/planted.distcp", payload, "manifest.json", "files")
    metadata = pickle.loads((epoch / "dcp" / ".metadata").read_bytes())  # ours: trusted
    fqn = next(
        key
        for key, entry in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(entry, TensorStorageMetadata)
    )
    metadata.state_dict_metadata[fqn] = BytesStorageMetadata()
    metadata.storage_data = {k: v for k, v in metadata.storage_data.items() if k.fqn != fqn}
    metadata.storage_data[MetadataIndex(fqn)] = _StorageInfo("planted.distcp", 0, len(payload))
    plant(epoch, "dcp/.metadata", pickle.dumps(metadata), "manifest.json", "files")
    return fqn


@pytest.mark.security
def test_resume_refuses_dcp_metadata_that_turns_a_tensor_into_pickled_bytes(
    checkpoints, digits_dir, tmp_path, capsys
) -> None:
    epoch = copy_checkpoint(checkpoints, "fsdp", tmp_path)
    marker = tmp_path / "ran"
    fqn = plant_bytes_entry(epoch, marker)
    code, err = resume(capsys, epoch.parent, digits_dir)
    refused(code, err, epoch / "dcp", marker)
    assert fqn in err


@pytest.mark.security
def test_collect_refuses_dcp_metadata_that_turns_a_tensor_into_pickled_bytes(
    checkpoints, tmp_path, capsys
) -> None:
    """Not skipped (which would publish a model missing a weight): refused, naming it."""
    epoch = copy_checkpoint(checkpoints, "fsdp", tmp_path)
    marker = tmp_path / "ran"
    fqn = plant_bytes_entry(epoch, marker)
    output = tmp_path / "m"
    code, _, err = cli(
        capsys, "collect", "--checkpoint-dir", str(epoch.parent), "--output", str(output)
    )
    refused(code, err, epoch / "dcp", marker)
    assert fqn.removeprefix("model.") in err and not output.exists()


@pytest.mark.security
def test_evaluate_refuses_a_planted_model_file(collected, digits_dir, tmp_path, capsys) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(collected, model_dir)
    marker = tmp_path / "ran"
    planted = plant(model_dir, "model.safetensors", raw_pickle(marker), "model.json", "sha256")
    code, _, err = cli(capsys, "evaluate", "--model", str(model_dir), "--data", str(digits_dir))
    refused(code, err, planted, marker)


@pytest.mark.security
def test_promote_refuses_a_planted_model_file_without_unpickling_it(collected, tmp_path, capsys):
    """Promote checks the safetensors header (never unpickles), so a pickle with a matching
    sha256 in its card is refused and nothing reaches the registry."""
    model_dir = tmp_path / "model"
    shutil.copytree(collected, model_dir)
    marker = tmp_path / "ran"
    plant(model_dir, "model.safetensors", raw_pickle(marker), "model.json", "sha256")
    registry = tmp_path / "registry"
    code, _, err = cli(
        capsys, "promote", "--model", str(model_dir), "--registry", str(registry), "--version", "v1"
    )
    refused(code, err, "model.safetensors", marker)
    assert "is not a safetensors file" in err
    assert not registry.exists() or not any(registry.iterdir())


def rewrite_archive(source: Path, target: Path, replace: dict[str, bytes]) -> None:
    """Copy a zip archive, replacing or adding the members named in ``replace``."""
    replace = dict(replace)
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            new.writestr(info, replace.pop(info.filename, old.read(info.filename)))
        for name, data in replace.items():
            new.writestr(name, data)


def pt2_planted_sample_inputs(archive: zipfile.ZipFile, marker: Path) -> dict[str, bytes]:
    """torch.export.load retries sample inputs with weights_only=False."""
    (name,) = [n for n in archive.namelist() if n.endswith("sample_inputs/model.pt")]
    return {name: torch_pickle(marker)}


def pt2_pickled_weight(archive: zipfile.ZipFile, marker: Path) -> dict[str, bytes]:
    """A weight marked ``use_pickle`` is torch.load-ed with weights_only=False."""
    (name,) = [n for n in archive.namelist() if n.endswith("model_weights_config.json")]
    config = json.loads(archive.read(name))
    fqn, entry = next(iter(config["config"].items()))
    config["config"][fqn] = {**entry, "use_pickle": True, "tensor_meta": None}
    weight = name.rsplit("/", 1)[0] + "/" + entry["path_name"]
    return {name: json.dumps(config).encode(), weight: torch_pickle(marker)}


def pt2_opaque_constant(archive: zipfile.ZipFile, marker: Path) -> dict[str, bytes]:
    """An opaque-object constant is ``pickle.loads``-ed as it is."""
    from torch.export.pt2_archive.constants import OPAQUE_OBJ_FILENAME_PREFIX

    (name,) = [n for n in archive.namelist() if n.endswith("model_constants_config.json")]
    path_name = f"{OPAQUE_OBJ_FILENAME_PREFIX}0"
    entry = {"path_name": path_name, "is_param": False, "use_pickle": True, "tensor_meta": None}
    return {
        name: json.dumps({"config": {"planted": entry}}).encode(),
        name.rsplit("/", 1)[0] + "/" + path_name: raw_pickle(marker),
    }


def torchscript_data_pkl(archive: zipfile.ZipFile, marker: Path) -> dict[str, bytes]:
    (name,) = [n for n in archive.namelist() if n.endswith("/data.pkl")]
    return {name: raw_pickle(marker)}


@pytest.mark.security
@pytest.mark.parametrize(
    ("kind", "file", "planting"),
    [
        ("torch-export", "model.pt2", pt2_planted_sample_inputs),
        ("torch-export", "model.pt2", pt2_pickled_weight),
        ("torch-export", "model.pt2", pt2_opaque_constant),
        ("torchscript", "model.torchscript.pt", torchscript_data_pkl),
    ],
)
def test_verify_export_refuses_a_planted_program(collected, tmp_path, kind, file, planting):
    from kubetrain.artifacts.export import EXPORT_CARD, verify_export
    from kubetrain.errors import IntegrityError

    model_dir = tmp_path / "model"
    shutil.copytree(collected, model_dir)
    marker = tmp_path / "ran"
    with zipfile.ZipFile(collected / file) as archive:
        rewrite_archive(collected / file, model_dir / file, planting(archive, marker))
    card = json.loads((model_dir / EXPORT_CARD).read_text())
    card["exports"][kind]["sha256"] = sha256_file(model_dir / file)
    (model_dir / EXPORT_CARD).write_text(json.dumps(card))
    with pytest.raises(IntegrityError, match=re.escape(str(model_dir / file))):
        verify_export(model_dir, kind)
    assert not marker.exists(), "the planted pickle ran"


@pytest.mark.security
def test_prep_refuses_an_npz_with_a_pickled_array(tmp_path, capsys) -> None:
    """(tests in components/dataset_prep cover the refusal; this one that nothing ran.)"""
    marker = tmp_path / "ran"
    source = tmp_path / "data.npz"
    labels = np.empty(1, dtype=object)
    labels[0] = RunsCode(marker)
    np.savez(source, x=np.zeros((1, 1, 8, 8), np.float32), y=labels)
    code, _, err = cli(capsys, "prep", "--source", str(source), "--output", str(tmp_path / "d"))
    assert not marker.exists(), "the planted pickle ran"
    assert code == 2 and str(source) in err and "Traceback" not in err, err


# --- 2. no shell: nothing a parameter reaches is parsed by a shell ---------------------------

SHELLS = {"sh", "bash", "dash", "zsh", "ash", "ksh"}
SHELL_FLAG = re.compile(r"-[a-z]*c[a-z]*")  # -c, -ec, -xc, -lc...
SHELL_FUNCTIONS = {
    "os.system",
    "os.popen",
    "subprocess.getoutput",
    "subprocess.getstatusoutput",
    "asyncio.create_subprocess_shell",
}
SUBPROCESS_FUNCTIONS = {
    f"subprocess.{name}" for name in ("run", "Popen", "call", "check_call", "check_output")
}
#: (file, the ``sh -c`` script as ``ast.unparse`` writes it) -> why that script, built at run
#: time, is no command line from parameters.
ALLOWED_SHELL_SCRIPTS = {
    ("kubetrain/render/rayjob.py", "line"): (
        "a RayJob's entrypoint is a shell line by Ray's and KubeRay's design (KubeRay pastes it "
        "into its submitter's bash line, Ray's job_supervisor runs it with shell=True): "
        "TrainJobSpec.ray_entrypoint shlex-quotes every word, and the `sh -c LINE` that keeps "
        "its `&&` from the submitter's bash is shlex.join'ed (rayjob.entrypoint's docstring)"
    ),
}


def shell_script_at(argv: list[Any]) -> int | None:
    """Where the script of ``[..., "sh", "-c", SCRIPT, ...]`` is (a shell directly followed by
    a -c flag), or None when ``argv`` runs no shell that way."""
    for index, (first, flag) in enumerate(zip(argv, argv[1:], strict=False)):
        if (
            isinstance(first, str)
            and os.path.basename(first) in SHELLS
            and isinstance(flag, str)
            and SHELL_FLAG.fullmatch(flag)
        ):
            return index + 2
    return None


def runs_a_shell(argv: list[Any]) -> bool:
    return shell_script_at(argv) is not None


def _is_text(node: ast.AST) -> bool:
    """A str built in place: literal, f-string, concatenation, %/format/join."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mod):
        return _is_text(node.left) or _is_text(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in ("format", "join") and _is_text(node.func.value)
    return False


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def shell_findings(
    source: str,
    filename: str = "<snippet>",
    allowed: Mapping[tuple[str, str], str] = ALLOWED_SHELL_SCRIPTS,
) -> list[str]:
    """Where Python code hands a shell a command line: shell=, os.system/popen and friends,
    subprocess given one string, or an argv list running ``sh -c`` on a script built at run
    time (a fixed script taking the parameters as "$@" is data-safe, like KFP's launcher)."""
    tree = ast.parse(source, filename)
    constants = {  # module-level names bound once to a str literal
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    aliases: dict[str, str] = {}  # local name -> qualified name, from the imports
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    findings = []
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.List | ast.Tuple):
            argv = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            at = shell_script_at(argv)
            # A fixed script (a literal, or a module constant holding one) may run, with the
            # parameters after it as "$@" data; a script built at run time may not.
            script = node.elts[at] if at is not None and at < len(node.elts) else None
            fixed = (isinstance(script, ast.Constant) and isinstance(script.value, str)) or (
                isinstance(script, ast.Name) and script.id in constants
            )
            listed = script is not None and (filename, ast.unparse(script)) in allowed
            if at is not None and not fixed and not listed:
                findings.append(f"{where}: a shell -c script built at run time")
        if not isinstance(node, ast.Call):
            continue
        head, _, rest = _dotted(node.func).partition(".")
        name = ".".join(filter(None, [aliases.get(head, head), rest]))
        for keyword in node.keywords:
            if keyword.arg == "shell" and not (
                isinstance(keyword.value, ast.Constant) and keyword.value.value is False
            ):
                findings.append(f"{where}: shell={ast.unparse(keyword.value)}")
        if name in SHELL_FUNCTIONS:
            findings.append(f"{where}: {name} runs its argument through a shell")
        if name in SUBPROCESS_FUNCTIONS:
            command = node.args[0] if node.args else None
            command = next((k.value for k in node.keywords if k.arg == "args"), command)
            if command is not None and _is_text(command):
                findings.append(f"{where}: {name} given one string, not an argv list")
    return findings


@pytest.mark.parametrize(
    "snippet",
    [
        "import subprocess\nsubprocess.run(cmd, shell=True)",
        "import subprocess as sp\nsp.Popen(command, shell=flag)",
        "import os\nos.system('tar xf ' + archive)",
        "from os import popen\npopen(f'cat {path}')",
        "import subprocess\nsubprocess.check_output(f'git log {ref}')",
        "from subprocess import run\nrun(args='kubectl get ' + name)",
        "import subprocess\nsubprocess.run(['bash', '-c', script])",
        "command = ['/bin/sh', '-ec', f'train --epochs {epochs}']",
        "import subprocess\nsubprocess.run(['sh', '-c', 'exec ' + program, 'x'])",
        "import asyncio\nasyncio.create_subprocess_shell(line)",
    ],
)
def test_the_shell_scanner_finds_a_shell(snippet: str) -> None:
    assert shell_findings(snippet)


@pytest.mark.parametrize(
    "snippet",
    [
        "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'pass'], check=True)",
        "import subprocess\nsubprocess.Popen(['torchrun', *args], shell=False)",
        "import asyncio\nasyncio.create_subprocess_exec('kubetrain', 'wait', name)",
        "import subprocess\nRUN = 'exec \"$@\"'\nsubprocess.run(['sh', '-c', RUN, 'sh', *argv])",
    ],
)
def test_the_shell_scanner_passes_an_argv(snippet: str) -> None:
    assert shell_findings(snippet) == []


def python_files(root: str) -> Iterator[Path]:
    """Our Python files under ``root``: not the virtual environments and caches in hidden or
    ignored folders (e.g. bench/.sdk-venv, which `make bench` creates)."""
    for path in sorted((REPO / root).rglob("*.py")):
        parts = path.relative_to(REPO).parts[:-1]
        if not any(part.startswith(".") or part == "__pycache__" for part in parts):
            yield path


@pytest.mark.security
@pytest.mark.parametrize("root", ["kubetrain", "components", "pipelines", "bench"])
def test_no_python_code_hands_a_shell_a_command_line(root: str) -> None:
    files = list(python_files(root))
    assert files
    findings = [
        finding
        for path in files
        for finding in shell_findings(path.read_text(), str(path.relative_to(REPO)))
    ]
    assert findings == []


def test_each_allowed_shell_script_is_still_there() -> None:
    """An allowance names a ``sh -c`` script the scanner would find: once it goes, so does
    the allowance."""
    for filename, script in ALLOWED_SHELL_SCRIPTS:
        source = (REPO / filename).read_text()
        others = {
            key: why for key, why in ALLOWED_SHELL_SCRIPTS.items() if key != (filename, script)
        }
        assert shell_findings(source, filename, others) != shell_findings(source, filename)


def is_kfp_bootstrap(argv: Any) -> bool:
    """KFP's lightweight-component launcher (``@dsl.component`` compiles to it): ``sh -ec`` with
    a fixed script that writes the component's source ($0) to a file and runs KFP's executor on
    "$@". Parameters reach it only as the argv element '{{$}}', never inside the script."""
    return (
        isinstance(argv, list)
        and argv[:2] == ["sh", "-ec"]
        and len(argv) > 2
        and isinstance(argv[2], str)
        and "kfp.dsl.executor_main" in argv[2]
        and '"$@"' in argv[2]
        and not any(isinstance(a, str) and ("{{" in a or "$(inputs" in a) for a in argv)
    )


def container_findings(document: Any, where: str) -> list[str]:
    """Containers (anything with a command/args list) and Argo script templates that run a
    shell on a command line, except KFP's fixed launcher."""
    findings = []
    if isinstance(document, dict):
        command, args = document.get("command"), document.get("args")
        argv = [
            *(command if isinstance(command, list) else []),
            *(args if isinstance(args, list) else []),
        ]
        if runs_a_shell(argv) and not is_kfp_bootstrap(command):
            findings.append(f"{where}: runs {argv[:3]}")
        if "source" in document and isinstance(command, list) and command:
            if os.path.basename(str(command[0])) in SHELLS:
                findings.append(f"{where}: a shell script template")
        for key, value in document.items():
            findings += container_findings(value, f"{where}.{key}")
    elif isinstance(document, list):
        for index, value in enumerate(document):
            findings += container_findings(value, f"{where}[{index}]")
    return findings


@pytest.mark.parametrize(
    "container",
    [
        {"command": ["sh", "-c", "train --epochs {{inputs.parameters.epochs}}"]},
        {"command": ["/bin/bash"], "args": ["-c", "kubetrain launch $(EXTRA)"]},
        {"command": ["bash"], "source": "kubetrain launch {{inputs.parameters.name}}"},
        {"command": ["sh", "-ec", 'python3 -m kfp.dsl.executor_main "$@" {{$}}']},
    ],
)
def test_the_container_scanner_finds_a_shell(container: dict[str, Any]) -> None:
    assert container_findings({"spec": {"templates": [{"container": container}]}}, "doc")


@pytest.mark.security
@pytest.mark.parametrize("path", sorted((REPO / "pipelines" / "compiled").glob("*.yaml")))
def test_no_compiled_pipeline_runs_a_shell_on_a_command_line(path: Path) -> None:
    documents = list(yaml.safe_load_all(path.read_text()))
    assert documents
    assert container_findings(documents, path.name) == []


def dockerfile_stages(path: Path) -> list[list[tuple[str, str]]]:
    """The build stages of a Dockerfile, each as (INSTRUCTION, arguments) pairs."""
    text = re.sub(r"\\\n", " ", path.read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in (raw.strip() for raw in text.splitlines()):
        if not line or line.startswith("#"):
            continue
        op, _, args = line.partition(" ")
        if op.upper() == "FROM":
            stages.append([])
        stages[-1].append((op.upper(), args.strip()))
    return stages


def dockerfile_findings(path: Path) -> list[str]:
    """CMD/ENTRYPOINT not in exec form (a JSON list), or running ``sh -c``; the final stage
    without a numeric, non-root ``USER uid[:gid]`` (runAsNonRoot can only check a number)."""
    stages = dockerfile_stages(path)
    findings = []
    for op, args in (step for stage in stages for step in stage):
        if op not in ("CMD", "ENTRYPOINT"):
            continue
        try:
            argv = json.loads(args)
        except json.JSONDecodeError:
            argv = None
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            findings.append(f"{path.name}: {op} {args} is in shell form")
        elif runs_a_shell(argv):
            findings.append(f"{path.name}: {op} runs a shell")
    users = [args for op, args in stages[-1] if op == "USER"] if stages else []
    ids = users[-1].split(":") if users else []
    if not ids or not all(part.isdigit() and int(part) != 0 for part in ids):
        findings.append(f"{path.name}: final stage USER is {users[-1] if users else None}")
    return findings


@pytest.mark.parametrize(
    "text",
    [
        "FROM python:3.11\nUSER 10001\nCMD python -m kubetrain",
        'FROM python:3.11\nUSER 10001\nENTRYPOINT ["sh", "-c", "kubetrain $0"]',
        "FROM python:3.11\nUSER kubetrain",
        "FROM python:3.11\nUSER 10001:0",
        'FROM python:3.11 AS build\nUSER 10001\nFROM python:3.11\nCMD ["kubetrain"]',
    ],
)
def test_the_dockerfile_scanner_finds_a_shell_or_root(tmp_path: Path, text: str) -> None:
    (tmp_path / "x.Dockerfile").write_text(text)
    assert dockerfile_findings(tmp_path / "x.Dockerfile")


@pytest.mark.security
@pytest.mark.parametrize("path", sorted((REPO / "images").glob("*.Dockerfile")))
def test_images_use_exec_form_and_end_as_a_numeric_non_root_user(path: Path) -> None:
    """(tests/test_runtimes.py checks the two images' USER too; this covers every Dockerfile,
    the final stage's USER and group, and CMD/ENTRYPOINT.)"""
    assert dockerfile_findings(path) == []


# --- 3. RBAC without wildcards or Secrets ----------------------------------------------------

SECRET_WRITES = {"create", "update", "patch", "delete", "deletecollection"}


def rbac_findings(document: dict[str, Any], where: str) -> list[str]:
    findings = []
    for index, rule in enumerate(document.get("rules") or []):
        for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            if any("*" in str(value) for value in rule.get(key) or []):
                findings.append(f"{where} rule {index}: '*' in {key}")
        resources = set(rule.get("resources") or [])
        if resources & {"secrets", "*"} and set(rule.get("verbs") or []) & (SECRET_WRITES | {"*"}):
            findings.append(f"{where} rule {index}: writes Secrets")
        if {"escalate", "bind", "impersonate"} & set(rule.get("verbs") or []):
            findings.append(f"{where} rule {index}: escalate/bind/impersonate")
    return findings


def repo_roles() -> list[tuple[str, dict[str, Any]]]:
    """Every Role and ClusterRole in the repository's YAML, wherever it is."""
    roles = []
    paths = []
    for folder, subfolders, files in os.walk(REPO):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d != "node_modules"]
        paths += [Path(folder, f) for f in files if f.endswith((".yaml", ".yml"))]
    for path in sorted(paths):
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and document.get("kind") in ("Role", "ClusterRole"):
                roles.append((f"{path.relative_to(REPO)} {document['kind']}", document))
    return roles


def test_the_rbac_scanner_finds_wildcards_and_secret_writes() -> None:
    rules = [
        {"apiGroups": ["*"], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]},
    ]
    assert len(rbac_findings({"kind": "Role", "rules": rules}, "role")) == 3


@pytest.mark.security
def test_every_role_in_the_repo_has_no_wildcards_and_writes_no_secrets() -> None:
    """(tests/test_runtimes.py checks the packaged RBAC's Role and ClusterRole; this finds
    every Role/ClusterRole in any YAML file, so a new one cannot skip the rules.)"""
    roles = repo_roles()
    assert any(where.startswith("kubetrain/render/manifests/rbac.yaml") for where, _ in roles)
    assert [f for where, role in roles for f in rbac_findings(role, where)] == []


# --- 4. pods never ask for root or privileges ------------------------------------------------


def privilege_findings(document: Any, where: str) -> list[str]:
    """Every securityContext that runs as root or grants privileges."""
    findings = []
    if isinstance(document, dict):
        context = document.get("securityContext")
        if isinstance(context, dict):
            if context.get("runAsUser") == 0 or context.get("runAsGroup") == 0:
                findings.append(f"{where}: runs as root")
            if context.get("runAsNonRoot") is False:
                findings.append(f"{where}: runAsNonRoot false")
            if context.get("privileged") or context.get("allowPrivilegeEscalation"):
                findings.append(f"{where}: privileged or privilege escalation")
            if (context.get("capabilities") or {}).get("add"):
                findings.append(f"{where}: adds capabilities")
        for key, value in document.items():
            findings += privilege_findings(value, f"{where}.{key}")
    elif isinstance(document, list):
        for index, value in enumerate(document):
            findings += privilege_findings(value, f"{where}[{index}]")
    return findings


def test_the_privilege_scanner_finds_root_and_privileges() -> None:
    pod = {"spec": {"securityContext": {"runAsUser": 0}, "containers": [
        {"securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}}}
    ]}}  # fmt: skip
    assert len(privilege_findings(pod, "pod")) == 3


def pod_specs(document: Any) -> list[dict[str, Any]]:
    """Every pod spec (a dict with a ``containers`` list) in ``document``."""
    if isinstance(document, list):
        return [spec for value in document for spec in pod_specs(value)]
    if not isinstance(document, dict):
        return []
    own = [document] if isinstance(document.get("containers"), list) else []
    return own + [spec for value in document.values() for spec in pod_specs(value)]


@pytest.mark.security
def test_rendered_jobs_runtimes_and_pipelines_never_ask_for_root(tmp_path: Path) -> None:
    """Nothing asks for root or privileges; the Indexed Job's pods and every Argo step
    container enforce runAsNonRoot (TrainJob pods get it from the runtime, which the
    TrainJob cannot override: see tests/test_runtimes.py)."""
    from kubetrain.jobspec import Resources, TrainJobSpec
    from kubetrain.render import render_indexed_job, render_trainjob

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = TrainJobSpec(
        name="sec",
        command=("torchrun", "train.py"),
        script=str(script),
        num_nodes=2,
        resources_per_node=Resources(cpu="1", memory="1Gi"),
        storage_secret="team-s3",
    )
    documents: list[tuple[str, Any]] = [
        ("trainjob", render_trainjob(spec)),
        ("indexed-job", render_indexed_job(spec)),
    ]
    for where, rendered in documents:
        for pod in pod_specs(rendered):
            context = pod.get("securityContext")
            assert context is None or context.get("runAsNonRoot") is True, (where, context)
    (indexed_pod,) = pod_specs(documents[1][1])
    assert indexed_pod["securityContext"]["runAsNonRoot"] is True
    for folder in ("runtimes", "pipelines/compiled"):
        for path in sorted((REPO / folder).glob("*.yaml")):
            documents.append((path.name, list(yaml.safe_load_all(path.read_text()))))
    for stem in ("training_workflow", "training_workflow_template"):
        workflow = yaml.safe_load((REPO / "pipelines/compiled" / f"{stem}.yaml").read_text())
        for template in workflow["spec"]["templates"]:
            if "container" in template:
                context = template["container"]["securityContext"]
                assert context["runAsNonRoot"] is True, (stem, template["name"])
    assert [f for where, doc in documents for f in privilege_findings(doc, where)] == []


# --- 5. secret values never leave the environment --------------------------------------------

PLANTED = {
    "AWS_SECRET_ACCESS_KEY": "planted-secret-XYZ-7d41",
    "AWS_ACCESS_KEY_ID": "planted-key-id-0b2e",
    "AWS_SESSION_TOKEN": "planted-session-9c3a",
    "ARGO_TOKEN": "planted-argo-token-5e8f",
}


@pytest.fixture
def planted_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("ARGO_")]:
        monkeypatch.delenv(name)
    for name, value in PLANTED.items():
        monkeypatch.setenv(name, value)


def leaked(text: str) -> list[str]:
    return [name for name, value in PLANTED.items() if value in text]


def files_text(root: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(root.rglob("*")) if p.is_file())


def stored_objects(api_client: kubernetes.client.ApiClient, namespace: str) -> dict[str, Any]:
    """Every object of the kinds a launch creates, read back over HTTP as the server sends it."""
    core = kubernetes.client.CoreV1Api(api_client)
    batch = kubernetes.client.BatchV1Api(api_client)
    custom = kubernetes.client.CustomObjectsApi(api_client)
    raw = {
        "configmaps": core.list_namespaced_config_map(namespace, _preload_content=False),
        "services": core.list_namespaced_service(namespace, _preload_content=False),
        "pods": core.list_namespaced_pod(namespace, _preload_content=False),
        "events": core.list_namespaced_event(namespace, _preload_content=False),
        "jobs": batch.list_namespaced_job(namespace, _preload_content=False),
        "trainjobs": custom.list_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", _preload_content=False
        ),
    }
    return {kind: json.loads(response.data)["items"] for kind, response in raw.items()}


def secret_references(document: Any) -> list[dict[str, Any]]:
    """Every secretKeyRef / secretRef in ``document``."""
    found = []
    if isinstance(document, dict):
        for key, value in document.items():
            if key in ("secretKeyRef", "secretRef"):
                found.append(value)
            else:
                found += secret_references(value)
    elif isinstance(document, list):
        for value in document:
            found += secret_references(value)
    return found


@pytest.mark.security
@pytest.mark.parametrize(
    ("backend", "extra"),
    [
        (
            "trainer",
            [
                "--dataset-uri",
                "hf://org/digits",
                "--dataset-secret",
                "hf-read",
                "--runtime",
                "with-data",
            ],
        ),
        ("job", []),
    ],
)
def test_launch_puts_secrets_in_objects_by_name_only(
    k8s, planted_environment, tmp_path, monkeypatch, capsys, backend, extra
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(k8s.emulator.write_kubeconfig(tmp_path / "kubeconfig")))
    if extra:  # a dataset initializer needs a runtime with that job (Trainer's JobSet Validate)
        k8s.emulator.create(
            "clustertrainingruntimes", torch_runtime("with-data", initializers=True)
        )
    outputs = tmp_path / "outputs"
    code, out, err = cli(
        capsys, "launch", "--backend", backend, "--name", "sec", "--nodes", "2",
        "--data", "s3://bucket/digits", "--checkpoint-dir", "s3://bucket/ckpt",
        "--storage-secret", "team-s3", "--output-parameters", str(outputs), *extra,
    )  # fmt: skip
    assert code == 0, err
    objects = stored_objects(k8s.api_client, k8s.namespace)
    created = {plural for plural, ns, _ in k8s.emulator.object_keys() if ns == k8s.namespace}
    assert created <= set(objects), "a kind of object this test does not read back"
    assert leaked(out + err) == [] and leaked(files_text(outputs)) == []
    assert leaked(json.dumps(objects)) == []
    references = secret_references(objects)
    expected = {"team-s3", *(["hf-read"] if extra else [])}
    assert {ref["name"] for ref in references} == expected
    assert all(set(ref) <= {"name", "key", "optional"} for ref in references), references


@pytest.mark.security
def test_submit_argo_sends_the_token_only_in_its_header(planted_environment, capsys) -> None:
    """(tests/test_submit_argo.py checks out/err; this checks what reaches the server.)"""
    token = PLANTED["ARGO_TOKEN"]
    with ArgoServer(token=token) as server:
        code, out, err = cli(
            capsys, "submit", "argo", "--host", server.url, "--param", "storage_secret=team-s3"
        )
        assert code == 0, err
        (request,) = server.requests
        stored = json.dumps(list(server.workflows.values()))
    assert request.header("Authorization") == [f"Bearer {token}"]
    assert leaked(json.dumps(request.body) + stored + out + err) == []
    parameters = request.body["workflow"]["spec"]["arguments"]["parameters"]
    assert {"name": "storage_secret", "value": "team-s3"} in [
        {k: p[k] for k in ("name", "value") if k in p} for p in parameters
    ]


@pytest.mark.security
def test_a_local_run_keeps_secret_values_out_of_its_logs_and_files(
    planted_environment, digits_dir, tmp_path, monkeypatch, capsys
) -> None:
    """The nodes inherit the environment (as pods get their Secrets); nothing writes it down."""
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(tmp_path / "jobs"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    outputs = tmp_path / "outputs"
    code, out, err = cli(
        capsys, "launch", "--backend", "local", "--name", "sec", "--nodes", "1",
        "--procs-per-node", "1", "--epochs", "1", "--data", str(digits_dir),
        "--output-parameters", str(outputs),
    )  # fmt: skip
    assert code == 0, err
    code, waited, wait_err = cli(capsys, "wait", "--backend", "local", "sec")
    assert code == 0, wait_err
    assert "training complete" in waited
    assert leaked(out + err + waited + wait_err) == []
    assert leaked(files_text(tmp_path / "jobs")) == [] and leaked(files_text(outputs)) == []
