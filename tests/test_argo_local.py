"""The local Argo harness (tests.support.argo_local) on small hand-written workflows, then the
compiled training workflow run end to end with it on the local backend."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubetrain.artifacts.model_card import read_model_card
from kubetrain.backends.local.supervisor import program_path
from kubetrain.cli.compile import argo_yaml
from tests.support.argo_local import (
    ArgoWorkflowError,
    UnsupportedArgoFeature,
    WorkflowRun,
    run_workflow,
)
from tests.support.seed_script import SAVES, write_user_folder

#: The ways a script saves that run end to end here; the plain state dict runs through
#: `kubetrain run` (tests/test_own_program.py), every way is collected in test_collect_formats.
END_TO_END_SAVES = ("dict", "per-epoch")


def training_workflow() -> dict[str, Any]:
    """The training Workflow as `kubetrain compile` writes it (tests/test_pipeline.py keeps the
    committed pipelines/compiled/training_workflow.yaml equal to it)."""
    return yaml.safe_load(argo_yaml("Workflow"))


# Small programs the containers run with this interpreter; argv[1:] are the template's args.
APPEND = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')"
WRITE = (
    "import os, sys\n"
    "for path, text in zip(sys.argv[1::2], sys.argv[2::2]):\n"
    "    os.makedirs(os.path.dirname(path), exist_ok=True)\n"
    "    open(path, 'w').write(text + '\\n')\n"
)
EXIT = "import sys; sys.exit(int(sys.argv[1]))"


def container(code: str, *args: str, **fields: Any) -> dict[str, Any]:
    """A container template body running ``python -c code args``."""
    return {
        "image": "python:3",
        "command": [sys.executable, "-c", code],
        "args": list(args),
        **fields,
    }


def template(name: str, code: str, *args: str, **fields: Any) -> dict[str, Any]:
    mounts = fields.pop("volumeMounts", None)
    body = container(code, *args, **({"volumeMounts": mounts} if mounts else {}))
    return {"name": name, "container": body, **fields}


def output_parameter(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"path": path}}


def workflow(tasks: list[dict], templates: list[dict], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "unit-", "labels": {"a": "b"}},
        "spec": {
            "entrypoint": "main",
            "templates": [{"name": "main", "dag": {"tasks": tasks}}, *templates],
            **spec,
        },
    }


def task(name: str, template_name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "template": template_name, **fields}


def parameters(**values: str) -> dict[str, Any]:
    return {"parameters": [{"name": k, "value": v} for k, v in values.items()]}


# --- the harness ------------------------------------------------------------------------------


def test_tasks_run_in_dependency_order(tmp_path: Path) -> None:
    order = tmp_path / "order"
    record = template(
        "record",
        APPEND,
        str(order),
        "{{inputs.parameters.label}}",
        inputs={"parameters": [{"name": "label"}]},
    )
    tasks = [
        task("d", "record", dependencies=["c"], arguments=parameters(label="d")),
        task("c", "record", depends="a && b", arguments=parameters(label="c")),
        task("b", "record", depends="a", arguments=parameters(label="b")),
        task("a", "record", arguments=parameters(label="a")),
    ]
    run = run_workflow(workflow(tasks, [record]), workdir=tmp_path / "wf")
    assert run.phase == "Succeeded"
    assert order.read_text().split() == ["a", "b", "c", "d"]
    assert run.name.startswith("unit-") and len(run.name) == len("unit-") + 5
    assert all(node.attempts == 1 and node.exit_code == 0 for node in run.nodes.values())
    assert "--- attempt 1" in run.nodes["a"].log
    assert (run.workdir / "nodes" / "a" / "main.log").is_file()


def test_when_skips_a_task_and_its_dependants_still_run(tmp_path: Path) -> None:
    flag = template(
        "flag",
        WRITE,
        "/tmp/out/flag",
        "go",
        outputs={"parameters": [output_parameter("flag", "/tmp/out/flag")]},
    )
    noop = template("noop", EXIT, "0")
    tasks = [
        task("gate", "flag"),
        task("yes", "noop", depends="gate", when="{{tasks.gate.outputs.parameters.flag}} == go"),
        task("no", "noop", depends="gate", when="'{{tasks.gate.outputs.parameters.flag}}' != 'go'"),
        task("quoted", "noop", depends="gate", when=' "{{workflow.name}}"=="nope" '),
        # As in Argo, `depends: no` means no.Succeeded || no.Skipped: this one runs.
        task("after-no", "noop", depends="no"),
    ]
    run = run_workflow(workflow(tasks, [flag, noop]), workdir=tmp_path)
    phases = {name: node.phase for name, node in run.nodes.items()}
    assert phases == {
        "gate": "Succeeded",
        "yes": "Succeeded",
        "no": "Skipped",
        "quoted": "Skipped",
        "after-no": "Succeeded",
    }
    assert run.nodes["gate"].outputs == {"flag": "go"}
    assert run.nodes["no"].attempts == 0 and run.phase == "Succeeded"


def test_parameters_and_artifacts_pass_between_tasks(tmp_path: Path) -> None:
    produce = template(
        "produce",
        WRITE,
        "/tmp/out/data/part-0",
        "{{inputs.parameters.text}}",
        "/tmp/out/message",
        "hello {{workflow.parameters.who}} in {{workflow.namespace}}",
        inputs={"parameters": [{"name": "text", "default": "payload"}]},
        outputs={
            "parameters": [output_parameter("message", "/tmp/out/message")],
            "artifacts": [{"name": "data", "path": "/tmp/out/data", "archive": {"none": {}}}],
        },
    )
    consume_code = (
        "import os, sys; data = open(sys.argv[1] + '/part-0').read().strip()\n"
        "os.makedirs(os.path.dirname(sys.argv[3]))  # as in a pod: the step creates it\n"
        "open(sys.argv[3], 'w').write(data + '|' + sys.argv[2])"
    )
    consume = template(
        "consume",
        consume_code,
        "/tmp/kubetrain/inputs/data",
        "{{inputs.parameters.message}}",
        "/tmp/kubetrain/outputs/combined",
        inputs={
            "parameters": [{"name": "message"}],
            "artifacts": [{"name": "data", "path": "/tmp/kubetrain/inputs/data"}],
        },
        outputs={"parameters": [output_parameter("combined", "/tmp/kubetrain/outputs/combined")]},
    )
    tasks = [
        task("produce", "produce"),
        task(
            "consume",
            "consume",
            depends="produce",
            arguments={
                **parameters(message="{{tasks.produce.outputs.parameters.message}}"),
                "artifacts": [{"name": "data", "from": "{{tasks.produce.outputs.artifacts.data}}"}],
            },
        ),
    ]
    document = workflow(
        tasks,
        [produce, consume],
        arguments={"parameters": [{"name": "who", "value": "nobody"}]},
    )
    run = run_workflow(
        document, workdir=tmp_path, arguments={"who": "argo"}, namespace="ns", name="fixed"
    )
    assert run.phase == "Succeeded" and run.name == "fixed", describe(run)
    assert run.nodes["produce"].outputs == {"message": "hello argo in ns"}
    stored = run.nodes["produce"].artifacts["data"]
    assert stored == tmp_path / "artifacts" / "produce" / "data"
    assert (stored / "part-0").read_text() == "payload\n"
    assert run.nodes["consume"].outputs == {"combined": "payload|hello argo in ns"}


def test_retry_until_success_and_retry_policies(tmp_path: Path) -> None:
    counter = tmp_path / "counter"
    flaky_code = (
        "import pathlib, sys; c = pathlib.Path(sys.argv[1]); n = int(c.read_text() or 0) + 1\n"
        "c.write_text(str(n)); sys.exit(0 if n >= 3 else 1)"
    )
    counter.write_text("")
    retry = {"limit": "3", "retryPolicy": "Always", "backoff": {"duration": "10s", "factor": "2"}}
    flaky = template("flaky", flaky_code, str(counter), retryStrategy=retry)
    on_error = template("on-error", EXIT, "1", retryStrategy={"limit": 3, "retryPolicy": "OnError"})
    run = run_workflow(workflow([task("flaky", "flaky")], [flaky]), workdir=tmp_path / "a")
    assert run.phase == "Succeeded"
    assert run.nodes["flaky"].attempts == 3 and counter.read_text() == "3"
    assert run.nodes["flaky"].log.count("--- attempt") == 3

    # OnError: a non-zero exit is a failure of the step, not retried.
    run = run_workflow(workflow([task("t", "on-error")], [on_error]), workdir=tmp_path / "b")
    assert (run.phase, run.nodes["t"].attempts, run.nodes["t"].exit_code) == ("Failed", 1, 1)

    # ...but a missing output parameter is an Error (as in Argo), which OnError retries.
    no_output = template(
        "no-output",
        EXIT,
        "0",
        outputs={"parameters": [output_parameter("x", "/tmp/out/x")]},
        retryStrategy={"limit": "2", "retryPolicy": "OnError"},
    )
    run = run_workflow(workflow([task("t", "no-output")], [no_output]), workdir=tmp_path / "c")
    assert (run.phase, run.nodes["t"].phase, run.nodes["t"].attempts) == ("Error", "Error", 3)
    assert "output parameter x" in run.nodes["t"].log


def exit_handler_workflow(code: str) -> dict[str, Any]:
    status = template(
        "status",
        WRITE,
        "/tmp/out/status",
        "{{inputs.parameters.status}}",
        inputs={"parameters": [{"name": "status"}]},
        outputs={"parameters": [output_parameter("status", "/tmp/out/status")]},
    )
    exit_dag = {
        "name": "exit",
        "dag": {
            "tasks": [
                task("report", "status", arguments=parameters(status="{{workflow.status}}")),
                task("on-failure", "exit-0", when="{{workflow.status}} != Succeeded"),
            ]
        },
    }
    tasks = [task("first", "exit-code"), task("second", "exit-0", depends="first")]
    templates = [template("exit-code", EXIT, code), template("exit-0", EXIT, "0"), status, exit_dag]
    return workflow(tasks, templates, onExit="exit")


@pytest.mark.parametrize(
    ("code", "phase", "second", "on_failure"),
    [("3", "Failed", "Omitted", "Succeeded"), ("0", "Succeeded", "Succeeded", "Skipped")],
)
def test_exit_handler_sees_the_workflow_status(
    tmp_path: Path, code: str, phase: str, second: str, on_failure: str
) -> None:
    run = run_workflow(exit_handler_workflow(code), workdir=tmp_path)
    assert run.phase == phase
    assert run.nodes["first"].exit_code == int(code)
    assert run.nodes["second"].phase == second
    assert run.exit_nodes["report"].outputs == {"status": phase}
    assert run.exit_nodes["on-failure"].phase == on_failure
    assert (tmp_path / "nodes" / "onExit.report" / "main.log").is_file()


def test_failing_exit_handler_fails_the_workflow(tmp_path: Path) -> None:
    document = exit_handler_workflow("0")
    document["spec"]["templates"][-1]["dag"]["tasks"].append(task("broken", "exit-code-9"))
    document["spec"]["templates"].append(template("exit-code-9", EXIT, "9"))
    run = run_workflow(document, workdir=tmp_path)
    assert run.exit_nodes["broken"].phase == "Failed" and run.phase == "Failed"


def test_volume_mounts_and_container_paths_map_to_host_folders(tmp_path: Path) -> None:
    show_code = (
        "import json, os, sys\n"
        "open(sys.argv[1], 'w').write('on the claim')\n"
        "os.makedirs(os.path.dirname(sys.argv[-1]), exist_ok=True)\n"
        "json.dump({'argv': sys.argv[2:-1], 'env': os.environ['WHERE']}, open(sys.argv[-1], 'w'))"
    )
    show = template(
        "show",
        show_code,
        "/mnt/data/file.txt",
        "/mnt/data",
        "/mnt/other/x",
        "data=claim:/mnt/data",
        "/mnt/database",
        "/tmp/kubetrain/outputs",
        "/tmp/kubetrain/outputs/argv.json",
        volumeMounts=[
            {"name": "data", "mountPath": "/mnt/data"},
            {"name": "other", "mountPath": "/mnt/other", "readOnly": True},
        ],
        outputs={"parameters": [output_parameter("argv", "/tmp/kubetrain/outputs/argv.json")]},
    )
    show["container"]["env"] = [{"name": "WHERE", "value": "/mnt/data/sub"}]
    document = workflow(
        [task("show", "show")],
        [show],
        volumeClaimTemplates=[{"metadata": {"name": "data"}, "spec": {"accessModes": ["RWX"]}}],
        volumes=[{"name": "other", "persistentVolumeClaim": {"claimName": "existing"}}],
        podGC={"strategy": "OnWorkflowSuccess"},
        ttlStrategy={"secondsAfterSuccess": 1},
        volumeClaimGC={"strategy": "OnWorkflowSuccess"},
    )
    run = run_workflow(document, workdir=tmp_path, name="wf")
    assert run.phase == "Succeeded", run.nodes["show"].log
    claim = tmp_path / "volumes" / "wf-data"
    outputs = tmp_path / "nodes" / "show" / "fs" / "tmp" / "kubetrain" / "outputs"
    assert (claim / "file.txt").read_text() == "on the claim"
    seen = json.loads(run.nodes["show"].outputs["argv"])
    assert seen["argv"] == [
        str(claim),
        str(tmp_path / "volumes" / "existing" / "x"),
        "data=claim:/mnt/data",  # not a path: left alone
        "/mnt/database",  # a prefix of another name, not of a path under the mount
        str(outputs),
    ]
    assert seen["env"] == str(claim / "sub")


def test_unknown_workflow_argument_and_missing_input_are_errors(tmp_path: Path) -> None:
    document = workflow([task("t", "needs")], [template("needs", EXIT, "{{inputs.parameters.x}}")])
    document["spec"]["templates"][1]["inputs"] = {"parameters": [{"name": "x"}]}
    with pytest.raises(ArgoWorkflowError, match="typo"):
        run_workflow(document, workdir=tmp_path, arguments={"typo": "1"})
    with pytest.raises(ArgoWorkflowError, match="'x'"):
        run_workflow(document, workdir=tmp_path)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d["spec"]["templates"].append({"name": "s", "steps": []}), r"\[s\]\.steps"),
        (lambda d: d["spec"]["templates"][0]["dag"]["tasks"][0].update(withItems=[1]), "withItems"),
        (lambda d: d["spec"].update(parallelism=2), "spec.parallelism"),
        (lambda d: d["spec"]["templates"][1].update(script={}), "script"),
        (lambda d: d["spec"]["templates"][1]["container"].update(workingDir="/"), "workingDir"),
        (lambda d: d.update(kind="WorkflowTemplate"), "kind"),
        (lambda d: d["spec"]["templates"][1]["container"]["args"].append("{{foo.bar}}"), "foo.bar"),
        (lambda d: d["spec"]["templates"][0]["dag"]["tasks"][0].update(when="1 < 2"), "when"),
        (
            lambda d: d["spec"]["templates"][0]["dag"]["tasks"].append(
                task("b", "noop", depends="a.Succeeded")
            ),
            "depends",
        ),
        (
            lambda d: d["spec"]["templates"][1]["container"]["args"].append("{{workflow.status}}"),
            "workflow.status",
        ),
    ],
)
def test_unsupported_features_fail_loudly(tmp_path: Path, change: Any, field: str) -> None:
    document = workflow([task("a", "noop")], [template("noop", EXIT, "0")])
    change(document)
    with pytest.raises(UnsupportedArgoFeature, match=field):
        run_workflow(document, workdir=tmp_path)


# --- the compiled training workflow, end to end on the local backend -------------------------


def run_training_workflow(root: Path, **arguments: str) -> WorkflowRun:
    document = training_workflow()
    env = {"KUBETRAIN_LOCAL_ROOT": str(root / "local"), "PATH": program_path()}
    form = arguments.pop("your_program", "")
    if form:
        # Your own program, written like the seeds' DDP examples; its model factory is
        # importable by the steps (on a cluster: installed in the components image).
        project = write_user_folder(root / "project", SAVES[form])
        script = str(project / "train.py")
        arguments = {**arguments, "script": script, "command": json.dumps(["torchrun", script])}
        env["PYTHONPATH"] = str(project)
    return run_workflow(
        document,
        workdir=root / "workflow",
        arguments={"backend": "local", "dataset_source": "sklearn:digits", **arguments},
        env=env,
        task_timeout=300,
    )


#: The runs the end-to-end tests check, started together so they overlap.
E2E_RUNS: dict[str, dict[str, str]] = {
    "default": {"export": "torch-export"},
    "below-threshold": {"epochs": "1", "accuracy_threshold": "0.999"},
    "prep-fails": {"dataset_source": "sklearn:nope"},
    "wait-times-out": {"wait_timeout_seconds": "1"},
    **{
        f"own-program-{form}": {
            "your_program": form,
            "model": "netdef:build",
            "accuracy_threshold": "0.9",
        }
        for form in END_TO_END_SAVES
    },
}


@pytest.fixture(scope="module")
def e2e_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future]]:
    # Each training run keeps two node processes busy: overlap runs only where cores allow.
    workers = max(1, min(len(E2E_RUNS), (os.cpu_count() or 1) // 2))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        yield {
            key: pool.submit(run_training_workflow, tmp_path_factory.mktemp(key), **arguments)
            for key, arguments in E2E_RUNS.items()
        }


def describe(run: WorkflowRun) -> str:
    """Every node's phase and the end of its log, for assertion messages."""
    return "\n".join(
        f"{name}: {node.phase} (exit {node.exit_code})\n{node.log[-2000:]}"
        for name, node in {**run.nodes, **run.exit_nodes}.items()
    )


