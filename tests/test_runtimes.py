"""Deployment manifests: our ClusterTrainingRuntimes and RBAC (package data, printed by
`kubetrain render runtimes|rbac`), and the Dockerfiles.

Runtimes are checked against the vendored v2.3 ClusterTrainingRuntime CRD (skipped without
../shared, failed under CI=true), always round-trip through the kubeflow_trainer_api models,
and their pod template is checked as a batch/v1 Job with kubernetes-validate.
"""

from __future__ import annotations

import importlib.resources
import re
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml
from k8s_schemas import CLUSTER_RUNTIME_CRD, REPO_ROOT, crd_schema, schema_errors
from kubeflow_trainer_api.models.trainer_v1alpha1_cluster_training_runtime import (
    TrainerV1alpha1ClusterTrainingRuntime,
)

from kubetrain.render.manifests import (
    KFP_SERVICE_ACCOUNTS,
    RUNTIME_NAMES,
    rbac_manifests,
    runtime_manifests,
)

IMAGES = REPO_ROOT / "images"
GPU_RUNTIMES = ("torch-ddp-gpu", "torch-fsdp-gpu", "torch-ddp-gpu-gang")
K8S_VERSION = "1.30"
OUR_TRAINER_IMAGE = "ghcr.io/kubetrain/kubetrain-trainer:0.1.0"
MANIFESTS = "kubetrain.render.manifests"


def load_runtime(name: str) -> dict:
    (runtime,) = [r for r in runtime_manifests() if r["metadata"]["name"] == name]
    return runtime


