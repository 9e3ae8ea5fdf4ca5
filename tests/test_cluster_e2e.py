"""End to end on an emulated cluster: the steps launch a TrainJob (or an Indexed Job), a fake
Trainer runs exactly what was submitted with real torchrun processes, wait streams rank 0's
log, and the model collected from the checkpoints passes evaluation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kubetrain.cli import main as kubetrain_main
from kubetrain.components.collect_checkpoint.collect import collect_checkpoint
from kubetrain.components.evaluate_model.evaluate import evaluate_model
from kubetrain.components.launch_trainjob.launch import LaunchRequest, TrainingOptions, launch
from kubetrain.components.wait_trainjob.wait import JobFailed, wait_for_job
from kubetrain.progress import parse_record
from tests.support.fake_trainer import FakeTrainer


@pytest.fixture
def trainer_cluster(k8s, tmp_path, monkeypatch) -> Iterator:
    """The emulated cluster with a fake Trainer, reached the way the steps reach a cluster:
    through KUBECONFIG."""
    monkeypatch.setenv("KUBECONFIG", str(k8s.emulator.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with FakeTrainer(k8s.emulator, tmp_path / "nodes") as trainer:
        yield k8s
    assert trainer.errors == []


def check_model(checkpoint_dir: Path, digits_dir: Path, tmp_path: Path) -> None:
    collect_checkpoint(str(checkpoint_dir), str(tmp_path / "model"))
    evaluation = evaluate_model(str(tmp_path / "model"), str(digits_dir), threshold=0.95)
    assert evaluation.accuracy >= 0.95 and evaluation.passed


def test_trainer_backend_trains_two_nodes(trainer_cluster, digits_dir, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    launched = launch(
        LaunchRequest(
            TrainingOptions(data_dir=str(digits_dir), checkpoint_dir=str(checkpoints)),
            name="digits-ddp",
            nodes=2,
        ),
        backend="trainer",
    )
    assert launched.job_name == "digits-ddp"
    trainjob = trainer_cluster.emulator.get("trainjobs", "digits-ddp")
    assert trainjob["spec"]["trainer"]["numNodes"] == 2
    lines: list[str] = []
    result = wait_for_job("digits-ddp", backend="trainer", on_log_line=lines.append)
    assert result.state == "Complete"
    records = [record for line in lines if (record := parse_record(line)) is not None]
    said = [line for line in lines if parse_record(line) is None]
    assert said[0].startswith("epoch 1/10") and said[-1].startswith("training complete")
    # rank 0's progress records come through the pod log, for wait's live display (issue 18)
    assert records and (records[-1].epoch, records[-1].epochs) == (10, 10)
    assert records[-1].batch == records[-1].batches
    assert trainer_cluster.emulator.count("get", "trainjobs") <= 2, "launch's check, not polling"
    check_model(checkpoints, digits_dir, tmp_path)


def test_job_backend_trains_two_nodes_from_the_cli(trainer_cluster, digits_dir, tmp_path, capsys):
    checkpoints = tmp_path / "checkpoints"
    launch = ["launch", "--backend", "job", "--name", "digits-job", "--nodes", "2"]
    data = ["--data", str(digits_dir), "--checkpoint-dir", str(checkpoints)]
    assert kubetrain_main([*launch, *data]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "digits-job"
    assert trainer_cluster.emulator.names("services") == {"digits-job"}
    assert kubetrain_main(["wait", "--backend", "job", "--namespace", "default", "digits-job"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("epoch 1/10") and out[-1].startswith("job digits-job Complete")
    check_model(checkpoints, digits_dir, tmp_path)
    assert kubetrain_main(["delete", "--backend", "job", "digits-job"]) == 0
    emulator = trainer_cluster.emulator
    assert emulator.names("jobs") == emulator.names("services") == emulator.names("pods") == set()


@pytest.mark.parametrize("backend", ["trainer", "job"])
def test_a_failing_node_fails_wait_with_its_exit_code_and_last_lines(trainer_cluster, backend):
    # Node 1 fails a second after starting, so that under load node 0 has printed its line
    # before the failed job's remaining pods are stopped.
    program = (
        "import os, sys, time; rank = os.environ['PET_NODE_RANK']; "
        "print('node', rank, 'of', os.environ['PET_NNODES']); "
        "time.sleep(rank == '1'); sys.exit(3 if rank == '1' else 0)"
    )
    name = f"fails-{backend}"
    launch(LaunchRequest(command=("python", "-c", program), name=name), backend=backend)
    lines: list[str] = []
    with pytest.raises(JobFailed) as failed:
        wait_for_job(name, backend=backend, on_log_line=lines.append)
    assert failed.value.exit_code == 3
    assert lines == ["node 0 of 2"]
    assert failed.value.log_tail == ["last 1 lines of node 1:", "node 1 of 2"]
    assert "\n" not in str(failed.value)
