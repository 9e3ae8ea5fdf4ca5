"""A user's DeepSpeed program in the seeds' style (``tests/support/seed_deepspeed.py``) runs
unchanged under torchrun and under mpirun (``--launcher mpi``), 2 nodes x 1 process each, as
TrainJobs the fake Trainer runs for real on the emulator: the torch runtime's nodes through the
local backend's torchrun path (the PET_* env), the MPI runtime's launcher through its mpirun
path, each followed by the Kubernetes backend's wait. Both runs train the same model to the
same loss and leave the ZeRO checkpoint ``engine.save_checkpoint`` writes."""

from __future__ import annotations

import re
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import CustomObjectsApi

from kubetrain.backends.base import COMPLETE
from kubetrain.jobspec import DEFAULT_RUNTIME, MPI_RUNTIME
from tests.support import objects, seed_deepspeed
from tests.support.fake_trainer import FakeTrainer

pytest.importorskip("deepspeed", reason="the user's DeepSpeed program needs kubetrain[deepspeed]")

NODES = 2


@pytest.fixture
def cluster(k8s, tmp_path, monkeypatch):
    k8s.emulator.create("clustertrainingruntimes", objects.shipped_runtime(MPI_RUNTIME))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with FakeTrainer(k8s.emulator, tmp_path / "nodes") as trainer:
        yield k8s
    assert trainer.errors == []


def run_trainjob(cluster, name: str, runtime: str, command: list[str]) -> list[str]:
    """Create the TrainJob through the real client, wait for it; its rank-0 log lines."""
    body: dict[str, Any] = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": runtime, "kind": "ClusterTrainingRuntime"},
            "trainer": {"numNodes": NODES, "numProcPerNode": 1, "command": command},
        },
    }
    CustomObjectsApi(cluster.api_client).create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", body
    )
    lines: list[str] = []
    status = cluster.backend().wait(name, 180, lines.append)
    assert status.state == COMPLETE, "\n".join([str(status), *lines[-40:]])
    return lines


def checkpoint_files(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()}


def last_loss(lines: list[str]) -> str:
    return [m.group(1) for line in lines if (m := re.search(r"step 4 loss (\S+)", line))][-1]


def test_a_users_deepspeed_program_runs_unchanged_under_torchrun_and_mpirun(
    cluster, tmp_path, monkeypatch
):
    expected = {
        "checkpoint/latest",
        "checkpoint/step_4/mp_rank_00_model_states.pt",
        *(f"checkpoint/step_4/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)),
    }
    losses = {}
    for launcher, runtime, command in (
        ("torchrun", DEFAULT_RUNTIME, ["torchrun", "train.py"]),
        (
            "mpi",
            MPI_RUNTIME,
            # The interpreter that has deepspeed, by path, as an image's would be.
            [
                "mpirun",
                "--hostfile",
                "/etc/mpi/hostfile",
                "-np",
                str(NODES),
                sys.executable,
                "train.py",
            ],  # fmt: skip
        ),
    ):
        folder = tmp_path / launcher
        seed_deepspeed.write_program(folder, world_size=NODES)
        monkeypatch.chdir(folder)  # the nodes run in the launch folder, as in the image's
        port_lock = seed_deepspeed.mpi_discovery_port() if launcher == "mpi" else nullcontext()
        with port_lock:
            lines = run_trainjob(cluster, f"ds-{launcher}", runtime, command)
        assert f"rank 0 of {NODES} saved step_4" in lines, lines[-30:]
        assert checkpoint_files(folder) >= expected
        assert (folder / "checkpoint/latest").read_text().strip() == "step_4"
        losses[launcher] = last_loss(lines)
    assert losses["torchrun"] == losses["mpi"], losses
