"""The rayjob backend end to end on the emulated cluster with the fake KubeRay v1.7.0 operator
(tests/support/fake_kuberay.py), whose head, worker and submitter are real local Ray processes:
a user's Ray Train script (a ``TorchTrainer`` of 2 gloo workers reporting a checkpoint, as seed
004 writes one) goes through `kubetrain launch --backend rayjob`, `wait` (the driver's output,
from the submitter pod), `logs`, `collect` of the checkpoint Ray Train wrote under the job's
KUBETRAIN_CHECKPOINT_DIR, and `delete`, after which no Ray process of the job is left."""

from __future__ import annotations

import time
from pathlib import Path

from safetensors.torch import load_file

from kubetrain.cli import main as kubetrain_main
from tests.test_fake_kuberay import kuberay_cluster, ray_processes  # noqa: F401 (the fixture)

#: A user's Ray Train program: the storage path is the job's checkpoint folder (absolute: a
#: relative one lands in Ray's ephemeral session folder), 2 workers on gloo, one epoch of a
#: linear model, rank 0 reports a checkpoint holding the model's state dict.
TRAIN = """
import os, tempfile
import torch
import ray.train
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer, prepare_model


def loop(config):
    model = prepare_model(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 4)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    rank = ray.train.get_context().get_world_rank()
    size = ray.train.get_context().get_world_size()
    print(f"worker {rank} of {size} epoch 1 loss {loss.item():.4f}")
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = None
        if rank == 0:
            state = getattr(model, "module", model).state_dict()
            torch.save(state, os.path.join(folder, "model.pt"))
            checkpoint = Checkpoint.from_directory(folder)
        ray.train.report({"loss": loss.item()}, checkpoint=checkpoint)


trainer = TorchTrainer(
    loop,
    scaling_config=ScalingConfig(num_workers=2),
    run_config=RunConfig(name="linear", storage_path=os.environ["KUBETRAIN_CHECKPOINT_DIR"]),
)
result = trainer.fit()
print("DRIVER-RESULT", result.checkpoint.path)
"""


def test_a_ray_train_script_runs_through_launch_wait_logs_collect_delete(
    kuberay_cluster,  # noqa: F811
    tmp_path,
    capsys,
):
    script, checkpoints = tmp_path / "train.py", tmp_path / "checkpoints"
    script.write_text(TRAIN)
    emulator, operator = kuberay_cluster.emulator, kuberay_cluster.operator
    launch = ["launch", "--backend", "rayjob", "--name", "ray-e2e", "--nodes", "1"]
    placement = ["--procs-per-node", "2", "--checkpoint-dir", str(checkpoints)]
    assert kubetrain_main([*launch, *placement, "--", "python", str(script)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "ray-e2e"

    assert kubetrain_main(["wait", "--backend", "rayjob", "ray-e2e", "--timeout", "240"]) == 0
    out = capsys.readouterr().out.splitlines()
    (result,) = [line for line in out if line.startswith("DRIVER-RESULT")]
    assert any("worker 0 of 2 epoch 1 loss" in line for line in out), out
    assert any("worker 1 of 2 epoch 1 loss" in line for line in out), out
    assert out[-1].startswith("job ray-e2e Complete"), out[-3:]
    checkpoint = Path(result.split()[1])
    assert checkpoint.parent == checkpoints / "linear" and (checkpoint / "model.pt").is_file()

    assert kubetrain_main(["logs", "--backend", "rayjob", "ray-e2e"]) == 0
    assert result in capsys.readouterr().out.splitlines()

    model = tmp_path / "model"
    collect = ["collect", "--checkpoint-dir", str(checkpoints), "--output", str(model)]
    assert kubetrain_main(collect) == 0
    assert sorted(load_file(model / "model.safetensors")) == ["bias", "weight"]

    cluster = emulator.get("rayjobs", "ray-e2e")["status"]["rayClusterName"]
    assert emulator.get("rayclusters", cluster) is not None, "within its 60 s TTL"
    assert ray_processes(operator.temp_dirs), "the cluster runs until deleted"
    assert kubetrain_main(["delete", "--backend", "rayjob", "ray-e2e"]) == 0
    deadline = time.monotonic() + 30
    while ray_processes(operator.temp_dirs) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray_processes(operator.temp_dirs) == [], "delete leaves no Ray process"
    assert emulator.get("rayjobs", "ray-e2e") is None
    assert emulator.get("rayclusters", cluster) is None
    assert emulator.names("pods") == set()
