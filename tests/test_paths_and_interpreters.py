"""Paths and interpreters, one rule (issue 26, 3): a path option reaches a node or a user's
program absolute against the caller's folder on every face; a user's program runs with the
caller's PATH and interpreter first, while kubetrain finds its own by path; a model factory
imports from the caller's folder; evaluate's program needs ``--data`` only when it asks for
it; a gate on a metric other than accuracy needs its bound.

The interpreter tests use a real second venv, made by ``python -m venv`` as a user makes
theirs: its own ``python`` and ``torchrun``, a module only it has (as ``lightning`` is only
in the user's), torch through a ``.pth`` line naming the site-packages torch is in (no install),
and no kubetrain."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from kubetrain.backends.base import COMPLETE
from kubetrain.backends.local.backend import LocalBackend
from kubetrain.cli import main as kubetrain_main
from kubetrain.errors import InvalidInput
from tests.support.seed_script import NETDEF, SAVES, write_user_folder

#: A user's program that records what it was given and where it runs, in its checkpoint folder.
SHOW = """
import json, os, sys

data = os.environ.get("KUBETRAIN_DATA_DIR")
seen = {
    "executable": sys.executable,
    "data_dir": data,
    "checkpoint_dir": os.environ["KUBETRAIN_CHECKPOINT_DIR"],
    "cwd": os.getcwd(),
    "dataset_readable": data is not None and os.path.isfile(os.path.join(data, "manifest.json")),
}
with open(os.path.join(os.environ["KUBETRAIN_CHECKPOINT_DIR"], "seen.json"), "w") as out:
    json.dump(seen, out)
"""
#: The module only the user's venv has.
USER_ONLY_MODULE = "only_in_my_venv"


@pytest.fixture
def project(tmp_path, digits_dir) -> Path:
    """The caller's folder: a copy of the dataset as ``data`` and the program ``show.py``."""
    folder = tmp_path / "project"
    shutil.copytree(digits_dir, folder / "data")
    (folder / "show.py").write_text(textwrap.dedent(SHOW))
    return folder


def wait_complete(name: str) -> None:
    status = LocalBackend().wait(name, timeout=120)
    log = "".join(LocalBackend().logs(name, node=0))
    assert status.state == COMPLETE, f"{status.message}\n{log}"


# ------------------------------------------------------------------ 1: paths made absolute
def test_relative_paths_reach_your_program_absolute_from_the_cli(project, local_root, monkeypatch):
    """`kubetrain launch` (and the Argo template, which runs it): the program runs in its
    checkpoint folder, yet finds the dataset named relative to the caller's folder."""
    monkeypatch.chdir(project)
    options = ["launch", "--backend", "local", "--nodes", "1", "--name", "paths-cli"]
    command = ["--data", "data", "--checkpoint-dir", "ckpt", "--", sys.executable, "show.py"]
    assert kubetrain_main([*options, *command]) == 0
    wait_complete("paths-cli")
    seen = json.loads((project / "ckpt" / "seen.json").read_text())
    assert seen["data_dir"] == str(project / "data")
    assert seen["checkpoint_dir"] == str(project / "ckpt") == seen["cwd"]
    assert seen["dataset_readable"]


def test_relative_paths_reach_your_program_absolute_from_the_kfp_component(
    project, local_root, monkeypatch
):
    from kubetrain.components.launch_trainjob.component import launch_trainjob

    monkeypatch.chdir(project)
    outputs = launch_trainjob.python_func(
        dataset=types.SimpleNamespace(path="data"),
        job_name="paths-kfp",
        backend="local",
        nodes=1,
        checkpoint_dir="ckpt",
        command=[sys.executable, "show.py"],
    )
    assert outputs.checkpoint_dir == str(project / "ckpt")
    wait_complete("paths-kfp")
    seen = json.loads((project / "ckpt" / "seen.json").read_text())
    assert seen["data_dir"] == str(project / "data") and seen["dataset_readable"]


