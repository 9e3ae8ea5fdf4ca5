"""Small reliability-by-construction cases of issue 28's hostile review: a failed `kubetrain
compile` leaves its output folder as it was, `kubetrain list` never blocks on a FIFO nor
breaks on one malformed record, and `kubetrain logs --node` outside the job's nodes is one
line, exit 2, on the local and the cluster backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kubetrain.backends.base import COMPLETE, RUNNING, JobStatus
from kubetrain.cli import compile as compile_cli
from kubetrain.cli import main
from kubetrain.jobspec import TrainJobSpec

IMAGE = "ghcr.io/example/trainer:1.0"
NODE_LINE = "--node: job {job} has 2 node(s), so no node {node}; give 0 to 1, or leave --node out"


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a folder)."""
    return {
        str(path.relative_to(root)): None if path.is_dir() else path.read_bytes()
        for path in sorted(root.rglob("*"))
    }


def _local_job(root: Path, name: str, status: dict | list, nodes: int = 2) -> Path:
    """A finished-looking job folder as launch and the supervisor write it."""
    job_dir = root / name
    job_dir.mkdir(parents=True)
    spec = TrainJobSpec(name=name, command=("true",), num_nodes=nodes).to_dict()
    (job_dir / "job.json").write_text(json.dumps({"spec": spec, "cwd": "/", "id": name}))
    (job_dir / "status.json").write_text(json.dumps(status))
    return job_dir


def _finished(name: str, **fields) -> dict:
    record = JobStatus(name=name, state=COMPLETE, created_at=time.time(), finished_at=time.time())
    return {**record.to_dict(), **fields}


# ------------------------------------------------------------------------------- compile
@pytest.mark.parametrize("existing", [True, False], ids=["existing-folder", "new-folder"])
def test_a_compile_that_fails_midway_leaves_the_output_folder_as_it_was(
    tmp_path, monkeypatch, capsys, existing
):
    """The components compile first, the Argo workflows last: failing there used to leave
    freshly written components beside the old pipeline."""
    output = tmp_path / "out"
    if existing:
        (output / "components" / "dataset_prep").mkdir(parents=True)
        (output / "components" / "dataset_prep" / "component.yaml").write_text("old\n")
        (output / "notes.txt").write_text("mine\n")
    before = _tree(tmp_path)

    def broken_argo(kind: str) -> str:
        raise RuntimeError("argo build failed")

    monkeypatch.setattr(compile_cli, "argo_yaml", broken_argo)
    assert main(["compile", "--output-dir", str(output)]) != 0
    assert "argo build failed" in capsys.readouterr().err
    assert _tree(tmp_path) == before, "no file written, no staging folder left"


def test_a_compile_replaces_files_whole_and_keeps_the_folders_other_files(tmp_path, capsys):
    output = tmp_path / "out"
    (output / "components" / "dataset_prep").mkdir(parents=True)
    (output / "components" / "dataset_prep" / "component.yaml").write_text("old\n")
    (output / "notes.txt").write_text("mine\n")
    assert main(["compile", "--output-dir", str(output)]) == 0
    written = [line.removeprefix("wrote ") for line in capsys.readouterr().out.splitlines()[:-1]]
    assert len(written) == len(compile_cli.COMPONENTS) + 1 + len(compile_cli.ARGO_WORKFLOWS)
    assert all(Path(path).is_file() and Path(path).is_relative_to(output) for path in written)
    component = output / "components" / "dataset_prep" / "component.yaml"
    assert component.read_text().startswith("# PIPELINE DEFINITION")
    assert (output / "notes.txt").read_text() == "mine\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"], "staging removed"


# ---------------------------------------------------------------------------------- list
def test_list_tells_a_malformed_record_and_lists_the_others(local_root, capsys):
    """A text created_at used to break the whole list with a TypeError."""
    _local_job(local_root, "good", _finished("good"))
    _local_job(local_root, "textual", _finished("textual", created_at="yesterday"))
    assert main(["list"]) == 0
    captured = capsys.readouterr()
    rows = [line.split() for line in captured.out.splitlines()[1:]]
    assert [row[:2] + row[3:] for row in rows] == [
        ["good", COMPLETE, "2"],
        ["textual", "Unknown", "2"],
    ]
    assert captured.err.splitlines() == [
        "textual: unreadable: status.json created_at is 'yesterday', not a time in seconds"
    ]


def test_list_tells_a_status_record_that_is_no_object(local_root, capsys):
    """A status.json holding [] broke the whole list with an AttributeError."""
    _local_job(local_root, "good", _finished("good"))
    _local_job(local_root, "listed", [])
    assert main(["list"]) == 0
    captured = capsys.readouterr()
    assert [line.split()[:2] for line in captured.out.splitlines()[1:]] == [
        ["good", COMPLETE],
        ["listed", "Unknown"],
    ]
    assert captured.err.splitlines() == [
        "listed: unreadable: status.json holds JSON list, not an object"
    ]


def test_list_never_blocks_on_a_fifo_record(local_root):
    """A FIFO job.json used to block `kubetrain list` forever (opening it waits for a
    writer); it is not read, and the other jobs are listed."""
    _local_job(local_root, "good", _finished("good"))
    fifo_job = _local_job(local_root, "piped", {**_finished("piped"), "state": RUNNING})
    (fifo_job / "job.json").unlink()
    os.mkfifo(fifo_job / "job.json")
    os.mkfifo(fifo_job / "supervisor.json")

    listed = subprocess.run(
        [sys.executable, "-m", "kubetrain", "list"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "KUBETRAIN_LOCAL_ROOT": str(local_root)},
    )
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()[1:]}
    assert sorted(rows) == ["good", "piped"]
    assert (rows["good"][1], rows["good"][3]) == (COMPLETE, "2")
    assert rows["piped"][3] == "-", "the FIFO job.json is not read"


# ---------------------------------------------------------------------------------- logs
@pytest.mark.bad_input
@pytest.mark.parametrize("node", ["99", "2", "-1"])
def test_logs_of_a_node_the_local_job_has_not_is_one_line(local_root, capsys, node):
    job_dir = _local_job(local_root, "pair", _finished("pair"))
    (job_dir / "node-0.log").write_text("node 0\n")
    assert main(["logs", "pair", "--node", node]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    expected = (
        "kubetrain logs: error: --node: -1 is below 0; give a node index from 0"
        if node == "-1"
        else "kubetrain logs: error: " + NODE_LINE.format(job="pair", node=node)
    )
    assert captured.err.startswith(expected), captured.err
    assert captured.err.count("\n") == 1


@pytest.mark.bad_input
@pytest.mark.parametrize("follow", [False, True], ids=["read", "follow"])
def test_logs_of_a_node_the_trainjob_has_not_is_one_line(kubeconfig, capsys, follow):
    """A follower of node 99 used to wait for a pod that never comes; reading it said the node
    had no pod "(yet)", exit 1."""
    kubeconfig.backend().launch(
        TrainJobSpec(name="demo", command=("torchrun", "t.py"), image=IMAGE, num_nodes=2)
    )
    argv = ["logs", "demo", "--backend", "trainer", "--node", "99", *(["-f"] * follow)]
    result: list[int] = []
    reader = threading.Thread(target=lambda: result.append(main(argv)), daemon=True)
    reader.start()
    reader.join(20)
    assert result == [2], "refused at once"
    captured = capsys.readouterr()
    assert captured.out == ""
    line = "kubetrain logs: error: " + NODE_LINE.format(job="demo", node=99)
    assert captured.err.startswith(line) and captured.err.count("\n") == 1, captured.err
