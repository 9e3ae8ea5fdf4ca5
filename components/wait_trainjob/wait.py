"""Wait step: follow a job to Complete or Failed, streaming global rank 0's log lines (node
0's log as ``NodeLogView`` shows it: torchrun's failure report folded), and fail with the
failing node's exit code, after the failing rank's traceback where wait has not shown it."""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kubetrain.backends import BackendOptions, get_backend
from kubetrain.backends.base import COMPLETE, Backend, JobStatus, NodeStatus
from kubetrain.backends.local.files import KEEP_FILES_ENV
from kubetrain.backends.torchrun_output import NodeLogView, folded
from kubetrain.backends.torchrun_report import rank_traceback, root_cause, torchrun_failure
from kubetrain.errors import InvalidInput, JobNotFound, KubetrainError
from kubetrain.names import derive_job_name
from kubetrain.progress import parse_record

FAILURE_LOG_LINES = 20
#: Lines read from the failing node's log to find the rank's exception: torchrun's report and
#: its own traceback take ~50 lines after the rank's ``[rankN]:`` traceback.
CAUSE_LOG_LINES = 400
#: A running job silent this long is stalled, unless its rank 0 promised a line sooner (0
#: turns the check off). Generous: a slow data load, validation pass or checkpoint must not be
#: taken for a hang; a stopped rank otherwise meets only torch's collective timeout (30
#: minutes for gloo), and hangs outside a collective meet none.
DEFAULT_STALL_TIMEOUT_SECONDS = 1800.0
#: After a progress record that promises its next line within ``heartbeat_seconds`` (our
#: trainer's, mid-epoch: at least 60 s), a silence of this many times that is a stall: five
#: missed heartbeats, room for a batch five times the slowest yet, a slow log stream or a
#: paused process, and a hung rank is reported in 5 minutes instead of 30.
HEARTBEATS_MISSED = 5
#: The least stall timeout a promise gives: a pod log stream that breaks is reopened within
#: seconds, but a whole heartbeat may come late behind it.
MIN_DERIVED_STALL_SECONDS = 120.0
#: ``--unschedulable-grace-seconds`` left to the runtime: 300 s, no limit for a gang runtime.
AUTO = "auto"


class StallLimit:
    """The silence that means a stall, asked at each check: ``explicit`` seconds when given
    (0: never), else derived from what the job's rank 0 says in its last line (fed here): a
    progress record promising its next line within ``heartbeat_seconds`` gives
    :data:`HEARTBEATS_MISSED` times that, at least :data:`MIN_DERIVED_STALL_SECONDS`; any other
    line, or none yet (a user program, data loading, an epoch's validation and checkpoint),
    :data:`DEFAULT_STALL_TIMEOUT_SECONDS`."""

    def __init__(self, explicit: float | None = None) -> None:
        self.explicit = explicit
        self.derived = DEFAULT_STALL_TIMEOUT_SECONDS

    def feed(self, line: str) -> None:
        record = parse_record(line)
        promise = record.heartbeat_seconds if record is not None else None
        self.derived = (
            DEFAULT_STALL_TIMEOUT_SECONDS
            if promise is None
            else max(MIN_DERIVED_STALL_SECONDS, HEARTBEATS_MISSED * promise)
        )

    def __call__(self) -> float | None:
        if self.explicit is not None:
            return self.explicit or None
        return self.derived


def stall_timeout(text: str | float | None, field: str = "stall_timeout") -> float | None:
    """``--stall-timeout`` as every face gives it: "auto" (or None: derived, see
    :class:`StallLimit`), or seconds (0: never)."""
    fix = (
        f"use auto ({DEFAULT_STALL_TIMEOUT_SECONDS:g} s, or {HEARTBEATS_MISSED} times the "
        "heartbeat our trainer states), 0 (never) or seconds"
    )
    return _auto_or_seconds(text, field, "auto or a finite 0 or more", fix)


def _auto_or_seconds(text: str | float | None, field: str, expected: str, fix: str) -> float | None:
    """None for "auto" (or None), else ``text`` as a finite number of seconds, 0 or more."""
    if text is None or text == AUTO:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds < math.inf:  # NaN too
        raise InvalidInput(field, f"{text!r} is not {expected}", fix)
    return seconds


