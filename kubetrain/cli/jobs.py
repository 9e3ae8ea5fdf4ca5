"""`kubetrain list`, `kubetrain logs` and `kubetrain delete`: find, look at and remove a job
on any backend."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, TextIO

from kubetrain.backends import get_backend
from kubetrain.components._shared.backend_options import add_backend_arguments, backend_options
from kubetrain.errors import InvalidInput, terminal_text

if TYPE_CHECKING:
    from kubetrain.backends.base import JobRow

#: The columns of `kubetrain list`, as kubectl names its own.
LIST_COLUMNS = ("NAME", "STATE", "AGE", "NODES")
BOLD, RESET = "\x1b[1m", "\x1b[0m"


def register(subparsers: argparse._SubParsersAction) -> None:
    listing = subparsers.add_parser(
        "list",
        help="list jobs: name, state, age, nodes",
        description=(
            "List jobs, running and finished, with their state, age and nodes: the local "
            "backend's (under $KUBETRAIN_LOCAL_ROOT, default ~/.kubetrain/local), or with "
            "--backend trainer|pytorchjob|job|rayjob kubetrain's TrainJobs / PyTorchJobs / "
            "Jobs / RayJobs in --namespace. An elastic job's NODES are its range, e.g. 1..2, "
            "and while it runs how many nodes train in it, e.g. 1 of 1..2; a RayJob's are its "
            "Ray worker nodes."
        ),
    )
    add_backend_arguments(listing)
    listing.set_defaults(handler=run_list)

    logs = subparsers.add_parser(
        "logs",
        help="print a job's logs",
        description=(
            "Print a job's logs: every node's, each line prefixed with [node-N], or one node's. "
            "Lines tagged with another rank than global rank 0 (torch's [rankN]: traceback "
            "lines, torchrun --tee's [defaultN]: lines) are left out unless --all-ranks; "
            "torchrun's failure report (ChildFailedError) is folded to one line. Rank 0's "
            "progress records are drawn as a live bar with --follow on a terminal. --raw "
            "prints every line as written. A Ray job's node 0 is its driver (--backend rayjob: "
            "one node, the RayJob's submitter pod, whose log is the driver's output, where the "
            "Ray Train workers' lines arrive too)."
        ),
    )
    logs.add_argument("name", help="job name")
    add_backend_arguments(logs)
    logs.add_argument(
        "--node",
        type=int,
        default=None,
        help="only this node's log (0 holds rank 0); default all nodes",
    )
    logs.add_argument(
        "--follow", "-f", action="store_true", help="keep printing new lines until the job ends"
    )
    logs.add_argument(
        "--all-ranks",
        action="store_true",
        help="also print the lines of every other rank (a node's local ranks 1 and up, the "
        "ranks of the other nodes); by default those a rank tag names are left out",
    )
    logs.add_argument(
        "--raw",
        action="store_true",
        help="print every line as written: every rank's, torchrun's failure report whole, "
        "rank 0's progress records (kubetrain-progress JSON) included; by default records "
        "are a live bar with --follow on a terminal, else left out",
    )
    logs.set_defaults(handler=run_logs)

    delete = subparsers.add_parser(
        "delete",
        help="stop a job and remove it",
        description=(
            "Stop every process (or pod) of a job and remove the job; nothing is left running "
            "(a RayJob: KubeRay's RayCluster, its head and workers, and the submitter go with "
            "it; a local Ray job: its head, workers and driver)."
        ),
    )
    delete.add_argument(
        "name", nargs="?", default="", help="job name (or give the launch's --run-name)"
    )
    delete.add_argument(
        "--run-name",
        default="",
        help="delete the job `kubetrain launch --run-name RUN` created (e.g. in an Argo exit "
        "handler, from {{workflow.name}})",
    )
    delete.add_argument(
        "--ignore-not-found",
        action="store_true",
        help="exit 0 when there is no such job (already deleted, or never launched)",
    )
    delete.add_argument(
        "--keep-complete",
        action="store_true",
        help="keep the job if it ended Complete, with its status and logs (the pipelines' "
        "exit handlers: a run whose training completed keeps its job, whatever came after)",
    )
    add_backend_arguments(delete)
    delete.set_defaults(handler=run_delete)


def run_list(args: argparse.Namespace) -> int:
    backend = get_backend(args.backend, backend_options(args))  # refuses an unknown name
    if args.backend == "local":
        from kubetrain.backends.local.listing import list_local_jobs

        rows = list_local_jobs(backend.root, _tell_unreadable)
        where = f"under {backend.root}"
    else:
        rows, where = backend.list_jobs(), f"in namespace {backend.namespace}"
    print(job_table(rows, sys.stdout), end="")
    if not rows:
        print(terminal_text(f"no {args.backend} jobs {where}"), file=sys.stderr)
    return 0


def _tell_unreadable(name: str, why: str) -> None:
    print(terminal_text(f"{name}: unreadable: {why}"), file=sys.stderr)


def job_table(rows: list[JobRow], stream: TextIO) -> str:
    """Aligned columns under a header, bold only on a terminal with ``NO_COLOR`` unset
    (https://no-color.org); plain text otherwise, so it greps and pipes."""
    cells = [LIST_COLUMNS] + [
        (
            terminal_text(row.name),
            terminal_text(row.state),
            age(row.age_seconds),
            "-" if row.nodes is None else str(row.nodes),
        )
        for row in rows
    ]
    widths = [max(len(line[column]) for line in cells) for column in range(len(LIST_COLUMNS))]
    lines = [
        "   ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in cells
    ]
    if stream.isatty() and not os.environ.get("NO_COLOR"):
        lines[0] = f"{BOLD}{lines[0]}{RESET}"
    return "\n".join(lines) + "\n"


def age(seconds: float) -> str:
    """kubectl's short form: 45s, 12m, 5h, 3d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def run_logs(args: argparse.Namespace) -> int:
    from kubetrain.components._shared.progress_display import LIVE, PLAIN, ProgressDisplay

    if args.node is not None and args.node < 0:
        raise InvalidInput(
            "--node", f"{args.node} is below 0", "give a node index from 0 (node 0 holds rank 0)"
        )
    backend = get_backend(args.backend, backend_options(args))
    lines = backend.logs(args.name, node=args.node, follow=args.follow)
    if args.raw:
        for line in lines:
            print(line, flush=True)
        return 0
    # A log read to its end shows no records: it has the epoch lines, and a dump of past
    # records is noise; while following, they are the live bar (or a line now and then).
    live = args.follow and sys.stdout.isatty()
    with ProgressDisplay(sys.stdout, LIVE if live else PLAIN) as display:
        for line in node_views(lines, args.node, args.all_ranks):
            display.feed(line)
    return 0


#: How a backend prefixes a line when it reads several nodes' logs.
NODE_PREFIX = re.compile(r"^(\[node-(\d+)\] )(.*)$", re.DOTALL)


def node_views(lines: Iterable[str], node: int | None, all_ranks: bool) -> Iterator[str]:
    """``lines`` (one node's, or several prefixed ``[node-N]``) as each node's
    ``NodeLogView`` shows them."""
    from kubetrain.backends.torchrun_output import NodeLogView

    views: dict[str, NodeLogView] = {}
    for line in lines:
        prefix, index, text = "", node or 0, line
        if node is None and (match := NODE_PREFIX.match(line)):
            prefix, index, text = match.group(1), int(match.group(2)), match.group(3)
        view = views.setdefault(prefix, NodeLogView(index, all_ranks))
        yield from (prefix + shown for shown in view.feed(text))
    for prefix, view in views.items():
        yield from (prefix + shown for shown in view.flush())


def run_delete(args: argparse.Namespace) -> int:
    from kubetrain.components.wait_trainjob.wait import delete_job, delete_run_job

    if bool(args.name) == bool(args.run_name):
        given = "both NAME and --run-name are" if args.name else "neither NAME nor --run-name is"
        raise InvalidInput(
            "name", f"{given} given", "give exactly one, e.g. `kubetrain delete my-job`"
        )
    how = (args.backend, backend_options(args), args.ignore_not_found, args.keep_complete)
    if args.run_name:  # the exit handlers' road: the KFP delete_trainjob component's too
        print(terminal_text(delete_run_job(args.run_name, *how)))
    else:
        print(terminal_text(delete_job(args.name, *how)))
    return 0
