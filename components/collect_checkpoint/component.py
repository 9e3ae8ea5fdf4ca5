"""KFP component of the collect step."""

from kfp import dsl

from kubetrain.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def collect_checkpoint(
    checkpoint_dir: str,
    model: dsl.Output[dsl.Model],
    storage: str = "",
    run_name: str = "",
    export: str = "none",
    model_factory: str = "",
):
    """Verify the newest complete rank-0 checkpoint and publish it as model.safetensors.

    With ``storage`` (an object-storage URL), the model goes to storage/models/<run_name> and
    ``model`` holds only a LOCATION pointer to it (its metadata ``uri`` names it too).
    ``export``: none, torch-export (model.pt2) or torchscript, published beside the model.
    ``model_factory``: package.module:callable building the model an export traces, needed
    when the checkpoint records custom model code (never imported on the manifest's word).
    """
    from kubetrain import storage as object_storage
    from kubetrain.components.collect_checkpoint.collect import collect_checkpoint as collect

    output = object_storage.run_folder(storage, "models", run_name) if storage else model.path
    collected = collect(checkpoint_dir, str(output), export, model_factory=model_factory)
    if storage:
        object_storage.write_pointer(model.path, output)
        model.metadata["uri"] = str(output)
    card = collected.card
    final = card["metrics"][-1] if card["metrics"] else {}
    model.metadata.update(
        {
            "framework": "pytorch",
            "format": "safetensors",
            "file": "model.safetensors",
            "sha256": collected.sha256,
            "epoch": card["epoch"],
            "step": card["step"],
            "world_size": card["world_size"],
            "strategy": card["strategy"],
            "model": card["model"]["spec"],
            "metrics": final,
        }
    )
    print(f"collected epoch {card['epoch']} ({card['strategy']}) sha256 {collected.sha256}")
