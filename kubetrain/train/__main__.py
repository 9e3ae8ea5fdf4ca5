"""``python -m kubetrain.train``: the entrypoint our DDP/FSDP image runs under torchrun."""

from __future__ import annotations

import sys

from kubetrain.errors import KubetrainError
from kubetrain.process_exit import skip_exit_collection
from kubetrain.train.distributed import init_runtime, shutdown
from kubetrain.train.options import PROG, parse_options
from kubetrain.train.progress import make_reporter
from kubetrain.train.trainer import run


def main(argv: list[str] | None = None) -> int:
    """Validate options before joining the process group, so bad input fails fast on all ranks."""
    reporter = None
    try:
        options = parse_options(argv)
        runtime = init_runtime(options.device)
        reporter = make_reporter(runtime.is_main)
        run(options, runtime, reporter)
        return 0
    except KubetrainError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    finally:
        if reporter is not None:
            reporter.close()
        shutdown()


if __name__ == "__main__":
    exit_code = main()
    skip_exit_collection()
    sys.exit(exit_code)