def registry(run: WorkflowRun) -> Path:
    """The default ``model_registry``, /mnt/registry-pvc/registry: the folder ``registry`` on
    the one claim of the run that is not its own (the harness names a claim's folder after it)."""
    (lasting,) = [
        claim
        for claim in (run.workdir / "volumes").iterdir()
        if claim.name not in run_claims(training_workflow(), run)
    ]
    return lasting / "registry"


def run_claims(document: dict[str, Any], run: WorkflowRun) -> set[str]:
    """The claims Argo creates for ``run`` (``volumeClaimTemplates``), named as it names
    them: ``<workflow>-<volume>``."""
    templates = document["spec"].get("volumeClaimTemplates", [])
    return {f"{run.name}-{template['metadata']['name']}" for template in templates}


def collect_claims_as_argo_does(document: dict[str, Any], run: WorkflowRun) -> None:
    """What Argo's controller does once a run has ended and its exit handler has run, which
    the harness does not: delete the run's claims per ``volumeClaimGC`` (argo-workflows v4.1.2
    workflow/controller/operator.go ``operate`` calls ``deletePVCs`` (~l. 2029) after the
    onExit node: OnWorkflowSuccess only for a Succeeded run, OnWorkflowCompletion always,
    and the pvc-protection finalizer stripped, so the data goes even while pods mount it)."""
    strategy = (document["spec"].get("volumeClaimGC") or {}).get("strategy", "")
    if strategy == "OnWorkflowCompletion" or (
        strategy == "OnWorkflowSuccess" and run.phase == "Succeeded"
    ):
        for claim in run_claims(document, run):
            shutil.rmtree(run.workdir / "volumes" / claim)


