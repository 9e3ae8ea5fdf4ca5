"""Launching on a cluster: everything is checked before anything is created (the Trainer is
installed and which version, the runtime exists; or the Training Operator serves PyTorchJobs,
or KubeRay RayJobs),
then the objects are created in order; a job
that a retried step already created is adopted when its spec is the same, and refused, with
what differs, when it is not."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubernetes.client import ApiextensionsV1Api

from kubetrain import bounded_json, rules
from kubetrain.backends.kubernetes.client import (
    Action,
    AlreadyExists,
    NotFound,
    PermissionDenied,
    answered_object,
    api_server,
)
from kubetrain.backends.kubernetes.kinds import (
    PYTORCHJOB,
    PYTORCHJOB_CRD,
    RAYJOB,
    RAYJOB_CRD,
    TRAINER_API_VERSION,
    TRAINER_GROUP,
    TRAINJOB_CRD,
)
from kubetrain.backends.kubernetes.objects import KubeObjects
from kubetrain.errors import InvalidInput, KubetrainError
from kubetrain.jobspec import (
    DATASET_INITIALIZER_JOB,
    MODEL_INITIALIZER_JOB,
    MPI_RUNTIME,
    NODE_JOB,
    TrainJobSpec,
)
from kubetrain.render.metadata import (
    JOB_NAME_LABEL,
    SCRIPT_SHA256_ANNOTATION,
    SPEC_ANNOTATION,
    SPEC_SHA256_ANNOTATION,
)
from kubetrain.render.trainjob import LATEST_VERSION

#: How our runtimes are installed (`kubetrain render runtimes` prints them from the package).
RUNTIMES_INSTALL = "kubetrain render runtimes | kubectl apply -f -"
TRAINER_INSTALL = (
    "install it (https://www.kubeflow.org/docs/components/trainer/operator-guides/installation/, "
    f"then `{RUNTIMES_INSTALL}`) or launch with --backend job (an Indexed Job + headless "
    "Service, no Trainer needed)"
)
#: The label that tells a runtime's replicated jobs apart (trainer v2.3.0
#: ``pkg/constants/constants.go`` LabelTrainJobAncestor, AncestorTrainer).
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_TRAINER = "trainer"
MAX_DIFFERENCES = 5


class TrainerNotInstalled(KubetrainError):
    """The cluster does not serve Kubeflow Trainer's TrainJob API."""

    def __init__(self, detail: str = "") -> None:
        reason = f" ({detail})" if detail else ""
        super().__init__(
            f"Kubeflow Trainer is not installed on this cluster: it has no {TRAINJOB_CRD} "
            f"CRD{reason}; {TRAINER_INSTALL}"
        )


#: Where the Training Operator comes from, for the message saying it is missing (as its
#: v1.9.0 README.md installs it, at that release's tag).
TRAINING_OPERATOR_INSTALL = (
    "install Kubeflow Training Operator 1.9 (`kubectl apply --server-side -k "
    '"github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.0"`) or '
    "launch with --backend trainer (Kubeflow Trainer v2) or --backend job (no operator needed)"
)


class TrainingOperatorNotInstalled(KubetrainError):
    """The cluster does not serve the Training Operator's PyTorchJob API (kubeflow.org/v1)."""

    def __init__(self) -> None:
        super().__init__(
            f"Kubeflow Training Operator is not installed on this cluster: it has no "
            f"{PYTORCHJOB_CRD} CRD; {TRAINING_OPERATOR_INSTALL}"
        )


def require_pytorchjob_api(objects: KubeObjects, namespace: str) -> None:
    """The PyTorchJob API must be served: one list of at most one PyTorchJob (a right the
    steps have; reading the CRD needs a ClusterRole)."""
    _require_api(objects, namespace, PYTORCHJOB, TrainingOperatorNotInstalled)


