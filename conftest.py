"""Shared fixtures: a small real dataset (sklearn digits) in the prepared-folder format, and an
emulated Kubernetes cluster with Kubeflow Trainer's CRDs for the cluster backends."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parent
# DeepSpeed's JIT-built ops (its CPU shm op) go where `make setup` built them, whatever HOME a
# test gives the processes it starts; else each new HOME builds them again (~30 s). Loading
# one runs `ninja` from PATH: the venv's, which built it (`make test` does not activate the
# venv; another ninja version, e.g. Debian's, takes the build for stale and rebuilds it).
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
# Counts the reliability tests and prints the figures the README quotes (`figures` fixture).
pytest_plugins = ("tests.support.reliability_figures",)


def write_digits(output_dir: Path, seed: int = 0) -> Path:
    """Digits as [N, 1, 8, 8], normalised with train statistics, split 80/20 with ``seed``."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from kubetrain.artifacts.datasets import write_dataset

    digits = load_digits()
    x = digits.images.astype(np.float32).reshape(-1, 1, 8, 8)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    mean, std = float(x_train.mean()), float(x_train.std())
    write_dataset(
        output_dir,
        {"train": ((x_train - mean) / std, y_train), "test": ((x_test - mean) / std, y_test)},
        classes=[str(i) for i in range(10)],
        mean=[mean],
        std=[std],
        provenance={"source": "sklearn:digits", "seed": seed},
    )
    return output_dir


@pytest.fixture
def local_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of its own for the local backend's jobs (``KUBETRAIN_LOCAL_ROOT``)."""
    root = tmp_path / "jobs"
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(root))
    return root


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared digits dataset folder, written once per test session."""
    return write_digits(tmp_path_factory.mktemp("data") / "digits")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_python(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` from the repo root: captured text, no inherited torchrun topology."""
    topology = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
    env = {key: value for key, value in os.environ.items() if key not in topology}
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="session")
def run_python() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a fresh Python process (real process boundaries: torchrun, SIGKILL, exit codes)."""
    return _run_python


@pytest.fixture(scope="session")
def free_port() -> Callable[[], int]:
    """A TCP port free right now, for torchrun's rendezvous."""
    return _free_port


@pytest.fixture(scope="session")
def trained_checkpoints(
    tmp_path_factory: pytest.TempPathFactory, digits_dir: Path
) -> dict[str, Path]:
    """Checkpoint folders of real trainer runs: ddp (world size 1, 2 epochs) and fsdp (torchrun,
    2 processes, 2 epochs), shared by the collect and evaluate tests, which only read them (a
    test that changes one copies it first). Trained once per test run: under pytest-xdist
    the first worker to ask trains them in a folder every worker of the run shares (named by
    the run's id, behind an ``flock``) and the others take them, instead of each training its
    own (3 x ~25 s of a suite that must stay under 15 minutes)."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id is None:  # one process: its own folder
        return _train_checkpoints(tmp_path_factory.mktemp("trained"), digits_dir)
    shared = tmp_path_factory.getbasetemp().parent / f"trained-{run_id}"
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not shared.is_dir():
            building = Path(f"{shared}.building")
            shutil.rmtree(building, ignore_errors=True)
            _train_checkpoints(building, digits_dir)
            building.rename(shared)  # whole, or not there
    return {"ddp": shared / "ddp", "fsdp": shared / "fsdp"}


def _train_checkpoints(root: Path, digits_dir: Path) -> dict[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    common = ["--data", str(digits_dir), "--epochs", "2"]
    ddp = _run_python(["-m", "kubetrain.train", *common, "--checkpoint-dir", str(root / "ddp")])
    assert ddp.returncode == 0, ddp.stderr
    fsdp = _run_python(
        [
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(_free_port()),
            "-m",
            "kubetrain.train",
            *common,
            "--strategy",
            "fsdp",
            "--checkpoint-dir",
            str(root / "fsdp"),
        ]
    )
    assert fsdp.returncode == 0, fsdp.stderr
    return {"ddp": root / "ddp", "fsdp": root / "fsdp"}


# ----------------------------------------------------------------------------------------------
# An emulated Kubernetes API server (tests.support) for the cluster backends.


@dataclass
class Cluster:
    """The emulator with Kubeflow Trainer's CRDs (the real v2.3 ones, enforced) and our
    default runtime, and a client configured for it (namespace ``default``)."""

    emulator: Any
    api_client: Any
    namespace: str = "default"

    def backend(self, kind: str = "trainer", **options: Any) -> Any:
        """A KubernetesBackend on this cluster; ``options`` are BackendOptions fields or
        KubernetesBackend keywords (grace periods, retry)."""
        from kubetrain.backends import BackendOptions
        from kubetrain.backends.kubernetes.backend import KubernetesBackend

        fields = {"namespace", "trainer_version", "on_cancel"}
        backend_options = BackendOptions(
            **{"namespace": self.namespace, **{k: v for k, v in options.items() if k in fields}}
        )
        keywords = {k: v for k, v in options.items() if k not in fields}
        return KubernetesBackend(kind, backend_options, self.api_client, **keywords)


@pytest.fixture
def k8s() -> Iterator[Cluster]:
    """A fresh emulated cluster per test (starting one takes milliseconds)."""
    from tests.support import KubeEmulator

    with KubeEmulator(namespace="default") as emulator:
        emulator.install_trainer()
        api_client = emulator.api_client()
        try:
            yield Cluster(emulator, api_client)
        finally:
            api_client.close()


@pytest.fixture
def kubeconfig(k8s: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    """``k8s``, with KUBECONFIG pointing at it: for the code that loads the kubeconfig itself
    (the KFP components, the CLI)."""
    monkeypatch.setenv("KUBECONFIG", str(k8s.emulator.write_kubeconfig(tmp_path / "config")))
    return k8s


@pytest.fixture(scope="module")
def s3(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A moto S3 server for the test module, with the module's ``BUCKET`` created."""
    from tests.support.s3_server import s3_server

    with s3_server() as server:
        server.create_bucket(request.module.BUCKET)
        yield server


@pytest.fixture
def s3_env(s3: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The server, its endpoint and keys in the environment as an S3 client reads them."""
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    return s3


@pytest.fixture
def no_hang(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that blocks (a FIFO or a device opened by mistake) after the module's
    ``HANG_SECONDS`` instead of hanging the suite; use it with ``usefixtures``."""
    import signal

    seconds = getattr(request.module, "HANG_SECONDS", 60)

    def hung(signum: int, frame: Any) -> None:
        raise TimeoutError(f"hung for {seconds} s: a FIFO or device was opened")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
