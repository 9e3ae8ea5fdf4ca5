"""The bugs a deliberate-bug audit planted that `make test` missed (issue 28): one test each,
each seen to fail with its bug planted.

* the local supervisor's own stop path leaving torchrun's workers in their sessions;
* a node ended by SIGTERM (exit 143: an eviction, a preemption) read as Complete;
* the evaluate gate's ``>=`` at its boundary: accuracy exactly equal to the threshold;
* ``DistributedSampler.set_epoch`` dropped: every epoch in the same order;
* every rank writing the DDP checkpoint payload, not rank 0 alone.
"""

from __future__ import annotations

import json
import math
import os
import signal
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from torch import nn
from torch.utils.data import DistributedSampler

from kubetrain.artifacts import datasets
from kubetrain.artifacts.checkpoint import latest_checkpoint, read_manifest
from kubetrain.artifacts.checkpoint_manifest import MODEL_FILE, OPTIMIZER_FILE
from kubetrain.backends.base import FAILED
from kubetrain.backends.local.backend import LocalBackend
from kubetrain.backends.local.processes import JOB_ID_ENV
from kubetrain.jobspec import TrainJobSpec
from tests.support import objects
from tests.support.processes import kubetrain_in_process, process_alive, supervisor_pid
from tests.test_kubernetes_backend import make_spec, node_pod, set_container


def write_script(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not after {timeout:g}s: {what}")
        time.sleep(0.05)
    return value


# --- (a) the supervisor's own stop path --------------------------------------------------------


def job_processes(job_id: str) -> list[psutil.Process]:
    """Every live process carrying the local job's identity in its environment, read here from
    /proc (not through the backend's own sweep, which is what is under test)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(JOB_ID_ENV) == job_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    return found


def test_a_failed_node_makes_the_supervisor_stop_the_other_nodes_workers_too(
    local_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches: the supervisor's own failure path (a node fails, the others are stopped)
    signalling only the node processes, torchrun, so the workers torchrun started in sessions
    of their own outlive the job. Every other test of this went through `kubetrain delete`,
    whose sweep of the job's processes hid it: here nothing but the supervisor stops them."""
    write_script(
        tmp_path,
        "worker.py",
        """
        import os, sys, time
        from pathlib import Path
        node, local = os.environ["PET_NODE_RANK"], os.environ["LOCAL_RANK"]
        Path(f"pid-{node}-{local}.tmp").write_text(str(os.getpid()))
        os.replace(f"pid-{node}-{local}.tmp", f"pid-{node}-{local}")
        if node == "1":  # fails once the test has seen every worker
            while not Path("go").exists():
                time.sleep(0.05)
            sys.exit(3)
        time.sleep(600)
        """,
    )
    monkeypatch.chdir(tmp_path)
    backend = LocalBackend()
    backend.launch(
        TrainJobSpec(
            name="one-fails", command=("torchrun", "worker.py"), num_nodes=2, procs_per_node=2
        )
    )
    job_id = json.loads((local_root / "one-fails" / "job.json").read_text())["id"]
    try:
        wait_for(lambda: len(list(tmp_path.glob("pid-*-?"))) == 4, 60, "4 workers started")
        workers = {p.name: int(p.read_text()) for p in tmp_path.glob("pid-*-?")}
        node_0 = backend.status("one-fails").nodes[0].pid
        node_0_workers = [workers["pid-0-0"], workers["pid-0-1"]]
        # the premise: a signal to node 0's process group would not reach its workers
        assert all(os.getsid(pid) != os.getsid(node_0) for pid in node_0_workers)
        supervisor = supervisor_pid(local_root / "one-fails")
        (tmp_path / "go").touch()

        status = backend.wait("one-fails", timeout=60)
        assert (status.state, status.failed_rank) == (FAILED, 1), status.message
        everything = [supervisor, node_0, *workers.values()]
        deadline = time.monotonic() + 5  # the supervisor exits right after recording the end
        while any(map(process_alive, everything)) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = {pid: psutil.Process(pid).cmdline() for pid in everything if process_alive(pid)}
        assert left == {}, "the supervisor left these running"
        assert job_processes(job_id) == []
    finally:
        for proc in job_processes(job_id):  # the test's own cleanup should the product fail
            proc.kill()


# --- (b) a node ended by SIGTERM (exit 143) ------------------------------------------------


@pytest.mark.parametrize("ending", ["exits 143", "dies of SIGTERM"])
def test_a_local_node_ended_by_sigterm_fails_the_wait_with_143(
    local_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], ending: str
) -> None:
    """Catches: a node that ended on SIGTERM (exit code 143, or killed by the signal: how an
    evicted or preempted node ends) read as a clean stop, the job Complete, while the other
    node exited 0."""
    end = "sys.exit(143)" if ending == "exits 143" else "os.kill(os.getpid(), signal.SIGTERM)"
    script = (
        "import os, signal, sys, time\n"
        "if os.environ['PET_NODE_RANK'] == '1':\n"
        "    time.sleep(0.3)  # node 0 has exited 0 by then\n"
        f"    {end}\n"
    )
    backend = LocalBackend(local_root)
    backend.launch(TrainJobSpec(name="evicted", command=("python", "-c", script), num_nodes=2))
    code, _, err = kubetrain_in_process(
        ["wait", "--backend", "local", "--timeout", "60", "evicted"], capsys
    )
    assert code == 143, err
    assert "job evicted failed" in err
    status = backend.status("evicted")
    assert (status.state, status.failed_rank) == (FAILED, 1)
    assert status.nodes[0].exit_code == 0
    assert status.nodes[1].exit_code in (143, -signal.SIGTERM)


