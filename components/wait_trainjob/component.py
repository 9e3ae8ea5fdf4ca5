"""KFP components of the wait step, and of the exit handler's delete."""

from typing import NamedTuple

from kfp import dsl

from kubetrain.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def wait_trainjob(
    job_name: str,
    backend: str = "trainer",
    timeout_seconds: float = 0,
    namespace: str = "",
    on_cancel: str = "delete",
    stall_timeout_seconds: str = "auto",
    unschedulable_grace_seconds: str = "auto",
    checkpoint_dir: str = "",
) -> NamedTuple(  # noqa: UP014
    "WaitOutputs", [("state", str), ("duration_seconds", float), ("checkpoint_dir", str)]
):
    """Follow the job to Complete, streaming global rank 0's log lines (torchrun's failure
    report folded); fail the step with the failing node's exit code, after the failing rank's
    traceback, if the job fails, or with exit 3 (after stopping the job) if it runs with no
    new log line for ``stall_timeout_seconds`` (0 = never; auto: derived from rank 0's heartbeat).

    ``namespace`` empty: this step's own (the run's). ``unschedulable_grace_seconds``: how long
    a node pod no node can take may wait ("auto": 300, no limit for a gang runtime; 0 or empty:
    no limit). ``checkpoint_dir`` (launch's output) comes back as an output once the job is
    Complete, so a step that reads the checkpoints takes it from here and cannot run before
    the training has ended."""
    from collections import namedtuple

    from kubetrain.backends import BackendOptions
    from kubetrain.components._shared.progress_display import ProgressDisplay
    from kubetrain.components.wait_trainjob.wait import (
        JobFailed,
        unschedulable_grace,
        wait_for_job,
    )
    from kubetrain.errors import report_failure

    options = BackendOptions(
        namespace=namespace,
        on_cancel=on_cancel,
        unschedulable_grace=unschedulable_grace(unschedulable_grace_seconds),
    )
    try:
        with ProgressDisplay() as display:  # a progress line now and then, not every record
            result = wait_for_job(
                job_name,
                backend=backend,
                timeout_seconds=timeout_seconds,
                on_log_line=display.feed,
                options=options,
                stall_timeout_seconds=stall_timeout_seconds,
            )
    except JobFailed as failure:  # its one line as the CLI face prints it, after the traceback
        raise SystemExit(report_failure("kubetrain wait", failure)) from None
    return namedtuple("WaitOutputs", ["state", "duration_seconds", "checkpoint_dir"])(
        result.state, result.duration_seconds, checkpoint_dir
    )


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def delete_trainjob(
    run_name: str,
    status: dsl.PipelineTaskFinalStatus,
    backend: str = "trainer",
    namespace: str = "",
):
    """The exit handler's clean-up (``dsl.ExitHandler``): delete, in the background, the job
    the launch step created for ``run_name``, unless it ended Complete (then it stays, with its
    status and logs); nothing if there is none. The job decides, not ``status``: a KFP
    backend passes the ML Metadata state of the body's DAG, which stays RUNNING when a dsl.If
    was false (tests/support/kfp_backend_states.py). A stopped run's wait step gets SIGTERM but
    has at most about a second to stop the job (KFP's launcher dies on it, and Argo's emissary
    then ends the container), so this is what surely stops training. The same road as
    `kubetrain delete --run-name RUN --ignore-not-found --keep-complete`, the Argo workflow's
    exit handler."""
    from kubetrain.backends import BackendOptions
    from kubetrain.components.wait_trainjob.wait import delete_run_job
    from kubetrain.errors import terminal_text

    outcome = delete_run_job(
        run_name, backend=backend, options=BackendOptions(namespace=namespace), keep_complete=True
    )
    # Printed, not decided on: the KFP backend's driver passes the ML Metadata execution state
    # (kubeflow/pipelines 2.17.0 backend/src/v2/driver/resolve.go ~471: COMPLETE, RUNNING,
    # FAILED...), KFP's local runner SUCCEEDED, FAILED or CANCELLED.
    print(f"KFP reports the run's body {terminal_text(status.state)}: {terminal_text(outcome)}")
