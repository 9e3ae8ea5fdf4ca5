"""The cluster-side manifests kubetrain ships, as package data (so a wheel has them): our
Kubeflow Trainer ``ClusterTrainingRuntime``s and the least-privilege RBAC the steps run with.
``kubetrain render runtimes|rbac`` prints them for ``kubectl apply -f -``.

The runtimes are the checkout's top-level ``runtimes/`` folder (what ``kubectl apply -k
runtimes/`` applies), installed as the package ``kubetrain.runtimes`` (pyproject.toml's
package-dir), so git holds one copy of them.

The RBAC's two roles are YAML (``rbac.yaml``); the ServiceAccount and the bindings are built
here, for the namespace the steps run in and the accounts that run them: ours (``kubetrain``,
what the Argo workflow uses; not KFP runs: KFP's launcher reads its artifact Secret with the
run's account, which ``kubetrain`` may not) and the
ones KFP runs steps as when a run names none: ``pipeline-runner`` (kubeflow/pipelines 2.17.0
``backend/src/apiserver/common/const.go`` DefaultPipelineRunnerServiceAccount; standalone KFP
runs in namespace ``kubeflow``, ``manifests/kustomize/base/installs/generic/kustomization.yaml``)
and, in multi-user KFP, the profile's ``default-editor`` in the user's namespace
(``manifests/kustomize/base/installs/multi-user/api-service/params.env``
DEFAULTPIPELINERUNNERSERVICEACCOUNT, applied by ``backend/src/apiserver/template/template.go``
setDefaultServiceAccount). KFP's own ``pipeline-runner`` Role
(``manifests/kustomize/base/pipeline/pipeline-runner-role.yaml``) grants nothing in
``trainer.kubeflow.org``, so without these bindings a KFP launch step is forbidden.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

import yaml

from kubetrain import rules

#: The package our ClusterTrainingRuntimes are in (the checkout's ``runtimes/``).
RUNTIMES_PACKAGE = "kubetrain.runtimes"
#: Our ClusterTrainingRuntimes, in the order they are printed (each is ``<name>.yaml`` in
#: RUNTIMES_PACKAGE, listed in this order in its ``kustomization.yaml``).
RUNTIME_NAMES = (
    "torch-ddp-cpu",
    "torch-ddp-gpu",
    "torch-fsdp-gpu",
    "torch-ddp-gpu-gang",
    "kubetrain-deepspeed-mpi",
)
#: The ServiceAccount we create and the steps run as (Argo's ``service_account`` default).
STEPS_SERVICE_ACCOUNT = "kubetrain"
#: The accounts KFP runs a step as when the run names none: standalone, multi-user.
KFP_SERVICE_ACCOUNTS = ("pipeline-runner", "default-editor")
#: The label every object we ship carries (``kubectl get ... -l`` finds them).
PART_OF = {"app.kubernetes.io/part-of": "kubetrain"}
RBAC_API_VERSION = "rbac.authorization.k8s.io/v1"
#: The commands our error messages and doctor point at.
APPLY_RUNTIMES = "kubetrain render runtimes | kubectl apply -f -"


def apply_rbac_command(namespace: str, service_accounts: Sequence[str] = ()) -> str:
    """The command that grants the steps' rights in ``namespace``, to ``service_accounts``
    too when they are not among the accounts bound by default."""
    extra = [a for a in service_accounts if a not in (STEPS_SERVICE_ACCOUNT, *KFP_SERVICE_ACCOUNTS)]
    accounts = "".join(f" --service-account {account}" for account in extra)
    return f"kubetrain render rbac --namespace {namespace}{accounts} | kubectl apply -f -"


def _load(filename: str, package: str = __name__) -> list[dict[str, Any]]:
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    return [document for document in yaml.safe_load_all(text) if document]


def runtime_manifests() -> list[dict[str, Any]]:
    """Our ClusterTrainingRuntimes (cluster-scoped: the same for every namespace)."""
    return [
        runtime for name in RUNTIME_NAMES for runtime in _load(f"{name}.yaml", RUNTIMES_PACKAGE)
    ]


def role_manifests() -> tuple[dict[str, Any], dict[str, Any]]:
    """The Role (namespace unset) and the ClusterRole with every right the steps use."""
    by_kind = {document["kind"]: document for document in _load("rbac.yaml")}
    return by_kind["Role"], by_kind["ClusterRole"]


def rbac_manifests(
    namespace: str,
    service_accounts: Sequence[str] = (STEPS_SERVICE_ACCOUNT, *KFP_SERVICE_ACCOUNTS),
) -> list[dict[str, Any]]:
    """ServiceAccount ``kubetrain``, the Role and its RoleBinding in ``namespace``, the
    ClusterRole and a ClusterRoleBinding of its own for ``namespace`` (so rendering for a second
    namespace adds one instead of replacing the first's subjects), both binding
    ``service_accounts`` of ``namespace``. A bound account that does not exist is harmless: a
    binding names it, it grants nothing until it exists."""
    rules.namespace(namespace, "--namespace", "give the namespace the steps run in, e.g. kubeflow")
    for account in service_accounts:
        rules.dns1123_subdomain(
            account, "--service-account", "give a ServiceAccount's name, e.g. pipeline-runner"
        )
    accounts = list(dict.fromkeys([STEPS_SERVICE_ACCOUNT, *service_accounts]))
    subjects = [
        {"kind": "ServiceAccount", "name": account, "namespace": namespace} for account in accounts
    ]
    role, cluster_role = role_manifests()
    role["metadata"] = {"name": role["metadata"]["name"], "namespace": namespace,
                        **role["metadata"]}  # fmt: skip
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": STEPS_SERVICE_ACCOUNT,
            "namespace": namespace,
            "labels": dict(PART_OF),
        },
    }
    return [
        account,
        role,
        _binding("RoleBinding", role, role["metadata"]["name"], subjects, namespace),
        cluster_role,
        _binding(
            "ClusterRoleBinding",
            cluster_role,
            f"{cluster_role['metadata']['name']}-{namespace}",
            subjects,
        ),
    ]


def _binding(
    kind: str,
    role: dict[str, Any],
    name: str,
    subjects: list[dict[str, str]],
    namespace: str | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": dict(PART_OF)}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": kind,
        "metadata": metadata,
        "roleRef": {
            "apiGroup": RBAC_API_VERSION.split("/")[0],
            "kind": role["kind"],
            "name": role["metadata"]["name"],
        },
        "subjects": subjects,
    }
