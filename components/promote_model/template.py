"""The promote step as an Argo Workflows container template (Hera)."""

from __future__ import annotations

from hera.workflows import Artifact, Container

from kubetrain.components._shared.argo_steps import (
    INPUTS_DIR,
    SHARED_VOLUME,
    SharedVolume,
    input_parameter,
    inputs,
    output_parameter,
    step_template,
)
from kubetrain.images import COMPONENT_IMAGE

MODEL_PATH = f"{INPUTS_DIR}/model"


def promote_model_template(
    name: str = "promote-model",
    volume: SharedVolume = SHARED_VOLUME,
    image: str = COMPONENT_IMAGE,
) -> Container:
    """`kubetrain promote`: publishes the verified ``model`` artifact as ``version`` in the
    ``registry`` (a folder on ``volume``'s claim or an fsspec URL) and points ``PROMOTED`` at
    it; run it only when evaluate passed. A registry under ``run_claim_mount`` (a claim the run
    deletes) is refused."""
    return step_template(
        name,
        ["promote"],
        [
            "--model",
            MODEL_PATH,
            "--registry",
            inputs("registry"),
            "--version",
            inputs("version"),
            "--accuracy",
            inputs("accuracy"),
            "--run-claim-mount",
            inputs("run_claim_mount"),
        ],  # fmt: skip
        [
            input_parameter("registry", "model registry: a folder on a lasting claim, or a URL"),
            input_parameter("version", "version name of the promoted model"),
            input_parameter("accuracy", "the accuracy evaluate measured, for the record"),
            input_parameter(
                "run_claim_mount",
                "mount path of a claim deleted with the run, where no registry may be; empty: none",
                "",
            ),
        ],
        [
            output_parameter("promoted_to", "the registry folder of this version"),
            output_parameter("sha256", "sha256 of the promoted model.safetensors"),
        ],
        input_artifacts=[Artifact(name="model", path=MODEL_PATH)],
        volume=volume,
        image=image,
    )
