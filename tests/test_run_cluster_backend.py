"""`kubetrain run --backend pytorchjob|trainer|job` (issue 20 (5)): the steps run here through
KFP's local runner, the training job on the kubeconfig's cluster, the dataset, checkpoints and
model in object storage both reach. Here the cluster is the emulated API server with the fake
Training Operator (its pods are real processes) and the storage a moto S3 server."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_pytorchjob import operator_cluster  # noqa: F401 (the fixture)

BUCKET = "kubetrain-cluster-run"


def test_kubetrain_run_trains_on_the_cluster_through_a_pytorchjob(
    operator_cluster,  # noqa: F811 (the fixture)
    s3_env,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(tmp_path / "local"))
    result = subprocess.run(
        [
            sys.executable, "-m", "kubetrain", "run", "--backend", "pytorchjob",
            "--storage", f"s3://{BUCKET}/team-a", "--output", str(tmp_path / "runs"),
            "--epochs", "4", "--threshold", "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"^accuracy 0\.\d{3} \(passed", result.stdout, re.MULTILINE), result.stdout
    job = re.search(r"launched (\S+);", result.stdout).group(1)
    # the job was the cluster's: a PyTorchJob whose Master and Worker trained, not local
    # processes, and a finished one the exit handler left alone
    pytorchjob = operator_cluster.emulator.get("pytorchjobs", job)
    assert set(pytorchjob["spec"]["pytorchReplicaSpecs"]) == {"Master", "Worker"}
    conditions = {c["type"]: c["status"] for c in pytorchjob["status"]["conditions"]}
    assert conditions["Succeeded"] == "True"
    assert not (tmp_path / "local").exists()
    keys = s3_env.keys(BUCKET, "team-a/")
    (run,) = {key.split("/")[2] for key in keys}
    for expected in (
        f"team-a/checkpoints/{run}/epoch-000004/manifest.json",
        f"team-a/models/{run}/model.safetensors",
    ):
        assert expected in keys, sorted(keys)
    assert "epoch 4/4" in result.stdout, "rank 0's lines came from the Master pod's log"


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ([], "--storage: it is not given: "),
        (["--storage", "runs/here"], "--storage: runs/here is on this machine: "),
        (["--storage", "s3://b/x", "--storage-secret", "Bad_Name"], "--storage-secret: "),
        (["--storage", "s3://b/x", "--namespace", "Team A"], "--namespace: "),
        (["--storage", "s3://b/x", "--image", "bad image"], "--image: "),
    ],
)
def test_a_cluster_run_is_refused_before_any_step(options, message, tmp_path: Path) -> None:
    """Local folders are unreadable from a cluster's pods: refused in one line before prep."""
    result = subprocess.run(
        [sys.executable, "-m", "kubetrain", "run", "--backend", "trainer", *options],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"kubetrain run: error: {message}"), line
    assert not list(tmp_path.iterdir()), "nothing written"
