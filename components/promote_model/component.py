"""KFP component of the promote step."""

from typing import NamedTuple

from kfp import dsl

from kubetrain.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def promote_model(
    model: dsl.Input[dsl.Model],
    registry: str,
    version: str,
    accuracy: float = -1.0,
) -> NamedTuple("PromoteOutputs", [("promoted_to", str), ("sha256", str)]):  # noqa: UP014
    """Publish the verified model as REGISTRY/VERSION and point REGISTRY/PROMOTED at it; run it
    inside the evaluate step's ``dsl.If(passed)``. A negative ``accuracy`` means not given."""
    from collections import namedtuple

    from kubetrain.components.promote_model.promote import promote_model as promote

    promoted = promote(model.path, registry, version, accuracy=accuracy if accuracy >= 0 else None)
    print(f"promoted {promoted.version} (sha256 {promoted.sha256}) to {promoted.path}")
    return namedtuple("PromoteOutputs", ["promoted_to", "sha256"])(promoted.path, promoted.sha256)
