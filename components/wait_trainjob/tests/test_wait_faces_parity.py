"""The wait step's three faces take the same options: `kubetrain wait` (CLI), the KFP
component and the Argo template (as components/launch_trainjob/tests/test_faces_parity.py
holds for launch). An option one face has and another lacks fails here."""

from __future__ import annotations

import argparse

import pytest

from kubetrain.cli import build_parser
from kubetrain.components.wait_trainjob.component import wait_trainjob
from kubetrain.components.wait_trainjob.template import wait_trainjob_template

#: CLI destination -> the name the KFP component and the Argo template give that option.
RENAMED = {
    "name": "job_name",
    "timeout": "timeout_seconds",
    "stall_timeout": "stall_timeout_seconds",
}
#: Options that belong to one face's plumbing, not to the wait, and why.
FACE_PLUMBING = {
    "cli": {
        "output_parameters": "where the CLI writes its outputs for Argo; KFP returns them",
        "quiet": "whether a terminal sees the log lines; a pipeline step always logs them",
    },
    "kfp": {
        "checkpoint_dir": "launch's output handed on as wait's, so KFP's collect depends on "
        "wait; Argo orders collect after wait with the DAG's dependencies",
    },
    "argo": set(),
}


def cli_options() -> set[str]:
    parser = build_parser()
    (subcommands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    wait = subcommands.choices["wait"]
    dests = {a.dest for a in wait._actions if not isinstance(a, argparse._HelpAction)}
    return {RENAMED.get(dest, dest) for dest in dests - set(FACE_PLUMBING["cli"])}


def kfp_options() -> set[str]:
    return set(wait_trainjob.component_spec.inputs) - set(FACE_PLUMBING["kfp"])


def argo_options() -> set[str]:
    return {p.name for p in wait_trainjob_template().inputs} - set(FACE_PLUMBING["argo"])


FACES = {"cli": cli_options, "kfp": kfp_options, "argo": argo_options}


@pytest.mark.parametrize("face", sorted(FACES))
def test_every_face_takes_every_wait_option(face: str) -> None:
    every = set().union(*(options() for options in FACES.values()))
    missing = every - FACES[face]()
    assert missing == set(), f"the {face} face of wait lacks {sorted(missing)}"


def test_the_unschedulable_grace_is_on_every_face_with_one_default() -> None:
    """Issue 17 (9): "auto" everywhere (300 s; no limit for a gang runtime)."""
    for face, options in FACES.items():
        assert "unschedulable_grace_seconds" in options(), face
    assert wait_trainjob.component_spec.inputs["unschedulable_grace_seconds"].default == "auto"
    argo = {p.name: p.default for p in wait_trainjob_template().inputs}
    assert argo["unschedulable_grace_seconds"] == "auto"
    assert build_parser().parse_args(["wait", "job"]).unschedulable_grace_seconds == "auto"
