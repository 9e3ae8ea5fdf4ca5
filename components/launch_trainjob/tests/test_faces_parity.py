"""The launch step's three faces take the same options: `kubetrain launch` (CLI), the KFP
component and the Argo template. An option one face has and another lacks fails here, so a
pipeline user can always ask for what a CLI user can."""

from __future__ import annotations

import argparse

import pytest

from kubetrain.cli import build_parser
from kubetrain.components.launch_trainjob.component import launch_trainjob
from kubetrain.components.launch_trainjob.template import launch_trainjob_template

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
