"""`kubetrain collect`: publish the newest complete rank-0 checkpoint as a safetensors model."""

from __future__ import annotations

import argparse

from kubetrain.components._shared.step_outputs import (
    add_output_parameters_argument,
    write_output_parameters,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "collect",
        help="verify the newest checkpoint and publish it as model.safetensors",
        description=(
            "Read the newest complete checkpoint through its LATEST pointer, verify every file's "
            "sha256, gather FSDP shards into one state dict, and publish OUTPUT/model.safetensors "
            "and OUTPUT/model.json atomically."
        ),
    )
    parser.add_argument("--checkpoint-dir", required=True, help="folder the training job wrote")
    parser.add_argument("--output", required=True, help="folder to publish the model in")
    parser.add_argument(
        "--export",
        choices=("none", "torch-export", "torchscript"),
        default="none",
        help=(
            "also publish a program for serving, checked against the model: torch-export "
            "(model.pt2) or torchscript (model.torchscript.pt); default none"
        ),
    )
    parser.add_argument(
        "--model-factory",
        default="",
        metavar="SPEC",
        help=(
            "package.module:callable that builds the model, for an export of a checkpoint of "
            "custom model code: the code its manifest names is imported only when given here"
        ),
    )
    add_output_parameters_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kubetrain.components.collect_checkpoint.collect import collect_checkpoint

    model = collect_checkpoint(
        args.checkpoint_dir, args.output, args.export, model_factory=args.model_factory
    )
    card = model.card
    print(
        f"collected epoch {card['epoch']} step {card['step']} ({card['strategy']}, "
        f"world size {card['world_size']}) from {card['source_checkpoint']}"
    )
    print(f"model {model.path} sha256 {model.sha256}")
    write_output_parameters(
        args.output_parameters,
        {"model_dir": args.output, "sha256": model.sha256, "epoch": card["epoch"]},
    )
    return 0
