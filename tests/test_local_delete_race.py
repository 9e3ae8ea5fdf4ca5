"""Two deletes of one local job at once (kubetrain.backends.local.backend.LocalBackend.delete):
the one that removes the job's folder deleted the job; the other finds no job (JobNotFound),
which ``--ignore-not-found`` accepts, as `kubectl delete` does when another delete removed the
object between its read and its DELETE (kubernetes/kubectl pkg/cmd/delete/delete.go,
DeleteResult: ``r.IgnoreErrors(errors.IsNotFound)``, which cli-runtime's Result.Visit applies
to the DELETE's own error too). The race is made certain here: the other delete runs at the
exact point where it bit."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from kubetrain.backends.local.backend import LocalBackend
from kubetrain.components.wait_trainjob.wait import delete_job
from kubetrain.errors import JobNotFound
from kubetrain.jobspec import TrainJobSpec
from tests.support.processes import process_alive, supervisor_pid


def launched(name: str) -> int:
    """Launch a local job that sleeps; its supervisor's PID once it runs."""
    backend = LocalBackend()
    backend.launch(
        TrainJobSpec(
            name=name, command=(sys.executable, "-c", "import time; time.sleep(60)"), num_nodes=1
        )
    )
    deadline = time.monotonic() + 30
    while not (backend.root / name / "supervisor.json").exists():
        assert time.monotonic() < deadline, "the supervisor never started"
        time.sleep(0.05)
    return supervisor_pid(backend.root / name)


def test_a_folder_another_delete_removed_during_ours_is_no_job(local_root, monkeypatch):
    supervisor = launched("raced")
    stop = LocalBackend.stop

    def stop_then_lose_the_race(self: LocalBackend, name: str, grace: float) -> None:
        stop(self, name, grace)
        monkeypatch.setattr(LocalBackend, "stop", stop)
        LocalBackend().delete(name)  # the other delete, all of it, before our removal

    monkeypatch.setattr(LocalBackend, "stop", stop_then_lose_the_race)
    with pytest.raises(JobNotFound, match="another delete removed it"):
        LocalBackend().delete("raced")
    assert not (local_root / "raced").exists()
    assert not process_alive(supervisor)

    launched("raced-ignored")
    monkeypatch.setattr(LocalBackend, "stop", stop_then_lose_the_race)
    said = delete_job("raced-ignored", "local", ignore_not_found=True)
    assert "another delete removed it" in said and "\n" not in said


def test_entries_another_delete_removes_under_our_removal_are_no_error(local_root, monkeypatch):
    """The other delete unlinks job.json between our listing of the folder and our unlink of
    it: ours goes on and removes the folder, so ours deleted the job."""
    launched("shared")
    unlink = os.unlink
    raced: list[str] = []

    def unlinked_by_the_other_delete_first(path: str | Path, *args: object, **kw: object) -> None:
        if path == "job.json" and not raced:
            raced.append(str(path))
            unlink(path, *args, **kw)  # type: ignore[arg-type]
        unlink(path, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "unlink", unlinked_by_the_other_delete_first)
    LocalBackend().delete("shared")
    assert raced == ["job.json"]
    assert not (local_root / "shared").exists()
