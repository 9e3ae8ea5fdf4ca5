"""What `kubetrain run` prints (issue 18 (1), (2)), without running the pipeline: the lines KFP's
local runner streams and logs (kfp 2.17 kfp/local/subprocess_task_handler.py,
task_dispatcher.py, logging_utils.py), shaped by kubetrain.cli.run_output. The whole runs are
in tests/test_pipeline.py."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from kubetrain.cli.run import EXECUTOR_OUTPUT, how_to_see_more
from kubetrain.cli.run_output import RunOutput, colour_wanted, kfp_output_shaped, strip_ansi

#: What KFP's executor writes around a step's own lines (kfp 2.17 kfp/dsl/executor_main.py).
EXECUTOR_HEAD = [
    "[KFP Executor 2026-11-25 06:07:50,886 INFO]: Looking for component `wait_trainjob` in ...",
    "[KFP Executor 2026-11-25 06:07:50,887 INFO]: Got executor_input:",
    *json.dumps({"inputs": {"parameterValues": {"job_name": "j"}}}, indent=4).splitlines(),
]
EXECUTOR_TAIL = ["[KFP Executor 2026-11-25 06:07:54,768 INFO]: Wrote executor output file to x."]
TRAINING = [
    "epoch 1/2 step 23 loss 1.9513 train_accuracy 0.6342 test_accuracy 0.8556 samples/s 21812.0",
    "checkpoint saved: /jobs/j/checkpoints/epoch-000001",
    "epoch 2/2 step 46 loss 0.8460 train_accuracy 0.8720 test_accuracy 0.9000 samples/s 27819.1",
    "checkpoint saved: /jobs/j/checkpoints/epoch-000002",
    "training complete: epoch 2 step 46 checkpoint /jobs/j/checkpoints/epoch-000002",
]
TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/work/main/kubetrain/backends/local/backend.py", line 195, in _check_deadline',
    "    raise KubetrainError(",
    "kubetrain.errors.KubetrainError: timed out after 1s waiting for job j (state Running)",
]


def shown(view: RunOutput, step: str, lines: list[str], succeeded: bool) -> None:
    view.step_started(step)
    for line in lines:
        view.step_line(line)
    view.step_ended(succeeded)


def test_concise_shows_a_line_per_step_start_and_end_and_rank_0s_epochs_only():
    out = io.StringIO()
    view = RunOutput(verbose=False, stream=out, colour=False)
    shown(view, "launch-trainjob", [*EXECUTOR_HEAD, "launched j; checkpoints in /c"], True)
    shown(view, "wait-trainjob", [*EXECUTOR_HEAD, *TRAINING, *EXECUTOR_TAIL], True)
    lines = out.getvalue().splitlines()
    assert lines[0] == "launch-trainjob started"
    assert lines[1].startswith("launch-trainjob done in ")
    assert lines[1].endswith("s: launched j; checkpoints in /c")
    assert lines[2] == "wait-trainjob started"
    assert lines[3:6] == [f"  {TRAINING[0]}", f"  {TRAINING[2]}", f"  {TRAINING[4]}"]
    assert lines[6].startswith("wait-trainjob done in ") and lines[6].endswith("s")
    assert len(lines) == 7


def test_verbose_streams_every_line_as_kfp_does_and_shows_no_step_lines(capsys):
    out = io.StringIO()
    view = RunOutput(verbose=True, stream=out, colour=False)
    shown(view, "wait-trainjob", [*EXECUTOR_HEAD, *TRAINING, "\x1b[91mred\x1b[0m"], True)
    assert out.getvalue() == ""  # KFP's own "Executing task ..." lines say when steps run
    printed = capsys.readouterr().out.splitlines()
    assert printed == [*EXECUTOR_HEAD, *TRAINING, "red"]


@pytest.mark.parametrize(
    ("output", "cause"),
    [
        # an uncaught kubetrain error: its message, written for the reader
        (TRACEBACK, "timed out after 1s waiting for job j (state Running)"),
        # anything else uncaught: its name too, not its module path
        ([*TRACEBACK[:-1], "torch.OutOfMemoryError: CUDA out of memory"],
         "OutOfMemoryError: CUDA out of memory"),
        # the one error line a kubetrain step ends with
        (["kubetrain launch: error: model: cannot import module 'netdef'; check --model"],
         "kubetrain launch: error: model: cannot import module 'netdef'; check --model"),
    ],
)  # fmt: skip
def test_a_failed_step_ends_with_its_one_line_cause(output, cause):
    out = io.StringIO()
    view = RunOutput(verbose=False, stream=out, colour=False)
    shown(view, "wait-trainjob", [*EXECUTOR_HEAD, "epoch 1/2 step 23 loss 1.9", *output], False)
    shown(view, "delete-trainjob", ["the run ended FAILED: deleted j"], True)
    lines = out.getvalue().splitlines()
    assert lines[1] == "  epoch 1/2 step 23 loss 1.9"  # the traceback is not a training line
    assert lines[2].startswith("wait-trainjob failed after ") and lines[2].endswith(f"s: {cause}")
    # the exit handler's step runs after the failing one, which the run's last line names
    failure = view.failure("kubetrain logs j", "pipeline failed")
    assert failure == f"step wait-trainjob failed: {cause}; to see more: kubetrain logs j"


def test_a_failure_no_step_explains_keeps_kfps_message_without_its_colour():
    view = RunOutput(verbose=False, stream=io.StringIO(), colour=False)
    fallback = "pipeline failed: Pipeline \x1b[95m'p'\x1b[0m finished with status FAILURE."
    assert (
        view.failure("x", fallback) == "pipeline failed: Pipeline 'p' finished with status FAILURE."
    )


def test_colour_only_on_a_terminal_and_never_with_no_color(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert colour_wanted(Terminal()) and not colour_wanted(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not colour_wanted(Terminal())
    out = Terminal()
    shown(RunOutput(verbose=False, stream=out, colour=True), "dataset-prep", [], False)
    assert "\x1b[31mfailed\x1b[0m" in out.getvalue()
    assert strip_ansi(out.getvalue()).startswith("dataset-prep started\ndataset-prep failed ")
    assert out.getvalue().endswith("s: no output\n")  # a step that wrote nothing


@pytest.mark.parametrize("verbose", [False, True])
def test_kfps_logging_is_quiet_by_default_and_never_coloured_off_a_terminal(verbose, capsys):
    """The runner's logging through its own root-logger handler on stdout (kfp 2.17
    kfp/local/logging_utils.py local_logger_context), inside the shaped run."""
    from kfp.local import logging_utils

    view = RunOutput(verbose=verbose, stream=io.StringIO(), colour=False)
    with kfp_output_shaped(view), logging_utils.local_logger_context():
        logging.info(f"Executing task {logging_utils.format_task_name('dataset-prep')}")
        logging.error(f"Task {logging_utils.format_task_name('x')} finished with status FAILURE")
        logging.warning(f"odd {logging_utils.format_pipeline_name('p')}")
        logging_utils.print_horizontal_line()
    captured = capsys.readouterr()
    assert "\x1b[" not in captured.out + captured.err
    if verbose:
        assert "Executing task 'dataset-prep'" in captured.out and "-----" in captured.out
        assert "odd 'p'" in captured.out
    else:
        assert captured.out == ""
        assert captured.err.strip().endswith("WARNING - odd 'p'")  # warnings still show
        assert "finished with status" not in captured.err  # the step's end line says it


def test_the_shaped_runner_streams_a_steps_process_and_restores_kfp():
    """A real step process through the replaced kfp/local/subprocess_task_handler.py
    run_local_subprocess: its lines reach the view, its exit code the runner."""
    from kfp.local import logging_utils, subprocess_task_handler, task_dispatcher

    originals = (
        subprocess_task_handler.run_local_subprocess,
        task_dispatcher.run_single_task_implementation,
        logging_utils.local_logger_context,
        logging_utils.print_horizontal_line,
    )
    out = io.StringIO()
    view = RunOutput(verbose=False, stream=out, colour=False)
    program = (
        "import sys; print('epoch 1/1 step 1 loss 0.5'); sys.exit('kubetrain wait: error: stalled')"
    )
    with kfp_output_shaped(view):
        view.step_started("wait-trainjob")
        code = subprocess_task_handler.run_local_subprocess([sys.executable, "-c", program])
        view.step_ended(code == 0)
    assert code == 1
    assert out.getvalue().splitlines()[1:] == [
        "  epoch 1/1 step 1 loss 0.5",
        f"wait-trainjob failed after {view.steps[0].seconds:.1f}s: kubetrain wait: error: stalled",
    ]
    assert originals == (
        subprocess_task_handler.run_local_subprocess,
        task_dispatcher.run_single_task_implementation,
        logging_utils.local_logger_context,
        logging_utils.print_horizontal_line,
    )


def test_more_of_a_failed_run_is_in_its_jobs_logs_while_the_job_is_kept(tmp_path, monkeypatch):
    """`kubetrain logs <job>` while the launched job is there; once the exit handler deleted
    it, or when no job was launched, the run again with --verbose."""
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(tmp_path / "jobs"))
    run = tmp_path / "runs" / "kubetrain-training-2026-11-25-06-07-49-570422"
    assert (
        how_to_see_more([])
        == how_to_see_more([run])
        == "kubetrain run --verbose (the same options)"
    )
    (run / "launch-trainjob").mkdir(parents=True)
    launched = {"parameterValues": {"job_name": "kubetrain-training-2026-f13e0bf1"}}
    (run / "launch-trainjob" / EXECUTOR_OUTPUT).write_text(json.dumps(launched))
    assert how_to_see_more([run]) == "kubetrain run --verbose (the same options)"
    job = tmp_path / "jobs" / "kubetrain-training-2026-f13e0bf1"
    job.mkdir(parents=True)
    (job / "status.json").write_text("{}")
    assert how_to_see_more([run]) == "kubetrain logs kubetrain-training-2026-f13e0bf1"
