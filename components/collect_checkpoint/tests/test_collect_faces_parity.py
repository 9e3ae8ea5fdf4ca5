"""The collect step's three faces take the same options: `kubetrain collect` (CLI), the KFP
component and the Argo template (as wait's and launch's parity tests hold for theirs). An
option one face has and another lacks (issue 26's --state-key, --allow-nonfinite, --data)
fails here."""

from __future__ import annotations

import argparse

import pytest

from kubetrain.cli import build_parser
from kubetrain.components.collect_checkpoint.component import collect_checkpoint
from kubetrain.components.collect_checkpoint.template import collect_checkpoint_template

#: CLI destination -> the name the KFP component and the Argo template give that option.
RENAMED = {"data": "dataset"}
#: Options that belong to one face's plumbing, not to the collect, and why.
FACE_PLUMBING = {
    "cli": {"output_parameters": "where the CLI writes its outputs for Argo; KFP returns them"},
    "kfp": {
        "model": "the KFP output artifact the model is published in (the CLI's --output)",
        "storage": "KFP's object-storage root: the model goes to storage/models/<run>",
        "run_name": "the run's name under storage, from KFP's placeholder",
    },
    "argo": set(),
}


def cli_options() -> set[str]:
    parser = build_parser()
    (subcommands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    collect = subcommands.choices["collect"]
    dests = {a.dest for a in collect._actions if not isinstance(a, argparse._HelpAction)}
    return {RENAMED.get(dest, dest) for dest in dests - set(FACE_PLUMBING["cli"])} - {"output"}


def kfp_options() -> set[str]:
    inputs = set(collect_checkpoint.component_spec.inputs or {})
    return inputs - set(FACE_PLUMBING["kfp"])


def argo_options() -> set[str]:
    names = {p.name for p in collect_checkpoint_template().inputs}
    return {RENAMED.get(name, name) for name in names} - {"output"}


FACES = {"cli": cli_options, "kfp": kfp_options, "argo": argo_options}


@pytest.mark.parametrize("face", sorted(FACES))
def test_every_face_takes_every_collect_option(face: str) -> None:
    every = set().union(*(options() for options in FACES.values()))
    missing = every - FACES[face]()
    assert missing == set(), f"the {face} face of collect lacks {sorted(missing)}"
    assert {"state_key", "allow_nonfinite", "dataset"} <= FACES[face]()
