"""`kubetrain promote`: publish a collected model as a registry version and point serving at it."""

from __future__ import annotations

import argparse

from kubetrain.components._shared.step_outputs import (
    add_output_parameters_argument,
    write_output_parameters,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "promote",
        help="publish a collected model into a model registry folder and mark it current",
        description=(
            "Verify MODEL/model.safetensors against its sha256, copy it and model.json to "
            "REGISTRY/VERSION (verified, published atomically, never replaced) and point "
            "REGISTRY/PROMOTED at it. Promoting the same model to the same version again is a "
            "no-op; another model under an existing version is refused."
        ),
    )
    parser.add_argument("--model", required=True, help="folder written by `kubetrain collect`")
    parser.add_argument(
        "--registry",
        required=True,
        help="model registry folder (a local path or file:// URL); created if missing",
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
    add_output_parameters_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kubetrain.components.promote_model.promote import promote_model

    promoted = promote_model(args.model, args.registry, args.version, accuracy=args.accuracy)
    print(f"promoted {promoted.version} (sha256 {promoted.sha256}) to {promoted.path}")
    write_output_parameters(
        args.output_parameters, {"promoted_to": promoted.path, "sha256": promoted.sha256}
    )
    return 0
