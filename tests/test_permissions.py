"""What `kubetrain doctor` checks is what the shipped RBAC grants (both are read from
kubetrain/render/manifests/rbac.yaml), and the reviews it sends ask the right question."""

from __future__ import annotations

from kubetrain.backends.kubernetes.permissions import (
    Permission,
    access_review,
    required_permissions,
)
from kubetrain.render.manifests import rbac_manifests


def granted(namespace: str = "default") -> set[tuple[str, str, str, bool, tuple[str, ...]]]:
    rules = set()
    for document in rbac_manifests(namespace):
        if document["kind"] not in ("Role", "ClusterRole"):
            continue
        cluster = document["kind"] == "ClusterRole"
        for rule in document["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        names = tuple(rule.get("resourceNames", ()))
                        rules.add((group, resource, verb, cluster, names))
    return rules


def test_doctor_checks_exactly_what_rbac_grants():
    needed = {
        (p.group, p.resource, verb, p.cluster, p.names)
        for p in required_permissions()
        for verb in p.verbs
    }
    assert needed == granted()
    assert ("", "pods", "get", False, ()) in needed  # the KFP owner lookup reads its own pod
    assert ("argoproj.io", "workflows", "get", False, ()) in needed  # ... Argo its Workflow
    assert ("batch", "jobs", "patch", False, ()) in needed  # the job backend's suspend


def test_a_review_for_yourself_and_one_for_a_service_account():
    """A SubjectAccessReview names the account as the API server authenticates its token:
    user system:serviceaccount:NS:NAME in groups system:serviceaccounts and
    system:serviceaccounts:NS (kubernetes staging/src/k8s.io/apiserver/pkg/authentication/
    serviceaccount/util.go MakeGroupNames), so a binding to the
    namespace's accounts as a group counts too."""
    logs = Permission("", "pods/log", ("get",))
    mine = access_review(logs, "get", "team-a", None)
    assert mine == {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"resource": "pods", "subresource": "log", "verb": "get",
                                        "namespace": "team-a"}},
    }  # fmt: skip
    crd = Permission("apiextensions.k8s.io", "customresourcedefinitions", ("get",), True,
                     ("trainjobs.trainer.kubeflow.org",))  # fmt: skip
    theirs = access_review(crd, "get", "team-a", "pipeline-runner")
    assert theirs["kind"] == "SubjectAccessReview"
    assert theirs["spec"]["user"] == "system:serviceaccount:team-a:pipeline-runner"
    assert theirs["spec"]["groups"] == [
        "system:serviceaccounts",
        "system:serviceaccounts:team-a",
        "system:authenticated",
    ]
    # Cluster-scoped: no namespace; limited to one CRD by name.
    assert theirs["spec"]["resourceAttributes"] == {
        "group": "apiextensions.k8s.io",
        "resource": "customresourcedefinitions",
        "verb": "get",
        "name": "trainjobs.trainer.kubeflow.org",
    }
