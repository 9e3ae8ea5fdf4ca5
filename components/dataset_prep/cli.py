"""`kubetrain prep`: the dataset prep step on the command line.

Only argparse at module level: ``kubetrain --help`` imports every subcommand module, so
numpy, sklearn and torch are imported inside the handler.
"""

from __future__ import annotations

import argparse
from typing import Any

from kubetrain.components._shared.step_outputs import (
    add_output_parameters_argument,
    check_output_parameters,
    write_output_parameters,
)
from kubetrain.errors import terminal_text

# Kept equal to prepare_dataset's defaults (a test checks); not imported, to stay light.
DEFAULT_SOURCE = "sklearn:digits"
DEFAULT_TEST_FRACTION = 0.2
DEFAULT_VALIDATION_FRACTION = 0.1
DEFAULT_SEED = 0
MAX_CLASSES_SHOWN = 12
#: What ``--output-parameters DIR`` holds once the step is done, one file each.
OUTPUT_NAMES = ("dataset_dir", "train_count", "test_count", "num_classes")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``prep`` subcommand to the ``kubetrain`` parser."""
    parser = subparsers.add_parser(
        "prep",
        help="prepare a dataset folder (split, normalised, checksummed) for training",
        description=(
            "Load a dataset, validate it, split it into train/validation/test (stratified, "
            "seeded), normalise it with the statistics of the samples not held out for "
            "testing and publish it atomically as a kubetrain dataset folder (manifest.json, "
            "train.safetensors, validation.safetensors, test.safetensors)."
        ),
    )
    parser.add_argument(
        "--source",
        default=DEFAULT_SOURCE,
        help=(
            "what to prepare: sklearn:digits|iris|wine|breast_cancer (bundled, offline), "
            "torchvision:MNIST|FashionMNIST|CIFAR10 (needs kubetrain[vision] and network), "
            "or a local .npz file (keys x, y, optional classes) or folder (data.npz, or "
            "train.npz + test.npz), as a path or file:// URL (default: %(default)s)"
        ),
    )
    parser.add_argument(
        "--output",
        required=True,
        metavar="DIR",
        help="folder to publish the dataset in; must be new, empty or an earlier dataset",
    )
    parser.add_argument(
        "--test-fraction",
        type=float,
        default=DEFAULT_TEST_FRACTION,
        metavar="F",
        help=(
            "share of samples held out for testing, strictly between 0 and 1; ignored by "
            "sources with their own split (default: %(default)s)"
        ),
    )
    parser.add_argument(
        "--validation-fraction",
        type=float,
        default=DEFAULT_VALIDATION_FRACTION,
        metavar="F",
        help=(
            "share of the training samples set aside as the validation split the trainer "
            "scores each epoch on (the test split is left to evaluate), from 0 to 0.5; 0 "
            "writes no validation split (default: %(default)s)"
        ),
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help="seed of the split; the same seed gives byte-identical files (default: %(default)s)",
    )
    parser.add_argument(
        "--cache-dir",
        default=None,
        metavar="DIR",
        help="where torchvision datasets are downloaded to (default: ~/.cache/kubetrain)",
    )
    add_output_parameters_argument(parser)
    parser.set_defaults(handler=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Prepare the dataset and print a short summary; errors propagate as InvalidInput."""
    check_output_parameters(args.output_parameters, OUTPUT_NAMES)
    from kubetrain.components.dataset_prep.prep import prepare_dataset

    manifest = prepare_dataset(
        source=args.source,
        output_dir=args.output,
        test_fraction=args.test_fraction,
        seed=args.seed,
        cache_dir=args.cache_dir,
        validation_fraction=args.validation_fraction,
    )
    print(summary(manifest, args.output))
    write_output_parameters(
        args.output_parameters,
        {
            "dataset_dir": args.output,
            "train_count": manifest["splits"]["train"]["count"],
            "test_count": manifest["splits"]["test"]["count"],
            "num_classes": manifest["num_classes"],
        },
    )
    return 0


def summary(manifest: dict[str, Any], output: str) -> str:
    """A few lines a person can check at a glance: counts, classes, shape, where it went; each
    line escaped for the terminal (``terminal_text``: a class is a user's folder name)."""
    splits = manifest["splits"]
    if manifest.get("split") == "stratified":
        how = f"stratified, test_fraction {manifest['test_fraction']}, seed {manifest['seed']}"
    else:
        how = "the source's own split"
    classes = manifest["classes"]
    shown = ", ".join(classes[:MAX_CLASSES_SHOWN])
    if len(classes) > MAX_CLASSES_SHOWN:
        shown += f", … ({len(classes) - MAX_CLASSES_SHOWN} more)"
    validation = splits.get("validation")
    held = "" if validation is None else f", validation: {validation['count']} samples"
    return "\n".join(
        terminal_text(line)
        for line in [
            f"prepared {manifest['source']} -> {output}",
            f"  train: {splits['train']['count']} samples{held}, test: "
            f"{splits['test']['count']} samples ({how})",
            f"  classes ({len(classes)}): {shown}",
            f"  sample shape: {manifest['sample_shape']}",
        ]
    )
