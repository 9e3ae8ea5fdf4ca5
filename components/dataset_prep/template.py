"""The dataset prep step as an Argo Workflows container template (Hera)."""

from __future__ import annotations

from hera.workflows import Container

from kubetrain.components._shared.argo_steps import (
    SHARED_VOLUME,
    SharedVolume,
    file_artifact,
    input_parameter,
    inputs,
    output_parameter,
    step_template,
)
from kubetrain.images import COMPONENT_IMAGE


def dataset_prep_template(
    name: str = "dataset-prep",
    volume: SharedVolume = SHARED_VOLUME,
    image: str = COMPONENT_IMAGE,
) -> Container:
    """`kubetrain prep` writing the dataset folder to ``output`` (a path on ``volume``, the
    storage the training pods mount too)."""
    return step_template(
        name,
        ["prep"],
        [
            "--source",
            inputs("source"),
            "--output",
            inputs("output"),
            "--test-fraction",
            inputs("test_fraction"),
            "--validation-fraction",
            inputs("validation_fraction"),
            "--seed",
            inputs("seed"),
        ],  # fmt: skip
        [
            input_parameter(
                "source",
                "sklearn:digits, torchvision:NAME, or an .npz file or folder path",
                "sklearn:digits",
            ),
            input_parameter("output", "folder to publish the dataset in (on the shared volume)"),
            input_parameter("test_fraction", "share of samples held out for testing", "0.2"),
            input_parameter(
                "validation_fraction",
                "share of training samples scored each epoch (0: no validation split)",
                "0.1",
            ),
            input_parameter("seed", "seed of the split", "0"),
        ],  # fmt: skip
        [
            output_parameter("dataset_dir", "the published dataset folder"),
            output_parameter("train_count", "training samples"),
            output_parameter("test_count", "held-out samples"),
            output_parameter("num_classes", "number of classes"),
            file_artifact("manifest", inputs("output") + "/manifest.json"),
        ],
        volume=volume,
        image=image,
    )
