"""`kubetrain doctor` against an emulated cluster, over HTTP with the real client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kubetrain.backends.kubernetes.permissions import required_permissions
from kubetrain.render.manifests import rbac_manifests
from tests.support.emulator import KubeEmulator
from tests.test_rbac_covers_emulator import Use, bound_rules

REVIEWS = "post /apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
SUBJECT_REVIEWS = "post /apis/authorization.k8s.io/v1/subjectaccessreviews"
VERSION = {
    "major": "1", "minor": "31", "gitVersion": "v1.31.0", "gitCommit": "0" * 40,
    "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23",
    "compiler": "gc", "platform": "linux/amd64",
}  # fmt: skip


@pytest.fixture
def cluster(tmp_path):
    """An emulated API server that answers SelfSubjectAccessReviews from a deny list."""
    denied: set[tuple[str, str]] = set()

    def review(request):
        attributes = request.data["spec"]["resourceAttributes"]
        resource = "/".join(filter(None, (attributes["resource"], attributes.get("subresource"))))
        allowed = (attributes["verb"], resource) not in denied
        return {"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
                "spec": request.data["spec"], "status": {"allowed": allowed}}  # fmt: skip

    with KubeEmulator() as emulator:
        emulator.api[REVIEWS] << review
        emulator.api["get /version/"] << VERSION
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        yield emulator, kubeconfig, denied


@pytest.fixture
def rbac_cluster(cluster):
    """The same, answering SubjectAccessReviews as RBAC would from the manifests in the list it
    yields (what `kubectl apply` put on the cluster)."""
    emulator, kubeconfig, _denied = cluster
    applied: list[dict] = []

    def review(request):
        spec = request.data["spec"]
        _system, _serviceaccount, namespace, name = spec["user"].split(":")
        assert {"system:serviceaccounts", f"system:serviceaccounts:{namespace}"} <= set(
            spec["groups"]
        )
        subject = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
        wanted = spec["resourceAttributes"]
        resource = "/".join(filter(None, (wanted["resource"], wanted.get("subresource"))))
        use = Use(wanted["verb"], wanted.get("group", ""), resource, wanted.get("namespace"),
                  wanted.get("name"))  # fmt: skip
        allowed = any(rule.grants(use) for rule in bound_rules(applied, subject))
        return {"kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
                "spec": spec, "status": {"allowed": allowed}}  # fmt: skip

    emulator.api[SUBJECT_REVIEWS] << review
    emulator.install_trainer(version="2.3")
    yield emulator, kubeconfig, applied


def doctor(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.run(
        [sys.executable, "-m", "kubetrain", "doctor", *args],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip


def test_a_ready_cluster_passes_every_check(cluster):
    emulator, kubeconfig, _denied = cluster
    emulator.install_trainer(version="2.3")
    result = doctor(kubeconfig)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "TrainJobs rendered for v2.3 (runtimePatches)" in result.stdout
    assert "ClusterTrainingRuntime torch-ddp-cpu exists" in result.stdout
    assert result.stdout.strip().endswith("ready")


def test_missing_permissions_are_named_with_the_fix(cluster):
    emulator, kubeconfig, denied = cluster
    emulator.install_trainer(version="2.1")
    denied.update({("watch", "trainjobs"), ("get", "pods/log")})
    result = doctor(kubeconfig)
    assert result.returncode == 1
    assert "podTemplateOverrides" in result.stdout
    assert (
        "missing for you in namespace default: watch trainjobs.trainer.kubeflow.org, get pods/log"
        in result.stdout
    )
    assert "fix: kubetrain render rbac --namespace default | kubectl apply -f -" in result.stdout


def test_the_account_kfp_runs_steps_as_is_checked(rbac_cluster):
    """KFP runs steps as pipeline-runner (kubeflow/pipelines 2.17.0
    backend/src/apiserver/common/const.go; standalone in namespace kubeflow): with what
    `kubetrain render rbac --namespace kubeflow` prints applied, it has every right."""
    _emulator, kubeconfig, applied = rbac_cluster
    applied += rbac_manifests("kubeflow")
    result = doctor(kubeconfig, "--namespace", "kubeflow", "--service-account", "pipeline-runner")
    assert result.returncode == 0, result.stdout + result.stderr
    verbs = sum(len(p.verbs) for p in required_permissions())
    assert (
        f"ok   rbac     ServiceAccount kubeflow/pipeline-runner: all {verbs} permissions the "
        "steps use are granted"
    ) in result.stdout


def test_an_account_the_rbac_does_not_bind_is_named_with_the_command_that_binds_it(rbac_cluster):
    """RBAC bound to kubetrain only (the old rbac.yaml): KFP's account may do nothing the
    steps do; doctor lists every verb and prints the command that grants them."""
    _emulator, kubeconfig, applied = rbac_cluster
    applied += rbac_manifests("team-a", service_accounts=["kubetrain"])
    result = doctor(kubeconfig, "--namespace", "team-a", "--service-account", "default-editor")
    assert result.returncode == 1
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("FAIL rbac")]
    assert line.startswith(
        "FAIL rbac     missing for ServiceAccount team-a/default-editor in namespace team-a: "
        "create trainjobs.trainer.kubeflow.org, get trainjobs.trainer.kubeflow.org,"
    )
    assert line.endswith("get customresourcedefinitions.apiextensions.k8s.io")
    assert "fix: kubetrain render rbac --namespace team-a | kubectl apply -f -" in result.stdout
    ours = doctor(kubeconfig, "--namespace", "team-a", "--service-account", "kubetrain")
    assert ours.returncode == 0, ours.stdout
    other = doctor(kubeconfig, "--namespace", "team-a", "--service-account", "ci")
    assert (
        "fix: kubetrain render rbac --namespace team-a --service-account ci | kubectl apply -f -"
        in other.stdout
    )


def test_no_right_to_review_another_account_is_said_so(cluster):
    emulator, kubeconfig, _denied = cluster
    emulator.install_trainer(version="2.3")
    forbidden = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
                 "reason": "Forbidden", "message": "subjectaccessreviews is forbidden"}  # fmt: skip
    emulator.api[SUBJECT_REVIEWS] << 403 << forbidden
    result = doctor(kubeconfig, "--service-account", "kubetrain")
    assert result.returncode == 1
    assert (
        "FAIL rbac     cannot check the rights of ServiceAccount default/kubetrain: you may not "
        "create subjectaccessreviews.authorization.k8s.io (subjectaccessreviews is forbidden)"
    ) in result.stdout


@pytest.mark.bad_input
def test_a_bad_service_account_name_is_refused_before_any_request(cluster):
    _emulator, kubeconfig, _denied = cluster
    result = doctor(kubeconfig, "--service-account", "Pipeline Runner")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        "kubetrain doctor: error: --service-account: 'Pipeline Runner' is not a DNS-1123 "
        "subdomain; give a ServiceAccount's name, e.g. kubetrain\n"
    )


def test_no_trainer_and_unknown_runtime_are_reported(cluster):
    emulator, kubeconfig, _denied = cluster
    result = doctor(kubeconfig)
    assert result.returncode == 1
    assert "Kubeflow Trainer is not installed" in result.stdout
    emulator.install_trainer(version="2.3")
    result = doctor(kubeconfig, "--runtime", "torch-fsdp-gpu")
    assert result.returncode == 1
    assert "no ClusterTrainingRuntime named 'torch-fsdp-gpu'" in result.stdout
    assert "torch-ddp-cpu" in result.stdout
    # One of ours: the command that installs it.
    assert "fix: kubetrain render runtimes | kubectl apply -f -" in result.stdout


def test_an_unreachable_api_is_reported(tmp_path):
    with KubeEmulator() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    result = doctor(kubeconfig)
    assert result.returncode == 1
    assert "FAIL api" in result.stdout


def test_with_no_namespace_doctor_checks_the_one_the_steps_would_use(cluster):
    """Issue 17 (2): like launch and wait, an empty --namespace is the pod's, else the
    kubeconfig context's (here team-x), else default."""
    emulator, kubeconfig, denied = cluster
    emulator.install_trainer(version="2.3")
    config = yaml.safe_load(kubeconfig.read_text())
    config["contexts"][0]["context"]["namespace"] = "team-x"
    kubeconfig.write_text(yaml.safe_dump(config))
    denied.add(("get", "pods/log"))
    result = doctor(kubeconfig)
    assert result.returncode == 1
    assert "missing for you in namespace team-x: get pods/log" in result.stdout
