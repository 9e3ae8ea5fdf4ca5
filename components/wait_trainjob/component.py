"""KFP component of the wait step."""

from typing import NamedTuple

from kfp import dsl

from kubetrain.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def wait_trainjob(
    job_name: str,
    backend: str = "local",
    timeout_seconds: float = 0,
    namespace: str = "default",
    on_cancel: str = "delete",
    stall_timeout_seconds: float = 1800,
) -> NamedTuple("WaitOutputs", [("state", str), ("duration_seconds", float)]):  # noqa: UP014
    """Follow the job to Complete, streaming rank-0 logs; fail the step with the failing node's
    exit code and last log lines if the job fails, or with exit 3 (after stopping the job) if
    it runs with no new log line for ``stall_timeout_seconds`` (0 = never)."""
    import sys
    from collections import namedtuple

    from kubetrain.backends import BackendOptions
    from kubetrain.components.wait_trainjob.wait import JobFailed, wait_for_job

    try:
        result = wait_for_job(
            job_name,
            backend=backend,
            timeout_seconds=timeout_seconds,
            on_log_line=lambda line: print(line, flush=True),
            options=BackendOptions(namespace=namespace, on_cancel=on_cancel),
            stall_timeout_seconds=stall_timeout_seconds,
        )
    except JobFailed as failure:
        print(failure, file=sys.stderr, flush=True)
        raise SystemExit(failure.exit_code) from None
    return namedtuple("WaitOutputs", ["state", "duration_seconds"])(
        result.state, result.duration_seconds
    )
