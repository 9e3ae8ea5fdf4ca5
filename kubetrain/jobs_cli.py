"""`kubetrain logs` and `kubetrain delete`: look at and remove a job on any backend."""

from __future__ import annotations

import argparse

from kubetrain.backends import get_backend


def register(subparsers: argparse._SubParsersAction) -> None:
    logs = subparsers.add_parser(
        "logs",
        help="print a job's logs",
        description=(
            "Print a job's logs: every node's, each line prefixed with [node-N], or one node's."
        ),
    )
    logs.add_argument("name", help="job name")
    logs.add_argument("--backend", default="local", help="where the job runs; default local")
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
    delete.add_argument("name", help="job name")
    delete.add_argument("--backend", default="local", help="where the job runs; default local")
    delete.set_defaults(handler=run_delete)


def run_logs(args: argparse.Namespace) -> int:
    for line in get_backend(args.backend).logs(args.name, node=args.node, follow=args.follow):
        print(line, flush=True)
    return 0


def run_delete(args: argparse.Namespace) -> int:
    get_backend(args.backend).delete(args.name)
    print(f"deleted {args.name}")
    return 0