@pytest.mark.parametrize(
    ("kind", "resource", "reason"),
    [("trainer", "trainjobs", "FailedJobs"), ("job", "jobs", "BackoffLimitExceeded")],
)
def test_a_cluster_node_evicted_with_exit_143_fails_the_wait_with_143(
    kubeconfig, capsys: pytest.CaptureFixture[str], kind: str, resource: str, reason: str
) -> None:
    """Catches: a node pod whose container ended with 143 (the kubelet's SIGTERM: eviction,
    preemption) and a job whose Failed condition says so, read as Complete or as a failure
    without its code; the other node exited 0. Both the kinds whose ``JobKind.state`` reads a
    Failed condition named so (kinds.py), through wait.py's decision and `kubetrain wait`."""
    emulator, backend = kubeconfig.emulator, kubeconfig.backend(kind)
    backend.launch(make_spec())
    done, evicted = (node_pod(emulator, "demo", index, kind=kind) for index in (0, 1))
    set_container(emulator, done, objects.terminated(0), "Succeeded")
    set_container(emulator, evicted, objects.terminated(143), "Failed")
    emulator.patch_status(
        resource, "demo", {"conditions": [objects.condition("Failed", reason=reason)]}
    )
    code, _, err = kubetrain_in_process(
        ["wait", "--backend", kind, "--namespace", "default", "--timeout", "60", "demo"], capsys
    )
    assert code == 143, err
    assert f"job demo failed ({reason})" in err
    status = backend.status("demo")
    assert (status.state, status.failed_rank) == (FAILED, 1)
    assert [node.exit_code for node in status.nodes] == [0, 143]


# --- (c) the evaluate gate at its boundary ----------------------------------------------------


