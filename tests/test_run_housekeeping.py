"""`kubetrain run`'s local job folder (issue 18 (3)): removed once collect has published the
model unless --keep-job, kept with its logs when the run fails (the line that ends the run says
where), and a timed-out wait leaves no process of the job running."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kubetrain.backends.base import FAILED
from kubetrain.backends.local.backend import LocalBackend
from kubetrain.backends.local.listing import list_local_jobs
from kubetrain.backends.local.processes import JOB_ID_ENV, marked_processes
from kubetrain.cli.run import job_folder_outcome
from kubetrain.jobspec import TrainJobSpec
from tests.support.processes import process_alive
from tests.test_pipeline import run_pipeline


def test_a_successful_run_removes_its_job_folder_and_keeps_the_model(local_root, tmp_path):
    result = run_pipeline(tmp_path, "--nodes", "1", "--epochs", "1", "--threshold", "0")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    removed = re.search(r"^removed the job's folder (\S+) \(--keep-job keeps it\)$",
                        result.stdout, re.MULTILINE)  # fmt: skip
    assert removed, result.stdout
    assert Path(removed.group(1)).parent == local_root
    assert list(local_root.iterdir()) == [] and list_local_jobs() == []
    model = Path(re.search(r"^model\s+(\S+)", result.stdout, re.MULTILINE).group(1))
    assert (model / "model.safetensors").is_file()  # collect's copy, not the job's checkpoint
    assert result.stdout.splitlines()[-1].startswith("promoted ")


@pytest.mark.parametrize("keep", [True, False])
def test_keep_job_keeps_the_folder_of_a_finished_job(local_root, keep):
    backend = LocalBackend()
    backend.launch(TrainJobSpec(name="done", command=("true",)))
    backend.wait("done", timeout=30)
    outcome = job_folder_outcome("done", keep)
    assert outcome == (
        f"kept the job's folder {local_root / 'done'}: `kubetrain delete done` removes it"
        if keep
        else f"removed the job's folder {local_root / 'done'} (--keep-job keeps it)"
    )
    assert [row.name for row in list_local_jobs()] == (["done"] if keep else [])


def test_a_timed_out_run_stops_its_job_and_keeps_its_logs(local_root, tmp_path):
    """The wait step's timeout stops the job's whole process tree; the exit handler's delete
    keeps the folder (``KEEP_FILES_ENV``); the run's last line names it, and `kubetrain list`
    shows the job."""
    result = run_pipeline(tmp_path, "--timeout", "2", "--keep-checkpoints", "0")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    (job_dir,) = local_root.iterdir()
    job = job_dir.name
    last_line = result.stderr.splitlines()[-1]
    assert last_line.startswith(
        f"kubetrain run: error: step wait-trainjob failed: timed out after 2s waiting for job {job}"
    ), last_line
    assert f"stopped its processes (its logs stay in {job_dir}); raise --timeout" in last_line
    assert last_line.endswith(f"; to see more: kubetrain logs {job}")
    assert result.stdout.splitlines()[-1] == (
        f"the job's node logs and checkpoints stay in {job_dir}; `kubetrain delete {job}` "
        "removes them"
    )
    assert (job_dir / "node-0.log").is_file() and (job_dir / "node-1.log").is_file()
    job_id = json.loads((job_dir / "job.json").read_text())["id"]
    assert marked_processes(JOB_ID_ENV, job_id) == []
    status = LocalBackend().status(job)
    assert status.state == FAILED
    assert [pid for pid in (node.pid for node in status.nodes) if pid and process_alive(pid)] == []
    assert [(row.name, row.state) for row in list_local_jobs()] == [(job, FAILED)]
