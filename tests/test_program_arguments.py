"""A user's program reaches its process as typed: an empty argument is an argument (only the
program's name must be a text that is not empty), an absolute interpreter path is not rewritten
on its way through KFP's local runner, and evaluate's ``--metrics-output`` is checked before the
program runs. The end-to-end cases are tests/reliability/test_hostile_issue28.py 4c, 4i, 4j
and 4k."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from kubetrain.components._shared.program import parse_command
from kubetrain.errors import InvalidInput
from tests.support.processes import kubetrain_in_process as run_cli


def test_command_json_keeps_an_empty_argument():
    assert parse_command('["python", "x.py", "--prefix", ""]', "--command-json") == (
        "python",
        "x.py",
        "--prefix",
        "",
    )


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('["", "x.py"]', "is not a list that names a program (its first text is empty)"),
        ('[""]', "is not a list that names a program (its first text is empty)"),
        ('["python", 3]', "is not a list of texts"),
        ('["python", null]', "is not a list of texts"),
        ('["python", "a\\u0000b"]', "holds a NUL byte"),
    ],
    ids=["empty-program", "only-empty", "number", "null", "nul"],
)
def test_command_json_still_refuses_no_program_and_what_is_no_text(text, problem):
    with pytest.raises(InvalidInput) as refused:
        parse_command(text, "--command-json")
    assert refused.value.field == "--command-json"
    assert problem in str(refused.value)


def test_evaluate_passes_an_empty_argument_and_refuses_an_empty_program(tmp_path, monkeypatch):
    """The function the KFP component calls with its ``command`` list, as the CLI does."""
    from kubetrain.components.evaluate_model.evaluate import Gate, evaluate_with_program

    program = tmp_path / "eval.py"
    program.write_text(
        "import json, os, sys\n"
        "json.dump(sys.argv[1:], open(os.environ['ARGV_FILE'], 'w'))\n"
        "json.dump({'loss': 0.1}, open(os.environ['KUBETRAIN_METRICS_FILE'], 'w'))\n"
    )
    monkeypatch.setenv("ARGV_FILE", str(tmp_path / "argv.json"))
    gate = Gate("loss", below=1.0)
    done = evaluate_with_program([sys.executable, str(program), ""], str(tmp_path), "", gate)
    assert done.passed
    assert json.loads((tmp_path / "argv.json").read_text()) == [""]
    with pytest.raises(InvalidInput, match="is no program"):
        evaluate_with_program(["", str(program)], str(tmp_path), "", gate)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A model `kubetrain collect` published from a torch.save'd state dict."""
    from kubetrain.cli import main

    root = tmp_path_factory.mktemp("model")
    (root / "ck").mkdir()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10))
    torch.save(net.state_dict(), root / "ck" / "model.pt")
    past = os.path.getmtime(root / "ck" / "model.pt") - 3600  # long finished: no grace
    os.utime(root / "ck" / "model.pt", (past, past))
    assert main(["collect", "--checkpoint-dir", str(root / "ck"), "--output", str(root / "m")]) == 0
    return root / "m"


@pytest.mark.bad_input
@pytest.mark.parametrize("where", ["a-folder", "under-a-file"])
def test_evaluate_refuses_metrics_output_before_its_program_runs(model, tmp_path, capsys, where):
    """A folder, or a path under a file, where the metrics file goes: one line naming
    --metrics-output, and the program (which may run for hours) never started."""
    from tests.reliability.test_bad_input import assert_one_line_error

    marker = tmp_path / "ran"
    (tmp_path / "afile").write_text("x")
    (tmp_path / "a-folder").mkdir()
    target = tmp_path / "a-folder" if where == "a-folder" else tmp_path / "afile" / "m.json"
    writes_marker = f"open({str(marker)!r}, 'w')"
    code, _, err = run_cli(["evaluate", "--model", model, "--metric", "loss", "--below", 1,
                            "--metrics-output", target, "--", sys.executable, "-c",
                            writes_marker],
                           capsys)  # fmt: skip
    assert code == 2
    assert_one_line_error(err, "kubetrain evaluate", "--metrics-output")
    assert not marker.exists(), "the program ran before the refusal"


@pytest.mark.bad_input
def test_evaluate_refuses_metrics_output_before_our_evaluation_reads_anything(tmp_path, capsys):
    """Our evaluation too: checked before the model and the dataset are read (neither
    exists here, and the refusal names --metrics-output, not them)."""
    from tests.reliability.test_bad_input import assert_one_line_error

    (tmp_path / "afile").write_text("x")
    metrics_output = tmp_path / "afile" / "m.json"
    code, _, err = run_cli(["evaluate", "--model", tmp_path / "no-model", "--data",
                            tmp_path / "no-data", "--metrics-output", metrics_output],
                           capsys)  # fmt: skip
    assert code == 2
    assert_one_line_error(err, "kubetrain evaluate", "--metrics-output")


def test_kfp_local_runner_puts_our_interpreter_in_the_step_s_command_only():
    """Under `kubetrain run`, KFP's ``python3`` -> this interpreter swap reaches the launch
    step's own ``sh -ec`` launcher, and leaves the executor input, which holds the parameter
    values (a program given as an absolute ``.../python3``), as it is."""
    from kfp.local import subprocess_task_handler

    from kubetrain.cli.run import interpreter_put_in_kfp_s_own_command
    from kubetrain.components.launch_trainjob.component import launch_trainjob

    container = launch_trainjob.component_spec.implementation.container
    values = {"command": ["/opt/venv/bin/python3", "-c", "print('python3')"]}
    executor_input = json.dumps({"inputs": {"parameterValues": values}})
    full_command = [*container.command, *container.args]
    full_command[full_command.index("{{$}}")] = executor_input
    original = subprocess_task_handler.replace_python_executable
    with interpreter_put_in_kfp_s_own_command():
        swapped = subprocess_task_handler.replace_python_executable(full_command, "/our/python")
    assert subprocess_task_handler.replace_python_executable is original
    launcher = full_command.index("-ec") + 1
    assert "/our/python -m kfp.dsl.executor_main" in swapped[launcher], swapped[launcher]
    assert "python3 -m" not in swapped[launcher]
    start = full_command.index("--executor_input")
    assert swapped[start:] == full_command[start:]
    # KFP's own swap, for contrast: it rewrote the program the user gave by its path
    assert "/opt/venv/bin//our/python" in original(full_command, "/our/python")[start + 1]
