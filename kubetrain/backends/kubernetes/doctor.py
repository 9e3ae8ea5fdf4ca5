"""`kubetrain doctor`: is this cluster ready for the steps? Each check says what is missing
and how to fix it, before a pipeline finds out the hard way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kubetrain.backends.kubernetes.permissions import REQUIRED
from kubetrain.errors import KubetrainError


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def check_api(api_client) -> Check:
    from kubernetes.client import VersionApi

    from kubetrain.backends.kubernetes.client import Action, call_with_retries

    try:
        version = call_with_retries(Action("get", "version"), VersionApi(api_client).get_code)
    except KubetrainError as exc:
        return Check("api", False, str(exc), "check KUBECONFIG / the cluster address")
    host = api_client.configuration.host
    return Check("api", True, f"Kubernetes {version.git_version} at {host}")


def check_trainer(objects, namespace: str) -> tuple[Check, str]:
    from kubetrain.backends.kubernetes.launch import TrainerNotInstalled, trainer_version

    warnings: list[str] = []
    try:
        version = trainer_version(objects, "auto", namespace, warnings.append)
    except TrainerNotInstalled as exc:
        return Check("trainer", False, str(exc), "or use --backend job"), ""
    except KubetrainError as exc:
        return Check("trainer", False, str(exc)), ""
    form = "runtimePatches" if version != "2.1" else "podTemplateOverrides"
    detail = f"Kubeflow Trainer installed; TrainJobs rendered for v{version} ({form})"
    return Check("trainer", True, "; ".join([detail, *warnings])), version


def check_runtime(objects, namespace: str, runtime: str, runtime_kind: str) -> Check:
    from kubetrain.backends.kubernetes.launch import check_runtime as runtime_exists
    from kubetrain.jobspec import RuntimeRef, TrainJobSpec

    spec = TrainJobSpec(name="doctor", command=("true",),
                        runtime=RuntimeRef(name=runtime, kind=runtime_kind))  # fmt: skip
    notes: list[str] = []  # e.g. that the runtime restarts failed jobs
    try:
        runtime_exists(objects, spec, namespace, notes.append)
    except KubetrainError as exc:
        return Check("runtime", False, str(exc))
    return Check("runtime", True, "; ".join([f"{runtime_kind} {runtime} exists", *notes]))


def check_permissions(api_client, namespace: str) -> Check:
    """One SelfSubjectAccessReview per verb the steps use."""
    from kubernetes.client import AuthorizationV1Api

    from kubetrain.backends.kubernetes.client import Action, call_with_retries

    api = AuthorizationV1Api(api_client)
    missing = []
    for permission in REQUIRED:
        resource, _, subresource = permission.resource.partition("/")
        for verb in permission.verbs:
            attributes = {
                "group": permission.group,
                "resource": resource,
                "subresource": subresource or None,
                "verb": verb,
                "namespace": None if permission.cluster else namespace,
                "name": permission.names[0] if permission.names else None,
            }
            review = {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": {k: v for k, v in attributes.items() if v}},
            }
            action = Action("create", "selfsubjectaccessreviews", "authorization.k8s.io")
            answer = call_with_retries(action, api.create_self_subject_access_review, review)
            if not answer.status.allowed:
                group = f".{permission.group}" if permission.group else ""
                missing.append(f"{verb} {permission.resource}{group}")
    if missing:
        return Check(
            "rbac",
            False,
            f"missing in namespace {namespace}: {', '.join(missing)}",
            "kubectl apply -k runtimes/ and run the steps as ServiceAccount kubetrain",
        )
    verbs = sum(len(p.verbs) for p in REQUIRED)
    return Check("rbac", True, f"all {verbs} permissions the steps use are granted")


def diagnose(
    api_client, namespace: str, runtime: str, runtime_kind: str, report: Callable[[Check], None]
) -> bool:
    """Run the checks in order (later ones need the earlier), reporting each; True if all pass."""
    from kubetrain.backends.kubernetes.client import RetryPolicy
    from kubetrain.backends.kubernetes.objects import KubeObjects

    api = check_api(api_client)
    report(api)
    if not api.ok:
        return False
    objects = KubeObjects(api_client, RetryPolicy())
    trainer, _version = check_trainer(objects, namespace)
    report(trainer)
    checks = [api, trainer]
    if trainer.ok:
        checks.append(check_runtime(objects, namespace, runtime, runtime_kind))
        report(checks[-1])
    checks.append(check_permissions(api_client, namespace))
    report(checks[-1])
    return all(check.ok for check in checks)
