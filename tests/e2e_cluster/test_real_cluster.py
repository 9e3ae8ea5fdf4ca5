"""Opt-in end to end on a real cluster with Kubeflow Trainer (`make e2e-cluster`).

Runs the steps as a user would, through the CLI, against the cluster in $KUBECONFIG: prep,
train, collect and evaluate each run as TrainJobs in our image on the shared PVC
(`kubetrain render runtimes|rbac`: the torch-ddp-cpu runtime and our RBAC; the
kubetrain-shared claim).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("KUBETRAIN_E2E_CLUSTER") != "1",
    reason="real-cluster end to end is opt-in: run `make e2e-cluster` (needs KUBECONFIG, "
    "Kubeflow Trainer and `kubetrain render runtimes|rbac` applied)",
)

NAMESPACE = os.environ.get("KUBETRAIN_E2E_NAMESPACE", "default")
RUNTIME = os.environ.get("KUBETRAIN_E2E_RUNTIME", "torch-ddp-cpu")
# Our runtimes mount the kubetrain-shared PVC here on every node.
SHARED = "/mnt/shared"


def kubetrain(*args: str, timeout: float = 1200) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "kubetrain", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result.stdout


def run_on_cluster(name: str, *command: str, nodes: int = 1) -> str:
    """Launch a job on the cluster, wait for it and return what its rank 0 printed."""
    kubetrain(
        "launch", "--backend", "trainer", "--namespace", NAMESPACE, "--runtime", RUNTIME,
        "--name", name, "--nodes", str(nodes), "--", *command,
    )  # fmt: skip
    return kubetrain("wait", "--backend", "trainer", "--namespace", NAMESPACE, name)


def test_pipeline_steps_on_a_real_cluster():
    run = f"e2e-{uuid.uuid4().hex[:6]}"
    data, checkpoints, model = (f"{SHARED}/{run}/{part}" for part in ("data", "ckpt", "model"))
    run_on_cluster(f"{run}-prep", "kubetrain", "prep", "--output", data)
    trained = run_on_cluster(
        f"{run}-train",
        "torchrun", "-m", "kubetrain.train", "--data", data, "--checkpoint-dir", checkpoints,
        nodes=2,
    )  # fmt: skip
    assert "training complete" in trained
    run_on_cluster(f"{run}-collect", "kubetrain", "collect", "--checkpoint-dir", checkpoints,
                   "--output", model)  # fmt: skip
    scored = run_on_cluster(f"{run}-eval", "kubetrain", "evaluate", "--model", model,
                            "--data", data)  # fmt: skip
    assert "passed" in scored
    for step in ("prep", "train", "collect", "eval"):
        kubetrain("delete", "--backend", "trainer", "--namespace", NAMESPACE, f"{run}-{step}")