def test_training_workflow_trains_evaluates_and_promotes(e2e_runs: dict[str, Future]) -> None:
    run = e2e_runs["default"].result()
    assert run.phase == "Succeeded", describe(run)
    assert [n.phase for n in run.nodes.values()] == ["Succeeded"] * 6
    evaluate = run.nodes["evaluate"]
    assert float(evaluate.outputs["accuracy"]) >= 0.95 and evaluate.outputs["passed"] == "true"
    assert run.nodes["collect"].outputs["epoch"] == "10"
    assert (run.nodes["collect"].artifacts["model"] / "model.pt2").is_file()
    promote = run.nodes["promote"]
    version = registry(run) / run.name
    assert promote.outputs["promoted_to"] == str(version)
    assert (version / "model.safetensors").is_file()
    pointer = json.loads((registry(run) / "PROMOTED").read_text())
    assert pointer["version"] == run.name
    assert pointer["sha256"] == promote.outputs["sha256"] == run.nodes["collect"].outputs["sha256"]
    assert json.loads(evaluate.artifacts["metrics"].read_text())
    report = evaluate.artifacts["report"]
    assert {"report.html", "training_curves.png", "confusion_matrix.png"} <= {
        p.name for p in report.iterdir()
    }
    # Issue 17 (4): the run's claim goes with a succeeded run, so its TrainJob goes too
    assert run.exit_nodes["delete-trainjob"].phase == "Succeeded"
    local_root = run.workdir.parent / "local"
    assert not (local_root / run.nodes["launch"].outputs["job_name"]).exists()
    # Issue 27 (3): ...and the promoted model outlives it
    collect_claims_as_argo_does(training_workflow(), run)
    assert not (run.workdir / "volumes" / f"{run.name}-shared").exists()
    assert read_model_card(version)["sha256"] == pointer["sha256"]
    assert json.loads((registry(run) / "PROMOTED").read_text())["version"] == run.name


