"""`kubetrain doctor`: is this cluster ready for the steps? Each check says what is missing
and how to fix it, before a pipeline finds out the hard way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kubetrain.backends.kubernetes.permissions import access_review, required_permissions
from kubetrain.errors import KubetrainError, terminal_text
from kubetrain.render.manifests import APPLY_RUNTIMES, RUNTIME_NAMES, apply_rbac_command


@dataclass(frozen=True)
class Check:
    """One check's verdict, as printed. ``detail`` quotes what the cluster said (a server's
    message, an object's name), so it and ``fix`` are escaped for the terminal when the check
    is made (``terminal_text``): whoever prints a Check prints safe text."""

    name: str
    ok: bool
    detail: str
    fix: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "detail", terminal_text(self.detail))
        object.__setattr__(self, "fix", terminal_text(self.fix))


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
        return Check("trainer", False, str(exc), "or use --backend job (or pytorchjob)"), ""
    except KubetrainError as exc:
        return Check("trainer", False, str(exc)), ""
    form = "runtimePatches" if version != "2.1" else "podTemplateOverrides"
    detail = f"Kubeflow Trainer installed; TrainJobs rendered for v{version} ({form})"
    return Check("trainer", True, "; ".join([detail, *warnings])), version


#: What tells Training Operator 1.9's PyTorchJob CRD from 1.7/1.8's: ``runPolicy.managedBy``
#: (kubeflow/training-operator ``manifests/base/crds/kubeflow.org_pytorchjobs.yaml``: in v1.9.0,
#: not in v1.7.0, v1.8.0, v1.8.1).
OPERATOR_19_FIELD = '"managedBy"'
#: The label of the operator's Deployment (v1.9.0 ``manifests/base/deployment.yaml``).
OPERATOR_SELECTOR = "control-plane=kubeflow-training-operator"


def check_training_operator(api_client, objects, namespace: str) -> Check:
    """The Training Operator's PyTorchJob CRD (kubeflow.org/v1), which release its schema is
    of, and its Deployment's image when it can be read (best effort: it needs a right the
    steps do not have); without the right to read the CRD, that the API is served."""
    import json

    from kubetrain.backends.kubernetes.kinds import PYTORCHJOB_CRD
    from kubetrain.backends.kubernetes.launch import (
        TrainingOperatorNotInstalled,
        require_pytorchjob_api,
    )

    version = _served_v1_of_crd(
        api_client, objects, namespace, "operator", PYTORCHJOB_CRD, "kubeflow.org/v1",
        TrainingOperatorNotInstalled(), require_pytorchjob_api,
        "Kubeflow Training Operator installed (PyTorchJobs are served; its CRD cannot be read, "
        "so its version is unknown)",
    )  # fmt: skip
    if isinstance(version, Check):
        return version
    schema = json.dumps(version.get("schema") or {})
    release = "1.9 or newer" if OPERATOR_19_FIELD in schema else "1.8 or older"
    image = _operator_image(api_client)
    found = f"; its Deployment runs {image}" if image else ""
    return Check(
        "operator",
        True,
        f"Kubeflow Training Operator installed: PyTorchJob CRD of release {release}{found}",
    )


def _served_v1_of_crd(
    api_client,
    objects,
    namespace: str,
    check: str,
    crd_name: str,
    group_version: str,
    missing: Exception,
    require_api,
    served_unread: str,
) -> dict | Check:
    """The ``v1`` version of an operator's CRD ``crd_name``, or the Check to report instead:
    the operator missing, or (without the right to read CRDs) whether its API is served."""
    from kubernetes.client import ApiextensionsV1Api

    from kubetrain.backends.kubernetes.client import (
        Action,
        NotFound,
        PermissionDenied,
        answered_object,
        api_server,
    )

    action = Action("get", "customresourcedefinitions", "apiextensions.k8s.io", crd_name)
    api = ApiextensionsV1Api(api_client)
    try:
        response = objects.call(
            action, api.read_custom_resource_definition, crd_name, _preload_content=False
        )
        crd = answered_object(
            response.data, action, api_server(api.read_custom_resource_definition)
        )
    except NotFound:
        return Check(check, False, str(missing))
    except PermissionDenied:
        try:
            require_api(objects, namespace)
        except KubetrainError as exc:
            return Check(check, False, str(exc))
        return Check(check, True, served_unread)
    versions = [v for v in crd.get("spec", {}).get("versions") or [] if v.get("name") == "v1"]
    if not versions or not versions[0].get("served", True):
        return Check(check, False, f"the {crd_name} CRD does not serve {group_version}")
    return versions[0]


def _operator_image(api_client, *selectors: str) -> str:
    """The image of the operator's Deployment (labelled by one of ``selectors``), in any
    namespace; empty when it cannot be read (no right to list Deployments cluster-wide, or
    installed otherwise)."""
    from kubernetes.client import AppsV1Api
    from kubernetes.client.rest import ApiException

    from kubetrain.backends.http_clients import ServerSilent

    images: list[str] = []
    for selector in selectors or (OPERATOR_SELECTOR,):
        try:
            listing = AppsV1Api(api_client).list_deployment_for_all_namespaces(
                label_selector=selector, _request_timeout=10
            )
        except (ApiException, OSError, ServerSilent):
            return ""
        images += [
            container.image
            for deployment in listing.items
            for container in (deployment.spec.template.spec.containers or [])
            if container.image not in images
        ]
    return ", ".join(images)


#: The labels of KubeRay's operator Deployment as its Helm chart (ray-project/kuberay v1.7.0
#: ``helm-chart/kuberay-operator/templates/_helpers.tpl`` ``kuberay-operator.labels``) and its
#: kustomize manifests (``ray-operator/config/manager/manager.yaml``) install it.
KUBERAY_SELECTORS = (
    "app.kubernetes.io/name=kuberay-operator",
    "app.kubernetes.io/component=kuberay-operator",
)


def check_kuberay(api_client, objects, namespace: str) -> Check:
    """KubeRay's RayJob CRD serving ray.io/v1 (the API the rayjob backend renders), and its
    operator's image when the Deployment can be read (best effort, as for the Training
    Operator); without the right to read the CRD, that the API is served."""
    from kubetrain.backends.kubernetes.kinds import RAYJOB_CRD
    from kubetrain.backends.kubernetes.launch import KubeRayNotInstalled, require_rayjob_api

    version = _served_v1_of_crd(
        api_client, objects, namespace, "kuberay", RAYJOB_CRD, "ray.io/v1",
        KubeRayNotInstalled(), require_rayjob_api,
        "KubeRay installed (RayJobs are served; its CRD cannot be read, so its version is "
        "unknown)",
    )  # fmt: skip
    if isinstance(version, Check):
        return version
    image = _operator_image(api_client, *KUBERAY_SELECTORS)
    found = f"; its operator Deployment runs {image}" if image else ""
    return Check("kuberay", True, f"KubeRay installed: RayJob CRD serves ray.io/v1{found}")


def check_runtime(objects, namespace: str, runtime: str, runtime_kind: str) -> Check:
    from kubetrain.backends.kubernetes.launch import check_runtime as runtime_exists
    from kubetrain.jobspec import RuntimeRef, TrainJobSpec

    spec = TrainJobSpec(name="doctor", command=("true",),
                        runtime=RuntimeRef(name=runtime, kind=runtime_kind))  # fmt: skip
    notes: list[str] = []  # e.g. that the runtime restarts failed jobs
    try:
        runtime_exists(objects, spec, namespace, notes.append)
    except KubetrainError as exc:
        return Check("runtime", False, str(exc), APPLY_RUNTIMES if runtime in RUNTIME_NAMES else "")
    return Check("runtime", True, "; ".join([f"{runtime_kind} {runtime} exists", *notes]))


def check_permissions(api_client, namespace: str, service_account: str | None = None) -> Check:
    """One access review per verb the steps use: for the caller (SelfSubjectAccessReview), or
    for ``service_account`` of ``namespace`` (SubjectAccessReview, which the caller must be
    allowed to create: a cluster admin usually is)."""
    from kubernetes.client import AuthorizationV1Api

    from kubetrain.backends.kubernetes.client import Action, PermissionDenied, call_with_retries

    api = AuthorizationV1Api(api_client)
    who = f"ServiceAccount {namespace}/{service_account}" if service_account else "you"
    if service_account:
        action = Action("create", "subjectaccessreviews", "authorization.k8s.io")
        create = api.create_subject_access_review
    else:
        action = Action("create", "selfsubjectaccessreviews", "authorization.k8s.io")
        create = api.create_self_subject_access_review
    permissions = required_permissions()
    missing = []
    for permission in permissions:
        for verb in permission.verbs:
            review = access_review(permission, verb, namespace, service_account)
            try:
                answer = call_with_retries(action, create, review)
            except PermissionDenied as exc:
                return Check(
                    "rbac",
                    False,
                    f"cannot check the rights of {who}: you may not create "
                    f"subjectaccessreviews.authorization.k8s.io ({exc.server_message})",
                    "run doctor as someone who may create SubjectAccessReviews (a cluster "
                    "admin), or as that account without --service-account",
                )
            if not answer.status.allowed:
                missing.append(permission.label(verb))
    if missing:
        return Check(
            "rbac",
            False,
            f"missing for {who} in namespace {namespace}: {', '.join(missing)}",
            apply_rbac_command(namespace, [service_account] if service_account else []),
        )
    verbs = sum(len(p.verbs) for p in permissions)
    return Check("rbac", True, f"{who}: all {verbs} permissions the steps use are granted")


def diagnose(
    api_client,
    namespace: str,
    runtime: str,
    runtime_kind: str,
    report: Callable[[Check], None],
    service_account: str | None = None,
    backend: str = "trainer",
) -> bool:
    """Run the checks in order (later ones need the earlier), reporting each; True if all pass.
    ``backend`` says what must be installed: the Trainer and the runtime (trainer), the
    Training Operator (pytorchjob), KubeRay (rayjob), or nothing (job)."""
    from kubetrain.backends.kubernetes.client import RetryPolicy
    from kubetrain.backends.kubernetes.objects import KubeObjects

    api = check_api(api_client)
    report(api)
    if not api.ok:
        return False
    objects = KubeObjects(api_client, RetryPolicy())
    checks = [api]
    if backend == "pytorchjob":
        checks.append(check_training_operator(api_client, objects, namespace))
        report(checks[-1])
    elif backend == "rayjob":
        checks.append(check_kuberay(api_client, objects, namespace))
        report(checks[-1])
    elif backend == "trainer":
        trainer, _version = check_trainer(objects, namespace)
        report(trainer)
        checks.append(trainer)
        if trainer.ok:
            checks.append(check_runtime(objects, namespace, runtime, runtime_kind))
            report(checks[-1])
    checks.append(check_permissions(api_client, namespace, service_account))
    report(checks[-1])
    return all(check.ok for check in checks)