def test_an_object_storage_url_reaches_the_nodes_as_given(project, monkeypatch):
    from kubetrain.backends import get_backend
    from kubetrain.components.launch_trainjob.launch import (
        LaunchRequest,
        TrainingOptions,
        plan_launch,
    )

    monkeypatch.chdir(project)
    training = TrainingOptions(data_dir="s3://bucket/digits", checkpoint_dir="s3://bucket/ckpt")
    request = LaunchRequest(training=training, command=("python", "show.py"), name="urls")
    plan = plan_launch(request, "local", get_backend("local"))
    assert plan.spec.env["KUBETRAIN_DATA_DIR"] == "s3://bucket/digits"
    assert plan.spec.env["KUBETRAIN_CHECKPOINT_DIR"] == "s3://bucket/ckpt"


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("options", "field"),
    [
        (["--data", "/mnt/shared/digits", "--checkpoint-dir", "ckpt"], "checkpoint_dir"),
        (["--data", "data"], "data"),  # not copied onto a claim: the nodes would get "data"
    ],
)
def test_a_relative_path_the_cluster_nodes_would_get_is_refused(
    options, field, project, monkeypatch, capsys
):
    """On a cluster this folder is not the nodes': a relative path there is refused in one line
    (our trainer too), not sent as a path that means nothing in them."""
    from tests.reliability.test_bad_input import assert_one_line_error

    monkeypatch.chdir(project)
    assert kubetrain_main(["render", "trainjob", *options]) == 2
    assert_one_line_error(capsys.readouterr().err, "kubetrain render", field)