#: Where KubeRay comes from, for the message saying it is missing (its v1.7.0 Helm chart, as
#: the KubeRay docs install the operator).
KUBERAY_INSTALL = (
    "install the KubeRay operator 1.7 (`helm repo add kuberay https://ray-project.github.io/"
    "kuberay-helm/ && helm install kuberay-operator kuberay/kuberay-operator --version 1.7.0`) "
    "or launch with --backend trainer, pytorchjob or job (and --launcher torchrun)"
)


class KubeRayNotInstalled(KubetrainError):
    """The cluster does not serve KubeRay's RayJob API (ray.io/v1)."""

    def __init__(self) -> None:
        super().__init__(
            f"KubeRay is not installed on this cluster: it has no {RAYJOB_CRD} CRD serving "
            f"ray.io/v1; {KUBERAY_INSTALL}"
        )


def require_rayjob_api(objects: KubeObjects, namespace: str) -> None:
    """The RayJob API (ray.io/v1) must be served: one list of at most one RayJob."""
    _require_api(objects, namespace, RAYJOB, KubeRayNotInstalled)


def _require_api(
    objects: KubeObjects, namespace: str, kind: Any, missing_error: Callable[[], KubetrainError]
) -> None:
    action = Action("list", kind.plural, kind.group, namespace=namespace)
    try:
        objects.call(
            action,
            objects.custom.list_namespaced_custom_object,
            kind.group,
            kind.version,
            namespace,
            kind.plural,
            limit=1,
        )
    except NotFound as missing:
        if missing.resource_missing:
            raise missing_error() from None
        raise


def version_from_crd(crd: dict[str, Any], warn: Callable[[str], None]) -> str:
    """The TrainJob form a CRD accepts: ``runtimePatches`` (v2.2+) or ``podTemplateOverrides``;
    v2.3's runtimePatches can also patch ``terminationGracePeriodSeconds``, v2.2's cannot
    (kubeflow/trainer ``manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml`` at v2.2.0
    and v2.3.0), which tells the versions that merge resources from those that replace them."""
    versions = [
        v
        for v in (crd.get("spec") or {}).get("versions") or []
        if v.get("name") == TRAINER_API_VERSION and v.get("served", True)
    ]
    if not versions:
        raise TrainerNotInstalled(f"its CRD does not serve {TRAINER_GROUP}/{TRAINER_API_VERSION}")
    schema = json.dumps(versions[0].get("schema") or {})
    if '"runtimePatches"' in schema:
        return LATEST_VERSION if '"terminationGracePeriodSeconds"' in schema else "2.2"
    if '"podTemplateOverrides"' in schema:
        return "2.1"
    warn(
        "kubetrain: the TrainJob CRD has neither runtimePatches nor podTemplateOverrides; "
        f"rendering the {LATEST_VERSION} form (pass --trainer-version to choose)"
    )
    return LATEST_VERSION


def trainer_version(
    objects: KubeObjects, requested: str, namespace: str, warn: Callable[[str], None]
) -> str:
    """Check that the Trainer is installed and resolve ``requested`` ("auto" reads the CRD)."""
    action = Action("get", "customresourcedefinitions", "apiextensions.k8s.io", TRAINJOB_CRD)
    api = ApiextensionsV1Api(objects.api_client)
    try:
        response = objects.call(
            action, api.read_custom_resource_definition, TRAINJOB_CRD, _preload_content=False
        )
        server = api_server(api.read_custom_resource_definition)
        crd = answered_object(response.data, action, server)
    except NotFound:
        raise TrainerNotInstalled() from None
    except PermissionDenied as denied:
        # Reading CRDs needs a ClusterRole; the TrainJob API itself says whether it is served.
        _probe_trainjobs(objects, namespace)
        if requested == "auto":
            warn(
                f"kubetrain: cannot read the TrainJob CRD ({denied.action}), so the Trainer "
                f"version is unknown; rendering the {LATEST_VERSION} form (pass "
                "--trainer-version, or grant it: `kubetrain render rbac --namespace NS | "
                "kubectl apply -f -`)"
            )
            return LATEST_VERSION
        return requested
    return version_from_crd(crd, warn) if requested == "auto" else requested


