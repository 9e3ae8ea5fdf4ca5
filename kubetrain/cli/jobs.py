"""`kubetrain logs` and `kubetrain delete`: look at and remove a job on any backend."""

from __future__ import annotations

import argparse

from kubetrain.backends import get_backend
from kubetrain.components._shared.backend_options import add_backend_arguments, backend_options
from kubetrain.errors import InvalidInput, JobNotFound


def register(subparsers: argparse._SubParsersAction) -> None:
    logs = subparsers.add_parser(
        "logs",
        help="print a job's logs",
        description=(
            "Print a job's logs: every node's, each line prefixed with [node-N], or one node's."
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
    logs.set_defaults(handler=run_logs)

    delete = subparsers.add_parser(
        "delete",
        help="stop a job and remove it",
        description=(
            "Stop every process (or pod) of a job and remove the job; nothing is left running."
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
    add_backend_arguments(delete)
    delete.set_defaults(handler=run_delete)


def run_logs(args: argparse.Namespace) -> int:
    backend = get_backend(args.backend, backend_options(args))
    for line in backend.logs(args.name, node=args.node, follow=args.follow):
        print(line, flush=True)
    return 0


def run_delete(args: argparse.Namespace) -> int:
    if bool(args.name) == bool(args.run_name):
        given = "both NAME and --run-name are" if args.name else "neither NAME nor --run-name is"
        raise InvalidInput(
            "name", f"{given} given", "give exactly one, e.g. `kubetrain delete my-job`"
        )
    if args.run_name:  # the exit handlers' road: the KFP delete_trainjob component's too
        from kubetrain.components.wait_trainjob.wait import delete_run_job

        print(
            delete_run_job(
                args.run_name, args.backend, backend_options(args), args.ignore_not_found
            )
        )
        return 0
    try:
        get_backend(args.backend, backend_options(args)).delete(args.name)
    except JobNotFound as missing:
        if not args.ignore_not_found:
            raise
        print(f"{args.name}: {missing}")
        return 0
    print(f"deleted {args.name}")
    return 0
