"""Which object owns the jobs we launch: the Argo Workflow of the pipeline run whose step pod
we run in (a KFP run is an Argo Workflow too), so deleting the run deletes its TrainJob
(garbage collection) and nothing is left training for a run that no longer exists.

Found from what the step's container really has, in order:

* ``KUBETRAIN_OWNER_NAME`` + ``KUBETRAIN_OWNER_UID`` (and optionally
  ``KUBETRAIN_OWNER_KIND``/``KUBETRAIN_OWNER_API_VERSION``, default an Argo Workflow): an
  explicit owner. Our Argo launch template sets them from ``{{workflow.name}}`` and
  ``{{workflow.uid}}`` (argo-workflows ``docs/variables.md``).
* ``KFP_POD_NAME``: KFP gives its step containers ``KFP_POD_NAME``/``KFP_POD_UID`` by the
  downward API and no namespace (kubeflow/pipelines 2.14.0-2.17.0
  ``backend/src/v2/compiler/argocompiler/common.go`` ``commonEnvs``); the pod is read in our
  own namespace and its ``Workflow`` ownerReference (else its ``workflows.argoproj.io/workflow``
  label) is the owner.
* ``ARGO_WORKFLOW_NAME`` (Argo 4.x gives the main container that and ``ARGO_NODE_ID``; the uid,
  ``ARGO_WORKFLOW_UID``, only the executor's init and wait containers: argo-workflows v4.1.2
  ``workflow/controller/workflowpod.go``, ``createEnvVars`` is for ``newExecContainer``), else
  ``ARGO_NODE_ID`` (Argo 3.6 gives main no workflow name: v3.6.9 ``workflowpod.go``), which is
  ``<workflow>-<hash>`` (``pkg/apis/workflow/v1alpha1/workflow_types.go`` ``NodeID``): the
  Workflow is read by name for its uid.

Outside a pipeline step there is no owner. An owner must share the job's namespace.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from kubetrain.backends.kubernetes.client import Action, ApiError
from kubetrain.backends.kubernetes.objects import KubeObjects

WORKFLOW_API_VERSION = "argoproj.io/v1alpha1"
WORKFLOW_KIND = "Workflow"
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"
#: An Argo node ID: the workflow's name, "-", a 32-bit FNV hash of the node's name.
ARGO_NODE_ID = re.compile(r"(?P<workflow>.+)-[0-9]+")


def _reference(api_version: str, kind: str, name: str, uid: str) -> dict[str, str]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid}


def find_owner(
    objects: KubeObjects,
    namespace: str,
    warn: Callable[[str], None],
    env: Mapping[str, str] = os.environ,
    pod_namespace: str = "",
) -> dict[str, str] | None:
    """The ownerReference (apiVersion, kind, name, uid) for our jobs in ``namespace``, or None.
    ``pod_namespace`` is the namespace our pod runs in (its ServiceAccount's; empty: the
    job's)."""
    if env.get("KUBETRAIN_OWNER_NAME") and env.get("KUBETRAIN_OWNER_UID"):
        return _reference(
            env.get("KUBETRAIN_OWNER_API_VERSION", WORKFLOW_API_VERSION),
            env.get("KUBETRAIN_OWNER_KIND", WORKFLOW_KIND),
            env["KUBETRAIN_OWNER_NAME"],
            env["KUBETRAIN_OWNER_UID"],
        )
    pod = env.get("KFP_POD_NAME", "")
    workflow = env.get("ARGO_WORKFLOW_NAME", "")
    if not workflow and (node := ARGO_NODE_ID.fullmatch(env.get("ARGO_NODE_ID", ""))):
        workflow = node["workflow"]
    if not pod and not workflow:
        return None
    if pod_namespace and pod_namespace != namespace:
        warn(
            f"kubetrain: this step runs in namespace {pod_namespace}, the job goes to "
            f"{namespace}: an owner must share the job's namespace, so the job will outlive the "
            "pipeline run; delete it with `kubetrain delete`"
        )
        return None
    try:
        if pod:
            return _owner_of_pod(objects, pod, namespace)
        return _workflow(objects, workflow, namespace)
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
    return _workflow(objects, workflow, namespace) if workflow else None


def _workflow(objects: KubeObjects, name: str, namespace: str) -> dict[str, str]:
    found: dict[str, Any] = objects.get(WORKFLOW_API_VERSION, WORKFLOW_KIND, name, namespace)
    return _reference(WORKFLOW_API_VERSION, WORKFLOW_KIND, name, found["metadata"]["uid"])
