"""The launch step's three faces take the same options: `kubetrain launch` (CLI), the KFP
component and the Argo template. An option one face has and another lacks fails here, so a
pipeline user can always ask for what a CLI user can."""

from __future__ import annotations

import argparse

import pytest

from kubetrain.cli import build_parser
from kubetrain.components.launch_trainjob.component import launch_trainjob
from kubetrain.components.launch_trainjob.template import launch_trainjob_template
from kubetrain.pipelines.training_workflow import ENTRYPOINT

#: CLI destination -> the name the KFP component and the Argo template give that option.
RENAMED = {
    "name": "job_name",
    "toleration": "tolerations",
    "volume": "volumes",
    "label": "labels",
    "pod_label": "pod_labels",
    "command_json": "command",
}
#: Options that belong to one face's plumbing, not to the job, and why.
FACE_PLUMBING = {
    "cli": {
        "output_parameters": "where the CLI writes its outputs for Argo; KFP returns them",
        "command": "the program after `--`; the same as --command-json",
        "data": "the dataset: a path on the CLI, the `dataset` artifact in KFP",
    },
    "kfp": {"dataset": "the prep step's Dataset artifact; --data on the CLI"},
    "argo": {"data": "the prep step's output folder; --data on the CLI"},
}
#: Options a face cannot have, and why.
NOT_APPLICABLE = {
    "argo": {
        "shared_mount": "where the template mounts its volume (SharedVolume.mount_path), "
        "fixed when the workflow is built: a volumeMount cannot be a parameter",
    },
}


def cli_options() -> set[str]:
    parser = build_parser()
    (subcommands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    launch = subcommands.choices["launch"]
    dests = {a.dest for a in launch._actions if not isinstance(a, argparse._HelpAction)}
    return {RENAMED.get(dest, dest) for dest in dests - set(FACE_PLUMBING["cli"])}


def kfp_options() -> set[str]:
    return set(launch_trainjob.component_spec.inputs) - set(FACE_PLUMBING["kfp"])


def argo_options() -> set[str]:
    template = launch_trainjob_template()
    return {p.name for p in template.inputs} - set(FACE_PLUMBING["argo"])


FACES = {"cli": cli_options, "kfp": kfp_options, "argo": argo_options}


@pytest.mark.parametrize("face", sorted(FACES))
def test_every_face_takes_every_launch_option(face: str) -> None:
    every = set().union(*(options() for options in FACES.values()))
    missing = every - FACES[face]() - set(NOT_APPLICABLE.get(face, {}))
    assert missing == set(), f"the {face} face of launch lacks {sorted(missing)}"


def test_the_check_notices_a_missing_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """Removing one input from the KFP face is caught."""
    inputs = dict(launch_trainjob.component_spec.inputs)
    inputs.pop("tolerations")
    monkeypatch.setattr(launch_trainjob.component_spec, "inputs", inputs)
    every = set().union(*(options() for options in FACES.values()))
    assert every - kfp_options() == {"tolerations"}


#: Options every launch face must have: the comparison above cannot notice one that no face
#: has (issue 29: DeepSpeed and the MPI launcher).
REQUIRED = {"strategy", "zero_stage", "deepspeed_config", "launcher"}


@pytest.mark.parametrize("face", sorted(FACES))
def test_every_face_takes_the_deepspeed_and_launcher_options(face: str) -> None:
    missing = REQUIRED - FACES[face]()
    assert missing == set(), f"the {face} face of launch lacks {sorted(missing)}"


def pipeline_options() -> set[str]:
    """The KFP pipeline's parameters the launch task gets as they are (from the exit handler's
    group, which gets them from the pipeline's own)."""
    from kubetrain.pipelines.training_pipeline import training_pipeline

    spec = training_pipeline.pipeline_spec
    ((group_task, group),) = [
        (name, spec.components[task.component_ref.name])
        for name, task in spec.root.dag.tasks.items()
        if "launch-trainjob" in spec.components[task.component_ref.name].dag.tasks
    ]
    group_inputs = spec.root.dag.tasks[group_task].inputs.parameters
    launch = group.dag.tasks["launch-trainjob"].inputs.parameters
    return {
        name
        for name, given in launch.items()
        if given.component_input_parameter
        and group_inputs[given.component_input_parameter].component_input_parameter == name
        and name in spec.root.input_definitions.parameters
    }


def workflow_options() -> set[str]:
    """The Argo workflow's parameters its launch task gets as they are."""
    from kubetrain.pipelines.training_workflow import build_training_workflow

    document = build_training_workflow().to_dict()
    declared = {p["name"] for p in document["spec"]["arguments"]["parameters"]}
    (dag,) = [t["dag"] for t in document["spec"]["templates"] if t["name"] == ENTRYPOINT]
    (launch,) = [t for t in dag["tasks"] if t["template"] == "launch-trainjob"]
    return {
        p["name"]
        for p in launch["arguments"]["parameters"]
        if p["value"] == "{{workflow.parameters." + p["name"] + "}}" and p["name"] in declared
    }


def run_options() -> set[str]:
    parser = build_parser()
    (subcommands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {a.dest for a in subcommands.choices["run"]._actions}


#: The whole-pipeline faces: `kubetrain run` (which calls the KFP pipeline with its options),
#: the KFP pipeline and the Argo workflow, each passing the option to its launch step.
PIPELINE_FACES = {"run": run_options, "kfp pipeline": pipeline_options, "argo": workflow_options}


@pytest.mark.parametrize("face", sorted(PIPELINE_FACES))
def test_every_pipeline_face_passes_the_deepspeed_and_launcher_options(face: str) -> None:
    missing = REQUIRED - PIPELINE_FACES[face]()
    assert missing == set(), f"the {face} face does not pass {sorted(missing)} to launch"


def test_the_check_notices_a_parameter_the_workflow_does_not_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kubetrain.pipelines import training_workflow

    parameters = dict(training_workflow.PARAMETERS)
    parameters.pop("zero_stage")
    monkeypatch.setattr(training_workflow, "PARAMETERS", parameters)
    assert REQUIRED - workflow_options() == {"zero_stage"}
