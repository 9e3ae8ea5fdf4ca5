"""What a KFP 2.17 backend passes a pipeline's exit task as ``status``
(``dsl.PipelineTaskFinalStatus``), for a run's outcome: a model of the ML Metadata (MLMD) state
machine of the executions its driver and launcher write, run over a compiled pipeline spec.

The exit task gets the last state of the exit handler's DAG execution (``resolve.go``), which
only a launcher's end-of-step update moves out of RUNNING (``UpdateDAGExecutionsState``, which
counts a child DAG created CANCELED, a false ``dsl.If``, as done, but no launcher runs after it).
So a run whose last step of the body is a false condition reports RUNNING, as does a stopped
run (its launchers die before publishing), while KFP shows the run Succeeded: the status string
cannot tell a finished training from one to stop.

Every rule cites kubeflow/pipelines at tag 2.17.0 (file, function, ~line):

* ``metadata/client.go`` ``CreateExecution`` ~659-665: a new execution is RUNNING, or CANCELED
  when not triggered (``NotTriggered``); DAG executions carry ``total_dag_tasks`` (~729).
* ``driver/dag.go`` ``DAG`` ~110: ``NotTriggered = !WillTrigger()`` (a false trigger condition);
  ~156: ``total_dag_tasks`` = the DAG component's task count; ~211: ``CreateExecution``; no
  state update after it. ``driver/root_dag.go`` ``RootDAG`` ~142: the root DAG gets no
  ``total_dag_tasks``. ``driver/container.go`` ``Container`` ~134, ~190: likewise for a step.
* ``component/launcher_v2.go`` ``Execute`` ~192: the step's status starts FAILED, ~299 becomes
  COMPLETE once the program exited 0; the deferred publish then ``UpdateDAGExecutionsState`` of
  the step's parent DAG (~221-231). The launcher installs no signal handler, so a step stopped
  with SIGTERM publishes nothing and stays RUNNING.
* ``metadata/client.go`` ``UpdateDAGExecutionsState`` ~800-878: the DAG's children (those with
  its ``parent_dag_id``: ``GetExecutionsInDAG`` ~983) counted: COMPLETE, CACHED and CANCELED
  are done, FAILED failed; all ``total_dag_tasks`` done → COMPLETE, else any failed → FAILED,
  else unchanged; a DAG made COMPLETE or FAILED updates its parent in turn; a DAG without
  ``total_dag_tasks`` (the root) is left alone (~814).
* ``driver/resolve.go`` ``resolveInputParameter`` ~458-491 (``TaskFinalStatus``): the exit
  task's ``status`` is ``{state: <its first dependent task's execution>.GetLastKnownState()
  .String(), pipelineTaskName, pipelineJobResourceName, error: {}}``, marshalled by protojson.
* ``compiler/argocompiler/dag.go``: a task runs once its dependencies Succeeded (``depends``
  ~713); a DAG task with a condition runs its body only when its driver's condition is not
  false (~276-279); the exit task is an exit hook of the DAG it depends on (~62-107), and runs
  whatever that DAG's outcome. ``apiserver/resource/resource_manager.go`` ``TerminateWorkflow``
  ~1023: stopping a run sets the workflow's activeDeadlineSeconds to 0: no further step starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from graphlib import TopologicalSorter
from typing import Any

# MLMD Execution.State names, as the driver's .String() spells them
RUNNING, COMPLETE, FAILED, CACHED, CANCELED = "RUNNING", "COMPLETE", "FAILED", "CACHED", "CANCELED"
#: The trigger strategy KFP gives an exit task (argocompiler/dag.go ~72).
EXIT_STRATEGY = "ALL_UPSTREAM_TASKS_COMPLETED"


@dataclass(eq=False)
class Execution:
    task: str
    state: str
    parent: Execution | None
    #: ``total_dag_tasks`` of a DAG execution; None for a step and the root DAG.
    total_dag_tasks: int | None = None


@dataclass(frozen=True)
class Outcome:
    """How a run goes: every ``dsl.If`` condition's value, the step whose program fails (its
    launcher publishes FAILED), the step during which the run is stopped (its launcher is
    killed, nothing more starts)."""

    conditions: bool = True
    failing_step: str | None = None
    stopped_in: str | None = None


class RunStopped(Exception):
    """The run was terminated: no step starts after this (TerminateWorkflow)."""


@dataclass
class Metadata:
    """The executions one run writes, with the driver's and launcher's rules."""

    executions: list[Execution] = field(default_factory=list)

    def create(
        self,
        task: str,
        parent: Execution | None,
        not_triggered: bool = False,
        total_dag_tasks: int | None = None,
    ) -> Execution:
        """client.go CreateExecution ~659-665."""
        state = CANCELED if not_triggered else RUNNING
        execution = Execution(task, state, parent, total_dag_tasks)
        self.executions.append(execution)
        return execution

    def publish(self, step: Execution, state: str) -> None:
        """launcher_v2.go Execute's deferred publish (~192-231): the step's state, then its
        parent DAG's update."""
        step.state = state
        if step.parent is not None:
            self.update_dag_state(step.parent)

    def update_dag_state(self, dag: Execution) -> None:
        """client.go UpdateDAGExecutionsState ~800-878."""
        if not dag.total_dag_tasks:
            return  # the root DAG (~814)
        children = [e for e in self.executions if e.parent is dag]
        done = sum(e.state in (COMPLETE, CACHED, CANCELED) for e in children)
        failed = sum(e.state == FAILED for e in children)
        if done == dag.total_dag_tasks:
            dag.state = COMPLETE
        elif failed > 0:
            dag.state = FAILED
        else:
            return  # still running: no write, no propagation
        if dag.parent is not None:
            self.update_dag_state(dag.parent)