def _probe_trainjobs(objects: KubeObjects, namespace: str) -> None:
    action = Action("list", "trainjobs", TRAINER_GROUP, namespace=namespace)
    try:
        objects.call(
            action,
            objects.custom.list_namespaced_custom_object,
            TRAINER_GROUP,
            TRAINER_API_VERSION,
            namespace,
            "trainjobs",
            limit=1,
        )
    except NotFound as missing:
        if missing.resource_missing:
            raise TrainerNotInstalled() from None
        raise


def _runtime_names(objects: KubeObjects, namespace: str) -> list[str]:
    """The runtimes that exist, as "kind/name"; those we may not list are left out."""
    names: list[str] = []
    listings = (
        ("ClusterTrainingRuntime", "clustertrainingruntimes", None),
        ("TrainingRuntime", "trainingruntimes", namespace),
    )
    for kind, plural, ns in listings:
        action = Action("list", plural, TRAINER_GROUP, namespace=ns or "")
        try:
            if ns is None:
                listing = objects.call(
                    action,
                    objects.custom.list_cluster_custom_object,
                    TRAINER_GROUP,
                    TRAINER_API_VERSION,
                    plural,
                )
            else:
                listing = objects.call(
                    action,
                    objects.custom.list_namespaced_custom_object,
                    TRAINER_GROUP,
                    TRAINER_API_VERSION,
                    ns,
                    plural,
                )
        except (NotFound, PermissionDenied):
            continue
        names += [f"{kind} {item['metadata']['name']}" for item in listing.get("items") or []]
    return sorted(names)


def read_runtime(objects: KubeObjects, kind: str, name: str, namespace: str) -> dict[str, Any]:
    """The ClusterTrainingRuntime or (in ``namespace``) TrainingRuntime ``name``; raises
    NotFound as the API answers."""
    cluster_scoped = kind == "ClusterTrainingRuntime"
    plural = "clustertrainingruntimes" if cluster_scoped else "trainingruntimes"
    action = Action("get", plural, TRAINER_GROUP, name, "" if cluster_scoped else namespace)
    if cluster_scoped:
        return objects.call(
            action,
            objects.custom.get_cluster_custom_object,
            TRAINER_GROUP,
            TRAINER_API_VERSION,
            plural,
            name,
        )
    return objects.call(
        action,
        objects.custom.get_namespaced_custom_object,
        TRAINER_GROUP,
        TRAINER_API_VERSION,
        namespace,
        plural,
        name,
    )


def check_runtime(
    objects: KubeObjects, spec: TrainJobSpec, namespace: str, warn: Callable[[str], None]
) -> dict[str, Any]:
    """The runtime the TrainJob refers to (returned) must exist (else say which ones do), have
    the initializers the spec asks for, give pods names that fit, and allow the restarts the
    spec asks for."""
    runtime = spec.runtime
    try:
        found = read_runtime(objects, runtime.kind, runtime.name, namespace)
    except NotFound as missing:
        cluster_scoped = runtime.kind == "ClusterTrainingRuntime"
        if missing.resource_missing:
            plural = "clustertrainingruntimes" if cluster_scoped else "trainingruntimes"
            raise TrainerNotInstalled(f"no {plural} API") from None
        where = "" if cluster_scoped else f" in namespace {namespace}"
        existing = _runtime_names(objects, namespace)
        fix = (
            f"use one that exists with --runtime NAME (and --runtime-kind): {', '.join(existing)}"
            if existing
            else f"none exist: install ours with `{RUNTIMES_INSTALL}`"
        )
        raise InvalidInput(
            "runtime", f"there is no {runtime.kind} named {runtime.name!r}{where}", fix
        ) from None
    check_launcher_policy(found, spec)
    check_initializers(found, spec)
    rules.jobset_pod_names(spec.name, runtime_replicated_jobs(found, spec), "name")
    check_restarts(found, spec, warn)
    return found


