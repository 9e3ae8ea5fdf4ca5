"""`kubetrain collect`: publish the newest complete rank-0 checkpoint as a safetensors model."""

from __future__ import annotations

import argparse

from kubetrain.components._shared.flags import add_flag
from kubetrain.components._shared.step_outputs import (
    add_output_parameters_argument,
    check_output_parameters,
    write_output_parameters,
)
from kubetrain.errors import terminal_text

#: What ``--output-parameters DIR`` holds once the step is done, one file each.
OUTPUT_NAMES = ("model_dir", "sha256", "epoch")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "collect",
        help="verify the newest checkpoint and publish it as model.safetensors",
        description=(
            "Read the newest complete checkpoint through its LATEST pointer, verify every file's "
            "sha256, gather FSDP shards into one state dict, and publish OUTPUT/model.safetensors "
            "and OUTPUT/model.json atomically. A folder a training script saved into is searched "
            "instead, depth first, for a torch.save'd state dict (.pt/.pth/.bin, or a dict "
            "holding one under model_state_dict, state_dict, model, MODEL_STATE, module, net, "
            "ema...), a Lightning .ckpt, a .safetensors file, a DCP folder or an HF index, and "
            "the newest taken (by the numbers in its path, else by modification time; never one "
            "still being written). Optimizer state is never published; a checkpoint holding "
            "several state dicts that may be the model is refused unless --state-key names one. "
            "A model holding NaN or Inf is refused."
        ),
    )
    parser.add_argument("--checkpoint-dir", required=True, help="folder the training job wrote")
    parser.add_argument(
        "--checkpoint-file",
        default="",
        metavar="PATH",
        help=(
            "the checkpoint to take instead of the newest: a file or folder inside "
            "--checkpoint-dir (relative to it, or absolute), e.g. model_epoch_9.pt"
        ),
    )
    parser.add_argument(
        "--state-key",
        default="",
        metavar="KEY",
        help=(
            "the state dict that is the model in a checkpoint of nested state, as a dotted "
            "path: e.g. app.model (the DCP recipe's AppState), ema, MODEL_STATE"
        ),
    )
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
            "custom model code: the code its manifest names is imported only when given here; "
            "with --data, a script's checkpoint is checked to load into its model first"
        ),
    )
    parser.add_argument(
        "--data",
        default="",
        metavar="DIR",
        help=(
            "the prepared dataset the model was trained on (its sample shape and classes "
            "build --model-factory's model, which the checkpoint must load into)"
        ),
    )
    add_flag(
        parser,
        "--allow-nonfinite",
        "publish a model holding NaN or Inf (refused by default: its training diverged)",
    )
    add_output_parameters_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    check_output_parameters(args.output_parameters, OUTPUT_NAMES)
    from kubetrain.components.collect_checkpoint.collect import collect_checkpoint

    model = collect_checkpoint(
        args.checkpoint_dir,
        args.output,
        args.export,
        model_factory=args.model_factory,
        checkpoint_file=args.checkpoint_file,
        state_key=args.state_key,
        allow_nonfinite=args.allow_nonfinite,
        data=args.data,
    )
    card = model.card
    # the card quotes the user's file names and state key: escaped for the terminal
    if "strategy" in card:  # a kubetrain checkpoint
        collected = (
            f"collected epoch {card['epoch']} step {card['step']} ({card['strategy']}, "
            f"world size {card['world_size']}) from {card['source_checkpoint']}"
        )
    else:
        epoch = f", epoch {card['epoch']}" if "epoch" in card else ""
        state = f", state {card['state_key']}" if card.get("state_key") else ""
        collected = (
            f"collected {card['source_file']} ({card['source_format']}{epoch}{state}) from "
            f"{card['source_checkpoint']}"
        )
    print(terminal_text(collected))
    print(terminal_text(f"model {model.path} sha256 {model.sha256}"))
    write_output_parameters(
        args.output_parameters,
        {"model_dir": args.output, "sha256": model.sha256, "epoch": card.get("epoch", "")},
    )
    return 0
