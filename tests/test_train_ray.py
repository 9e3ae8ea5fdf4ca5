"""Our trainer as a Ray Train program (``python -m kubetrain.train.ray``): a real Ray head on
127.0.0.1 and ``JobSubmissionClient`` jobs that train 2 workers, publish our manifest/LATEST
checkpoints, resume, and leave Ray's own record (read with ``ray.train.Result.from_path``);
plus the option checks, the failure line and the pieces that need no cluster."""

from __future__ import annotations

import os
import pickle
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch.distributed as dist

from kubetrain.artifacts.checkpoint import latest_name
from kubetrain.components.collect_checkpoint.collect import collect_checkpoint
from kubetrain.errors import InvalidInput, KubetrainError
from kubetrain.progress import parse_record
from kubetrain.train import distributed
from kubetrain.train import ray as ray_program
from kubetrain.train.deepspeed_config import MICRO_BATCH
from kubetrain.train.options import parse_options
from kubetrain.train.progress import SilentReporter
from kubetrain.train.trainer import run
from tests.support.processes import descendants
from tests.test_train import EPOCH_LINE

#: The ports a head would otherwise take at fixed defaults, each given a free one, so that
#: this cluster runs beside others on the machine (xdist workers, other suites).
PORT_FLAGS = (
    "--port", "--dashboard-port", "--ray-client-server-port", "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port",
    "--node-manager-port", "--object-manager-port",
)  # fmt: skip
REPO = Path(__file__).resolve().parents[1]
HEAD_START_SECONDS = 180
JOB_SECONDS = 300


@dataclass(frozen=True)
class Head:
    address: str  # the dashboard's, which JobSubmissionClient takes

    def submit(self, name: str, args: list[str], cwd: Path = REPO) -> tuple[str, int | None, str]:
        """Run ``cd CWD && python -m kubetrain.train.ray ARGS`` as a Ray job to its end (the
        shape of a RayJob's entrypoint): its status, the driver's exit code and its log (the
        driver's output)."""
        from ray.job_submission import JobStatus, JobSubmissionClient

        client = JobSubmissionClient(self.address)
        command = shlex.join([sys.executable, "-m", "kubetrain.train.ray", *args])
        entrypoint = f"cd {shlex.quote(str(cwd))} && {command}"
        job = client.submit_job(
            entrypoint=entrypoint, submission_id=f"{name}-{uuid.uuid4().hex[:6]}"
        )
        deadline = time.monotonic() + JOB_SECONDS
        while not (status := client.get_job_status(job)).is_terminal():
            assert time.monotonic() < deadline, client.get_job_logs(job)
            time.sleep(0.5)
        info = client.get_job_info(job)
        assert status != JobStatus.STOPPED
        return str(status), info.driver_exit_code, client.get_job_logs(job)


@pytest.fixture(scope="module")
def ray_head(
    free_port: Callable[[], int], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Head]:
    """A Ray head on 127.0.0.1 with 2 CPUs, its own temp folder (short: Ray's socket paths must
    stay under 107 characters) and ports, token authentication off for it and for this
    process's client; stopped by killing its process tree (never `ray stop`, which stops
    every Ray of the user on the machine)."""
    temp = Path(f"/tmp/kt-ray-{uuid.uuid4().hex[:8]}")
    ports = {flag: free_port() for flag in PORT_FLAGS}
    command = [
        str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
        "--node-ip-address", "127.0.0.1", "--num-cpus", "2", "--disable-usage-stats",
        "--temp-dir", str(temp), "--dashboard-host", "127.0.0.1",
        "--min-worker-port", "0", "--max-worker-port", "0",  # workers: ports the OS picks
        *(part for flag, port in ports.items() for part in (flag, str(port))),
    ]  # fmt: skip
    log = tmp_path_factory.mktemp("ray-head") / "head.log"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_AUTH_MODE", "disabled")
        patch.delenv("RAY_ADDRESS", raising=False)
        with log.open("wb") as output:
            head = subprocess.Popen(
                command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            address = f"http://127.0.0.1:{ports['--dashboard-port']}"
            _wait_for_jobs_api(address, head, log)
            yield Head(address)
        finally:
            _kill_tree(head)
            shutil.rmtree(temp, ignore_errors=True)


#: What `ray start --block` prints once every process of the head runs: the job API answers
#: before that, and refuses a job until the head's agent runs ("No available agent").
HEAD_STARTED = b"Ray runtime started."


def _wait_for_jobs_api(address: str, head: subprocess.Popen[bytes], log: Path) -> None:
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + HEAD_START_SECONDS
    while True:
        assert head.poll() is None, log.read_text()
        try:
            if HEAD_STARTED in log.read_bytes():
                JobSubmissionClient(address).list_jobs()
                return
        except ConnectionError:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.5)


