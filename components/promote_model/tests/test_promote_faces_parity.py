"""The promote step's three faces take the same options: `kubetrain promote` (CLI), the KFP
component and the Argo template (as collect's, wait's and launch's parity tests hold for
theirs). An option one face has and another lacks fails here."""

from __future__ import annotations

import argparse

import pytest

from kubetrain.cli import build_parser
from kubetrain.components.promote_model.component import promote_model
from kubetrain.components.promote_model.template import promote_model_template

#: Options that belong to one face's plumbing, not to the promotion, and why.
RUN_CLAIM = "Argo's claim per run, deleted when the run succeeds: no KFP run deletes its claim"
FACE_PLUMBING = {
    "cli": {
        "output_parameters": "where the CLI writes its outputs for Argo; KFP returns them",
        "run_claim_mount": RUN_CLAIM,
    },
    "kfp": {},
    "argo": {"run_claim_mount": RUN_CLAIM},
}


def cli_options() -> set[str]:
    parser = build_parser()
    (subcommands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    promote = subcommands.choices["promote"]
    dests = {a.dest for a in promote._actions if not isinstance(a, argparse._HelpAction)}
    return dests - set(FACE_PLUMBING["cli"])


def kfp_options() -> set[str]:
    return set(promote_model.component_spec.inputs or {}) - set(FACE_PLUMBING["kfp"])


def argo_options() -> set[str]:
    return {p.name for p in promote_model_template().inputs} - set(FACE_PLUMBING["argo"])


FACES = {"cli": cli_options, "kfp": kfp_options, "argo": argo_options}


@pytest.mark.parametrize("face", sorted(FACES))
def test_every_face_takes_every_promote_option(face: str) -> None:
    every = set().union(*(options() for options in FACES.values()))
    missing = every - FACES[face]()
    assert missing == set(), f"the {face} face of promote lacks {sorted(missing)}"
    assert {"model", "registry", "version", "accuracy"} <= FACES[face]()


def test_the_run_claim_rule_is_on_the_faces_that_have_a_run_claim() -> None:
    assert "run_claim_mount" in {p.name for p in promote_model_template().inputs}
    parser = build_parser()
    (subcommands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert "run_claim_mount" in {a.dest for a in subcommands.choices["promote"]._actions}