def is_mpi_runtime(runtime: dict[str, Any]) -> bool:
    """Whether a runtime's ML policy is MPI (``mlPolicy.mpi``): its TrainJobs run mpirun in
    a launcher pod."""
    policy = (runtime.get("spec") or {}).get("mlPolicy") or {}
    return isinstance(policy, dict) and "mpi" in policy


def check_launcher_policy(runtime: dict[str, Any], spec: TrainJobSpec) -> None:
    """The runtime's ML policy runs the spec's launcher: the torch plugin sets the PET_* env a
    torchrun command reads, the MPI plugin the hostfile, ssh keys and launcher job mpirun needs
    (trainer v2.3.0 ``pkg/apis/trainer/v1alpha1/trainingruntime_types.go`` MLPolicySource: one
    of torch, mpi). The other way round the job starts and fails on every node."""
    has_mpi = is_mpi_runtime(runtime)
    if spec.launcher == "mpi" and not has_mpi:
        raise InvalidInput(
            "runtime",
            f"{spec.runtime.name} has no mlPolicy.mpi, which --launcher mpi needs",
            f"use --runtime {MPI_RUNTIME} (ours: `{RUNTIMES_INSTALL}`) or another MPI runtime",
        )
    if spec.launcher != "mpi" and has_mpi:
        raise InvalidInput(
            "runtime",
            f"{spec.runtime.name} is an MPI runtime (mlPolicy.mpi), which sets no PET_* env "
            "for torchrun",
            "add --launcher mpi, or use a torch runtime such as torch-ddp-cpu",
        )


def _replicated_jobs(runtime: dict[str, Any]) -> list[dict[str, Any]]:
    jobset = ((runtime.get("spec") or {}).get("template") or {}).get("spec") or {}
    return list(jobset.get("replicatedJobs") or [])


def _pod_spec(replicated_job: dict[str, Any]) -> dict[str, Any]:
    job = (replicated_job.get("template") or {}).get("spec") or {}
    return (job.get("template") or {}).get("spec") or {}


def runtime_replicated_job_specs(runtime: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, Job spec) of every replicated job of the runtime's JobSet."""
    return [
        (job.get("name") or "", (job.get("template") or {}).get("spec") or {})
        for job in _replicated_jobs(runtime)
    ]