@dataclass(frozen=True)
class WaitResult:
    job_name: str
    state: str
    reason: str
    message: str
    duration_seconds: float
    #: An elastic job's nodes at its end, e.g. "1 of 1..2 nodes"; "" for a fixed size.
    membership: str = ""


class JobFailed(KubetrainError):
    """The job ended Failed; the exit code is the failing node's (128+N for signal N). Its
    message is one line, the cause (the failing rank's exception where a log names it);
    ``log_tail`` holds what of the failing node's log was not shown yet (``failure_context``),
    which a face prints before that line so a step's log (and `kubetrain run`'s cause, its
    last line) ends with the cause. ``streamed``: the view wait streamed node 0's log through,
    None when it streamed nothing."""

    def __init__(
        self, status: JobStatus, last_lines: list[str], streamed: NodeLogView | None = None
    ) -> None:
        node = status.failed_node
        code = node.exit_code if node is not None and node.exit_code is not None else 1
        exit_code = 128 - code if code < 0 else (code if 0 < code < 256 else 1)
        message = f"job {status.name} failed ({status.reason}): {status.message}"
        failure = torchrun_failure(last_lines)
        if failure and failure.exception and not failure.consequence:
            if (named := failure.describe()) not in message:  # the local backend names it
                message += f"; {named}"
        if cause := root_cause(last_lines):
            message += f"; torchrun: {cause}"
        self.log_tail = failure_context(node, last_lines, streamed)
        super().__init__(message, exit_code=exit_code)
        self.status = status

    def context_lines(self) -> list[str]:
        return self.log_tail


def failure_context(
    node: NodeStatus | None, lines: list[str], streamed: NodeLogView | None
) -> list[str]:
    """What the failing node's log adds to the error line, each thing once: the failing
    rank's traceback (``rank_traceback``) unless wait streamed it already, else, when wait
    did not stream that node, its last lines with torchrun's report folded (the error line
    names the report's root cause)."""
    if node is None or not lines:
        return []
    seen = streamed is not None and streamed.node == node.rank
    if traceback := rank_traceback(lines):
        if seen and streamed.shows(traceback):
            return []
        failure = torchrun_failure(lines)
        whose = f"rank {failure.rank}" if failure and failure.rank is not None else "the rank"
        return [f"{whose} failed on node {node.rank}:", *traceback]
    if seen:
        return []
    shown = folded(lines)[-FAILURE_LOG_LINES:]
    return [f"last {len(shown)} lines of node {node.rank}:", *shown] if shown else []


def last_log_lines(
    backend: Backend, status: JobStatus, count: int = FAILURE_LOG_LINES
) -> list[str]:
    """The failing node's last lines: those the backend kept, else read now (best effort: the
    node's pod may be gone, and the failure must still be reported)."""
    if status.log_tail:
        return status.log_tail[-count:]
    node = status.failed_node
    if node is None:
        return []
    try:
        return list(deque(backend.logs(status.name, node=node.rank, follow=False), maxlen=count))
    except KubetrainError:
        return []


def unschedulable_grace(text: str | float | None) -> float | None:
    """``--unschedulable-grace-seconds`` as every face gives it: "auto" (or None: 300 s, no
    limit for a gang runtime), "" or 0 (no limit), or seconds."""
    if text == "":
        return 0.0
    return _auto_or_seconds(
        text,
        "unschedulable_grace_seconds",
        "auto, empty or a finite 0 or more",
        "use auto (300 s; no limit for a gang runtime), 0 or empty (no limit), or seconds",
    )


def delete_run_job(
    run_name: str,
    backend: str = "trainer",
    options: BackendOptions | None = None,
    ignore_not_found: bool = True,
    keep_complete: bool = False,
) -> str:
    """Delete the job the launch step created for pipeline run ``run_name`` (its name derives
    from the run: ``derive_job_name``) and say what was done, whether or not launch got as far
    as creating the job (``ignore_not_found``). `kubetrain delete --run-name`, the Argo
    exit handler and the KFP ``delete_trainjob`` component all come here."""
    if not run_name:
        raise InvalidInput("run_name", "is empty", "pass the run_name the launch step was given")
    return delete_job(derive_job_name(run_name), backend, options, ignore_not_found, keep_complete)