def _kill_tree(head: subprocess.Popen[bytes]) -> None:
    """SIGKILL the head and every process below it, listed before any is killed (a killed
    parent's children are reparented out of its tree)."""
    for _ in range(2):
        for pid in [head.pid, *descendants(head.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    head.wait()


def train_args(data: Path, checkpoints: Path, *extra: str) -> list[str]:
    """Two workers, few steps: a cluster test pays for Ray, not for training."""
    return ["--data", str(data), "--checkpoint-dir", str(checkpoints), "--num-workers", "2",
            "--batch-size", "128", *extra]  # fmt: skip


def test_a_ray_job_trains_publishes_resumes_and_reports_to_ray(
    ray_head: Head, digits_dir: Path, tmp_path: Path
) -> None:
    import ray.train

    checkpoints = tmp_path / "checkpoints"
    status, code, log = ray_head.submit(
        "first", train_args(digits_dir, checkpoints, "--epochs", "1")
    )
    assert (status, code) == ("SUCCEEDED", 0), log
    lines = log.splitlines()
    epochs = [EPOCH_LINE.fullmatch(line) for line in lines if line.startswith("epoch ")]
    assert len(epochs) == 1 and all(epochs), log  # rank 0's line, unprefixed, once
    assert epochs[0].group(1, 2) == ("1", "1")
    steps = int(epochs[0][3])
    records = [parse_record(line) for line in lines if line.startswith("kubetrain-progress ")]
    assert records and all(records), log
    assert records[-1].batch == records[-1].batches and records[-1].step == steps
    first = checkpoints / "epoch-000001"
    assert f"training complete: epoch 1 step {steps} checkpoint {first}" in lines
    assert latest_name(checkpoints) == "epoch-000001"

    # Ray's record names the checkpoint: its folder is a second name of our files
    result = ray.train.Result.from_path(str(checkpoints / ray_program.RAY_RUN))
    reported = Path(result.checkpoint.path)
    assert reported.parent == checkpoints / ray_program.RAY_RUN
    assert re.fullmatch(r"checkpoint_epoch-000001_[\d_.-]+", reported.name), reported
    assert result.metrics["checkpoint"] == "epoch-000001" and result.metrics["step"] == steps
    for name in ("manifest.json", "model.safetensors", "optimizer.pt"):
        assert (reported / name).stat().st_ino == (first / name).stat().st_ino

    collected = collect_checkpoint(str(checkpoints), str(tmp_path / "model"))
    assert (collected.card["source_checkpoint"], collected.card["epoch"]) == (str(first), 1)

    status, code, log = ray_head.submit(
        "resume", train_args(digits_dir, checkpoints, "--epochs", "2")
    )
    assert (status, code) == ("SUCCEEDED", 0), log
    lines = log.splitlines()
    assert f"resumed epoch 1 at world size 2: step {steps} from {first}" in lines
    assert [line.split()[1] for line in lines if line.startswith("epoch ")] == ["2/2"]
    assert latest_name(checkpoints) == "epoch-000002"
    result = ray.train.Result.from_path(str(checkpoints / ray_program.RAY_RUN))
    names = [Path(checkpoint.path).name for checkpoint, _ in result.best_checkpoints]
    assert [name.split("_")[1] for name in names] == ["epoch-000001", "epoch-000002"]
    assert Path(result.checkpoint.path).name == names[-1]


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
        "Ray Train worker 1 failed: RuntimeError: The actor died unexpectedly."
    )
