"""The permissions the steps need on a cluster, read from the roles we ship
(``kubetrain/render/manifests/rbac.yaml``, what ``kubetrain render rbac`` prints), so what
``kubetrain doctor`` checks cannot drift from what the RBAC grants; and the access reviews that
check them, for the caller (SelfSubjectAccessReview) or for a ServiceAccount
(SubjectAccessReview)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubetrain.render.manifests import role_manifests


@dataclass(frozen=True)
class Permission:
    group: str
    resource: str
    verbs: tuple[str, ...]
    #: Cluster-scoped resources are granted by the ClusterRole, the rest by the Role.
    cluster: bool = False
    #: Limited to these object names (RBAC resourceNames); empty = any.
    names: tuple[str, ...] = ()

    def label(self, verb: str) -> str:
        """``watch trainjobs.trainer.kubeflow.org``, ``get pods/log``: as kubectl names it."""
        group = f".{self.group}" if self.group else ""
        return f"{verb} {self.resource}{group}"


def required_permissions() -> tuple[Permission, ...]:
    """One Permission per (API group, resource) of each rule of the shipped Role and
    ClusterRole, in their order."""
    return tuple(
        Permission(group, resource, tuple(rule["verbs"]), role["kind"] == "ClusterRole",
                   tuple(rule.get("resourceNames", ())))
        for role in role_manifests()
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    )  # fmt: skip


def service_account_user(namespace: str, name: str) -> tuple[str, list[str]]:
    """The user name and groups the API server authenticates a ServiceAccount's token as
    (kubernetes ``staging/src/k8s.io/apiserver/pkg/authentication/serviceaccount/util.go``
    MakeUsername/MakeGroupNames, plus ``system:authenticated``, which every authenticated
    request gets), so a review for it counts bindings to its groups too."""
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}",
              "system:authenticated"]  # fmt: skip
    return f"system:serviceaccount:{namespace}:{name}", groups


def access_review(
    permission: Permission, verb: str, namespace: str, service_account: str | None
) -> dict[str, Any]:
    """The review asking whether ``verb`` on ``permission`` is allowed in ``namespace``: for the
    caller, or for ``service_account`` of ``namespace``."""
    resource, _, subresource = permission.resource.partition("/")
    attributes = {
        "group": permission.group,
        "resource": resource,
        "subresource": subresource or None,
        "verb": verb,
        "namespace": None if permission.cluster else namespace,
        "name": permission.names[0] if permission.names else None,
    }
    spec: dict[str, Any] = {"resourceAttributes": {k: v for k, v in attributes.items() if v}}
    kind = "SelfSubjectAccessReview"
    if service_account:
        kind = "SubjectAccessReview"
        spec["user"], spec["groups"] = service_account_user(namespace, service_account)
    return {"apiVersion": "authorization.k8s.io/v1", "kind": kind, "spec": spec}
