"""KFP component of the collect step."""

from typing import Optional

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
    checkpoint_file: str = "",
    state_key: str = "",
    allow_nonfinite: bool = False,
    dataset: Optional[dsl.Input[dsl.Dataset]] = None,  # noqa: UP045 (KFP reads it)
):
    """Verify the newest complete rank-0 checkpoint and publish it as model.safetensors.

    ``checkpoint_dir``: take it from wait_trainjob's ``checkpoint_dir`` output, which it
    returns once the job is Complete; from launch's, this step would run beside the training
    on a cluster.

    With ``storage`` (an object-storage URL), the model goes to storage/models/<run_name> (pass
    ``dsl.PIPELINE_JOB_RESOURCE_NAME_PLACEHOLDER``, unique per run) and
    ``model`` holds only a LOCATION pointer to it (its metadata ``uri`` names it too).
    ``export``: none, torch-export (model.pt2) or torchscript, published beside the model.
    ``model_factory``: package.module:callable building the model an export traces, needed
    when the checkpoint records custom model code (never imported on the manifest's word).
    ``checkpoint_file``: the checkpoint to take instead of the newest, a file or folder inside
    ``checkpoint_dir`` (e.g. model_epoch_9.pt); empty: the newest.
    ``state_key``: the state dict that is the model in a checkpoint of nested state (e.g.
    ``app.model``); empty: the one named as a model, refused when several are.
    ``allow_nonfinite``: publish a model holding NaN or Inf (refused by default).
    ``dataset``: prep's dataset; with ``model_factory``, a script's checkpoint is checked to
    load into that model before it is published.
    """
    from kubetrain import storage as object_storage
    from kubetrain.components.collect_checkpoint.collect import collect_checkpoint as collect
    from kubetrain.errors import terminal_text

    output = object_storage.run_folder(storage, "models", run_name) if storage else model.path
    collected = collect(
        checkpoint_dir,
        str(output),
        export,
        model_factory=model_factory,
        checkpoint_file=checkpoint_file,
        state_key=state_key,
        allow_nonfinite=allow_nonfinite,
        data=dataset.path if dataset is not None else "",
    )
    if storage:
        object_storage.write_pointer(model.path, output)
        model.metadata["uri"] = str(output)
    card = collected.card
    final = card["metrics"][-1] if card["metrics"] else {}
    recorded = {
        "epoch": card.get("epoch"),
        "step": card.get("step"),
        "world_size": card.get("world_size"),
        "strategy": card.get("strategy"),
        "model": card["model"].get("spec"),
    }
    model.metadata.update(
        {
            "framework": "pytorch",
            "format": "safetensors",
            "file": "model.safetensors",
            "sha256": collected.sha256,
            "source_file": card["source_file"],
            "source_sha256": card["source_sha256"],
            "source_format": card["source_format"],
            **{key: value for key, value in recorded.items() if value is not None},
            "metrics": final,
        }
    )
    print(
        terminal_text(
            f"collected {card['source_file']} ({card['source_format']}, epoch "
            f"{card.get('epoch', 'unknown')}) sha256 {collected.sha256}"
        )
    )
