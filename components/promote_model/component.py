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
    inside the evaluate step's ``dsl.If(passed)``. A negative ``accuracy`` means not given."""
    from collections import namedtuple

    from kubetrain import storage
    from kubetrain.components.promote_model.promote import promote_model as promote

    # collect's model is a LOCATION pointer when it went to `storage`: promote what it names
    source = storage.dereference(model.path)
    promoted = promote(source, registry, version, accuracy=accuracy if accuracy >= 0 else None)
    print(f"promoted {promoted.version} (sha256 {promoted.sha256}) to {promoted.path}")
    return namedtuple("PromoteOutputs", ["promoted_to", "sha256"])(promoted.path, promoted.sha256)


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def promotion_gate(passed: bool, model_registry: str = "", storage: str = "") -> bool:
    """Whether to promote: the evaluation ``passed``, a ``model_registry`` is given, and the
    model is a local folder (``storage`` empty or local; promote publishes local folders only).
    A pipeline runs promote_model in ``dsl.If(gate.output == True)``: one output, because KFP's
    local runner evaluates a condition on a NamedTuple output (evaluate's ``passed``) as false
    (kubeflow/pipelines#13313; kfp 2.17 kfp/local/orchestrator/enhanced_dag_orchestrator.py
    ConditionEvaluator resolves ``<task>-Output`` and ``<task>--<output>`` channels only)."""
    from kubetrain import storage as object_storage

    if not passed:
        reason = "the model did not pass the evaluation"
    elif not model_registry:
        reason = "no model_registry given"
    elif storage and not object_storage.is_local(storage):
        reason = f"the model is in {storage}; promote publishes local folders only"
    else:
        print(f"promoting to {model_registry}")
        return True
    print(f"not promoting: {reason}")
    return False