def _is_trainer(replicated_job: dict[str, Any]) -> bool:
    labels = ((replicated_job.get("template") or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(ANCESTOR_LABEL) == ANCESTOR_TRAINER


def runtime_replicated_jobs(
    runtime: dict[str, Any], spec: TrainJobSpec
) -> list[tuple[str, int, int]]:
    """(name, replicas, completions) of every replicated job of the runtime's JobSet, as the
    Trainer builds it: the trainer's job (label trainjob-ancestor-step: trainer) gets one
    replica of ``numNodes`` pods (trainer v2.3.0 ``pkg/runtime/framework/plugins/jobset/
    builder.go`` Trainer, ``pkg/runtime/core/trainingruntime.go``), the others what the
    runtime says (1 when unset)."""
    jobs = []
    for job in _replicated_jobs(runtime):
        name = job.get("name") or ""
        if _is_trainer(job) or name == NODE_JOB:
            jobs.append((name, 1, spec.num_nodes))
        else:
            completions = ((job.get("template") or {}).get("spec") or {}).get("completions")
            jobs.append((name, int(job.get("replicas") or 1), int(completions or 1)))
    return jobs or spec.replicated_jobs()


#: The volume an initializer container must mount (trainer v2.3.0
#: pkg/runtime/framework/plugins/jobset/constants/constants.go VolumeNameInitializer).
INITIALIZER_VOLUME = "initializer"


def check_initializers(runtime: dict[str, Any], spec: TrainJobSpec) -> None:
    """A dataset or model to fetch needs a runtime with that initializer: a replicated job and
    a container both named ``dataset-initializer`` (``model-initializer``), the container
    mounting the ``initializer`` volume, as trainer v2.3.0
    ``pkg/runtime/framework/plugins/jobset/jobset.go`` Validate requires; refused here, before
    anything is created, with the option that asked for it."""
    mounts = {
        job.get("name"): {
            c.get("name"): {m.get("name") for m in c.get("volumeMounts") or []}
            for c in _pod_spec(job).get("containers") or []
        }
        for job in _replicated_jobs(runtime)
    }
    asked = (
        (spec.dataset_initializer, DATASET_INITIALIZER_JOB, "dataset_uri", "--dataset-uri"),
        (spec.model_initializer, MODEL_INITIALIZER_JOB, "model_uri", "--model-uri"),
    )
    for initializer, job, field, option in asked:
        if initializer is None:
            continue
        if job not in mounts:
            problem = f"has no {job} job"
        elif job not in mounts[job]:
            problem = f"has no {job} container"
        elif INITIALIZER_VOLUME not in mounts[job][job]:
            problem = f"mounts no {INITIALIZER_VOLUME!r} volume in its {job} container"
        else:
            continue
        raise InvalidInput(
            field,
            f"{spec.runtime.kind} {spec.runtime.name} {problem}, so it cannot fetch "
            f"{initializer.storage_uri}",
            f"use a runtime with a {job} job (--runtime), or drop {option} and read the data "
            "from a mounted volume",
        )


def node_resources(runtime: dict[str, Any]) -> dict[str, Any]:
    """The runtime's resources for the ``node`` container of the trainer's job (empty when it
    sets none)."""
    for job in _replicated_jobs(runtime):
        if _is_trainer(job) or job.get("name") == NODE_JOB:
            for container in _pod_spec(job).get("containers") or []:
                if container.get("name") == NODE_JOB:
                    return dict(container.get("resources") or {})
    return {}


def is_gang(runtime: dict[str, Any]) -> bool:
    """Whether the runtime schedules its pods as a gang (``spec.podGroupPolicy``: coscheduling
    or Volcano, trainer v2.3.0 ``pkg/runtime/framework/plugins/coscheduling``, ``volcano``):
    its pods wait, Unschedulable, until the whole group fits."""
    return bool((runtime.get("spec") or {}).get("podGroupPolicy"))


def check_restarts(
    runtime: dict[str, Any], spec: TrainJobSpec, warn: Callable[[str], None]
) -> None:
    """Restarts of a TrainJob are the runtime's JobSet ``failurePolicy.maxRestarts`` (Trainer
    v2.3's runtimePatches cannot change it): refuse a job asking for more than it allows, and
    say so when it will restart more often than asked."""
    jobset = runtime.get("spec", {}).get("template", {}).get("spec", {})
    allowed = (jobset.get("failurePolicy") or {}).get("maxRestarts", 0)
    if allowed > spec.max_restarts:
        warn(
            f"{spec.runtime.kind} {spec.runtime.name} restarts a failed job up to {allowed} "
            f"times (failurePolicy.maxRestarts); --max-restarts {spec.max_restarts} cannot "
            "lower that"
        )
    if allowed < spec.max_restarts:
        raise InvalidInput(
            "max_restarts",
            f"{spec.max_restarts} restarts asked, but {spec.runtime.kind} {spec.runtime.name} "
            f"allows {allowed} (spec.template.spec.failurePolicy.maxRestarts)",
            "use a runtime whose JobSet failurePolicy allows them (a copy of one that "
            "`kubetrain render runtimes` prints, with spec.template.spec.failurePolicy."
            "maxRestarts set) or a lower --max-restarts",
        )


# ---------------------------------------------------------------- adopting or refusing
def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def spec_differences(old: Any, new: Any, path: str = "") -> list[str]:
    """Field-by-field differences between two ``TrainJobSpec.to_dict()`` values."""
    if isinstance(old, dict) and isinstance(new, dict):
        found: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in old:
                found.append(f"{where}: (unset) -> {_short(new[key])}")
            elif key not in new:
                found.append(f"{where}: {_short(old[key])} -> (unset)")
            else:
                found += spec_differences(old[key], new[key], where)
        return found
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        found = []
        for index, (a, b) in enumerate(zip(old, new, strict=True)):
            found += spec_differences(a, b, f"{path}[{index}]")
        return found
    return [] if old == new else [f"{path}: {_short(old)} -> {_short(new)}"]


def adopt_or_refuse(
    existing: dict[str, Any], rendered: dict[str, Any], backend: str, namespace: str
) -> None:
    """Return (adopt) when ``existing`` is the job ``rendered`` describes; else InvalidInput
    naming what differs."""
    theirs = existing.get("metadata", {}).get("annotations") or {}
    ours = rendered["metadata"].get("annotations") or {}
    keys = (SPEC_SHA256_ANNOTATION, SCRIPT_SHA256_ANNOTATION)
    if theirs.get(SPEC_SHA256_ANNOTATION) and all(theirs.get(k) == ours.get(k) for k in keys):
        return
    kind, name = rendered["kind"], rendered["metadata"]["name"]
    fix = (
        f"delete it first (`kubetrain delete --backend {backend} --namespace {namespace} {name}`) "
        "or choose another --name"
    )
    if not theirs.get(SPEC_SHA256_ANNOTATION):
        raise InvalidInput(
            "name",
            f"a {kind} named {name!r} already exists in namespace {namespace} and was not "
            "created by kubetrain",
            fix,
        )
    try:
        differences = spec_differences(
            bounded_json.loads(theirs.get(SPEC_ANNOTATION, "{}")),
            bounded_json.loads(ours[SPEC_ANNOTATION]),
        )
    except ValueError:
        differences = ["its kubetrain.io/spec annotation is unreadable"]
    if theirs.get(SCRIPT_SHA256_ANNOTATION) != ours.get(SCRIPT_SHA256_ANNOTATION):
        differences.append("script: the file's content changed")
    shown = differences[:MAX_DIFFERENCES]
    if len(differences) > MAX_DIFFERENCES:
        shown.append(f"and {len(differences) - MAX_DIFFERENCES} more")
    raise InvalidInput(
        "name",
        f"a {kind} named {name!r} already exists in namespace {namespace} with a different "
        f"spec ({'; '.join(shown)})",
        fix,
    )


def _ours(obj: dict[str, Any], job: str) -> bool:
    return (obj.get("metadata", {}).get("labels") or {}).get(JOB_NAME_LABEL) == job


def create_or_adopt(
    objects: KubeObjects,
    rendered: list[dict[str, Any]],
    job: str,
    backend: str,
    namespace: str,
) -> None:
    """Create ``rendered`` in order (the job's own object last); on AlreadyExists, keep what
    is the same, replace a leftover script ConfigMap of ours, refuse anything else."""
    for obj in rendered:
        try:
            objects.create(obj)
            continue
        except AlreadyExists:
            pass
        kind, name = obj["kind"], obj["metadata"]["name"]
        existing = objects.get(obj["apiVersion"], kind, name, namespace)
        if kind == "ConfigMap" and _ours(existing, job):
            same = (existing.get("metadata", {}).get("annotations") or {}).get(
                SCRIPT_SHA256_ANNOTATION
            ) == obj["metadata"]["annotations"].get(SCRIPT_SHA256_ANNOTATION)
            if not same:  # a failed launch's leftover (immutable: replace it)
                objects.delete(obj["apiVersion"], kind, name, namespace, "Background")
                objects.create(obj)
            continue
        if kind == "Service" and _ours(existing, job):
            continue
        if kind in ("ConfigMap", "Service"):
            raise InvalidInput(
                "name",
                f"a {kind} named {name!r} already exists in namespace {namespace} and was not "
                "created by kubetrain for this job",
                "choose another --name",
            )
        adopt_or_refuse(existing, obj, backend, namespace)
