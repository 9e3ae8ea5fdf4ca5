"""KFP component of the collect step."""

from kfp import dsl

from kubetrain.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def collect_checkpoint(checkpoint_dir: str, model: dsl.Output[dsl.Model]):
    """Verify the newest complete rank-0 checkpoint and publish it as model.safetensors."""
    from kubetrain.components.collect_checkpoint.collect import collect_checkpoint as collect

    collected = collect(checkpoint_dir, model.path)
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