def test_accuracy_exactly_at_the_threshold_passes_every_face_of_the_gate(
    digits_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Catches: the gate's ``>=`` turned into ``>`` on any face that decides it. `kubetrain
    evaluate --help` promises exit 0 "if accuracy >= --threshold" and `--threshold` "pass when
    --metric is at least this", `--below` "pass when --metric is below this"; the README: "pass
    at or above X", "pass under X". So accuracy equal to the threshold passes (Evaluation.passed,
    the CLI's exit code, --json and output parameter, the KFP component's ``passed`` and report,
    promotion_gate after it, your own program's metric) and equal to --below does not."""
    from kubetrain.components.collect_checkpoint.collect import collect_checkpoint
    from kubetrain.components.evaluate_model.evaluate import evaluate_model
    from kubetrain.components.evaluate_model.report import accuracy_verdict
    from kubetrain.components.promote_model.component import promotion_gate
    from kubetrain.train.__main__ import main as train

    checkpoints, model = tmp_path / "ckpt", tmp_path / "model"
    argv = ["--data", str(digits_dir), "--epochs", "1", "--checkpoint-dir", str(checkpoints)]
    assert train(argv) == 0
    collect_checkpoint(str(checkpoints), str(model))
    capsys.readouterr()
    accuracy = evaluate_model(str(model), str(digits_dir), threshold=0.0).accuracy
    assert 0 < accuracy < 1
    assert evaluate_model(str(model), str(digits_dir), threshold=accuracy).passed
    verdict = accuracy_verdict({"accuracy": accuracy, "threshold": accuracy})
    assert verdict.passed and "≥ threshold" in verdict.line()

    evaluate = ["evaluate", "--model", model, "--data", digits_dir]
    outputs = tmp_path / "outputs"
    at = [*evaluate, "--threshold", repr(accuracy), "--json", "--output-parameters", outputs]
    code, out, err = kubetrain_in_process(at, capsys)
    assert code == 0, out + err
    assert json.loads(out[: out.rindex("}") + 1])["passed"] is True
    assert (outputs / "passed").read_text() == "true"
    code, out, _ = kubetrain_in_process([*evaluate, "--below", repr(accuracy)], capsys)
    assert code == 3 and "below threshold" in out

    from kfp import dsl

    from kubetrain.components.evaluate_model.component import evaluate_model as component

    step = component.python_func(
        model=dsl.Model(uri=str(model)),
        dataset=dsl.Dataset(uri=str(digits_dir)),
        metrics=dsl.Metrics(uri=str(tmp_path / "metrics")),
        classification_metrics=dsl.ClassificationMetrics(uri=str(tmp_path / "classes")),
        report=dsl.HTML(uri=str(tmp_path / "report")),
        threshold=accuracy,
    )
    assert step.passed is True
    assert '<p class="verdict passed">passed: accuracy' in (tmp_path / "report").read_text()
    assert promotion_gate.python_func(step.passed, str(tmp_path / "registry")) is True

    program = ["--", "python", "-c", "import json, os; json.dump({'score': 0.5}, "
               "open(os.environ['KUBETRAIN_METRICS_FILE'], 'w'))"]  # fmt: skip
    ours = ["evaluate", "--model", model, "--metric", "score"]
    assert kubetrain_in_process([*ours, "--threshold", "0.5", *program], capsys)[0] == 0
    assert kubetrain_in_process([*ours, "--below", "0.5", *program], capsys)[0] == 3


# --- (d) DistributedSampler.set_epoch each epoch -------------------------------------------

#: The training samples' indices in the order the model saw them (``index_recorder``).
TRAINED_ON: list[int] = []


def indexed_digits(data_dir: str | None, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The digits split with each sample's index in its first pixel, so the model can tell
    which samples it is given (a ``--dataset`` callable)."""
    assert data_dir is not None
    x, y = datasets.load_split(data_dir, split)
    x = x.clone()
    x[:, 0, 0, 0] = torch.arange(len(x), dtype=x.dtype)
    return x, y


class IndexRecorder(nn.Module):
    """A linear classifier that notes, in training mode, the indices ``indexed_digits`` put in
    the samples it is given."""

    def __init__(self, sample_shape: list[int], num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(math.prod(sample_shape), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            TRAINED_ON.extend(x[:, 0, 0, 0].long().tolist())
        return self.linear(x.flatten(1))


def index_recorder(sample_shape: list[int], num_classes: int) -> nn.Module:
    return IndexRecorder(sample_shape, num_classes)


def test_each_epoch_trains_in_the_order_the_sampler_gives_for_that_epoch(
    digits_dir: Path, tmp_path: Path
) -> None:
    """Catches: ``DistributedSampler.set_epoch`` not called each epoch, so every epoch shuffles
    alike (epoch 0's order). The trainer's batches must be, epoch by epoch, what the sampler
    gives for that epoch with the run's seed, and differ between epochs."""
    from kubetrain.train.__main__ import main as train

    seed = 7
    TRAINED_ON.clear()
    argv = [
        "--dataset", "test_planted_bugs:indexed_digits", "--data", str(digits_dir),
        "--model", "test_planted_bugs:index_recorder", "--epochs", "2", "--seed", str(seed),
        "--checkpoint-dir", str(tmp_path / "ckpt"),
    ]  # fmt: skip
    assert train(argv) == 0
    samples = len(datasets.load_split(str(digits_dir), "train")[1])
    assert len(TRAINED_ON) == 2 * samples
    orders = [TRAINED_ON[:samples], TRAINED_ON[samples:]]
    for epoch, order in enumerate(orders, start=1):
        sampler = DistributedSampler(range(samples), num_replicas=1, rank=0, seed=seed)
        sampler.set_epoch(epoch)
        assert order == list(sampler), f"epoch {epoch} is not the sampler's order for it"
    assert orders[0] != orders[1]


# --- (e) rank 0 alone writes the DDP payload --------------------------------------------------

#: Runs our trainer with every rank but 0 unable to write a byte to any file: RLIMIT_FSIZE 0,
#: soft and hard (no unprivileged process can raise it again), enforced by the kernel on every
#: write whatever makes it (safetensors' Rust, torch.save's C++, Python). SIGXFSZ ignored, a
#: write past the limit fails with EFBIG; the probe checks that the limit holds here.
NO_WRITES_BUT_RANK_0 = """\
import errno, os, resource, signal, sys, tempfile
if os.environ["RANK"] != "0":
    tempfile.gettempdir()  # found (by writing a probe file) before the limit; torch asks
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    probe = os.memfd_create("probe")  # a regular file, in memory
    try:
        os.write(probe, b"x")
    except OSError as exc:
        assert exc.errno == errno.EFBIG, exc
    else:
        sys.exit("RLIMIT_FSIZE does not stop writes here")
    finally:
        os.close(probe)
from kubetrain.train.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_only_rank_0_writes_the_ddp_checkpoint_payload(
    digits_dir: Path, tmp_path: Path, run_python, free_port
) -> None:
    """Catches: every rank writing the DDP payload (model.safetensors, optimizer.pt) into the
    checkpoint folder being staged, not rank 0 alone: the replicas are equal, so the files
    come out the same, but N writers race on one file. Two real processes under torchrun, rank
    1 unable to write to any file (``NO_WRITES_BUT_RANK_0``): a write of its fails the run."""
    trainer = write_script(tmp_path, "rank_0_writes.py", NO_WRITES_BUT_RANK_0)
    checkpoints = tmp_path / "ckpt"
    torchrun = [
        "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
        str(trainer), "--data", str(digits_dir), "--epochs", "1",
        "--checkpoint-dir", str(checkpoints),
    ]  # fmt: skip
    trained = run_python(torchrun)
    refused = [line for line in trained.stderr.splitlines() if "kubetrain.train: error" in line]
    assert refused == [], "a rank other than 0 wrote to a file"
    assert trained.returncode == 0, trained.stderr[-3000:]
    newest = latest_checkpoint(checkpoints)
    assert read_manifest(newest)["world_size"] == 2
    assert (newest / MODEL_FILE).stat().st_size > 0 and (newest / OPTIMIZER_FILE).is_file()