@pytest.mark.parametrize("form", END_TO_END_SAVES)
def test_training_workflow_trains_your_own_program(form, e2e_runs: dict[str, Future]) -> None:
    """The compiled workflow with `command` (a JSON list) and `script`: the program runs in its
    checkpoint folder and saves the way the seeds' scripts do (a state dict, one file per
    epoch, a dict with the model's state); collect takes the newest and evaluate passes it."""
    run = e2e_runs[f"own-program-{form}"].result()
    assert run.phase == "Succeeded", describe(run)
    assert float(run.nodes["evaluate"].outputs["accuracy"]) >= 0.9
    # The epoch is known from the file name (model_epoch_8.pt) or the dict's "epoch".
    epoch = {"per-epoch": "8", "dict": "8", "state-dict": ""}[form]
    assert run.nodes["collect"].outputs["epoch"] == epoch
    assert run.nodes["promote"].phase == "Succeeded"


def test_training_workflow_below_threshold_skips_promote(e2e_runs: dict[str, Future]) -> None:
    run = e2e_runs["below-threshold"].result()
    assert run.phase == "Succeeded", describe(run)
    assert run.nodes["collect"].outputs["epoch"] == "1"
    assert run.nodes["evaluate"].outputs["passed"] == "false"
    assert run.nodes["promote"].phase == "Skipped"
    assert not (registry(run) / "PROMOTED").exists()
    assert run.exit_nodes["delete-trainjob"].phase == "Succeeded"


