"""`kubetrain doctor` against an emulated cluster, over HTTP with the real client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.emulator import KubeEmulator

REVIEWS = "post /apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
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
    assert "missing in namespace default: watch trainjobs.trainer.kubeflow.org, get pods/log" in (
        result.stdout
    )
    assert "kubectl apply -k runtimes/" in result.stdout


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


def test_an_unreachable_api_is_reported(tmp_path):
    with KubeEmulator() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    result = doctor(kubeconfig)
    assert result.returncode == 1
    assert "FAIL api" in result.stdout
