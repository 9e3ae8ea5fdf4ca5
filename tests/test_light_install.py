"""A base install (``pip install kubetrain``, no ``train`` nor ``ray`` extra) compiles, renders
and submits pipelines: the ``kubetrain`` CLI runs here with torch, numpy, scikit-learn,
safetensors, matplotlib and ray unimportable (a ``sitecustomize`` on PYTHONPATH installs an
import finder that refuses them), and a command that needs them ends as one line naming the
extra to install."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kubetrain.cli import build_parser
from kubetrain.errors import failure_line

REPO = Path(__file__).resolve().parents[1]

#: Top-level modules of the ``train`` extra (pyproject.toml), made unimportable.
TRAIN_EXTRA_MODULES = ("torch", "numpy", "sklearn", "safetensors", "matplotlib")
#: The ``ray`` extra's, made unimportable too: nothing Ray is imported by `--help`.
RAY_EXTRA_MODULES = ("ray",)
BLOCKED_MODULES = (*TRAIN_EXTRA_MODULES, *RAY_EXTRA_MODULES)
#: In the message of the blocked imports: the block, not a missing package, refused them.
MARKER = "blocked by tests/test_light_install.py"

#: Installs the finder, then runs the sitecustomize it shadows (if the interpreter has one),
#: so the subprocess differs from a normal one in the blocked imports only.
SITECUSTOMIZE = f'''
import importlib.machinery
import importlib.util
import os
import sys

BLOCKED = frozenset({BLOCKED_MODULES!r})


class BlockTrainExtra:
    """Refuse the train and ray extras' packages the way a missing package is refused."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} ({MARKER})", name=name)
        return None


sys.meta_path.insert(0, BlockTrainExtra())

_here = os.path.dirname(os.path.abspath(__file__))
_others = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
_shadowed = importlib.machinery.PathFinder.find_spec("sitecustomize", _others)
if _shadowed is not None and _shadowed.loader is not None:
    _module = importlib.util.module_from_spec(_shadowed)
    _shadowed.loader.exec_module(_module)
