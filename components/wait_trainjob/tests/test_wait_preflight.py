"""`kubetrain wait --output-parameters` is checked before the wait (issue 28: a folder under a
file was refused only when the outputs were written, after a whole training had been waited
for)."""

from __future__ import annotations

import time

import pytest

from kubetrain.backends.local.backend import LocalBackend
from kubetrain.cli import main
from kubetrain.jobspec import TrainJobSpec


@pytest.mark.bad_input
def test_an_output_folder_under_a_file_is_refused_before_waiting(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(tmp_path / "jobs"))
    backend = LocalBackend()
    backend.launch(TrainJobSpec(name="slow", command=("sleep", "30")))
    try:
        (tmp_path / "file").write_text("")
        started = time.monotonic()
        code = main(
            [
                "wait",
                "slow",
                "--backend",
                "local",
                "--output-parameters",
                str(tmp_path / "file/out"),
            ]
        )
        assert code == 2 and time.monotonic() - started < 20
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(
            f"kubetrain wait: error: --output-parameters: {tmp_path / 'file'} is a file, not a "
            "folder"
        ), line
        assert not backend.status("slow").finished, "refused before waiting, the job untouched"
    finally:
        backend.delete("slow")
