"""Wait reports how a job ended; a failed job fails the step with the node's own exit code."""

from __future__ import annotations

import pytest

from kubetrain.backends.local.backend import LocalBackend
from kubetrain.components.wait_trainjob.wait import JobFailed, wait_for_job
from kubetrain.errors import InvalidInput, KubetrainError
from kubetrain.jobspec import TrainJobSpec


@pytest.fixture
def backend(tmp_path, monkeypatch) -> LocalBackend:
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(tmp_path / "jobs"))
    return LocalBackend()


def test_complete_job_streams_rank0_lines_and_reports_duration(backend):
    script = "import os; print('hello from node', os.environ['PET_NODE_RANK'])"
    backend.launch(TrainJobSpec(name="hello", command=("python", "-c", script), num_nodes=2))
    lines: list[str] = []
    result = wait_for_job("hello", on_log_line=lines.append)
    assert (result.state, result.reason) == ("Complete", "Completed")
    assert lines == ["hello from node 0"], "only the rank-0 node's log is streamed"
    assert result.duration_seconds > 0


def test_a_node_killed_by_a_signal_fails_with_128_plus_signal(backend):
    script = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    backend.launch(TrainJobSpec(name="killed", command=("python", "-c", script)))
    with pytest.raises(JobFailed) as failure:
        wait_for_job("killed", on_log_line=None)
    assert failure.value.exit_code == 128 + 9
    assert "node 0 was killed by signal SIGKILL" in str(failure.value)


def test_unknown_job_and_bad_arguments(backend):
    with pytest.raises(KubetrainError, match="no local job named 'ghost'"):
        wait_for_job("ghost")
    with pytest.raises(InvalidInput, match="job_name"):
        wait_for_job("")
    with pytest.raises(InvalidInput, match="timeout"):
        wait_for_job("ghost", timeout_seconds=-1)
    with pytest.raises(InvalidInput, match="backend"):
        wait_for_job("ghost", backend="slurm")
