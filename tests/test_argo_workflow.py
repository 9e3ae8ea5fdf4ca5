"""The Argo workflows (Hera): valid against Argo's schema, loadable by Hera, shaped as users of
Argo expect, and each step's template kept in step with that step's CLI."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from argo_schema import argo_schema_errors
from hera.workflows import Container, Parameter, Workflow, WorkflowTemplate

from kubetrain.cli import build_parser
from kubetrain.cli.compile import ARGO_WORKFLOWS
from kubetrain.components.collect_checkpoint.template import collect_checkpoint_template
from kubetrain.components.dataset_prep.template import dataset_prep_template
from kubetrain.components.evaluate_model.template import evaluate_model_template
from kubetrain.components.launch_trainjob.template import launch_trainjob_template
from kubetrain.components.promote_model.template import promote_model_template
from kubetrain.components.wait_trainjob.template import (
    delete_trainjob_template,
    wait_trainjob_template,
)
from kubetrain.errors import InvalidInput
from kubetrain.pipelines.training_workflow import (
    ClaimTemplate,
    ExistingClaim,
    build_training_workflow,
    check_registry_outlives_run,
)
from tests.support.argo_expr import evaluate_bool

REPO = Path(__file__).resolve().parents[1]
COMPILED = REPO / "pipelines" / "compiled"
INPUT = re.compile(r"\{\{inputs\.parameters\.([A-Za-z0-9_-]+)\}\}")

#: Options of each step's CLI that its Argo template deliberately leaves at their defaults.
#: Adding an option to a step's CLI fails test_template_covers_the_cli until it is either
#: passed by the template or listed here.
LEFT_AT_DEFAULT = {
    "prep": {"cache_dir"},
    "launch": {"command"},  # the template passes the program as --command-json
    "wait": {"quiet"},
    "collect": set(),
    "evaluate": {"json", "command"},  # the template passes the program as --command-json
    "promote": set(),
    "delete": {"name"},
}  # fmt: skip

TEMPLATES: dict[str, Callable[[], Container]] = {
    "prep": dataset_prep_template,
    "launch": launch_trainjob_template,
    "wait": wait_trainjob_template,
    "collect": collect_checkpoint_template,
    "evaluate": evaluate_model_template,
    "promote": promote_model_template,
    "delete": delete_trainjob_template,
}


def compiled(stem: str) -> dict[str, Any]:
    return yaml.safe_load((COMPILED / f"{stem}.yaml").read_text())


@pytest.mark.parametrize("stem", sorted(ARGO_WORKFLOWS))
def test_compiled_yaml_validates_against_argo_schema(stem):
    document = compiled(stem)
    assert document["kind"] == ARGO_WORKFLOWS[stem]
    assert argo_schema_errors(document) == []


@pytest.mark.parametrize(
    "storage", [ClaimTemplate(size="50Gi", storage_class="efs"), ExistingClaim("team-pvc")]
)
@pytest.mark.parametrize("kind", ["Workflow", "WorkflowTemplate"])
def test_every_kind_and_storage_validates(kind, storage):
    document = build_training_workflow(kind, storage).to_dict()
    assert argo_schema_errors(document) == []


@pytest.mark.parametrize("stem", sorted(ARGO_WORKFLOWS))
def test_compiled_yaml_loads_back_through_hera(stem):
    model = Workflow if ARGO_WORKFLOWS[stem] == "Workflow" else WorkflowTemplate
    text = (COMPILED / f"{stem}.yaml").read_text()
    loaded = model.from_yaml(text)
    assert loaded.to_dict() == yaml.safe_load(text)


def dag_tasks(document: dict[str, Any], template: str) -> dict[str, dict[str, Any]]:
    (dag,) = [t["dag"] for t in document["spec"]["templates"] if t["name"] == template]
    return {task["name"]: task for task in dag["tasks"]}


def template_named(document: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [t for t in document["spec"]["templates"] if t["name"] == name]
    return found


def test_workflow_runs_the_steps_in_order_and_promotes_only_when_passed():
    document = compiled("training_workflow")
    tasks = dag_tasks(document, document["spec"]["entrypoint"])
    order = ["prep", "launch", "wait", "collect", "evaluate", "promote"]
    assert list(tasks) == order
    for before, after in zip(order, order[1:], strict=False):
        assert tasks[after]["depends"] == before
    assert tasks["promote"]["when"] == "{{tasks.evaluate.outputs.parameters.passed}} == true"
    # the model travels as an artifact, the dataset as a path on the shared claim
    for step in ("evaluate", "promote"):
        (artifact,) = tasks[step]["arguments"]["artifacts"]
        assert artifact["from"] == "{{tasks.collect.outputs.artifacts.model}}"


@pytest.mark.parametrize(
    ("kind", "when"),
    [("Workflow", None), ("WorkflowTemplate", "{{workflow.status}} != Succeeded")],
)
def test_exit_handler_deletes_the_trainjob_unless_the_run_succeeded_on_an_existing_claim(
    kind, when
):
    """Issue 17 (4): with a claim per run (the Workflow's), the TrainJob goes whatever the
    outcome, before Argo deletes the claim its finished pods still mount (argo-workflows
    v4.1.2 workflow/controller/operator.go: the onExit node completes, then deletePVCs);
    with an existing claim (the WorkflowTemplate's) a succeeded run's TrainJob is kept."""
    document = build_training_workflow(kind).to_dict()
    handler = dag_tasks(document, document["spec"]["onExit"])
    (delete,) = handler.values()
    assert delete.get("when") == when
    container = template_named(document, delete["template"])["container"]
    assert container["command"] == ["kubetrain", "delete"]
    assert "--ignore-not-found" in container["args"]
    launch = dag_tasks(document, "train-and-evaluate")["launch"]
    run_name = {p["name"]: p["value"] for p in launch["arguments"]["parameters"]}["run_name"]
    assert {p["name"]: p["value"] for p in delete["arguments"]["parameters"]}["run_name"] == (
        run_name
    )


def test_claim_template_workflow_passes_its_claim_to_the_trainjob():
    document = compiled("training_workflow")
    spec = document["spec"]
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    launch = dag_tasks(document, spec["entrypoint"])["launch"]
    arguments = {p["name"]: p["value"] for p in launch["arguments"]["parameters"]}
    # Argo names a claim template's PVC <workflow name>-<template name>
    assert arguments["shared_pvc"] == "{{workflow.name}}-" + claim["metadata"]["name"]
    assert spec["volumeClaimGC"] == {"strategy": "OnWorkflowSuccess"}


def test_template_workflow_uses_an_existing_claim_named_by_a_parameter():
    document = compiled("training_workflow_template")
    spec = document["spec"]
    assert document["metadata"]["name"] == "kubetrain-training"
    assert "volumeClaimTemplates" not in spec
    (volume,) = spec["volumes"]
    claim = volume["persistentVolumeClaim"]["claimName"]
    assert claim == "{{workflow.parameters.shared_pvc}}"
    parameters = {p["name"]: p["value"] for p in spec["arguments"]["parameters"]}
    assert parameters["shared_pvc"] == "kubetrain-shared"
    launch = dag_tasks(document, spec["entrypoint"])["launch"]
    assert {p["name"]: p["value"] for p in launch["arguments"]["parameters"]}["shared_pvc"] == (
        claim
    )


def parameter_values(document: dict[str, Any]) -> dict[str, str]:
    return {p["name"]: p["value"] for p in document["spec"]["arguments"]["parameters"]}


@pytest.mark.parametrize("kind", ["Workflow", "WorkflowTemplate"])
def test_the_default_registry_is_on_a_claim_that_outlives_the_run(kind):
    """Issue 27 (3): Argo deletes the claims of ``volumeClaimTemplates`` once a run succeeded
    and its exit handler ran (volumeClaimGC OnWorkflowSuccess: argo-workflows v4.1.2
    workflow/controller/operator.go ``operate`` calls ``deletePVCs`` (~l. 2029) after the
    onExit node, stripping the pvc-protection finalizer; v3.6.19 the same, ~l. 1814), so the
    default ``model_registry`` must be on a claim the workflow names, not one it creates."""
    document = build_training_workflow(kind).to_dict()
    spec = document["spec"]
    parameters = parameter_values(document)
    promote = dag_tasks(document, spec["entrypoint"])["promote"]
    mounts = template_named(document, promote["template"])["container"]["volumeMounts"]
    registry = parameters["model_registry"]
    (volume,) = [m["name"] for m in mounts if registry.startswith(m["mountPath"] + "/")]
    created = {claim["metadata"]["name"] for claim in spec.get("volumeClaimTemplates", [])}
    assert volume not in created, f"{registry} is on the run's own claim {volume}"
    (claim,) = [
        v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if v["name"] == volume
    ]
    (parameter,) = re.fullmatch(r"\{\{workflow\.parameters\.([a-z_]+)\}\}", claim).groups()
    # the claim the KFP pipeline's registry is on (shared_pvc), by default
    assert parameters[parameter] == "kubetrain-shared"


def test_a_run_with_its_own_claim_tells_promote_where_that_claim_is():
    document = build_training_workflow("Workflow").to_dict()
    spec = document["spec"]
    assert spec["volumeClaimGC"] == {"strategy": "OnWorkflowSuccess"}
    promote = dag_tasks(document, spec["entrypoint"])["promote"]
    passed = {p["name"]: p["value"] for p in promote["arguments"]["parameters"]}
    (claim,) = spec["volumeClaimTemplates"]
    prep = template_named(document, dag_tasks(document, spec["entrypoint"])["prep"]["template"])
    (mount,) = [
        m["mountPath"]
        for m in prep["container"]["volumeMounts"]
        if m["name"] == claim["metadata"]["name"]
    ]
    assert passed["run_claim_mount"] == mount
    # with an existing claim nothing is deleted with the run: the template's default (none)
    template = build_training_workflow("WorkflowTemplate").to_dict()
    promote = dag_tasks(template, template["spec"]["entrypoint"])["promote"]
    assert "run_claim_mount" not in {p["name"] for p in promote["arguments"]["parameters"]}


@pytest.mark.parametrize(
    ("registry", "refused"),
    [
        ("/mnt/shared/registry", True),
        ("/mnt/shared", True),
        ("file:///mnt/shared/models", True),
        ("/mnt/registry-pvc/registry", False),
        ("/mnt/registry-pvc/team", False),
        ("s3://bucket/models", False),
        ("/mnt/shared-other/registry", False),
    ],
)
def test_a_registry_on_the_run_claim_is_refused_when_the_run_is_made(registry, refused):
    document = build_training_workflow("Workflow").to_dict()
    if not refused:
        check_registry_outlives_run(document, {"model_registry": registry})
        return
    with pytest.raises(InvalidInput, match="run's own claim") as error:
        check_registry_outlives_run(document, {"model_registry": registry})
    assert error.value.field == "--param model_registry"
    # the WorkflowTemplate's claim is an existing one: its registry may be there
    template = build_training_workflow("WorkflowTemplate").to_dict()
    check_registry_outlives_run(template, {"model_registry": registry})


def test_claim_template_size_and_class_are_set_when_built():
    spec = build_training_workflow(storage=ClaimTemplate("50Gi", "efs")).to_dict()["spec"]
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert claim["spec"]["storageClassName"] == "efs"


@pytest.mark.parametrize("stem", sorted(ARGO_WORKFLOWS))
def test_operations_settings(stem):
    document = compiled(stem)
    spec = document["spec"]
    assert spec["podGC"]["strategy"] == "OnWorkflowSuccess"
    assert spec["ttlStrategy"]["secondsAfterSuccess"] > 0
    assert spec["ttlStrategy"]["secondsAfterFailure"] >= spec["ttlStrategy"]["secondsAfterSuccess"]
    parameters = {p["name"]: p["value"] for p in spec["arguments"]["parameters"]}
    assert parameters["service_account"] == "kubetrain"
    assert all(isinstance(value, str) for value in parameters.values())
    for template in spec["templates"]:
        if "container" in template:
            assert template["serviceAccountName"] == "{{workflow.parameters.service_account}}"
    retried = {t["name"]: t["retryStrategy"] for t in spec["templates"] if "retryStrategy" in t}
    # the steps that talk to the Kubernetes API are retried
    assert {"launch-trainjob", "wait-trainjob", "delete-trainjob"} <= set(retried)
    assert all(isinstance(r["limit"], str) for r in retried.values())
    # ...but not after bad input (exit 2) or a stalled job (exit 3), which a retry cannot fix
    for name, strategy in retried.items():
        if strategy["retryPolicy"] == "Always":
            last = {"lastRetry.status": "Failed", "lastRetry.duration": "1"}
            last["lastRetry.message"] = ""
            decide = [
                evaluate_bool(strategy["expression"], {**last, "lastRetry.exitCode": code})
                for code in ("1", "2", "3", "-1")
            ]
            assert decide == [True, False, False, True], name
    # the TrainJob's pods carry the workflow label, so `argo logs WF -c node` shows them
    launch_args = template_named(document, "launch-trainjob")["container"]["args"]
    label = launch_args[launch_args.index("--pod-label") + 1]
    assert label == "workflows.argoproj.io/workflow={{workflow.name}}"


def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def input_parameters(template: Container) -> list[Parameter]:
    return [p for p in template.inputs if isinstance(p, Parameter)]


def sample_arguments(template: Container) -> list[str]:
    """The template's command line with each input parameter replaced by its default, or by
    "1" (which every option type accepts) when it has none."""
    samples = {p.name: p.default or "1" for p in input_parameters(template)}
    return [INPUT.sub(lambda m: samples[m.group(1)], arg) for arg in template.args]


def cli_options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The step CLI's options and positionals by destination (help excluded)."""
    return {
        action.dest: action
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
    }


def options_passed(parser: argparse.ArgumentParser, template: Container) -> set[str]:
    """Destinations the template's arguments set: options it names, and the positionals
    (whose values the template's arguments end with)."""
    args = set(template.args)
    return {
        dest
        for dest, action in cli_options(parser).items()
        if (set(action.option_strings) & args)
        or (not action.option_strings and action.nargs is None)
    }


@pytest.mark.parametrize("step", sorted(TEMPLATES))
def test_template_parses_with_the_step_cli(step):
    template = TEMPLATES[step]()
    assert template.command == ["kubetrain", step]
    used = {m.group(1) for arg in template.args for m in INPUT.finditer(arg)}
    declared = {p.name for p in input_parameters(template)}
    assert used == declared, "every input parameter is passed to the CLI, and only those"
    # argparse exits on an unknown option, a missing required one or a badly typed value
    args = build_parser().parse_args([step, *sample_arguments(template)])
    assert args.handler is not None


@pytest.mark.parametrize("step", sorted(TEMPLATES))
def test_template_covers_the_cli(step):
    parser = subcommand_parsers()[step]
    passed = options_passed(parser, TEMPLATES[step]())
    uncovered = set(cli_options(parser)) - passed - LEFT_AT_DEFAULT[step]
    assert uncovered == set(), f"`kubetrain {step}` options the Argo template does not pass"
    stale = LEFT_AT_DEFAULT[step] & passed
    assert stale == set(), f"listed as left at default but passed by the template: {stale}"
    unknown = LEFT_AT_DEFAULT[step] - set(cli_options(parser))
    assert unknown == set(), f"listed as left at default but not an option: {unknown}"


def test_a_new_cli_option_without_the_template_fails_the_coverage_check():
    parser = subcommand_parsers()["collect"]
    parser.add_argument("--compression", default="none")
    passed = options_passed(parser, TEMPLATES["collect"]())
    assert set(cli_options(parser)) - passed - LEFT_AT_DEFAULT["collect"] == {"compression"}


@pytest.mark.parametrize("kind", ["Workflow", "WorkflowTemplate"])
def test_the_unschedulable_grace_is_a_workflow_parameter(kind):
    """Issue 17 (9): a gang job waiting for Volcano, or one waiting for the autoscaler, is
    Unschedulable for minutes; the grace wait gives it is the run's choice on every face."""
    document = build_training_workflow(kind).to_dict()
    parameters = {p["name"]: p["value"] for p in document["spec"]["arguments"]["parameters"]}
    assert parameters["unschedulable_grace_seconds"] == "auto"
    wait = dag_tasks(document, document["spec"]["entrypoint"])["wait"]
    arguments = {p["name"]: p["value"] for p in wait["arguments"]["parameters"]}
    assert arguments["unschedulable_grace_seconds"] == (
        "{{workflow.parameters.unschedulable_grace_seconds}}"
    )