'''

#: ``PROG: error: PACKAGE is not installed; install kubetrain[train] (...)``, one line.
MISSING_TRAIN = (
    r"(?:torch|numpy|scikit-learn|safetensors|matplotlib) is not installed; "
    r"install kubetrain\[train\] \(pip install 'kubetrain\[train\]'\)"
)


@pytest.fixture(scope="module")
def light_env(tmp_path_factory) -> dict[str, str]:
    """The environment of a subprocess that cannot import the train extra's packages."""
    folder = tmp_path_factory.mktemp("light-site")
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
    env.pop("KUBETRAIN_DEBUG", None)
    return env


def kubetrain(
    args: list[str], env: dict[str, str] | None, cwd: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubetrain", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


@pytest.mark.parametrize("module", [*BLOCKED_MODULES, "torch.distributed", "sklearn.metrics"])
def test_the_block_is_in_force(light_env, tmp_path, module):
    """Not vacuous: in that environment the packages really cannot be imported (by the block,
    while they are installed here), and the block leaves other imports alone."""
    result = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        capture_output=True,
        text=True,
        env=light_env,
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert "ModuleNotFoundError" in result.stderr and MARKER in result.stderr, result.stderr
    others = subprocess.run(
        [sys.executable, "-c", "import kfp, yaml, kubetrain"], env=light_env, cwd=tmp_path
    )
    assert others.returncode == 0


def test_help_of_every_command_needs_no_train_extra(light_env, tmp_path):
    top = kubetrain(["--help"], light_env, tmp_path)
    assert top.returncode == 0, top.stderr
    assert "compile" in top.stdout and "render" in top.stdout
    (subparsers,) = [
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ]
    names = list(subparsers.choices)
    assert {"prep", "run", "compile", "render", "submit", "doctor", "launch"} <= set(names)
    for args in [
        *([name, "--help"] for name in names),
        ["render", "trainjob", "--help"],
        ["render", "runtimes", "--help"],
        ["render", "rbac", "--help"],
        ["submit", "kfp", "--help"],
        ["submit", "argo", "--help"],
    ]:
        result = kubetrain(args, light_env, tmp_path)
        assert result.returncode == 0 and result.stdout.startswith("usage:"), (args, result.stderr)


def _compiled(folder: Path) -> dict[str, str]:
    """The compiled files under ``folder`` (components/*/component.yaml and
    pipelines/compiled/*.yaml) by relative path, less the kfp release's ``sdkVersion:`` line."""
    files = [*folder.glob("components/*/component.yaml"), *folder.glob("pipelines/compiled/*.yaml")]
    return {
        str(path.relative_to(folder)): "".join(
            line for line in path.read_text().splitlines(True) if not line.startswith("sdkVersion:")
        )
        for path in files
    }


def test_compile_writes_what_a_normal_compile_writes(light_env, tmp_path):
    """Byte for byte (but the ``sdkVersion:`` stamp) what a compile with the train extra
    writes, and the files that are committed. Whether the committed YAML is current is
    tests/test_pipeline.py's test_committed_yaml_is_not_stale."""
    light = kubetrain(["compile", "--output-dir", str(tmp_path / "light")], light_env, tmp_path)
    assert light.returncode == 0, light.stderr
    normal = kubetrain(["compile", "--output-dir", str(tmp_path / "normal")], None, tmp_path)
    assert normal.returncode == 0, normal.stderr
    written = _compiled(tmp_path / "light")
    assert written == _compiled(tmp_path / "normal")
    assert sorted(written) == sorted(_compiled(REPO))
    assert not (tmp_path / "components").exists()  # nothing written outside --output-dir


def test_render_trainjob_prints_a_trainjob(light_env, tmp_path):
    result = kubetrain(["render", "trainjob", "--run-name", "r1"], light_env, tmp_path)
    assert result.returncode == 0, result.stderr
    documents = [d for d in yaml.safe_load_all(result.stdout) if d]
    kinds = [d["kind"] for d in documents]
    assert "TrainJob" in kinds, kinds
    (job,) = [d for d in documents if d["kind"] == "TrainJob"]
    assert job["metadata"]["labels"]["kubetrain.io/run-name"] == "r1"


def test_render_prints_the_runtimes_and_rbac_to_apply(light_env, tmp_path):
    """What the README's install pipes to `kubectl apply -f -`, from a base install."""
    runtimes = kubetrain(["render", "runtimes"], light_env, tmp_path)
    assert runtimes.returncode == 0, runtimes.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(runtimes.stdout) if d}
    assert kinds == {"ClusterTrainingRuntime"}
    rbac = kubetrain(["render", "rbac", "--namespace", "kubeflow"], light_env, tmp_path)
    assert rbac.returncode == 0, rbac.stderr
    documents = [d for d in yaml.safe_load_all(rbac.stdout) if d]
    assert [d["kind"] for d in documents] == [
        "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"
    ]  # fmt: skip


def test_submit_argo_checks_parameters(light_env, tmp_path):
    """Parameters are checked against the workflow's before anything is sent (no server)."""
    result = kubetrain(
        ["submit", "argo", "--host", "http://127.0.0.1:9", "--param", "nodes=abc"],
        light_env,
        tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "kubetrain submit: error: --param nodes: 'abc' is not N nor MIN:MAX; give a whole "
        "number of nodes, e.g. 2, or MIN:MAX for an elastic job, e.g. 1:2"
    ]


@pytest.mark.parametrize(
    "args",
    [
        ["prep", "--output", "OUT/dataset"],
        ["run", "--output", "OUT/runs"],
    ],
    ids=["prep", "run"],
)
def test_a_command_that_needs_torch_says_which_extra(light_env, tmp_path, args):
    args = [arg.replace("OUT", str(tmp_path)) for arg in args]
    result = kubetrain(args, light_env, tmp_path)
    assert result.returncode == 1
    assert re.fullmatch(rf"kubetrain {args[0]}: error: {MISSING_TRAIN}\n", result.stderr), (
        result.stderr
    )


def test_the_trainer_says_which_extra(light_env, tmp_path):
    (tmp_path / "data").mkdir()  # options are checked first, torch imported after them
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubetrain.train",
            "--data",
            str(tmp_path / "data"),
            "--checkpoint-dir",
            str(tmp_path / "checkpoints"),
        ],
        capture_output=True,
        text=True,
        env=light_env,
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert re.fullmatch(rf"kubetrain.train: error: {MISSING_TRAIN}\n", result.stderr), result.stderr


def test_the_ray_trainer_help_needs_neither_extra(light_env, tmp_path):
    """`python -m kubetrain.train.ray --help` (what a RayJob's entrypoint runs) imports
    neither torch nor Ray: both are imported where the job runs."""
    result = subprocess.run(
        [sys.executable, "-m", "kubetrain.train.ray", "--help"],
        capture_output=True,
        text=True,
        env=light_env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.startswith("usage: kubetrain.train.ray") and "--num-workers" in result.stdout
    )


def test_only_a_package_of_an_extra_is_named_as_missing():
    """The boundary's line for a ModuleNotFoundError: the extra for one of its packages (raised
    or the explicit cause), an internal error for any other module or a mere context."""
    line, code = failure_line(ModuleNotFoundError("No module named 'torch'", name="torch"))
    assert (line, code) == (
        "torch is not installed; install kubetrain[train] (pip install 'kubetrain[train]')",
        1,
    )
    sub = ModuleNotFoundError("No module named 'sklearn.metrics'", name="sklearn.metrics")
    assert failure_line(sub)[0].startswith(
        "scikit-learn is not installed; install kubetrain[train]"
    )
    wrapped = RuntimeError("loading failed")
    wrapped.__cause__ = ModuleNotFoundError(name="torchvision")
    assert failure_line(wrapped)[0].startswith(
        "torchvision is not installed; install kubetrain[vision]"
    )
    assert failure_line(ModuleNotFoundError("No module named 'foo'", name="foo"))[0].startswith(
        "internal error (ModuleNotFoundError"
    )
    handled = RuntimeError("a bug while handling it")
    handled.__context__ = ModuleNotFoundError(name="torch")
    assert failure_line(handled)[0].startswith("internal error (RuntimeError")
