"""The collect step as an Argo Workflows container template (Hera)."""

from __future__ import annotations

from hera.workflows import Artifact, Container

from kubetrain.components._shared.argo_steps import (
    SHARED_VOLUME,
    SharedVolume,
    input_parameter,
    inputs,
    output_parameter,
    step_template,
)
from kubetrain.images import COMPONENT_IMAGE


def collect_checkpoint_template(
    name: str = "collect-checkpoint",
    volume: SharedVolume = SHARED_VOLUME,
    image: str = COMPONENT_IMAGE,
) -> Container:
    """`kubetrain collect`: verifies rank 0's newest complete checkpoint and publishes the model
    folder at ``output``; the folder is also the output artifact ``model``."""
    return step_template(
        name,
        ["collect"],
        [
            "--checkpoint-dir",
            inputs("checkpoint_dir"),
            "--output",
            inputs("output"),
            "--export",
            inputs("export"),
            "--model-factory",
            inputs("model_factory"),
            "--checkpoint-file",
            inputs("checkpoint_file"),
            "--state-key",
            inputs("state_key"),
            "--allow-nonfinite",
            inputs("allow_nonfinite"),
            "--data",
            inputs("data"),
        ],  # fmt: skip
        [
            input_parameter("checkpoint_dir", "folder the training job wrote"),
            input_parameter("output", "folder to publish the model in"),
            input_parameter("export", "none, torch-export or torchscript", "none"),
            input_parameter(
                "model_factory",
                "package.module:callable building a custom model to export; empty: built-in",
                "",
            ),
            input_parameter(
                "checkpoint_file",
                "the checkpoint to take, inside checkpoint_dir (e.g. model_epoch_9.pt); "
                "empty: the newest",
                "",
            ),
            input_parameter(
                "state_key",
                "the state dict that is the model in nested state (e.g. app.model); empty: the "
                "one named as a model",
                "",
            ),
            input_parameter(
                "allow_nonfinite", "publish a model holding NaN or Inf: true or false", "false"
            ),
            input_parameter(
                "data",
                "prepared dataset folder: a script's checkpoint must load into model_factory's "
                "model for it; empty: not checked",
                "",
            ),
        ],
        [
            output_parameter("model_dir", "the published model folder"),
            output_parameter("sha256", "sha256 of model.safetensors"),
            output_parameter("epoch", "epoch of the collected checkpoint"),
            Artifact(name="model", path=inputs("output")),
        ],
        volume=volume,
        image=image,
    )