# ------------------------------------------------------------------ 2: whose interpreter
@pytest.fixture(scope="module")
def user_venv(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("user") / "myvenv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = venv / "lib" / version / "site-packages"
    torch_site = Path(importlib.util.find_spec("torch").origin).parent.parent
    (site / "torch_from_elsewhere.pth").write_text(f"{torch_site}\n")
    (site / f"{USER_ONLY_MODULE}.py").write_text("")
    torchrun = venv / "bin" / "torchrun"  # what pip writes for torch's console script
    torchrun.write_text(
        f"#!{venv}/bin/python\nimport sys\nfrom torch.distributed.run import main\n"
        "sys.exit(main())\n"
    )
    torchrun.chmod(0o755)
    check = [venv / "bin" / "python", "-c", "import kubetrain"]
    assert subprocess.run(check, capture_output=True, cwd=venv).returncode != 0, "no kubetrain"
    return venv


def activated(venv: Path, local_root: Path) -> dict[str, str]:
    """The environment after `source myvenv/bin/activate`, with kubetrain's venv nowhere on
    PATH (kubetrain is invoked by its path)."""
    return {
        **os.environ,
        "PATH": f"{venv / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "VIRTUAL_ENV": str(venv),
        "KUBETRAIN_LOCAL_ROOT": str(local_root),
        "OMP_NUM_THREADS": "1",
    }


def kubetrain_by_path(*args: str, cwd: Path, env: dict[str, str], timeout: float = 120):
    """`/path/.venv/bin/kubetrain ARGS`, as a user runs kubetrain from a venv not activated."""
    command = [str(Path(sys.executable).parent / "kubetrain"), *args]
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_your_torchrun_runs_your_venvs_python(user_venv, project, local_root):
    """`-- torchrun show.py` from the user's activated venv runs its torchrun and python (which
    has their module), not kubetrain's."""
    env = activated(user_venv, local_root)
    (project / "mine.py").write_text(f"import {USER_ONLY_MODULE}\n" + textwrap.dedent(SHOW))
    launched = kubetrain_by_path(
        "launch", "--backend", "local", "--nodes", "1", "--name", "your-venv",
        "--data", "data", "--", "torchrun", "mine.py", cwd=project, env=env,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    waited = kubetrain_by_path("wait", "your-venv", cwd=project, env=env)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    (seen_file,) = local_root.glob("your-venv/checkpoints/seen.json")
    assert json.loads(seen_file.read_text())["executable"] == str(user_venv / "bin" / "python")


def test_our_trainer_runs_on_kubetrains_torch_whatever_your_path(user_venv, project, local_root):
    """With the user's venv first on PATH (its torchrun has no kubetrain) and kubetrain's
    venv not on it at all, `kubetrain launch` without a program still trains."""
    env = activated(user_venv, local_root)
    launched = kubetrain_by_path(
        "launch", "--backend", "local", "--nodes", "1", "--name", "ours", "--data", "data",
        "--epochs", "1", cwd=project, env=env,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    waited = kubetrain_by_path("wait", "ours", cwd=project, env=env)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert (local_root / "ours" / "checkpoints" / "LATEST").is_file()


def test_kubetrain_run_runs_your_program_in_your_venv(user_venv, tmp_path):
    """`source myvenv/bin/activate; kubetrain run --script train.py -- torchrun train.py`:
    the steps find kubetrain's python by path, the program runs on the user's venv (one node:
    every node gets the same PATH)."""
    folder = write_user_folder(
        tmp_path / "project", SAVES["state-dict"], after=f"import {USER_ONLY_MODULE}"
    )
    env = activated(user_venv, tmp_path / "jobs")
    result = kubetrain_by_path(
        "run", "--output", str(tmp_path / "runs"), "--script", "train.py", "--nodes", "1",
        "--model", "netdef:build", "--threshold", "0.9", "--", "torchrun", "train.py",
        cwd=folder, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert any(line.startswith("accuracy ") for line in result.stdout.splitlines())


# ------------------------------------------------------------------ evaluate
#: A user's evaluation program: reads the model after moving to another folder, writes
#: metrics, and records whether it got a dataset.
EVAL = """
import json, os

model = os.environ["KUBETRAIN_MODEL_DIR"]
os.chdir("/")
size = os.path.getsize(os.path.join(model, "model.safetensors"))
with open(os.environ["KUBETRAIN_METRICS_FILE"], "w") as out:
    json.dump({"mse": 0.5, "size": size, "had_data": int("KUBETRAIN_DATA_DIR" in os.environ)},
              out)
"""


@pytest.fixture(scope="module")
def evaluated_project(tmp_path_factory, digits_dir) -> Path:
    """A folder holding ``netdef.py``, ``eval.py``, ``data`` and ``model``: a model of the
    user's own code, saved as a plain state dict and collected."""
    from kubetrain.components.collect_checkpoint.collect import collect_checkpoint

    folder = tmp_path_factory.mktemp("evaluated")
    (folder / "netdef.py").write_text(textwrap.dedent(NETDEF))
    (folder / "eval.py").write_text(textwrap.dedent(EVAL))
    shutil.copytree(digits_dir, folder / "data")
    build = {}
    exec(textwrap.dedent(NETDEF), build)  # the factory, without putting the folder on sys.path
    import torch

    torch.manual_seed(0)
    checkpoints = folder / "checkpoints"
    checkpoints.mkdir()
    torch.save(build["build"]([1, 8, 8], 10).state_dict(), checkpoints / "model.pt")
    collect_checkpoint(str(checkpoints), str(folder / "model"))
    return folder


def evaluate(folder: Path, *args: str, env: dict[str, str] | None = None):
    """`kubetrain evaluate ARGS` by kubetrain's console script, in ``folder``."""
    return kubetrain_by_path("evaluate", *args, cwd=folder, env=env or dict(os.environ))


def test_model_factory_imports_from_the_folder_you_run_in(evaluated_project):
    """As `kubetrain run --model` does; the console script puts no folder of the caller's on
    sys.path."""
    result = evaluate(
        evaluated_project, "--model", "model", "--data", "data", "--threshold", "0",
        "--model-factory", "netdef:build",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("accuracy ")


def test_your_evaluation_program_gets_absolute_folders_and_no_data_unless_given(
    evaluated_project, tmp_path
):
    """The program changes folder before it reads the model, named relative here; without
    ``--data`` (or with the Argo template's empty one) it runs, without KUBETRAIN_DATA_DIR."""
    metrics = tmp_path / "metrics.json"
    gate = ["--metric", "mse", "--below", "1", "--metrics-output", str(metrics)]
    program = ["--", sys.executable, "eval.py"]
    for data, had_data in ((["--data", "data"], 1), ([], 0), (["--data", ""], 0)):
        result = evaluate(evaluated_project, "--model", "model", *data, *gate, *program)
        assert result.returncode == 0, result.stderr
        assert json.loads(metrics.read_text())["had_data"] == had_data


def test_the_kfp_component_runs_your_program_without_a_dataset(
    evaluated_project, tmp_path, monkeypatch
):
    from kfp import dsl

    from kubetrain.components.evaluate_model.component import evaluate_model

    monkeypatch.chdir(evaluated_project)
    outputs = evaluate_model.python_func(
        model=types.SimpleNamespace(path="model"),
        metrics=dsl.Metrics(name="metrics", uri=str(tmp_path / "metrics")),
        classification_metrics=dsl.ClassificationMetrics(name="cm", uri=str(tmp_path / "cm")),
        report=dsl.HTML(name="report", uri=str(tmp_path / "report.html")),
        command=[sys.executable, "eval.py"],
        metric="mse",
        below=1.0,
    )
    assert outputs.passed is True and outputs.metric_value == 0.5


@pytest.mark.bad_input
def test_our_evaluation_still_needs_data(evaluated_project):
    from tests.reliability.test_bad_input import assert_one_line_error

    result = evaluate(evaluated_project, "--model", "model", "--model-factory", "netdef:build")
    assert result.returncode == 2
    assert_one_line_error(result.stderr, "kubetrain evaluate", "--data")


# ------------------------------------------------------------------ 5: a gate needs its bound
@pytest.mark.bad_input
@pytest.mark.parametrize(
    "options",
    [
        ["--metric", "mse", "--", sys.executable, "eval.py"],
        ["--metric", "mse", "--threshold", "", "--below", "", "--command-json",
         json.dumps([sys.executable, "eval.py"])],  # as the Argo template passes them
        ["--metric", "loss", "--model-factory", "netdef:build"],  # ours
    ],
)  # fmt: skip
def test_a_gate_on_another_metric_without_its_bound_is_refused(options, evaluated_project):
    from tests.reliability.test_bad_input import assert_one_line_error

    metrics = evaluated_project / "refused-metrics.json"
    result = evaluate(
        evaluated_project, "--model", "model", "--data", "data",
        "--metrics-output", str(metrics), *options,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    line = assert_one_line_error(result.stderr, "kubetrain evaluate", "metric")
    assert "--below" in line and "--threshold" in line
    assert not metrics.exists()


@pytest.mark.bad_input
def test_the_kfp_component_refuses_the_same_gate(evaluated_project, tmp_path, monkeypatch):
    from kfp import dsl

    from kubetrain.components.evaluate_model.component import evaluate_model

    marker = tmp_path / "ran"
    monkeypatch.chdir(evaluated_project)
    with pytest.raises(InvalidInput, match=r"^metric: 'mse' is gated on no bound"):
        evaluate_model.python_func(
            model=types.SimpleNamespace(path="model"),
            metrics=dsl.Metrics(name="metrics", uri=str(tmp_path / "metrics")),
            classification_metrics=dsl.ClassificationMetrics(name="cm", uri=str(tmp_path / "c")),
            report=dsl.HTML(name="report", uri=str(tmp_path / "report.html")),
            command=[sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
            metric="mse",
        )
    assert not marker.exists()
