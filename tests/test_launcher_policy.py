"""A launcher needs the runtime's ML policy that runs it, and a backend that can run it: both
refused in one line before anything is created or read.

The Trainer's runtime has one ML policy source (trainer v2.3.0
``pkg/apis/trainer/v1alpha1/trainingruntime_types.go`` MLPolicySource): the torch plugin sets
the PET_* env torchrun reads, the MPI plugin the hostfile, ssh keys and launcher job mpirun
needs. A TrainJob with the other launcher is created and fails on every node.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kubetrain.backends import BackendOptions
from kubetrain.backends.kubernetes.backend import KubernetesBackend
from kubetrain.components.launch_trainjob.launch import LaunchRequest, TrainingOptions, launch
from kubetrain.errors import InvalidInput
from kubetrain.jobspec import MPI_RUNTIME, RuntimeRef, TrainJobSpec
from tests.support import objects


def spec(launcher: str, runtime: str) -> TrainJobSpec:
    command = ("python", "train.py") if launcher == "mpi" else ("torchrun", "train.py")
    return TrainJobSpec(
        name="policy",
        command=command,
        launcher=launcher,
        num_nodes=2,
        procs_per_node=1,
        runtime=RuntimeRef(name=runtime),
    ).validate()


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("launcher", "runtime", "refusal"),
    [
        (
            "mpi",
            "torch-ddp-cpu",
            "runtime: torch-ddp-cpu has no mlPolicy.mpi, which --launcher mpi needs; use "
            f"--runtime {MPI_RUNTIME}",
        ),
        (
            "torchrun",
            MPI_RUNTIME,
            f"runtime: {MPI_RUNTIME} is an MPI runtime (mlPolicy.mpi), which sets no PET_* env "
            "for torchrun; add --launcher mpi",
        ),
    ],
)
def test_a_launcher_on_a_runtime_of_the_other_policy_creates_nothing(
    k8s, launcher, runtime, refusal
):
    if runtime == MPI_RUNTIME:
        k8s.emulator.create("clustertrainingruntimes", objects.shipped_runtime(MPI_RUNTIME))
    creates = k8s.emulator.count("create")
    backend = KubernetesBackend("trainer", BackendOptions("default"), k8s.api_client)
    with pytest.raises(InvalidInput) as refused:
        backend.launch(spec(launcher, runtime))
    assert str(refused.value).startswith(refusal)
    assert "\n" not in str(refused.value)
    assert k8s.emulator.count("create") == creates


def test_each_launcher_on_its_own_runtime_is_created(k8s):
    k8s.emulator.create("clustertrainingruntimes", objects.shipped_runtime(MPI_RUNTIME))
    backend = KubernetesBackend("trainer", BackendOptions("default"), k8s.api_client)
    for launcher, runtime in (("torchrun", "torch-ddp-cpu"), ("mpi", MPI_RUNTIME)):
        name = backend.launch(spec(launcher, runtime))
        backend.delete(name)


@pytest.mark.bad_input
@pytest.mark.parametrize("backend", ["job", "pytorchjob"])
def test_launch_refuses_mpi_on_job_and_pytorchjob_before_reading_a_cluster(
    backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Before the kubeconfig is read or a dataset staged: this one names no cluster at all."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    request = LaunchRequest(
        launcher="mpi", procs_per_node=2, training=TrainingOptions(data_dir=str(tmp_path))
    )
    with pytest.raises(InvalidInput, match=r"^launcher: mpi is not run by backend"):
        launch(request, backend, BackendOptions("default"))
