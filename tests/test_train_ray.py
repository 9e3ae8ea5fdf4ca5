"""Our trainer as a Ray Train program (``python -m kubetrain.train.ray``): the option checks,
the failure line and the pieces that need no cluster. The program's real run (a Ray cluster,
TorchTrainer workers, our manifest/LATEST checkpoints reported to Ray and read back with
``ray.train.Result.from_path``) is tests/test_ray_run.py's `kubetrain run --launcher ray`; a
Ray job resuming from our checkpoints is checked by hand (that module's docstring)."""

from __future__ import annotations

import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch.distributed as dist

from kubetrain.errors import InvalidInput, KubetrainError
from kubetrain.train import distributed
from kubetrain.train import ray as ray_program
from kubetrain.train.deepspeed_config import MICRO_BATCH
from kubetrain.train.options import parse_options
from kubetrain.train.progress import SilentReporter
from kubetrain.train.trainer import run

# --- no cluster needed ----------------------------------------------------------------------


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``main`` prints for ``argv`` (exit code 2; argparse's usage errors exit),
    before any Ray is reached."""
    try:
        code = ray_program.main(argv)
    except SystemExit as exit:
        code = exit.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ([], "the following arguments are required: --num-workers"),
        (["--num-workers", "0"], "--num-workers: 0 is below 1; pass 1 or more"),
        (["--num-workers", "2", "--use-gpu", "--device", "cpu"], "--device: cpu trains on"),
        (["--num-workers", "2", "--device", "cuda"], "--device: cuda needs a GPU"),
        (["--num-workers", "2", "--epochs", "0"], "--epochs: 0 is below 1"),
        (["--num-workers", "2"], "RAY_ADDRESS: is not set, and this program is a Ray job's"),
    ],
)
def test_bad_input_is_one_line_before_ray(
    extra: list[str],
    expected: str,
    digits_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    line = refusal(["--data", str(digits_dir), "--checkpoint-dir", str(tmp_path), *extra], capsys)
    assert line.startswith(f"kubetrain.train.ray: error: {expected}"), line
    assert not (tmp_path / ray_program.RAY_RUN).exists()


def test_deepspeed_batch_settings_count_the_ray_workers(digits_dir: Path, tmp_path: Path) -> None:
    """The driver has no WORLD_SIZE: DeepSpeed's batch settings are checked against
    --num-workers processes."""
    argv = [
        "--data", str(digits_dir), "--checkpoint-dir", str(tmp_path), "--strategy", "deepspeed",
        "--deepspeed-config", '{"train_batch_size": 64}', "--batch-size", "32",
    ]  # fmt: skip
    for workers, micro_batch in ((2, 32), (4, 16)):
        _, options = ray_program.parse([*argv, "--num-workers", str(workers)])
        assert options.deepspeed_config is not None
        assert options.deepspeed_config[MICRO_BATCH] == micro_batch == options.batch_size
    with pytest.raises(InvalidInput, match="train_batch_size"):
        ray_program.parse([*argv, "--num-workers", "3"])


def test_local_paths_are_made_absolute_for_the_workers(
    digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray Train runs each worker in a folder of its own: the driver's relative paths would
    name other folders there."""
    shutil.copytree(digits_dir, tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    args, options = ray_program.parse(
        ["--data", "data", "--checkpoint-dir", "ckpt", "--tensorboard-dir", "tb",
         "--num-workers", "1"]
    )  # fmt: skip
    assert (options.data, options.checkpoint_dir) == (
        str(tmp_path / "data"),
        str(tmp_path / "ckpt"),
    )
    assert options.tensorboard_dir == str(tmp_path / "tb")
    _, remote = ray_program.parse(
        ["--data", "data", "--checkpoint-dir", "s3://bucket/run", "--num-workers", "1"]
    )
    assert remote.checkpoint_dir == "s3://bucket/run"


def test_an_existing_process_group_is_joined_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray Train starts the group and sets torchrun's variables before our code runs: joining
    must not start a second one (torch refuses to: "trying to initialize the default process
    group twice")."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        group = dist.group.WORLD
        runtime = distributed.init_runtime("cpu")
        assert (runtime.rank, runtime.world_size, runtime.device.type) == (0, 1, "cpu")
        assert dist.group.WORLD is group
    finally:
        distributed.shutdown()


def test_the_trainer_tells_a_hook_each_epoch_and_its_checkpoint(
    digits_dir: Path, tmp_path: Path
) -> None:
    """What Ray's reports hang on: every epoch's record, with the checkpoint it wrote or None."""
    options = parse_options(
        ["--data", str(digits_dir), "--checkpoint-dir", str(tmp_path), "--epochs", "2",
         "--checkpoint-every", "2", "--tensorboard-dir", "", "--batch-size", "512"]
    )  # fmt: skip
    heard: list[tuple[int, str | None]] = []
    runtime = distributed.init_runtime("cpu")
    try:
        run(
            options,
            runtime,
            SilentReporter(),
            lambda record, saved: heard.append((record["epoch"], saved)),
        )
    finally:
        distributed.shutdown()
    assert heard == [(1, None), (2, str(tmp_path / "epoch-000002"))]


def test_a_checkpoint_is_published_for_ray_as_hard_links(tmp_path: Path) -> None:
    ours = tmp_path / "epoch-000003"
    (ours / "dcp").mkdir(parents=True)
    (ours / "manifest.json").write_text("{}")
    (ours / "dcp" / "__0_0.distcp").write_bytes(b"shard")
    names = [ray_program.publish_for_ray(str(ours), str(tmp_path)) for _ in range(2)]
    assert names[0] != names[1]  # a run started over never reuses a recorded folder's name
    for name in names:
        assert re.fullmatch(r"checkpoint_epoch-000003_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.\d{6}", name)
        published = tmp_path / ray_program.RAY_RUN / name
        for relative in ("manifest.json", "dcp/__0_0.distcp"):
            assert (published / relative).stat().st_ino == (ours / relative).stat().st_ino


def test_a_worker_failure_is_its_one_line_and_exit_code(tmp_path: Path) -> None:
    """What crosses to the driver: the trainer's own line for bad input (exit 2), and whether
    the worker failed only because another one died (the trainer raises that from gloo's
    error)."""
    own = ray_program.worker_failure(
        InvalidInput("--dataset", "x [4, 3] and y [5]", "fix it"), 1, str(tmp_path)
    )
    assert (str(own), own.exit_code, own.rank, own.lost_peer) == (
        "rank 1: --dataset: x [4, 3] and y [5]; fix it", 2, 1, False
    )  # fmt: skip
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:538] Connection closed by peer [::1]:4")
    try:
        raise KubetrainError("another process of this job was lost (gloo)") from gloo
    except KubetrainError as exc:
        consequence = ray_program.worker_failure(exc, 0, str(tmp_path))
    assert consequence.lost_peer and str(consequence).startswith("rank 0: another process")


def test_the_failure_shown_is_the_first_worker_that_failed_of_its_own_accord() -> None:
    from ray.train import WorkerGroupError

    lost = ray_program.WorkerFailure("rank 0: another process of this job was lost", 1, 0, True)
    cause = ray_program.WorkerFailure("rank 2: --dataset: bad", 2, 2, False)
    crossed = pickle.loads(pickle.dumps(cause))  # as Ray carries it to the driver
    assert (str(crossed), crossed.exit_code, crossed.rank, crossed.lost_peer) == (
        "rank 2: --dataset: bad", 2, 2, False
    )  # fmt: skip
    failures = {0: lost, 2: crossed, 3: ray_program.WorkerFailure("rank 3: x", 1, 3, False)}
    assert ray_program.job_failure(WorkerGroupError("...", failures)) is crossed
    died = WorkerGroupError("...", {1: RuntimeError("The actor died unexpectedly.\nmore")})
    assert str(ray_program.job_failure(died)) == (
        "Ray Train worker 1 failed: RuntimeError: The actor died unexpectedly; "
        + ray_program.SEE_RAY_LOGS
    )
