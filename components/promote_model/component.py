"""KFP components of the promote step: the promotion itself, and the gate a pipeline runs it
behind."""

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
    inside the evaluate step's ``dsl.If(passed)``. ``registry`` is a folder the pod sees or an
    fsspec URL (s3://bucket/models). A negative ``accuracy`` means not given."""
    from collections import namedtuple

    from kubetrain.components.promote_model.promote import promote_model as promote
    from kubetrain.errors import terminal_text

    # collect's model is a LOCATION pointer when it went to `storage`: promote follows it
    promoted = promote(model.path, registry, version, accuracy=accuracy if accuracy >= 0 else None)
    print(
        terminal_text(f"promoted {promoted.version} (sha256 {promoted.sha256}) to {promoted.path}")
    )
    return namedtuple("PromoteOutputs", ["promoted_to", "sha256"])(promoted.path, promoted.sha256)


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def promotion_gate(passed: bool, model_registry: str = "", storage: str = "") -> bool:
    """Whether to promote: the evaluation ``passed``, a ``model_registry`` is given, and a run
    that keeps its data in object storage (``storage`` a URL) keeps its registry there too, so
    no model bytes land on a disk or claim the run did not choose (promote itself reads and
    writes either). A pipeline runs promote_model in ``dsl.If(gate.output == True)``: one
    output, because KFP's local runner evaluates a condition on a NamedTuple output
    (evaluate's ``passed``) as false (kubeflow/pipelines#13313; kfp 2.17
    kfp/local/orchestrator/enhanced_dag_orchestrator.py ConditionEvaluator resolves
    ``<task>-Output`` and ``<task>--<output>`` channels only)."""
    from kubetrain import storage as object_storage
    from kubetrain.errors import terminal_text

    if not passed:
        reason = "the model did not pass the evaluation"
    elif not model_registry:
        reason = "no model_registry given"
    elif (
        storage and not object_storage.is_local(storage) and object_storage.is_local(model_registry)
    ):
        reason = (
            f"the model is in {storage} and model_registry {model_registry} is not in object "
            f"storage; give model_registry as a URL, e.g. {storage.rstrip('/')}/registry"
        )
    else:
        print(f"promoting to {terminal_text(model_registry)}")
        return True
    print(f"not promoting: {terminal_text(reason)}")
    return False
