"""The permissions the steps need on a cluster: what `runtimes/rbac.yaml` grants (a test keeps
the two equal) and what `kubetrain doctor` checks with SelfSubjectAccessReviews."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Permission:
    group: str
    resource: str
    verbs: tuple[str, ...]
    #: Cluster-scoped resources are granted by the ClusterRole, the rest by the Role.
    cluster: bool = False
    #: Limited to these object names (RBAC resourceNames); empty = any.
    names: tuple[str, ...] = ()


REQUIRED = (
    Permission("trainer.kubeflow.org", "trainjobs",
               ("create", "get", "list", "watch", "patch", "delete")),
    Permission("trainer.kubeflow.org", "trainingruntimes", ("get", "list")),
    Permission("", "pods", ("get", "list", "watch")),
    Permission("", "pods/log", ("get",)),
    Permission("", "events", ("list",)),
    Permission("", "configmaps", ("create", "get", "delete")),
    Permission("batch", "jobs", ("create", "get", "list", "watch", "patch", "delete")),
    Permission("", "services", ("create", "get", "delete")),
    Permission("argoproj.io", "workflowtaskresults", ("create", "patch")),
    Permission("argoproj.io", "workflows", ("get",)),
    Permission("trainer.kubeflow.org", "clustertrainingruntimes", ("get", "list"), cluster=True),
    Permission("apiextensions.k8s.io", "customresourcedefinitions", ("get",), cluster=True,
               names=("trainjobs.trainer.kubeflow.org",)),
)  # fmt: skip
