"""`kubetrain promote`: publish a collected model as a registry version and point serving at it."""

from __future__ import annotations

import argparse

from kubetrain.components._shared.step_outputs import (
    add_output_parameters_argument,
    check_output_parameters,
    write_output_parameters,
)
from kubetrain.errors import terminal_text

#: What ``--output-parameters DIR`` holds once the step is done, one file each.
OUTPUT_NAMES = ("promoted_to", "sha256")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "promote",
        help="publish a collected model into a model registry folder and mark it current",
        description=(
            "Verify MODEL/model.safetensors against its sha256, copy it and model.json to "
            "REGISTRY/VERSION (verified, published atomically, never replaced) and point "
            "REGISTRY/PROMOTED at it. MODEL and REGISTRY are local folders or fsspec URLs "
            "(s3://bucket/models: the model file first, model.json last). Promoting the same "
            "model to the same version again is a no-op; another model under an existing "
            "version is refused."
        ),
    )
    parser.add_argument(
        "--model", required=True, help="folder or URL written by `kubetrain collect`"
    )
    parser.add_argument(
        "--registry",
        required=True,
        help="model registry: a local folder (created if missing), file:// or an fsspec URL "
        "such as s3://bucket/models",
    )
    parser.add_argument(
        "--version",
        required=True,
        metavar="NAME",
        help="version folder to publish as: letters, digits, '.', '_', '-' (e.g. 2024-06-01)",
    )
    parser.add_argument(
        "--accuracy",
        type=float,
        default=None,
        help="test accuracy from `kubetrain evaluate` (a fraction), recorded in PROMOTED",
    )
    parser.add_argument(
        "--run-claim-mount",
        default="",
        metavar="PATH",
        help="mount path of a claim deleted with the run (an Argo per-run claim): a registry "
        "under it is refused; default none",
    )
    add_output_parameters_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    check_output_parameters(args.output_parameters, OUTPUT_NAMES)
    from kubetrain.components.promote_model.promote import promote_model

    promoted = promote_model(
        args.model,
        args.registry,
        args.version,
        accuracy=args.accuracy,
        run_claim_mount=args.run_claim_mount,
    )
    print(
        terminal_text(f"promoted {promoted.version} (sha256 {promoted.sha256}) to {promoted.path}")
    )
    write_output_parameters(
        args.output_parameters, {"promoted_to": promoted.path, "sha256": promoted.sha256}
    )
    return 0
