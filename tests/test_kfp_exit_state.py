"""Issue 27 (1, 7): the KFP exit handler keeps the job of a run whose training completed and
deletes any other, whatever status string KFP passes it. The string a KFP 2.17 backend passes
for each outcome comes from a model of its ML Metadata state machine
(tests/support/kfp_backend_states.py) run over the compiled training pipeline, and reaches
our component through KFP's own executor, as in a step's pod; the job is the emulator's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kfp import compiler
from kfp.dsl.executor import Executor

from kubetrain.components.wait_trainjob.component import delete_trainjob
from kubetrain.names import derive_job_name
from kubetrain.pipelines.training_pipeline import training_pipeline
from tests.support import objects
from tests.support.kfp_backend_states import (
    CANCELED,
    COMPLETE,
    FAILED,
    RUNNING,
    Metadata,
    Outcome,
    exit_status,
)
from tests.test_kubernetes_backend import complete, make_spec, node_pod, set_container

RUN = "kubetrain-training-x7k2p"

ALL_DONE = Outcome()
GATE_FALSE = Outcome(conditions=False)
WAIT_FAILS = Outcome(failing_step="wait-trainjob")
COLLECT_FAILS = Outcome(failing_step="collect-checkpoint")
LAUNCH_FAILS = Outcome(failing_step="launch-trainjob")
STOPPED_IN_WAIT = Outcome(stopped_in="wait-trainjob")
STOPPED_IN_EVALUATE = Outcome(stopped_in="evaluate-model")


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The training pipeline's IR, as the KFP backend gets it."""
    path = tmp_path_factory.mktemp("pipeline") / "training_pipeline.yaml"
    compiler.Compiler().compile(training_pipeline, str(path))
    return next(yaml.safe_load_all(path.read_text()))


# ---------------------------------------------------------------- the model of the backend
@pytest.mark.parametrize(
    ("outcome", "state"),
    [
        (ALL_DONE, COMPLETE),
        (GATE_FALSE, RUNNING),  # KFP shows the run Succeeded
        (WAIT_FAILS, FAILED),
        (COLLECT_FAILS, FAILED),
        (STOPPED_IN_WAIT, RUNNING),
    ],
)
def test_the_state_a_kfp_backend_passes_the_exit_task(spec, outcome: Outcome, state: str) -> None:
    status = exit_status(spec, outcome, RUN)
    assert status == {
        "state": state,
        "pipelineTaskName": "exit-handler-1",
        "pipelineJobResourceName": RUN,
        "error": {},
    }


def test_a_false_condition_is_done_only_for_a_later_update() -> None:
    """Why a false dsl.If leaves its parent RUNNING (kubeflow/pipelines 2.17.0
    metadata/client.go UpdateDAGExecutionsState counts a CANCELED child done; driver/dag.go
    creates the condition's DAG CANCELED after the gate's launcher updated the parent, and
    nothing updates it after): an update made after the creation would complete it."""
    metadata = Metadata()
    body = metadata.create("exit-handler-1", metadata.create("", None), total_dag_tasks=2)
    metadata.publish(metadata.create("promotion-gate", body), COMPLETE)
    assert body.state == RUNNING  # one child of two
    condition = metadata.create("condition-2", body, not_triggered=True)
    assert (condition.state, body.state) == (CANCELED, RUNNING)
    metadata.update_dag_state(body)
    assert body.state == COMPLETE


def test_a_failed_child_fails_its_dag_and_the_dags_above() -> None:
    metadata = Metadata()
    body = metadata.create("exit-handler-1", metadata.create("", None), total_dag_tasks=2)
    condition = metadata.create("condition-2", body, total_dag_tasks=1)
    metadata.publish(metadata.create("promote-model", condition), FAILED)
    assert (condition.state, body.state) == (FAILED, FAILED)


# ------------------------------------------------- the exit handler against each outcome
def job_in_state(k8s, state: str) -> str:
    """The run's TrainJob, as launch created it, then left ``state`` by the run."""
    name = derive_job_name(RUN)
    k8s.backend().launch(make_spec(name))
    if state == "Complete":
        complete(k8s.emulator, name)
    elif state == "Failed":
        failed = objects.condition("Failed", reason="FailedMaxRestarts", message="rank 1 died")
        k8s.emulator.set_conditions("trainjobs", name, [failed])
    elif state == "Running":
        set_container(k8s.emulator, node_pod(k8s.emulator, name), objects.running())
    elif state == "Suspended":  # wait's on_cancel=suspend got to it
        k8s.emulator.patch("trainjobs", name, {"spec": {"suspend": True}})
    return name


def run_exit_task(status: dict[str, Any], tmp_path: Path) -> None:
    """The exit task as its pod runs it: KFP's executor builds dsl.PipelineTaskFinalStatus
    from the driver's parameter value and calls the component's function."""
    executor_input = {
        "inputs": {
            "parameterValues": {
                "run_name": RUN,
                "status": status,
                "backend": "trainer",
                "namespace": "default",
            }
        },
        "outputs": {"outputFile": str(tmp_path / "executor" / "executor_output.json")},
    }
    Executor(json.loads(json.dumps(executor_input)), delete_trainjob.python_func).execute()


@pytest.mark.usefixtures("kubeconfig")
@pytest.mark.parametrize(
    ("outcome", "job_state", "kept"),
    [
        pytest.param(ALL_DONE, "Complete", True, id="all-done"),
        pytest.param(GATE_FALSE, "Complete", True, id="gate-false"),
        pytest.param(WAIT_FAILS, "Failed", False, id="wait-fails-on-a-failed-job"),
        pytest.param(WAIT_FAILS, "Running", False, id="wait-times-out"),
        pytest.param(COLLECT_FAILS, "Complete", True, id="collect-fails-after-training"),
        pytest.param(STOPPED_IN_WAIT, "Running", False, id="stopped-while-training"),
        pytest.param(STOPPED_IN_WAIT, "Suspended", False, id="stopped-job-suspended"),
        pytest.param(STOPPED_IN_EVALUATE, "Complete", True, id="stopped-after-training"),
    ],
)  # fmt: skip
def test_the_exit_handler_keeps_a_complete_job_and_deletes_any_other(
    k8s, spec, tmp_path: Path, capsys, outcome: Outcome, job_state: str, kept: bool
) -> None:
    """A gate that said no leaves KFP's status RUNNING for a run it shows Succeeded: the
    Complete job, its status and logs stay. A job still running (or suspended) when the run
    failed or was stopped, or one that failed, is deleted, in the background."""
    name = job_in_state(k8s, job_state)
    status = exit_status(spec, outcome, RUN)
    run_exit_task(status, tmp_path)
    if kept:
        assert k8s.emulator.names("trainjobs") == {name}
        assert k8s.emulator.requests("delete", "trainjobs") == []
        said = f"job {name} completed, kept with its status and logs"
    else:
        assert k8s.emulator.names("trainjobs") == set()
        (request,) = k8s.emulator.requests("delete", "trainjobs")
        assert request.params.get("propagationPolicy") == "Background"
        said = f"deleted {name}"
    assert capsys.readouterr().out == f"KFP reports the run's body {status['state']}: {said}\n"


@pytest.mark.usefixtures("kubeconfig")
def test_the_exit_handler_of_a_run_whose_launch_failed_finds_nothing(
    k8s, spec, tmp_path: Path, capsys
) -> None:
    """Launch failed before creating the job: the exit task says so and succeeds."""
    status = exit_status(spec, LAUNCH_FAILS, RUN)
    assert status["state"] == FAILED
    run_exit_task(status, tmp_path)
    assert "no TrainJob named" in capsys.readouterr().out
