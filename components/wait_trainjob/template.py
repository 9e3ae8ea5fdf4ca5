"""The wait step, and the exit handler's delete, as Argo Workflows container templates (Hera).

Argo's resource templates cannot wait on one condition type among several
(``successCondition`` has no selector by type), so waiting is this step's own job.
"""

from __future__ import annotations

from hera.workflows import Container

from kubetrain.components._shared.argo_steps import (
    api_retry,
    input_parameter,
    inputs,
    output_parameter,
    pod_retry,
    step_template,
)
from kubetrain.images import COMPONENT_IMAGE


def wait_trainjob_template(name: str = "wait-trainjob", image: str = COMPONENT_IMAGE) -> Container:
    """`kubetrain wait`: follows the job to Complete/Failed, streaming rank-0 logs; fails with
    the failing node's exit code. Stopping the workflow (SIGTERM) deletes or suspends the job."""
    return step_template(
        name,
        ["wait"],
        [
            inputs("job_name"),
            "--backend",
            inputs("backend"),
            "--namespace",
            inputs("namespace"),
            "--timeout",
            inputs("timeout_seconds"),
            "--on-cancel",
            inputs("on_cancel"),
            "--stall-timeout",
            inputs("stall_timeout_seconds"),
            "--unschedulable-grace-seconds",
            inputs("unschedulable_grace_seconds"),
        ],  # fmt: skip
        [
            input_parameter("job_name", "the job launch created"),
            input_parameter("backend", "trainer, pytorchjob, job, rayjob or local", "trainer"),
            input_parameter("namespace", "namespace of the job", "{{workflow.namespace}}"),
            input_parameter("timeout_seconds", "fail after this many seconds; 0 = never", "0"),
            input_parameter("on_cancel", "delete or suspend the job when stopped", "delete"),
            input_parameter(
                "stall_timeout_seconds",
                "stop a job that logs nothing this long while running (exit 3); 0 = never; "
                "auto = 5 times the heartbeat rank 0 states (at least 120 s), else 1800",
                "auto",
            ),
            input_parameter(
                "unschedulable_grace_seconds",
                "fail after a node pod is unschedulable this long; auto = 300, no limit for a "
                "gang runtime; 0 or empty = no limit",
                "auto",
            ),
        ],
        [
            output_parameter("state", "Complete"),
            output_parameter("duration_seconds", "how long the job ran"),
        ],
        retry=pod_retry(),
        image=image,
    )


def delete_trainjob_template(
    name: str = "delete-trainjob", image: str = COMPONENT_IMAGE, keep_complete: bool = True
) -> Container:
    """`kubetrain delete --run-name RUN --ignore-not-found --keep-complete`: the exit handler's
    clean-up, whether or not launch got as far as creating the job. It decides from the job,
    as the KFP face does: a Complete job stays with its status and logs, any other goes.
    ``keep_complete=False`` deletes a Complete job too (a workflow whose claim Argo deletes
    after the exit handler, while the job's finished pods still mount it)."""
    return step_template(
        name,
        ["delete"],
        [
            "--run-name",
            inputs("run_name"),
            "--backend",
            inputs("backend"),
            "--namespace",
            inputs("namespace"),
            "--ignore-not-found",
            *(["--keep-complete"] if keep_complete else []),
        ],  # fmt: skip
        [
            input_parameter("run_name", "the run_name launch was given"),
            input_parameter("backend", "trainer, pytorchjob, job, rayjob or local", "trainer"),
            input_parameter("namespace", "namespace of the job", "{{workflow.namespace}}"),
        ],
        retry=api_retry(),
        image=image,
    )
