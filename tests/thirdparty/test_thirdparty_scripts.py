"""Issue 26 (6): training scripts in the styles of public examples (the DDP tutorial's
snapshot, FSDP2's full state dicts, the DCP recipe's ``{"app": AppState}``, the Kubeflow SDK's
training function, a Lightning ``Trainer(num_nodes=2)`` and HF-style sharded safetensors) run
unmodified, as a user runs them: through ``kubetrain run --script ... -- torchrun ...`` and
through ``kubetrain launch``/``wait``/``collect``/``evaluate`` typed in the project folder with
relative paths. The model collect publishes is the script's model and nothing else (its
parameter names, no optimizer state), its card names the file it came from, and evaluate's
accuracy is the script's own score of its final model (to 1e-6). Each script runs through one
of the two ways (corpus.py's ``through``), to keep the suite's time."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from safetensors import safe_open

from tests.thirdparty.corpus import (
    CORPUS,
    KUBETRAIN_RUN,
    NODES,
    STEP_BY_STEP,
    ThirdPartyScript,
    kubetrain,
    only,
    script_accuracy,
    user_env,
    write_project,
)


def assert_collected_as_trained(
    script: ThirdPartyScript, model_dir: Path, checkpoint_dir: Path, evaluated: float
) -> None:
    card = json.loads((model_dir / "model.json").read_text())
    expected = (script.source_format, script.source_file(checkpoint_dir))
    assert (card.get("source_format"), card.get("source_file")) == expected, card
    with safe_open(model_dir / "model.safetensors", framework="pt") as model:
        assert set(model.keys()) == script.model_keys()
    own = script_accuracy(checkpoint_dir)
    assert own > 0.8, f"{script.file} trained to {own} only"
    assert abs(evaluated - own) <= 1e-6, (evaluated, own)


def summary_path(stdout: str, label: str) -> Path:
    match = re.search(rf"^{label}\s+(\S+)$", stdout, re.MULTILINE)
    assert match, stdout[-3000:]
    return Path(match.group(1))


def through(way: str) -> list:
    return [pytest.param(script, id=script.id) for script in CORPUS if script.through == way]


@pytest.mark.parametrize("script", through(KUBETRAIN_RUN))
def test_kubetrain_run_takes_the_script_as_it_is(script, tmp_path):
    project = write_project(tmp_path / "project")
    env = user_env(tmp_path / "jobs")
    # --keep-job: the script's own accuracy stays in its checkpoint folder
    result = kubetrain(
        project, env, "run", "--output", "runs", "--keep-job", "--nodes", str(NODES),
        "--threshold", "0.8", "--model", script.factory, *script.script_option,
        "--", *script.command(project),
    )  # fmt: skip
    metrics = json.loads(summary_path(result.stdout, "metrics").read_text())
    checkpoint_dir = only(list((tmp_path / "jobs").iterdir())) / "checkpoints"
    assert_collected_as_trained(
        script, summary_path(result.stdout, "model"), checkpoint_dir, metrics["accuracy"]
    )


@pytest.mark.parametrize("script", through(STEP_BY_STEP))
def test_launch_wait_collect_evaluate_as_a_user_types_them(script, tmp_path, digits_dir):
    project = write_project(tmp_path / "project", digits_dir)
    env = user_env(tmp_path / "jobs")
    launch = kubetrain(
        project, env, "launch", "--data", "data", "--nodes", str(NODES), *script.script_option,
        "--", *script.command(project),
    )  # fmt: skip
    job = launch.stdout.split()[-1]
    checkpoints = re.search(r"^checkpoints: (\S+)$", launch.stderr, re.MULTILINE)
    assert checkpoints, launch.stderr
    wait = kubetrain(project, env, "wait", job)
    assert "test accuracy" in wait.stdout, wait.stdout  # rank 0's lines reach the user
    kubetrain(project, env, "collect", "--checkpoint-dir", checkpoints[1], "--output", "model")
    kubetrain(
        project, env, "evaluate", "--model", "model", "--data", "data",
        "--model-factory", script.factory, "--threshold", "0.8", "--metrics-output", "metrics.json",
    )  # fmt: skip
    evaluated = json.loads((project / "metrics.json").read_text())["accuracy"]
    assert_collected_as_trained(script, project / "model", Path(checkpoints[1]), evaluated)
