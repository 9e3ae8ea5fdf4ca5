"""Deployment manifests: our ClusterTrainingRuntimes, RBAC, kustomization and Dockerfiles.

Runtimes are checked against the vendored v2.3 ClusterTrainingRuntime CRD (skipped without
../shared, failed under CI=true), always round-trip through the kubeflow_trainer_api models,
and their pod template is checked as a batch/v1 Job with kubernetes-validate.
"""

from __future__ import annotations

import re

import kubernetes_validate
import pytest
import yaml
from k8s_schemas import CLUSTER_RUNTIME_CRD, REPO_ROOT, crd_schema, schema_errors
from kubeflow_trainer_api.models.trainer_v1alpha1_cluster_training_runtime import (
    TrainerV1alpha1ClusterTrainingRuntime,
)

RUNTIMES = REPO_ROOT / "runtimes"
IMAGES = REPO_ROOT / "images"
RUNTIME_NAMES = ("torch-ddp-cpu", "torch-ddp-gpu", "torch-fsdp-gpu", "torch-ddp-gpu-gang")
GPU_RUNTIMES = ("torch-ddp-gpu", "torch-fsdp-gpu", "torch-ddp-gpu-gang")
K8S_VERSION = "1.30"
OUR_TRAINER_IMAGE = "ghcr.io/kubetrain/kubetrain-trainer:0.1.0"


def load_runtime(name: str) -> dict:
    return yaml.safe_load((RUNTIMES / f"{name}.yaml").read_text())


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


def rbac_documents() -> dict[str, dict]:
    docs = list(yaml.safe_load_all((RUNTIMES / "rbac.yaml").read_text()))
    by_kind = {doc["kind"]: doc for doc in docs}
    assert len(by_kind) == len(docs) == 5
    return by_kind


def test_rbac_manifests_are_valid():
    for doc in rbac_documents().values():
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_rbac_grants_exactly_the_least_privilege_the_steps_need():
    docs = rbac_documents()
    assert docs["ServiceAccount"]["metadata"]["name"] == "kubetrain"
    assert docs["Role"]["rules"] == EXPECTED_ROLE_RULES
    assert docs["ClusterRole"]["rules"] == EXPECTED_CLUSTER_RULES
    subject = {"kind": "ServiceAccount", "name": "kubetrain", "namespace": "default"}
    for binding, role in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
        assert docs[binding]["subjects"] == [subject]
        assert docs[binding]["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role,
            "name": docs[role]["metadata"]["name"],
        }


def test_rbac_has_no_wildcards_and_no_secrets():
    for kind in ("Role", "ClusterRole"):
        for rule in rbac_documents()[kind]["rules"]:
            for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert not any("*" in value for value in rule.get(key, [])), (kind, rule)
            assert "secrets" not in rule["resources"]
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((RUNTIMES / "kustomization.yaml").read_text())
    manifests = {p.name for p in RUNTIMES.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(manifests)
    assert {f"{name}.yaml" for name in RUNTIME_NAMES} | {"rbac.yaml"} == manifests


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
