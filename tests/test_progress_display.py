"""Rank 0's progress records (kubetrain/progress.py) and how `wait`, `logs` and `kubetrain run`
show them (components/_shared/progress_display.py): a live bar on a terminal, a line now and
then off one, untouched for a parent that draws them (issue 18 (1))."""

from __future__ import annotations

import io
import math
import re
import subprocess
import sys

import pytest

from kubetrain.cli.run_output import RunOutput
from kubetrain.components._shared import progress_display
from kubetrain.components._shared.progress_display import (
    LIVE,
    MODE_VARIABLE,
    PLAIN,
    RECORDS,
    ProgressDisplay,
    display_mode,
)
from kubetrain.progress import PREFIX, Progress, format_record, parse_record

RECORD = Progress(
    epoch=2,
    epochs=10,
    batch=40,
    batches=120,
    step=160,
    loss=0.41234,
    samples_per_second=5234.3,
    eta_seconds=72.0,
)
#: An SGR foreground colour escape, normal or bright (a bar's cursor moves are other escapes).
COLOUR = re.compile(r"\x1b\[(?:[0-9]+;)*(?:3[0-9]|9[0-7])m")


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as rich and ``display_mode`` ask."""

    def isatty(self) -> bool:
        return True


def test_a_record_round_trips_and_is_found_behind_a_prefix():
    line = format_record(RECORD)
    assert line.startswith(PREFIX)
    assert parse_record(line) == RECORD
    assert parse_record(f"[default0]:{line}") == RECORD  # torchrun --tee's prefix
    assert parse_record(f"[node-0] {line}") == RECORD  # kubetrain logs' prefix


def test_a_diverged_loss_is_still_a_record_and_a_malformed_one_is_a_plain_line():
    diverged = parse_record(format_record(Progress(1, 1, 1, 1, 1, math.nan, math.inf)))
    assert diverged is not None and math.isnan(diverged.loss)
    assert '"loss":null' in format_record(Progress(1, 1, 1, 1, 1, math.nan, 1.0))
    for line in (
        "epoch 1/2 step 23 loss 1.9513",
        f"{PREFIX}{{not json",
        f'{PREFIX}{{"epoch": "2"}}',
        f'{PREFIX}{{"epoch":1,"epochs":1,"batch":1,"batches":1,"step":1.5,"loss":1,'
        '"samples_per_second":1}',
        # numbers written as text, or booleans, by someone's own trainer: shown as lines,
        # never a crash of the display drawing them
        format_record(RECORD).replace('"loss":0.41234', '"loss":"0.5"'),
        format_record(RECORD).replace('"eta_seconds":72.0', '"eta_seconds":"5"'),
        format_record(RECORD).replace('"samples_per_second":5234.3', '"samples_per_second":true'),
        format_record(RECORD).replace('"epoch":2', '"epoch":true'),
    ):
        assert parse_record(line) is None, line


def test_unknown_keys_are_ignored_so_records_can_grow():
    line = format_record(RECORD)[:-1] + ',"gpu_memory":1.5}'
    assert parse_record(line) == RECORD


def test_the_plain_line_and_the_fraction_done():
    assert RECORD.describe() == (
        "epoch 2/10 batch 40/120 step 160 loss 0.4123 samples/s 5234.3 eta 1:12"
    )
    assert RECORD.fraction() == pytest.approx((1 + 40 / 120) / 10)


def test_off_a_terminal_records_become_a_line_only_after_a_silence(monkeypatch):
    out = io.StringIO()
    display = ProgressDisplay(out)
    assert display.mode == PLAIN
    display.feed("epoch 1/10 step 80 loss 0.9")
    display.feed(format_record(RECORD))
    assert out.getvalue().splitlines() == ["epoch 1/10 step 80 loss 0.9"]
    monkeypatch.setattr(progress_display, "PLAIN_PROGRESS_SECONDS", 0.0)
    display.feed(format_record(RECORD))
    assert out.getvalue().splitlines()[-1] == RECORD.describe()
    assert PREFIX not in out.getvalue()


def test_on_a_terminal_records_draw_a_live_bar_and_other_lines_print_above_it(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv(MODE_VARIABLE, raising=False)
    out = Terminal()
    with ProgressDisplay(out) as display:
        assert display.mode == LIVE
        display.feed(format_record(RECORD))
        display.feed("epoch 2/10 step 240 loss 0.3 train_accuracy 0.9")
        display.feed(format_record(RECORD))
    shown = out.getvalue()
    for text in ("epoch 2/10", "batch 40/120", "loss 0.4123", "5,234 samples/s", "eta 1:12"):
        assert text in shown, text
    assert "epoch 2/10 step 240 loss 0.3 train_accuracy 0.9" in shown
    assert PREFIX not in shown


def test_the_bar_under_a_line_is_the_newest_record_not_one_a_refresh_behind(monkeypatch):
    """Short epochs (digits: 0.3 s) end faster than a timed refresh; the bar redrawn under an
    epoch's line must be that epoch's, as seen in tmux (it showed the epoch before)."""
    monkeypatch.delenv(MODE_VARIABLE, raising=False)
    out = Terminal()
    with ProgressDisplay(out) as display:
        for epoch in (1, 2, 3):
            display.feed(format_record(Progress(epoch, 10, 21, 21, 21 * epoch, 0.5, 900.0)))
            display.feed(f"epoch {epoch}/10 step {21 * epoch} loss 0.5")
            shown = out.getvalue()
            assert f"epoch {epoch}/10" in shown[shown.rindex(f"epoch {epoch}/10 step") + 20 :]


def test_no_color_keeps_the_bar_but_not_its_colours(monkeypatch):
    monkeypatch.delenv(MODE_VARIABLE, raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    coloured = Terminal()
    with ProgressDisplay(coloured) as display:
        display.feed(format_record(RECORD))
    monkeypatch.setenv("NO_COLOR", "1")
    plain = Terminal()
    with ProgressDisplay(plain) as display:
        display.feed(format_record(RECORD))
    assert COLOUR.search(coloured.getvalue())
    assert "loss 0.4123" in plain.getvalue() and not COLOUR.search(plain.getvalue())


def test_the_environment_picks_the_mode_for_a_step_whose_parent_draws(monkeypatch):
    monkeypatch.setenv(MODE_VARIABLE, RECORDS)
    assert display_mode(Terminal()) == RECORDS
    out = io.StringIO()
    ProgressDisplay(out).feed(format_record(RECORD))
    assert out.getvalue() == format_record(RECORD) + "\n"
    monkeypatch.setenv(MODE_VARIABLE, "bogus")
    assert display_mode(Terminal()) == LIVE
    assert display_mode(io.StringIO()) == PLAIN


def test_kubetrain_run_draws_the_wait_steps_records_and_shows_no_json():
    """The wait step passes its records on (``KUBETRAIN_PROGRESS=records``); `kubetrain run`
    draws a bar on a terminal and keeps a redirected run to its epoch lines."""
    step_lines = [
        format_record(RECORD),
        "epoch 2/10 step 240 loss 0.3 train_accuracy 0.9",
        format_record(RECORD),
    ]
    redirected = io.StringIO()
    view = RunOutput(verbose=False, stream=redirected, colour=False)
    view.step_started("wait-trainjob")
    for line in step_lines:
        view.step_line(line)
    view.step_ended(True)
    lines = redirected.getvalue().splitlines()
    assert lines[1] == "  epoch 2/10 step 240 loss 0.3 train_accuracy 0.9"
    assert len(lines) == 3 and PREFIX not in redirected.getvalue()
    assert view.steps[-1].lines == [step_lines[1]], "records are not kept as the step's lines"

    terminal = Terminal()
    view = RunOutput(verbose=False, stream=terminal, colour=True)
    view.step_started("wait-trainjob")
    for line in step_lines:
        view.step_line(line)
    view.step_ended(True)
    assert "batch 40/120" in terminal.getvalue() and PREFIX not in terminal.getvalue()
    assert view.display is None, "the bar ends with the step"


def test_kubetrain_runs_steps_are_told_to_pass_records_on(monkeypatch):
    """The env `kubetrain run` starts its steps with (its copy of kfp's run_local_subprocess)."""
    from kfp.local import subprocess_task_handler

    from kubetrain.cli.run_output import kfp_output_shaped

    out = io.StringIO()
    view = RunOutput(verbose=False, stream=out, colour=False)
    view.step_started("wait-trainjob")
    code = (
        "import os, sys; from kubetrain.components._shared.progress_display import "
        "ProgressDisplay; ProgressDisplay(sys.stdout).feed(os.environ['LINE'])"
    )
    with kfp_output_shaped(view):
        subprocess_task_handler.run_local_subprocess(
            [sys.executable, "-c", code], {"LINE": format_record(RECORD)}
        )
    assert view.display is not None and view.display.last == RECORD, "the record reached run"


def test_kubetrain_logs_leaves_records_out_unless_raw(monkeypatch, capsys):
    from kubetrain.cli import jobs

    log = [f"[node-0] {format_record(RECORD)}", "[node-0] epoch 2/10 step 240 loss 0.3"]

    class Backend:
        def logs(self, name: str, node: int | None, follow: bool) -> list[str]:
            return log

    monkeypatch.setattr(jobs, "get_backend", lambda *args: Backend())
    parser = jobs_parser()
    jobs.run_logs(parser.parse_args(["logs", "j"]))
    assert capsys.readouterr().out.splitlines() == [log[1]]
    jobs.run_logs(parser.parse_args(["logs", "j", "--raw"]))
    assert capsys.readouterr().out.splitlines() == log


def jobs_parser():
    import argparse

    from kubetrain.cli import jobs

    parser = argparse.ArgumentParser()
    jobs.register(parser.add_subparsers())
    return parser


def test_wait_help_says_how_progress_is_shown():
    result = subprocess.run(
        [sys.executable, "-m", "kubetrain", "wait", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "live bar" in result.stdout