def delete_job(
    name: str,
    backend: str = "trainer",
    options: BackendOptions | None = None,
    ignore_not_found: bool = False,
    keep_complete: bool = False,
) -> str:
    """Delete job ``name`` and say what was done. ``keep_complete`` is the exit handlers'
    rule, decided from the job and not from the pipeline's word for the run: a job that ended
    Complete trained to its end and stays, with its status and logs, whatever came after it;
    a running, pending, suspended or Failed one is deleted. A KFP backend's exit status cannot
    decide it: a run whose dsl.If was false reports RUNNING (tests/support/
    kfp_backend_states.py)."""
    backend_impl = get_backend(backend, options)
    if keep_complete:
        try:
            state = backend_impl.status(name).state
        except JobNotFound:
            state = None  # delete still removes what launch left before the job (a ConfigMap)
        if state == COMPLETE:
            return f"job {name} completed, kept with its status and logs"
    try:
        backend_impl.delete(name)
    except JobNotFound as missing:
        if not ignore_not_found:
            raise
        return f"{name}: {missing}"
    if backend == "local" and os.environ.get(KEEP_FILES_ENV):  # under `kubetrain run`
        return f"stopped {name}; its folder stays for its logs"
    return f"deleted {name}"


def wait_for_job(
    job_name: str,
    backend: str = "local",
    timeout_seconds: float = 0,
    on_log_line: Callable[[str], None] | None = print,
    options: BackendOptions | None = None,
    stall_timeout_seconds: float | str | None = AUTO,
) -> WaitResult:
    """Block until the job finishes; raise JobFailed if it failed. ``timeout_seconds`` 0 = none.
    A job running with no new log line for ``stall_timeout_seconds`` (0 = never; "auto" or
    None: derived from rank 0's heartbeat, :class:`StallLimit`) is stopped and reported as
    ``JobStalled`` (exit 3). ``options`` (namespace, what to do on cancel, how long a node may
    stay unschedulable) matter to the cluster backends."""
    if not job_name:
        raise InvalidInput("job_name", "is empty", "pass the name printed by the launch step")
    if not 0 <= timeout_seconds < math.inf:  # NaN too
        raise InvalidInput(
            "timeout",
            f"{timeout_seconds} is not a finite 0 or more",
            "use 0 (none) or more seconds",
        )
    limit = StallLimit(stall_timeout(stall_timeout_seconds))
    backend_impl = get_backend(backend, options)
    started = time.monotonic()
    view = NodeLogView(0) if on_log_line is not None else None  # node 0 holds global rank 0
    try:
        status = backend_impl.wait(
            job_name,
            timeout=timeout_seconds or None,
            on_log_line=_through(view, on_log_line, limit),
            stall_timeout=limit if limit() is not None else None,
        )
    finally:
        if view is not None and on_log_line is not None:
            for line in view.flush():
                on_log_line(line)
    if status.state != COMPLETE:
        raise JobFailed(status, last_log_lines(backend_impl, status, CAUSE_LOG_LINES), view)
    return WaitResult(
        job_name=job_name,
        state=status.state,
        reason=status.reason,
        message=status.message,
        duration_seconds=round(time.monotonic() - started, 3),
        membership=status.membership,
    )


def _through(
    view: NodeLogView | None, on_log_line: Callable[[str], None] | None, limit: StallLimit
) -> Callable[[str], None] | None:
    """``on_log_line`` fed the lines ``view`` shows, and every rank-0 line fed to ``limit``
    when it derives the stall timeout (so even a quiet wait follows rank 0's log)."""
    derives = limit.explicit is None
    if not derives and (view is None or on_log_line is None):
        return None

    def shown(line: str) -> None:
        if derives:
            limit.feed(line)
        if view is not None and on_log_line is not None:
            for kept in view.feed(line):
                on_log_line(kept)

    return shown