def render(*args: str) -> list[dict]:
    """`kubetrain render ARGS`'s documents, run as a user runs it."""
    result = subprocess.run(
        [sys.executable, "-m", "kubetrain", "render", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT.parent,  # not the checkout: the installed package's data
    )
    assert result.returncode == 0, result.stderr
    return [document for document in yaml.safe_load_all(result.stdout) if document]


def node_job(runtime: dict) -> dict:
    (job,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    return job


def node_container(runtime: dict) -> dict:
    (container,) = node_job(runtime)["template"]["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("name", RUNTIME_NAMES)
def test_runtime_round_trips_through_the_trainer_models(name):
    runtime = load_runtime(name)
    assert TrainerV1alpha1ClusterTrainingRuntime.from_dict(runtime).to_dict() == runtime


@pytest.mark.parametrize("name", RUNTIME_NAMES)
def test_runtime_is_valid_against_the_v2_3_crd(name):
    assert schema_errors(load_runtime(name), crd_schema(CLUSTER_RUNTIME_CRD)) == []


@pytest.mark.parametrize("name", RUNTIME_NAMES)
def test_runtime_pod_template_is_a_valid_job_template(name):
    job = node_job(load_runtime(name))["template"]
    kubernetes_validate.validate(
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, **job},
        K8S_VERSION,
        strict=True,
    )


@pytest.mark.parametrize("name", RUNTIME_NAMES)
def test_runtime_runs_our_trainer_under_torchrun_on_the_shared_volume(name):
    runtime = load_runtime(name)
    assert runtime["kind"] == "ClusterTrainingRuntime"
    assert runtime["metadata"]["name"] == name
    assert runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch"
    # The torch plugin injects PET_* into the container named `node` of the trainer job.
    assert "torch" in runtime["spec"]["mlPolicy"]
    job = node_job(runtime)
    assert job["name"] == "node"
    labels = job["template"]["metadata"]["labels"]
    assert labels["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
    container = node_container(runtime)
    assert container["name"] == "node"
    assert container["image"] == OUR_TRAINER_IMAGE
    assert container["command"] == ["torchrun"]
    assert container["args"][:2] == ["-m", "kubetrain.train"]
    assert {"name": "shared", "mountPath": "/mnt/shared"} in container["volumeMounts"]
    pod = job["template"]["spec"]["template"]["spec"]
    assert {"name": "shared", "persistentVolumeClaim": {"claimName": "kubetrain-shared"}} in pod[
        "volumes"
    ]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    gpus = container["resources"].get("limits", {}).get("nvidia.com/gpu")
    assert (gpus is not None) == (name in GPU_RUNTIMES)


def test_fsdp_and_gang_variants():
    assert "fsdp" in node_container(load_runtime("torch-fsdp-gpu"))["args"]
    assert "ddp" in node_container(load_runtime("torch-ddp-gpu"))["args"]
    gang = load_runtime("torch-ddp-gpu-gang")
    assert gang["spec"]["podGroupPolicy"] == {"volcano": {}}
    assert node_job(gang)["template"]["spec"]["template"]["spec"]["schedulerName"] == "volcano"
    for name in ("torch-ddp-cpu", "torch-ddp-gpu", "torch-fsdp-gpu"):
        assert "podGroupPolicy" not in load_runtime(name)["spec"]


# --- RBAC ---------------------------------------------------------------------------------

# Exactly what the steps need; a change here is a change of privileges, made on purpose.
EXPECTED_ROLE_RULES = [
    {
        "apiGroups": ["trainer.kubeflow.org"],
        "resources": ["trainjobs"],
        "verbs": ["create", "get", "list", "watch", "patch", "delete"],
    },
    {
        "apiGroups": ["kubeflow.org"],
        "resources": ["pytorchjobs"],
        "verbs": ["create", "get", "list", "watch", "patch", "delete"],
    },
    {
        "apiGroups": ["trainer.kubeflow.org"],
        "resources": ["trainingruntimes"],
        "verbs": ["get", "list"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "delete"]},
    {
        "apiGroups": ["batch"],
        "resources": ["jobs"],
        "verbs": ["create", "get", "list", "watch", "patch", "delete"],
    },
    {"apiGroups": [""], "resources": ["services"], "verbs": ["create", "get", "delete"]},
    {
        "apiGroups": ["argoproj.io"],
        "resources": ["workflowtaskresults"],
        "verbs": ["create", "patch"],
    },
    {"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["get"]},
]
EXPECTED_CLUSTER_RULES = [
    {
        "apiGroups": ["trainer.kubeflow.org"],
        "resources": ["clustertrainingruntimes"],
        "verbs": ["get", "list"],
    },
    {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "resourceNames": ["trainjobs.trainer.kubeflow.org"],
        "verbs": ["get"],
    },
]


def rbac_documents(namespace: str = "default", **options) -> dict[str, dict]:
    docs = rbac_manifests(namespace, **options)
    by_kind = {doc["kind"]: doc for doc in docs}
    assert len(by_kind) == len(docs) == 5
    return by_kind


def test_rbac_manifests_are_valid():
    for doc in rbac_documents().values():
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def subjects(*names: str, namespace: str = "default") -> list[dict]:
    return [{"kind": "ServiceAccount", "name": n, "namespace": namespace} for n in names]


def test_rbac_grants_exactly_the_least_privilege_the_steps_need():
    docs = rbac_documents()
    assert docs["ServiceAccount"]["metadata"]["name"] == "kubetrain"
    assert docs["Role"]["rules"] == EXPECTED_ROLE_RULES
    assert docs["ClusterRole"]["rules"] == EXPECTED_CLUSTER_RULES
    for binding, role in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
        assert docs[binding]["subjects"] == subjects("kubetrain", *KFP_SERVICE_ACCOUNTS)
        assert docs[binding]["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role,
            "name": docs[role]["metadata"]["name"],
        }


def test_rbac_binds_the_accounts_kfp_runs_steps_as():
    """KFP runs a step as the run's account, by default pipeline-runner (kubeflow/pipelines
    2.17.0 backend/src/apiserver/common/const.go), default-editor in multi-user mode
    (manifests/kustomize/base/installs/multi-user/api-service/params.env); KFP's own Role for
    it (manifests/kustomize/base/pipeline/pipeline-runner-role.yaml) has nothing in
    trainer.kubeflow.org. The old rbac.yaml bound kubetrain only, so a KFP launch step was
    forbidden to create its TrainJob."""
    assert KFP_SERVICE_ACCOUNTS == ("pipeline-runner", "default-editor")
    docs = rbac_documents("kubeflow", service_accounts=("kubetrain", "pipeline-runner"))
    assert docs["RoleBinding"]["subjects"] == subjects(
        "kubetrain", "pipeline-runner", namespace="kubeflow"
    )
    assert docs["ClusterRoleBinding"]["subjects"] == docs["RoleBinding"]["subjects"]
    assert {
        docs[k]["metadata"]["namespace"] for k in ("ServiceAccount", "Role", "RoleBinding")
    } == {"kubeflow"}
    # Cluster-scoped: one binding per namespace, so rendering for team-b keeps team-a's.
    assert docs["ClusterRoleBinding"]["metadata"]["name"] == "kubetrain-cluster-reads-kubeflow"
    assert "namespace" not in docs["ClusterRoleBinding"]["metadata"]


def test_rbac_has_no_wildcards_and_no_secrets():
    for kind in ("Role", "ClusterRole"):
        for rule in rbac_documents()[kind]["rules"]:
            for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert not any("*" in value for value in rule.get(key, [])), (kind, rule)
            assert "secrets" not in rule["resources"]
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


# --- package data and `kubetrain render runtimes|rbac` ------------------------------------


def test_the_manifests_are_package_data():
    """In the package (so in the wheel: pyproject.toml's package-data), not only in the
    checkout: the errors that told users to `kubectl apply -k runtimes/` pointed at files a
    pip install does not have."""
    files = importlib.resources.files(MANIFESTS)
    shipped = {f.name for f in files.iterdir() if f.name.endswith(".yaml")}
    assert shipped == {f"{name}.yaml" for name in RUNTIME_NAMES} | {"rbac.yaml"}
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert f'"{MANIFESTS}" = ["*.yaml"]' in pyproject
    assert f'"{MANIFESTS}",' in pyproject  # in [tool.setuptools] packages


def test_render_runtimes_prints_every_runtime_valid_against_the_crd():
    documents = render("runtimes")
    assert [d["metadata"]["name"] for d in documents] == list(RUNTIME_NAMES)
    assert documents == runtime_manifests()
    schema = crd_schema(CLUSTER_RUNTIME_CRD)
    for document in documents:
        assert schema_errors(document, schema) == [], document["metadata"]["name"]


def test_render_rbac_prints_valid_rbac_for_the_namespace_and_accounts():
    documents = render("rbac", "--namespace", "team-a", "--service-account", "ci-runner")
    for document in documents:
        kubernetes_validate.validate(document, K8S_VERSION, strict=True)
    by_kind = {d["kind"]: d for d in documents}
    expected = subjects("kubetrain", *KFP_SERVICE_ACCOUNTS, "ci-runner", namespace="team-a")
    assert by_kind["RoleBinding"]["subjects"] == expected
    assert by_kind["ClusterRoleBinding"]["subjects"] == expected
    assert by_kind["Role"]["metadata"]["namespace"] == "team-a"
    only_ours = {d["kind"]: d for d in render("rbac", "--no-kfp-accounts")}
    assert only_ours["RoleBinding"]["subjects"] == subjects("kubetrain")


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--namespace", "Team_A"],
         "--namespace: 'Team_A' is not a namespace name; give the namespace the steps run in, "
         "e.g. kubeflow"),
        (["--service-account", "CI runner"],
         "--service-account: 'CI runner' is not a DNS-1123 subdomain; give a ServiceAccount's "
         "name, e.g. pipeline-runner"),
    ],
)  # fmt: skip
def test_render_rbac_refuses_bad_names_in_one_line(args, line):
    result = subprocess.run(
        [sys.executable, "-m", "kubetrain", "render", "rbac", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == f"kubetrain render: error: {line}\n"


def test_the_runtimes_folder_points_at_the_commands():
    """kustomize refuses files outside its folder (its default load restrictor,
    kubernetes-sigs/kustomize api/internal/loader/loadrestrictions.go RestrictionRootOnly, on
    the path with symlinks resolved), so `kubectl apply -k runtimes/` could only work on a
    second copy of the YAML:
    the folder keeps a README that points at `kubetrain render`, and no YAML to drift."""
    folder = REPO_ROOT / "runtimes"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md"]
    readme = (folder / "README.md").read_text()
    assert "kubetrain render runtimes | kubectl apply -f -" in readme
    assert "kubetrain render rbac --namespace" in readme
    assert "kubectl apply -k" not in readme
    # kfp-kubernetes 2.17 has no set_service_account (kfp/kubernetes/__init__.py).
    assert "set_service_account" not in readme


def test_every_runtime_names_a_device_the_kubeflow_sdk_knows():
    """The Kubeflow SDK (kubeflow 0.5, trainer/backends/kubernetes/utils.py
    get_container_devices) takes the device from the node container's limits and raises
    "Unknown device type" on limits without cpu or an accelerator, failing list_runtimes() for
    the whole cluster: torch-ddp-cpu's limits held memory only. GPU counts are quoted, or the
    SDK reports "1.0" GPUs. (tests/test_kubeflow_sdk.py runs the SDK itself.)"""
    for name in RUNTIME_NAMES:
        limits = node_container(load_runtime(name))["resources"]["limits"]
        device = "nvidia.com/gpu" if name in GPU_RUNTIMES else "cpu"
        assert limits[device] == "1", name


def test_a_cpu_request_never_exceeds_the_runtime_cpu_limit():
    """Trainer v2.3 merges resourcesPerNode into the runtime's resources key by key (kubeflow/
    trainer v2.3.0 pkg/util/trainingruntime/trainingruntime.go MergeResourceRequirements): --cpu 4
    on torch-ddp-cpu (limits.cpu 1) must not make requests > limits, an invalid pod."""
    from kubetrain.jobspec import Resources
    from kubetrain.render.pod import resource_requirements

    rendered = resource_requirements(Resources(cpu="4"))
    runtime = node_container(load_runtime("torch-ddp-cpu"))["resources"]
    merged = {key: {**runtime.get(key, {}), **rendered.get(key, {})} for key in runtime}
    assert float(merged["requests"]["cpu"]) <= float(merged["limits"]["cpu"])


# --- Dockerfiles --------------------------------------------------------------------------


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (IMAGES / dockerfile).read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


@pytest.mark.parametrize("dockerfile", ["trainer.Dockerfile", "components.Dockerfile"])
def test_dockerfile_pins_its_base_and_runs_as_a_numeric_non_root_user(dockerfile):
    steps = instructions(dockerfile)
    bases = [args.split()[0] for op, args in steps if op == "FROM"]
    assert bases
    for base in bases:
        name, _, tag = base.partition(":")
        assert tag and tag != "latest" and re.search(r"\d+\.\d+", tag), base
    users = [args for op, args in steps if op == "USER"]
    assert users, "no USER: the image would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    runs = " ".join(args for op, args in steps if op == "RUN")
    assert "| sh" not in runs and "| bash" not in runs


def test_trainer_image_lets_the_trainer_set_the_command():
    steps = instructions("trainer.Dockerfile")
    assert not [op for op, _ in steps if op in ("ENTRYPOINT", "CMD")]
    assert [args for op, args in steps if op == "WORKDIR"][-1] == "/workspace"
    assert "pytorch/pytorch" in next(args for op, args in steps if op == "FROM")


def test_components_image_installs_kubetrain_and_kfp():
    steps = instructions("components.Dockerfile")
    assert next(args for op, args in steps if op == "FROM").startswith("python:3.11")
    runs = " ".join(args for op, args in steps if op == "RUN")
    assert 'pip install "/tmp/kubetrain[train]" kfp' in runs
    readme = (IMAGES / "README.md").read_text()
    assert "KUBETRAIN_COMPONENT_IMAGE" in readme and "KUBETRAIN_TRAINER_IMAGE" in readme