def test_training_workflow_failing_step_runs_the_exit_handler(
    e2e_runs: dict[str, Future],
) -> None:
    run = e2e_runs["prep-fails"].result()
    assert run.phase == "Failed", describe(run)
    assert run.nodes["prep"].phase == "Failed" and "nope" in run.nodes["prep"].log
    assert {run.nodes[name].phase for name in run.nodes if name != "prep"} == {"Omitted"}
    delete = run.exit_nodes["delete-trainjob"]
    assert (delete.phase, delete.attempts) == ("Succeeded", 1), delete.log


def test_training_workflow_exit_handler_deletes_the_running_job(
    e2e_runs: dict[str, Future],
) -> None:
    run = e2e_runs["wait-times-out"].result()
    assert run.phase == "Failed", describe(run)
    wait = run.nodes["wait"]
    # retryPolicy OnError: a step that ran and failed is not retried.
    assert (wait.phase, wait.attempts, wait.exit_code) == ("Failed", 1, 124), wait.log
    assert run.exit_nodes["delete-trainjob"].phase == "Succeeded"
    local_root = run.workdir.parent / "local"
    assert not (local_root / run.nodes["launch"].outputs["job_name"]).exists()


# ------------------------------------------------------------- retryStrategy.expression
def shipped_api_retry() -> dict[str, Any]:
    """The retryStrategy the launch step ships with, from the compiled YAML."""
    document = training_workflow()
    (launch,) = [t for t in document["spec"]["templates"] if t["name"] == "launch-trainjob"]
    return launch["retryStrategy"]


