"""`kubetrain run --launcher ray` (issue 31, "Done when"): the whole pipeline, our trainer run as
a Ray Train program (``python -m kubetrain.train.ray``) on a local Ray cluster of a head and 2
worker nodes. It passes; rank 0's epoch lines reach the wait step once each, unprefixed; our
checkpoints are published in the manifest/LATEST layout and reported to Ray, whose own record
(``ray.train.Result.from_path``) names hard links of them; collect takes the newest; no Ray
process of the job is left; `kubetrain delete` removes the kept job.

Not in the suite, for time (a second Ray job costs a cluster start and a Ray Train run): a Ray
job resuming from our checkpoints (the same --checkpoint-dir trained again with more epochs:
"resumed epoch 1 at world size 2: step N from .../epoch-000001", only epoch 2's line, Ray's
record naming epoch-000001 and epoch-000002), checked by hand."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kubetrain.artifacts.checkpoint import latest_name
from kubetrain.backends.local import ray_engine
from kubetrain.backends.local.files import read_record
from kubetrain.progress import parse_record
from kubetrain.train import ray as ray_program
from tests.support.processes import run_kubetrain
from tests.test_ray_local import wait_for_no_process

pytest.importorskip("ray", reason="the local Ray engine needs kubetrain[ray]")

EPOCHS = 4
#: Rank 0's epoch line as `python -m kubetrain.train` prints it (the split scored is prep's
#: validation split).
EPOCH_LINE = re.compile(
    r"epoch (\d+)/(\d+) step (\d+) loss [\d.]+ train_accuracy [\d.]+ "
    r"validation_accuracy [\d.]+ samples/s [\d.]+"
)


def test_kubetrain_run_trains_our_trainer_on_a_local_ray_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray.train

    local_root = tmp_path / "jobs"
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(local_root))
    result = subprocess.run(
        [
            sys.executable, "-m", "kubetrain", "run", "--launcher", "ray", "--nodes", "2",
            "--epochs", str(EPOCHS), "--threshold", "0.9", "--output", str(tmp_path / "runs"),
            "--keep-job",  # the job's folder is looked at below
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert re.search(r"^accuracy 0\.\d{3} \(passed, threshold 0\.9\)$", out, re.MULTILINE), out
    job, checkpoints = re.search(
        r"launched (\S+); checkpoints in (\S+)$", out, re.MULTILINE
    ).groups()
    job_dir, checkpoints = local_root / job, Path(checkpoints)
    assert checkpoints == job_dir / "checkpoints"

    # rank 0's epoch lines, once each and unprefixed (not Ray's "(RayTrainWorker pid=...)")
    epoch_lines = [
        line.strip() for line in out.splitlines() if re.search(r"epoch \d+/\d+ step ", line)
    ]
    epochs = [EPOCH_LINE.fullmatch(line) for line in epoch_lines]
    assert all(epochs), epoch_lines
    assert [m.group(1, 2) for m in epochs] == [(str(n), str(EPOCHS)) for n in range(1, EPOCHS + 1)]
    steps = int(epochs[-1][3])
    # the driver's log (node 0's) holds rank 0's progress records, the last at the epoch's end
    driver = (job_dir / "node-0.log").read_text().splitlines()
    records = [parse_record(line) for line in driver if line.startswith("kubetrain-progress ")]
    assert records and all(records), driver
    assert (records[-1].batch, records[-1].step) == (records[-1].batches, steps)
    last = checkpoints / f"epoch-{EPOCHS:06d}"
    assert f"training complete: epoch {EPOCHS} step {steps} checkpoint {last}" in out
    assert latest_name(checkpoints) == last.name

    # Ray's record names the last checkpoint: its folder is a second name of our files
    reported = ray.train.Result.from_path(str(checkpoints / ray_program.RAY_RUN))
    folder = Path(reported.checkpoint.path)
    assert folder.parent == checkpoints / ray_program.RAY_RUN
    assert re.fullmatch(rf"checkpoint_{last.name}_[\d_.-]+", folder.name), folder
    assert (reported.metrics["checkpoint"], reported.metrics["step"]) == (last.name, steps)
    for name in ("manifest.json", "model.safetensors", "optimizer.pt"):
        assert (folder / name).stat().st_ino == (last / name).stat().st_ino, name
    collected = (
        r"^collect-checkpoint done in [\d.]+s: collected manifest\.json "
        rf"\(kubetrain, epoch {EPOCHS}\) sha256 [0-9a-f]{{64}}$"
    )
    assert re.search(collected, out, re.MULTILINE), out

    # the job ended whole: no process of its Ray cluster is left, its temp folder is gone
    job_id = read_record(job_dir / "job.json")["id"]
    temp_dir = read_record(job_dir / ray_engine.RECORD)["temp_dir"]
    assert not wait_for_no_process(job_id, temp_dir, 5.0)
    assert not Path(temp_dir).exists()
    deleted = run_kubetrain("delete", "--backend", "local", job)
    assert deleted.returncode == 0, deleted.stderr
    assert not job_dir.exists()
