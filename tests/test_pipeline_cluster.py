"""The KFP pipeline as a KFP cluster (2.14-2.17) runs it (issue 17): a cluster backend in the
run's namespace, every job and folder named by the run's resource name, an exit handler that
deletes the TrainJob of a failed or stopped run, collect after wait, promote behind a gate, the
shared claim mounted where it is read; and the README's KFP example, compiled as a user would."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import json_format
from kfp import compiler
from kfp.pipeline_spec import pipeline_spec_pb2

from kubetrain.pipelines.training_pipeline import SHARED_MOUNT, training_pipeline

REPO = Path(__file__).resolve().parents[1]
#: What the KFP driver resolves to the run's Argo Workflow name (kubeflow/pipelines 2.17.0
#: backend/src/v2/driver/resolve.go; argocompiler/argo.go runResourceName).
RESOURCE_NAME = {"runtimeValue": {"constant": "{{$.pipeline_job_resource_name}}"}}
EXAMPLE = re.compile(r"<!-- readme-example: kfp -->\n```python\n(.*?)```", re.DOTALL)


def load(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pipeline spec and the Kubernetes platform spec of a compiled pipeline."""
    spec, platform = yaml.safe_load_all(path.read_text())
    json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec())  # valid IR
    return spec, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def tasks_of(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every task of the pipeline by name, from the root DAG and the nested ones."""
    dags = [spec["root"]["dag"], *(c["dag"] for c in spec["components"].values() if "dag" in c)]
    return {name: task for dag in dags for name, task in dag["tasks"].items()}


def producer(task: dict[str, Any], parameter: str) -> tuple[str, str]:
    source = task["inputs"]["parameters"][parameter]["taskOutputParameter"]
    return source["producerTask"], source["outputParameterKey"]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> tuple[dict[str, Any], dict[str, Any]]:
    path = tmp_path_factory.mktemp("pipeline") / "training_pipeline.yaml"
    compiler.Compiler().compile(training_pipeline, str(path))
    return load(path)


def test_defaults_are_a_cluster_backend_in_the_runs_namespace(pipeline):
    """Issue 17 (11, 2): `local` died with the launch pod and `default` is not where KFP runs
    the steps (the run's namespace, or kubeflow standalone), so the claim differed."""
    spec, _ = pipeline
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    assert parameters["backend"]["defaultValue"] == "trainer"
    assert parameters["namespace"]["defaultValue"] == ""
    tasks = tasks_of(spec)
    for step in ("launch-trainjob", "wait-trainjob", "delete-trainjob"):
        inputs = tasks[step]["inputs"]["parameters"]
        for name in ("backend", "namespace"):
            assert inputs[name]["componentInputParameter"].endswith(name), (step, name)


def test_the_runs_resource_name_names_its_job_folders_and_version(pipeline):
    """Issue 17 (7): the display name (PIPELINE_JOB_NAME_PLACEHOLDER) is shared by runs named
    alike, which would adopt one TrainJob, and empty for recurring runs."""
    spec, _ = pipeline
    tasks = tasks_of(spec)
    named = {
        "dataset-prep": "run_name",
        "launch-trainjob": "run_name",
        "collect-checkpoint": "run_name",
        "promote-model": "version",
        "delete-trainjob": "run_name",
    }
    for step, parameter in named.items():
        assert tasks[step]["inputs"]["parameters"][parameter] == RESOURCE_NAME, step
    assert "{{$.pipeline_job_name}}" not in yaml.safe_dump(spec)


def test_an_exit_handler_deletes_the_trainjob_of_a_failed_or_stopped_run(pipeline):
    """Issue 17 (5): a stopped run's wait gets SIGTERM, but KFP's launcher dies on it and the
    emissary then ends the container (pipelines/training_pipeline.py), so only an exit task
    surely stops the training; the Argo compiler makes it an exit lifecycle hook of the body's
    DAG (kubeflow/pipelines 2.17.0 backend/src/v2/compiler/argocompiler/dag.go). It keeps a
    Complete job (tests/test_kfp_exit_state.py)."""
    spec, executors = pipeline
    root = spec["root"]["dag"]["tasks"]
    assert set(root) == {"exit-handler-1", "delete-trainjob"}
    delete = root["delete-trainjob"]
    assert delete["triggerPolicy"] == {"strategy": "ALL_UPSTREAM_TASKS_COMPLETED"}
    assert delete["inputs"]["parameters"]["status"] == {
        "taskFinalStatus": {"producerTask": "exit-handler-1"}
    }
    assert delete["inputs"]["parameters"]["run_name"] == RESOURCE_NAME
    assert delete["cachingOptions"].get("enableCache", False) is False
    body = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    assert {"dataset-prep", "launch-trainjob", "wait-trainjob", "collect-checkpoint"} <= set(body)
    assert executors["exec-delete-trainjob"]["securityContext"]["runAsNonRoot"] is True


def test_the_unschedulable_grace_is_a_pipeline_parameter(pipeline):
    """Issue 17 (9): how long wait lets a node pod stay Unschedulable (a gang waiting for
    Volcano, a node for the autoscaler) is the run's choice; auto = 300 s, none for a gang."""
    spec, _ = pipeline
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    assert parameters["unschedulable_grace_seconds"]["defaultValue"] == "auto"
    wait = tasks_of(spec)["wait-trainjob"]["inputs"]["parameters"]
    assert wait["unschedulable_grace_seconds"] == {
        "componentInputParameter": "pipelinechannel--unschedulable_grace_seconds"
    }


def test_collect_takes_the_checkpoint_folder_from_wait(pipeline):
    """Issue 17 (18): from launch's output, collect ran beside the training on a cluster."""
    tasks = tasks_of(pipeline[0])
    assert producer(tasks["wait-trainjob"], "checkpoint_dir") == (
        "launch-trainjob",
        "checkpoint_dir",
    )
    assert producer(tasks["collect-checkpoint"], "checkpoint_dir") == (
        "wait-trainjob",
        "checkpoint_dir",
    )


def test_promote_runs_behind_the_single_output_gate(pipeline):
    """Issue 17 (20): promote, with the run's resource name as version, only where the gate's
    one output is true (a condition on evaluate's NamedTuple `passed` is always false under
    KFP's local runner, kubeflow/pipelines#13313)."""
    spec, _ = pipeline
    tasks = tasks_of(spec)
    (condition,) = [name for name in tasks if name.startswith("condition-")]
    assert tasks[condition]["triggerPolicy"]["condition"] == (
        "inputs.parameter_values['pipelinechannel--promotion-gate-Output'] == true"
    )
    assert set(spec["components"][f"comp-{condition}"]["dag"]["tasks"]) == {"promote-model"}
    assert producer(tasks["promotion-gate"], "passed") == ("evaluate-model", "passed")
    promote = tasks["promote-model"]["inputs"]
    assert promote["artifacts"]["model"] == {
        "componentInputArtifact": "pipelinechannel--collect-checkpoint-model"
    }
    assert promote["parameters"]["registry"] == {
        "componentInputParameter": "pipelinechannel--model_registry"
    }
    default = spec["root"]["inputDefinitions"]["parameters"]["model_registry"]["defaultValue"]
    assert default == f"{SHARED_MOUNT}/registry"


def test_the_shared_claim_is_mounted_by_the_steps_that_use_it(pipeline):
    """Launch copies the dataset onto it, collect reads the checkpoints, promote writes the
    registry; the TrainJob's nodes mount the same claim at the same path."""
    _, executors = pipeline
    mounting = {name for name, config in executors.items() if "pvcMount" in config}
    assert mounting == {"exec-launch-trainjob", "exec-collect-checkpoint", "exec-promote-model"}
    for name in mounting:
        (mount,) = executors[name]["pvcMount"]
        assert mount["mountPath"] == SHARED_MOUNT
        assert mount["pvcNameParameter"] == {
            "componentInputParameter": "pipelinechannel--shared_pvc"
        }


# --- the README's KFP example --------------------------------------------------------------
def readme_example() -> str:
    match = EXAMPLE.search((REPO / "README.md").read_text())
    assert match, "README.md lost its KFP example (<!-- readme-example: kfp -->)"
    return match.group(1)


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> tuple[dict[str, Any], dict[str, Any]]:
    """The example run as a user would, in an empty folder: the pipeline YAML it writes."""
    folder = tmp_path_factory.mktemp("kfp-example")
    (folder / "my_pipeline.py").write_text(readme_example())
    result = subprocess.run(
        [sys.executable, "my_pipeline.py"], capture_output=True, text=True, timeout=120, cwd=folder
    )
    assert result.returncode == 0, result.stderr
    (written,) = folder.glob("*.yaml")
    return load(written)


def test_readme_kfp_example_is_one_that_works_on_a_cluster(example):
    """Issue 17 (18): a cluster backend, the claim mounted where launch and collect use it,
    collect after wait, the run's resource name, an exit handler for a stopped run."""
    spec, executors = example
    tasks = tasks_of(spec)
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    assert parameters["backend"]["defaultValue"] == "trainer"
    assert producer(tasks["collect-checkpoint"], "checkpoint_dir") == (
        "wait-trainjob",
        "checkpoint_dir",
    )
    for step in ("launch-trainjob", "collect-checkpoint"):
        (mount,) = executors[f"exec-{step}"]["pvcMount"]
        assert mount["mountPath"] == SHARED_MOUNT
    launch = tasks["launch-trainjob"]["inputs"]["parameters"]
    assert launch["run_name"] == RESOURCE_NAME
    assert launch["shared_mount"]["runtimeValue"]["constant"] == SHARED_MOUNT
    assert "shared_pvc" in launch
    assert tasks["delete-trainjob"]["triggerPolicy"] == {"strategy": "ALL_UPSTREAM_TASKS_COMPLETED"}
