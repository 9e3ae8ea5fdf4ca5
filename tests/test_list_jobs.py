"""`kubetrain list`: local jobs (from their folders under the local root) and kubetrain's
cluster jobs (TrainJobs or Indexed Jobs, over HTTP against the emulator), with name, state,
age and nodes."""

from __future__ import annotations

import io
import time

import pytest

from kubetrain.backends.base import COMPLETE, CREATED, RUNNING, JobRow
from kubetrain.backends.local.backend import LocalBackend
from kubetrain.backends.local.listing import UNKNOWN, list_local_jobs
from kubetrain.cli import main
from kubetrain.cli.jobs import BOLD, age, job_table
from kubetrain.jobspec import TrainJobSpec
from kubetrain.render.metadata import MANAGED_BY_LABEL
from tests.support import objects

IMAGE = "ghcr.io/example/trainer:1.0"


def _until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not true in time"
        time.sleep(0.05)


def _table(capsys) -> list[list[str]]:
    return [line.split() for line in capsys.readouterr().out.splitlines()]


# ------------------------------------------------------------------------------------- local
def test_local_jobs_running_and_finished_are_listed(local_root, capsys) -> None:
    backend = LocalBackend()
    backend.launch(TrainJobSpec(name="done", command=("true",)))
    backend.launch(TrainJobSpec(name="busy", command=("sleep", "30"), num_nodes=2))
    try:
        _until(lambda: backend.status("done").state == COMPLETE)
        _until(lambda: backend.status("busy").state == RUNNING)
        (local_root / "stray").mkdir()  # not a job: no status.json
        damaged = local_root / "damaged"
        damaged.mkdir()
        (damaged / "status.json").write_text("{half")

        rows = {row.name: row for row in list_local_jobs()}
        assert sorted(rows) == ["busy", "damaged", "done"]
        assert (rows["busy"].state, rows["busy"].nodes) == (RUNNING, 2)
        assert (rows["done"].state, rows["done"].nodes) == (COMPLETE, 1)
        assert (rows["damaged"].state, rows["damaged"].nodes) == (UNKNOWN, None)
        assert all(0 <= row.age_seconds < 60 for row in rows.values())

        assert main(["list"]) == 0
        output = capsys.readouterr().out
        assert "\x1b" not in output  # not a terminal: plain text
        lines = [line.split() for line in output.splitlines()]
        assert lines[0] == ["NAME", "STATE", "AGE", "NODES"]
        assert [line[:2] + line[3:] for line in lines[1:]] == [
            ["busy", RUNNING, "2"],
            ["damaged", UNKNOWN, "-"],
            ["done", COMPLETE, "1"],
        ]
        assert all(line[2].endswith("s") for line in lines[1:])
    finally:
        backend.delete("busy")


def test_no_local_jobs_prints_the_header_and_says_where_it_looked(local_root, capsys) -> None:
    assert list_local_jobs() == []
    assert main(["list"]) == 0
    captured = capsys.readouterr()
    assert captured.out.split() == ["NAME", "STATE", "AGE", "NODES"]
    assert captured.err.strip() == f"no local jobs under {local_root}"


@pytest.mark.bad_input
def test_an_unknown_backend_is_refused_in_one_line(local_root, capsys) -> None:
    assert main(["list", "--backend", "slurm"]) == 2
    err = capsys.readouterr().err.strip()
    # the backends named grow (pytorchjob): the line names the field and offers ours first
    assert err.startswith(
        "kubetrain list: error: backend: 'slurm' is unknown; use one of local, trainer, job"
    )
    assert "\n" not in err


# ------------------------------------------------------------------------------------ output
class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_table_is_aligned_and_bold_only_on_a_terminal(monkeypatch) -> None:
    rows = [JobRow("a-long-name", RUNNING, 3700, 2), JobRow("b", COMPLETE, 5, None)]
    plain = job_table(rows, io.StringIO())
    assert plain.splitlines() == [
        "NAME          STATE      AGE   NODES",
        "a-long-name   Running    1h    2",
        "b             Complete   5s    -",
    ]
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert job_table(rows, _Terminal()).startswith(BOLD)
    monkeypatch.setenv("NO_COLOR", "1")
    assert job_table(rows, _Terminal()) == plain


@pytest.mark.parametrize(
    ("seconds", "shown"), [(0, "0s"), (59.9, "59s"), (60, "1m"), (7199, "1h"), (3 * 86400, "3d")]
)
def test_ages_read_as_kubectl_writes_them(seconds: float, shown: str) -> None:
    assert age(seconds) == shown


# ---------------------------------------------------------------------------------- cluster
def _spec(name: str, nodes: int = 2) -> TrainJobSpec:
    return TrainJobSpec(name=name, command=("torchrun", "train.py"), image=IMAGE, num_nodes=nodes)


def _run_pod(emulator, job: str, kind: str) -> None:
    owner = emulator.get("trainjobs" if kind == "trainer" else "jobs", job)
    pod = emulator.create_pod(objects.node_pod(job, 0, kind=kind, image=IMAGE, owner=owner))
    emulator.set_pod_status(
        pod["metadata"]["name"],
        objects.pod_status("Running", [objects.container_status(IMAGE, objects.running())]),
    )


def test_cluster_trainjobs_of_kubetrain_are_listed_with_state_and_nodes(k8s, capsys) -> None:
    emulator, backend = k8s.emulator, k8s.backend()
    for name, nodes in (("waiting", 2), ("training", 3), ("finished", 1), ("foreign", 1)):
        backend.launch(_spec(name, nodes))
    _run_pod(emulator, "training", "trainer")
    emulator.set_conditions("trainjobs", "finished", [objects.condition("Complete", reason="Done")])
    # a TrainJob kubetrain did not make (no managed-by label) is not ours to list
    emulator.patch("trainjobs", "foreign", {"metadata": {"labels": {MANAGED_BY_LABEL: None}}})

    rows = backend.list_jobs()
    assert [(row.name, row.state, row.nodes) for row in rows] == [
        ("finished", COMPLETE, 1),
        ("training", RUNNING, 3),
        ("waiting", CREATED, 2),
    ]
    assert all(0 <= row.age_seconds < 120 for row in rows)
    listed = [request for request in emulator.requests("list") if request.resource == "trainjobs"]
    assert listed, "the TrainJobs were listed in one request, not read one by one"


def test_cluster_indexed_jobs_are_listed_by_the_cli(k8s, monkeypatch, capsys) -> None:
    emulator, backend = k8s.emulator, k8s.backend("job")
    backend.launch(_spec("indexed", 2))
    _run_pod(emulator, "indexed", "job")
    monkeypatch.setattr("kubetrain.cli.jobs.get_backend", lambda name, options: backend)
    assert main(["list", "--backend", "job", "--namespace", k8s.namespace]) == 0
    lines = _table(capsys)
    assert lines[0] == ["NAME", "STATE", "AGE", "NODES"]
    assert [line[:2] + line[3:] for line in lines[1:]] == [["indexed", RUNNING, "2"]]
