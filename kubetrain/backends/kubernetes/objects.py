"""Create, read, patch and delete the objects a job is made of (TrainJob, PyTorchJob, RayJob
or Job, Service, ConfigMap) as plain dicts, whichever API serves them, each call retried and
its errors translated (``client``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kubernetes.client

from kubetrain.backends.kubernetes.client import Action, RetryPolicy, call_with_retries

#: Kinds served by the core API (typed CoreV1Api methods), by their method-name suffix.
CORE_KINDS = {"ConfigMap": ("config_map", "configmaps"), "Service": ("service", "services")}
#: What a create asks of the API server about unknown or duplicate fields (kubectl's default).
FIELD_VALIDATION = "Strict"
#: Kinds read through CustomObjectsApi (any API group), by plural.
CUSTOM_PLURALS = {
    "TrainJob": "trainjobs",
    "PyTorchJob": "pytorchjobs",
    "RayJob": "rayjobs",
    "Job": "jobs",
    "Workflow": "workflows",
}


def split_api_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


class KubeObjects:
    def __init__(self, api_client: kubernetes.client.ApiClient, retry: RetryPolicy) -> None:
        self.api_client = api_client
        self.retry = retry
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.custom = kubernetes.client.CustomObjectsApi(api_client)

    def call(self, action: Action, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return call_with_retries(action, fn, *args, retry=self.retry, **kwargs)

    def _action(self, verb: str, api_version: str, kind: str, name: str, namespace: str) -> Action:
        if kind in CORE_KINDS:
            return Action(verb, CORE_KINDS[kind][1], "", name, namespace)
        group, _ = split_api_version(api_version)
        return Action(verb, CUSTOM_PLURALS[kind], group, name, namespace)

    def as_dict(self, obj: Any) -> dict[str, Any]:
        return obj if isinstance(obj, dict) else self.api_client.sanitize_for_serialization(obj)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create ``obj`` with strict field validation, as kubectl does by default: a field the
        schema does not have is refused, not silently pruned (a CRD's structural schema
        would otherwise drop it and the job run without it)."""
        kind, namespace = obj["kind"], obj["metadata"]["namespace"]
        action = self._action("create", obj["apiVersion"], kind, obj["metadata"]["name"], namespace)
        if kind in CORE_KINDS:
            method = getattr(self.core, f"create_namespaced_{CORE_KINDS[kind][0]}")
            return self.as_dict(
                self.call(action, method, namespace, obj, field_validation=FIELD_VALIDATION)
            )
        group, version = split_api_version(obj["apiVersion"])
        return self.call(
            action,
            self.custom.create_namespaced_custom_object,
            group,
            version,
            namespace,
            CUSTOM_PLURALS[kind],
            obj,
            field_validation=FIELD_VALIDATION,
        )

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any]:
        action = self._action("get", api_version, kind, name, namespace)
        if kind in CORE_KINDS:
            method = getattr(self.core, f"read_namespaced_{CORE_KINDS[kind][0]}")
            return self.as_dict(self.call(action, method, name, namespace))
        group, version = split_api_version(api_version)
        return self.call(
            action,
            self.custom.get_namespaced_custom_object,
            group,
            version,
            namespace,
            CUSTOM_PLURALS[kind],
            name,
        )

    def patch(
        self, api_version: str, kind: str, name: str, namespace: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """A JSON merge patch of a custom (or batch) object."""
        action = self._action("patch", api_version, kind, name, namespace)
        group, version = split_api_version(api_version)
        return self.call(
            action,
            self.custom.patch_namespaced_custom_object,
            group,
            version,
            namespace,
            CUSTOM_PLURALS[kind],
            name,
            body,
        )

    def delete(
        self, api_version: str, kind: str, name: str, namespace: str, propagation: str
    ) -> None:
        """Delete with ``propagation`` (Background, Foreground, Orphan) as the query parameter
        DeleteOptions may be given as."""
        action = self._action("delete", api_version, kind, name, namespace)
        if kind in CORE_KINDS:
            method = getattr(self.core, f"delete_namespaced_{CORE_KINDS[kind][0]}")
            self.call(action, method, name, namespace, propagation_policy=propagation)
            return
        group, version = split_api_version(api_version)
        self.call(
            action,
            self.custom.delete_namespaced_custom_object,
            group,
            version,
            namespace,
            CUSTOM_PLURALS[kind],
            name,
            propagation_policy=propagation,
        )
