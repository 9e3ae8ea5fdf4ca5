"""``python -m kubetrain.train``: the entrypoint our trainer image runs under torchrun (DDP,
FSDP, DeepSpeed), or once per rank under mpirun (``--launcher mpi``)."""

from __future__ import annotations

import json
import os
import sys
import time

from kubetrain.errors import failure_line, report_failure
from kubetrain.process_exit import skip_exit_collection
from kubetrain.train.options import PROG, parse_options
from kubetrain.train.progress import make_reporter


def record_for_torchrun(line: str) -> None:
    """Write ``line`` to the error file torchrun gives each worker (TORCHELASTIC_ERROR_FILE),
    in the format of torch.distributed.elastic's ``ErrorHandler``: torchrun's "Root Cause"
    report, the last lines of the node's log, then shows it instead of "<N/A>"."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": line, "extraInfo": {"py_callstack": line}}}
    data["message"]["extraInfo"]["timestamp"] = str(int(time.time()))
    try:
        with open(path, "w") as handle:
            json.dump(data, handle)
    except OSError:
        pass  # best effort: the line is on stderr already


def main(argv: list[str] | None = None) -> int:
    """Validate options before joining the process group, so bad input fails fast on all ranks;
    every error ends as one line (``kubetrain.errors.report_failure``). torch (the ``train``
    extra) is imported inside the boundary, so a base install says which extra to install."""
    reporter = None
    checkpoint_dir = None
    distributed = None
    try:
        options = parse_options(argv)
        checkpoint_dir = str(options.checkpoint_dir)
        from kubetrain.train import distributed
        from kubetrain.train.trainer import run

        runtime = distributed.init_runtime(options.device)
        reporter = make_reporter(runtime.is_main, runtime.world_size)
        run(options, runtime, reporter)
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # One line: a disk full while checkpointing names the checkpoint folder ("No space
        # left on device"); torchrun's failure report, printed after it, repeats it.
        code = report_failure(PROG, exc, output=checkpoint_dir)
        line, _ = failure_line(exc, output=checkpoint_dir)
        record_for_torchrun(f"{PROG}: error: {line}")
        return code
    finally:
        if reporter is not None:
            reporter.close()
        if distributed is not None:
            distributed.shutdown()


if __name__ == "__main__":
    exit_code = main()
    skip_exit_collection()
    sys.exit(exit_code)