# Exit code -> attempts Argo makes with limit 3: bad input (2) and a stalled job (3) once,
# anything else (a transient failure) until the limit.
RETRY_CASES = {0: 1, 1: 4, 2: 1, 3: 1, 4: 4, 124: 4, 137: 4}


@pytest.mark.parametrize(("code", "attempts"), RETRY_CASES.items(), ids=map(str, RETRY_CASES))
def test_the_api_steps_retry_expression_spares_final_exit_codes(tmp_path, code, attempts):
    retry = shipped_api_retry()
    assert retry["expression"] and retry["retryPolicy"] == "Always"
    step = template("step", EXIT, str(code), retryStrategy=retry)
    run = run_workflow(workflow([task("t", "step")], [step]), workdir=tmp_path)
    node = run.nodes["t"]
    assert (node.attempts, node.exit_code) == (attempts, code)
    assert ("evaluated to false" in node.log) == (code in (2, 3))


def test_a_transient_failure_is_still_retried_until_it_succeeds(tmp_path):
    counter = tmp_path / "counter"
    counter.write_text("")
    flaky = (
        "import pathlib, sys; c = pathlib.Path(sys.argv[1]); n = int(c.read_text() or 0) + 1\n"
        "c.write_text(str(n)); sys.exit(0 if n >= 3 else 1)"
    )
    step = template("flaky", flaky, str(counter), retryStrategy=shipped_api_retry())
    run = run_workflow(workflow([task("t", "flaky")], [step]), workdir=tmp_path / "run")
    assert (run.phase, run.nodes["t"].attempts) == ("Succeeded", 3)


def test_an_attempt_without_exit_code_is_retried_as_argo_does(tmp_path):
    """A missing output is an Error with no exit code: lastRetry.exitCode is "-1"."""
    step = template(
        "no-output",
        EXIT,
        "0",
        outputs={"parameters": [output_parameter("x", "/tmp/out/x")]},
        retryStrategy=shipped_api_retry(),
    )
    run = run_workflow(workflow([task("t", "no-output")], [step]), workdir=tmp_path)
    assert (run.nodes["t"].phase, run.nodes["t"].attempts) == ("Error", 4)


@pytest.mark.parametrize(
    "expression",
    ['lastRetry.message.startsWith("x")', "asInt(lastRetry.exitCode) + 1 > 2", "unknown == 1"],
)
def test_an_expression_outside_the_supported_subset_is_refused(tmp_path, expression):
    retry = {"limit": "1", "retryPolicy": "Always", "expression": expression}
    step = template("step", EXIT, "1", retryStrategy=retry)
    with pytest.raises(UnsupportedArgoFeature, match="expression"):
        run_workflow(workflow([task("t", "step")], [step]), workdir=tmp_path)
