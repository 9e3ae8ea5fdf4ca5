"""`kubetrain wait`: follow a job to the end, streaming rank-0 logs."""

from __future__ import annotations

import argparse

from kubetrain.components._shared.backend_options import add_backend_arguments, backend_options
from kubetrain.components._shared.step_outputs import (
    add_output_parameters_argument,
    check_output_parameters,
    write_output_parameters,
)
from kubetrain.components.wait_trainjob.wait import (
    AUTO,
    DEFAULT_STALL_TIMEOUT_SECONDS,
    HEARTBEATS_MISSED,
    MIN_DERIVED_STALL_SECONDS,
)
from kubetrain.errors import terminal_text

#: The files ``--output-parameters`` gets: what Argo's template reads.
OUTPUT_NAMES = ("state", "duration_seconds")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "wait",
        help="follow a job to Complete/Failed, streaming rank-0 logs",
        description=(
            "Follow a job until it is Complete (exit 0) or Failed (exit with the failing node's "
            "exit code, printing the failing rank's traceback, or that node's last log lines, "
            "once, then the reason), streaming global rank 0's log lines as they are written "
            "(other ranks' tagged lines left out, torchrun's failure report folded to one line: "
            "`kubetrain logs --all-ranks`/`--raw` show them), its progress records as a live "
            "bar on a terminal (off one, a progress line when nothing was said for 30 s). "
            "An elastic job's node changes come as lines of their own (kubetrain: node 1 lost "
            "...; continuing with 1 of 1..2 nodes), its nodes on the bar and the last line. "
            "SIGTERM (a cancelled pipeline run) or Ctrl-C stops the job (on a cluster: deletes "
            "or suspends it) before exiting 143 or 130."
        ),
    )
    parser.add_argument("name", help="job name, as printed by `kubetrain launch`")
    add_backend_arguments(parser)
    parser.add_argument(
        "--timeout",
        type=float,
        default=0,
        help="give up after this many seconds (exit 124); the job goes on running, for "
        "`kubetrain delete` or the pipeline's exit handler to stop; default 0 = wait forever",
    )
    parser.add_argument(
        "--stall-timeout",
        default=AUTO,
        help="stop a running job whose nodes log nothing for this many seconds (a stopped or "
        f"hung rank) and exit 3; 0 = never; default {AUTO}: {HEARTBEATS_MISSED} times the "
        "heartbeat rank 0's last progress record states (our trainer's, mid-epoch: 5 min), at "
        f"least {MIN_DERIVED_STALL_SECONDS:g} s, else {DEFAULT_STALL_TIMEOUT_SECONDS:g} s (a "
        "program of your own, data loading, validation and checkpoints)",
    )
    parser.add_argument(
        "--on-cancel",
        default="delete",
        help="what SIGTERM, or a node that cannot start, does to a cluster job: delete "
        "(default) or suspend",
    )
    parser.add_argument(
        "--unschedulable-grace-seconds",
        default=AUTO,
        help="fail a cluster job whose node pod no node can take for this many seconds (it "
        "says what the pod waits for meanwhile); 0 or empty = no limit (an autoscaler, a "
        f"queue); default {AUTO}: 300, no limit for a gang (a runtime's podGroupPolicy, a pod "
        "in a pod group)",
    )
    parser.add_argument("--quiet", action="store_true", help="do not stream rank-0 log lines")
    add_output_parameters_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from kubetrain.components._shared.progress_display import ProgressDisplay
    from kubetrain.components.wait_trainjob.wait import unschedulable_grace, wait_for_job

    check_output_parameters(args.output_parameters, OUTPUT_NAMES)  # before the wait, not after
    options = replace(
        backend_options(args),
        unschedulable_grace=unschedulable_grace(args.unschedulable_grace_seconds),
    )
    with ProgressDisplay() as display:
        result = wait_for_job(
            args.name,
            backend=args.backend,
            timeout_seconds=args.timeout,
            on_log_line=None if args.quiet else display.feed,
            options=options.validate(),
            stall_timeout_seconds=args.stall_timeout,
        )
    membership = f" ({result.membership})" if result.membership else ""  # an elastic job's
    print(
        f"job {terminal_text(result.job_name)} {terminal_text(result.state)} after "
        f"{result.duration_seconds:.1f}s{terminal_text(membership)}"
    )
    outputs = (result.state, round(result.duration_seconds, 3))
    write_output_parameters(args.output_parameters, dict(zip(OUTPUT_NAMES, outputs, strict=True)))
    return 0
