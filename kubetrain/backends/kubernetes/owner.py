"""Which object owns the jobs we launch: the Argo Workflow of the pipeline run whose step pod
we run in, so deleting the run deletes its TrainJob (garbage collection) and nothing is left
training for a run that no longer exists.

Found from, in order: ``KUBETRAIN_OWNER_NAME`` + ``KUBETRAIN_OWNER_UID`` (and optionally
``KUBETRAIN_OWNER_KIND``/``KUBETRAIN_OWNER_API_VERSION``, default an Argo Workflow); else our
own pod (``POD_NAME``/``POD_NAMESPACE``, or ``KUBETRAIN_OWNER_POD``/``..._POD_NAMESPACE``): its
Workflow ownerReference, else its ``workflows.argoproj.io/workflow`` label and that Workflow's
uid. Outside a pod there is no owner.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from kubetrain.backends.kubernetes.client import Action, ApiError
from kubetrain.backends.kubernetes.objects import KubeObjects

WORKFLOW_API_VERSION = "argoproj.io/v1alpha1"
WORKFLOW_KIND = "Workflow"
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"


def _reference(api_version: str, kind: str, name: str, uid: str) -> dict[str, str]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid}


def find_owner(
    objects: KubeObjects,
    namespace: str,
    warn: Callable[[str], None],
    env: Mapping[str, str] = os.environ,
) -> dict[str, str] | None:
    """The ownerReference (apiVersion, kind, name, uid) for our jobs, or None."""
    if env.get("KUBETRAIN_OWNER_NAME") and env.get("KUBETRAIN_OWNER_UID"):
        return _reference(
            env.get("KUBETRAIN_OWNER_API_VERSION", WORKFLOW_API_VERSION),
            env.get("KUBETRAIN_OWNER_KIND", WORKFLOW_KIND),
            env["KUBETRAIN_OWNER_NAME"],
            env["KUBETRAIN_OWNER_UID"],
        )
    pod_name = env.get("KUBETRAIN_OWNER_POD") or env.get("POD_NAME")
    pod_namespace = env.get("KUBETRAIN_OWNER_POD_NAMESPACE") or env.get("POD_NAMESPACE")
    if not pod_name or not pod_namespace:
        return None
    if pod_namespace != namespace:
        warn(
            f"kubetrain: this step runs in namespace {pod_namespace}, the job goes to "
            f"{namespace}: an owner must share the job's namespace, so the job will outlive the "
            "pipeline run; delete it with `kubetrain delete`"
        )
        return None
    try:
        return _owner_of_pod(objects, pod_name, namespace)
    except ApiError as error:
        warn(
            f"kubetrain: cannot find the pipeline run that owns this step ({error}); the job "
            "will not be deleted with the run"
        )
        return None


def _owner_of_pod(objects: KubeObjects, pod_name: str, namespace: str) -> dict[str, str] | None:
    action = Action("get", "pods", "", pod_name, namespace)
    pod = objects.call(action, objects.core.read_namespaced_pod, pod_name, namespace)
    for ref in pod.metadata.owner_references or []:
        if ref.kind == WORKFLOW_KIND:
            return _reference(ref.api_version, ref.kind, ref.name, ref.uid)
    workflow = (pod.metadata.labels or {}).get(WORKFLOW_LABEL)
    if not workflow:
        return None
    found: dict[str, Any] = objects.get(WORKFLOW_API_VERSION, WORKFLOW_KIND, workflow, namespace)
    return _reference(WORKFLOW_API_VERSION, WORKFLOW_KIND, workflow, found["metadata"]["uid"])
