"""What `kubetrain run` prints: by default one line per step as it starts and as it ends, rank
0's training lines (the wait step's), its progress records as a live bar on a terminal
(``ProgressDisplay``), and the failing step's cause; KFP's local-runner logging
(executor inputs, "Executing task", artifact reprs) only with --verbose. Colour only on a
terminal, with ``NO_COLOR`` unset (https://no-color.org): KFP colours its own lines whatever
its stream is (kfp 2.17 kfp/local/logging_utils.py color_text), so they are stripped.

KFP's local runner streams a step's stdout and stderr line by line through ``print`` (kfp 2.17
kfp/local/subprocess_task_handler.py run_local_subprocess), runs each task through
kfp/local/task_dispatcher.py run_single_task_implementation, and logs through a root-logger
handler on stdout it installs per message group (kfp/local/logging_utils.py
local_logger_context, print_horizontal_line); those module attributes, looked up at each call,
are what ``kfp_output_shaped`` replaces for the run."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from kubetrain.components._shared.progress_display import (
    LIVE,
    MODE_VARIABLE,
    PLAIN,
    RECORDS,
    ProgressDisplay,
)
from kubetrain.progress import parse_record

#: An ANSI SGR escape (colour, bold, reset), the only kind KFP's local runner writes.
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
#: The step whose streamed lines are rank 0's training lines (it follows node 0's log).
TRAINING_STEP = "wait-trainjob"
#: Rank 0's lines left to --verbose: one per epoch on top of the epoch's own line.
HOUSEKEEPING_PREFIXES = ("checkpoint saved: ",)
#: KFP's executor prefixes its own log lines so (kfp 2.17 kfp/dsl/executor_main.py).
KFP_EXECUTOR_PREFIX = "[KFP Executor "
#: The executor line after which it dumps the executor input, a JSON document indented by 4
#: that ends with a "}" line of its own (kfp 2.17 kfp/dsl/executor_main.py).
EXECUTOR_INPUT_HEADER = "Got executor_input:"
#: An uncaught exception's last traceback line: ``package.module.Name: message``.
EXCEPTION_LINE = re.compile(
    r"(?P<module>(?:[A-Za-z_]\w*\.)*)(?P<name>[A-Za-z_]\w*(?:Error|Exception)\b): (?P<message>.*)"
)
#: The one line a kubetrain step fails with (kubetrain/errors.py report_failure): the cause its
#: end line carries, not a training line.
STEP_ERROR_LINE = re.compile(r"kubetrain [\w-]+: error: ")
GREEN, RED, CYAN, RESET = "\x1b[32m", "\x1b[31m", "\x1b[36m", "\x1b[0m"


def strip_ansi(text: str) -> str:
    return ANSI_ESCAPE.sub("", text)


def colour_wanted(stream: TextIO) -> bool:
    """Colour on a terminal only, and not when ``NO_COLOR`` is set to anything but empty."""
    return stream.isatty() and not os.environ.get("NO_COLOR")


@dataclass
class Step:
    """One task the local runner ran: its name, when it started, and its own output lines
    (KFP's executor lines and executor-input dump left out)."""

    name: str
    started: float
    lines: list[str] = field(default_factory=list)
    succeeded: bool | None = None
    seconds: float = 0.0
    in_executor_input: bool = False

    def cause(self) -> str:
        """The step's one-line cause of failure: its last line (the ``kubetrain STEP: error:``
        line a step ends with), of an uncaught exception the ``Name: message`` without its module
        path, of kubetrain's own errors the message alone (written for whoever reads it)."""
        last = self.last_line()
        exception = EXCEPTION_LINE.fullmatch(last) if self.traceback_shown() else None
        if exception is None:
            return last or "no output"
        if exception["module"].startswith("kubetrain."):
            return exception["message"]
        return f"{exception['name']}: {exception['message']}"

    def last_line(self) -> str:
        return next((line.strip() for line in reversed(self.lines) if line.strip()), "")

    def traceback_shown(self) -> bool:
        return any(line.startswith("Traceback (most recent call last)") for line in self.lines)


class RunOutput:
    """The run's terminal view: told each step's start, lines and end by the patched runner."""

    def __init__(self, verbose: bool, stream: TextIO, colour: bool) -> None:
        self.verbose = verbose
        self.stream = stream
        self.colour = colour
        self.steps: list[Step] = []
        #: Draws rank 0's progress records while the training step runs (concise output).
        self.display: ProgressDisplay | None = None

    def paint(self, text: str, colour: str) -> str:
        return f"{colour}{text}{RESET}" if self.colour else text

    def write(self, line: str) -> None:
        if self.display is not None:  # above its live bar
            self.display.print(line)
            return
        self.stream.write(f"{line}\n")
        self.stream.flush()

    def step_started(self, name: str) -> None:
        self.steps.append(Step(name, time.monotonic()))
        if not self.verbose:
            self.write(f"{self.paint(name, CYAN)} started")

    def step_line(self, line: str) -> None:
        """One line the running step wrote; printed as KFP would (--verbose) or, concise, when
        it is rank 0's training line."""
        if not self.colour:
            line = strip_ansi(line)
        step = self.steps[-1]
        if self.verbose:
            print(line)  # KFP's indented_print indents it, as it does the lines it streams
        if step.in_executor_input:
            step.in_executor_input = line != "}"
            return
        if line.startswith(KFP_EXECUTOR_PREFIX):
            step.in_executor_input = line.endswith(EXECUTOR_INPUT_HEADER)
            return
        if parse_record(line) is None:  # records are drawn, not kept
            step.lines.append(line)
        if not self.verbose and self.shown_as_training(step, line):
            self.training_display().feed(line)

    def training_display(self) -> ProgressDisplay:
        """The training step's display: a live bar on a terminal, plain lines off one."""
        if self.display is None:
            mode = LIVE if self.stream.isatty() else PLAIN
            self.display = ProgressDisplay(self.stream, mode, indent="  ")
        return self.display

    @staticmethod
    def shown_as_training(step: Step, line: str) -> bool:
        return (
            step.name == TRAINING_STEP
            and bool(line.strip())
            and not line.startswith(HOUSEKEEPING_PREFIXES)
            and not STEP_ERROR_LINE.match(line)
            and not step.traceback_shown()
        )

    def step_ended(self, succeeded: bool) -> None:
        step = self.steps[-1]
        step.succeeded, step.seconds = succeeded, time.monotonic() - step.started
        if self.display is not None:
            self.display.close()
            self.display = None
        if self.verbose:
            return
        if not succeeded:
            ended = f"{self.paint('failed', RED)} after {step.seconds:.1f}s: {step.cause()}"
        else:
            ended = f"{self.paint('done', GREEN)} in {step.seconds:.1f}s"
            if step.last_line() and step.name != TRAINING_STEP:  # what it did, in its words
                ended += f": {step.last_line()}"
        self.write(f"{self.paint(step.name, CYAN)} {ended}")

    def failure(self, see_more: str, fallback: str) -> str:
        """The run's last line when a step failed: the first failing step (the exit handler's
        runs after it), its cause and the command to see more."""
        failed = next((step for step in self.steps if step.succeeded is False), None)
        if failed is None:
            return strip_ansi(fallback)
        return f"step {failed.name} failed: {failed.cause()}; to see more: {see_more}"


@contextlib.contextmanager
def kfp_output_shaped(view: RunOutput) -> Iterator[None]:
    """Route KFP's local runner's output through ``view`` for the duration of the run."""
    from kfp.local import (
        executor_input_utils,
        logging_utils,
        status,
        subprocess_task_handler,
        task_dispatcher,
    )

    from kubetrain.backends.owned_processes import start_owned

    run_task = task_dispatcher.run_single_task_implementation
    logger_context = logging_utils.local_logger_context
    horizontal_line = logging_utils.print_horizontal_line
    run_process = subprocess_task_handler.run_local_subprocess

    def run_task_shown(**task: Any) -> Any:
        view.step_started(executor_input_utils.get_local_task_resource_name(task["component_name"]))
        outputs, task_status = run_task(**task)
        view.step_ended(task_status == status.Status.SUCCESS)
        return outputs, task_status

    @contextlib.contextmanager
    def logger_context_shaped() -> Iterator[None]:
        with logger_context():
            for handler in logging.getLogger().handlers:
                if not view.verbose:  # KFP's warnings still show, on stderr
                    handler.setLevel(logging.WARNING)
                    handler.addFilter(not_a_task_status)
                    handler.setStream(sys.stderr)  # type: ignore[attr-defined]
                if not view.colour:
                    handler.addFilter(without_colour)
            yield

    def run_process_shown(full_command: list[str], env_vars: dict[str, str] | None = None) -> int:
        """kfp 2.17 run_local_subprocess, with each line handed to ``view``, the step owned
        (``owned_processes.start_owned``): nothing it starts outlives it but the local job
        its launch leaves running, which the run's exit handler deletes. The ``with`` returns
        at once on KeyboardInterrupt, which `kubetrain run`'s interrupt handling needs."""
        # The wait step passes rank 0's progress records on for ``view`` to draw.
        env = {**os.environ, **(env_vars or {}), MODE_VARIABLE: RECORDS}
        with start_owned(
            full_command,
            env=env,
            spare_local_jobs=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        ) as process:
            assert process.stdout is not None
            for line in iter(process.stdout.readline, ""):
                view.step_line(line.rstrip("\n"))
            return process.wait()

    task_dispatcher.run_single_task_implementation = run_task_shown
    logging_utils.local_logger_context = logger_context_shaped
    subprocess_task_handler.run_local_subprocess = run_process_shown
    if not view.verbose:
        logging_utils.print_horizontal_line = lambda: None
    try:
        yield
    finally:
        task_dispatcher.run_single_task_implementation = run_task
        logging_utils.local_logger_context = logger_context
        logging_utils.print_horizontal_line = horizontal_line
        subprocess_task_handler.run_local_subprocess = run_process


def not_a_task_status(record: logging.LogRecord) -> bool:
    """A logging filter that drops KFP's "Task 'x' finished with status FAILURE": the step's
    own end line says so, with its cause."""
    return "finished with status" not in record.getMessage()


def without_colour(record: logging.LogRecord) -> bool:
    """A logging filter that keeps the record, its message without ANSI escapes."""
    record.msg, record.args = strip_ansi(record.getMessage()), None
    return True
