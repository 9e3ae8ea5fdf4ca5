"""Your own training code through `kubetrain run`: a torchrun script written the way the seed
documents' DDP examples are (init_process_group, DistributedSampler, DDP, rank 0
``torch.save(model.module.state_dict(), "model.pt")`` into its working directory), with its
model factory in a module beside it, trained by real processes through KFP's local runner and
collected, verified and evaluated by the pipeline's own steps."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.seed_script import SAVES, write_user_folder


def test_kubetrain_run_trains_collects_and_evaluates_your_program(tmp_path):
    """The seeds' plain ``model.pt`` state dict; the other ways scripts save (one file per
    epoch, a dict) run end to end in the Argo workflow (tests/test_argo_local.py) and are
    collected in components/collect_checkpoint/tests/test_collect_formats.py."""
    folder = write_user_folder(tmp_path / "project", SAVES["state-dict"])
    env = {**os.environ, "KUBETRAIN_LOCAL_ROOT": str(tmp_path / "jobs"), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, "-m", "kubetrain", "run", "--output", str(tmp_path / "runs"),
        "--script", "train.py", "--model", "netdef:build", "--threshold", "0.9",
        "--", "torchrun", "train.py",
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=folder, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = result.stdout.splitlines()
    (accuracy_line,) = [line for line in summary if line.startswith("accuracy ")]
    assert float(accuracy_line.split()[1]) >= 0.9, accuracy_line
    assert any("torchrun train.py on sklearn:digits" in line for line in summary)
    assert not list(folder.glob("*.pt")), "the script saved into its checkpoint folder"


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("options", "field"),
    [
        (["--", "torchrun", "train.py"], "--model"),  # mlp is our trainer's, not the program's
        (["--model", "netdef:nope", "--", "torchrun", "train.py"], "model"),  # no such callable
        (["--model", "netdef:build", "--script", "missing.py", "--", "torchrun", "missing.py"],
         "--script"),
    ],
)  # fmt: skip
def test_kubetrain_run_refuses_a_bad_program_before_any_step(options, field, tmp_path):
    """Checked in a second, before prep runs: nothing is written."""
    from tests.reliability.test_bad_input import assert_one_line_error

    folder = write_user_folder(tmp_path / "project", SAVES["state-dict"])
    command = [sys.executable, "-m", "kubetrain", "run", "--output", str(tmp_path / "runs")]
    result = subprocess.run(
        [*command, *options], cwd=folder, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2  # InvalidInput's exit code
    assert_one_line_error(result.stderr, "kubetrain run", field)
    assert not (tmp_path / "runs").exists()
