"""``python -m kubetrain.train``: the entrypoint our DDP/FSDP image runs under torchrun."""

from __future__ import annotations

import sys

from kubetrain.errors import report_failure
from kubetrain.process_exit import skip_exit_collection
from kubetrain.train.distributed import init_runtime, shutdown
from kubetrain.train.options import PROG, parse_options
from kubetrain.train.progress import make_reporter
from kubetrain.train.trainer import run


def main(argv: list[str] | None = None) -> int:
    """Validate options before joining the process group, so bad input fails fast on all ranks;
    every error ends as one line (``kubetrain.errors.report_failure``)."""
    reporter = None
    checkpoint_dir = None
    try:
        options = parse_options(argv)
        checkpoint_dir = str(options.checkpoint_dir)
        runtime = init_runtime(options.device)
        reporter = make_reporter(runtime.is_main)
        run(options, runtime, reporter)
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # One line, the node log's last: a disk full while checkpointing names the checkpoint
        # folder ("No space left on device"), which `wait`'s failure report quotes.
        return report_failure(PROG, exc, output=checkpoint_dir)
    finally:
        if reporter is not None:
            reporter.close()
        shutdown()


if __name__ == "__main__":
    exit_code = main()
    skip_exit_collection()
    sys.exit(exit_code)