def exit_status(spec: dict[str, Any], outcome: Outcome, run_name: str = "run") -> dict[str, Any]:
    """The ``status`` parameter the driver resolves for the root DAG's exit task of the
    compiled pipeline ``spec`` (its IR as a dict) when the run goes as ``outcome``."""
    metadata = Metadata()
    root = metadata.create("", None)  # root_dag.go ~142: no total_dag_tasks
    root_tasks = spec["root"]["dag"]["tasks"]
    (exit_name,) = [
        name
        for name, task in root_tasks.items()
        if task.get("triggerPolicy", {}).get("strategy") == EXIT_STRATEGY
    ]
    try:
        _run_dag(spec, metadata, root_tasks, root, outcome, skip={exit_name})
    except RunStopped:
        pass
    producer_name = root_tasks[exit_name]["dependentTasks"][0]  # resolve.go ~467
    (producer,) = [e for e in metadata.executions if e.parent is root and e.task == producer_name]
    return {
        "state": producer.state,
        "pipelineTaskName": producer_name,
        "pipelineJobResourceName": run_name,
        "error": {},
    }


def _run_dag(
    spec: dict[str, Any],
    metadata: Metadata,
    tasks: dict[str, Any],
    dag: Execution,
    outcome: Outcome,
    skip: frozenset[str] | set[str] = frozenset(),
) -> None:
    """Run ``tasks`` of ``dag`` in dependency order as Argo does (argocompiler/dag.go depends:
    a task runs once every dependency Succeeded)."""
    succeeded: set[str] = set()
    for name in _in_dependency_order(tasks, skip):
        task = tasks[name]
        if not set(task.get("dependentTasks", [])) <= succeeded:
            continue
        component = spec["components"][task["componentRef"]["name"]]
        if "dag" in component:
            condition = task.get("triggerPolicy", {}).get("condition", "")
            triggered = outcome.conditions if condition else True
            child_tasks = component["dag"]["tasks"]
            child = metadata.create(  # dag.go ~110, ~156, ~211
                name, dag, not_triggered=not triggered, total_dag_tasks=len(child_tasks)
            )
            if not triggered:
                continue  # argocompiler/dag.go ~276-279: the body is skipped, nothing updates
            _run_dag(spec, metadata, child_tasks, child, outcome)
            if child.state == COMPLETE:
                succeeded.add(name)
            continue
        step = metadata.create(name, dag)  # container.go ~134, ~190
        if outcome.stopped_in == name:
            raise RunStopped(name)  # SIGTERM: the launcher dies unpublished, stays RUNNING
        metadata.publish(step, FAILED if outcome.failing_step == name else COMPLETE)
        if step.state == COMPLETE:
            succeeded.add(name)


def _in_dependency_order(tasks: dict[str, Any], skip: frozenset[str] | set[str]) -> list[str]:
    """Independent tasks one after another, by name (a real run may interleave them; the
    training pipeline's body is a chain, where the order is the run's)."""
    graph = {name: sorted(tasks[name].get("dependentTasks", [])) for name in sorted(tasks)}
    return [name for name in TopologicalSorter(graph).static_order() if name not in skip]
