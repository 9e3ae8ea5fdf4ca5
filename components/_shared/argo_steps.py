"""What every step's Argo (Hera) template shares: one container template per step, running
``kubetrain <step> …`` in the components image, its inputs as Argo input parameters and its
outputs as files under ``OUTPUTS_DIR`` that Argo reads back (``valueFrom.path``).

The step logic is the same plain function the KFP component calls; these templates only map
Argo parameters and artifacts onto the step's CLI options.
"""

from __future__ import annotations

from dataclasses import dataclass

from hera.workflows import (
    Artifact,
    Container,
    Env,
    NoneArchiveStrategy,
    Parameter,
    RetryStrategy,
)
from hera.workflows.models import (
    Backoff,
    Capabilities,
    SeccompProfile,
    SecurityContext,
    ValueFrom,
    VolumeMount,
)

from kubetrain.components._shared.step_outputs import OPTION as OUTPUT_PARAMETERS_OPTION
from kubetrain.images import COMPONENT_IMAGE
from kubetrain.render.pod import NON_ROOT_UID

#: Where a step writes one file per output parameter (``--output-parameters``).
OUTPUTS_DIR = "/tmp/kubetrain/outputs"
#: Where input artifacts (e.g. the collected model) are unpacked in a step's pod.
INPUTS_DIR = "/tmp/kubetrain/inputs"


@dataclass(frozen=True)
class SharedVolume:
    """The volume the steps and the TrainJob's nodes share for the dataset and checkpoints."""

    name: str = "shared"
    mount_path: str = "/mnt/shared"

    def mount(self) -> VolumeMount:
        return VolumeMount(name=self.name, mount_path=self.mount_path)


SHARED_VOLUME = SharedVolume()

#: What makes a step's Workflow the owner of the objects it creates (``kubetrain.backends.
#: kubernetes.owner``): its name and uid, which Argo gives a main container only as these
#: template variables (argo-workflows ``docs/variables.md``: ``workflow.uid`` "useful for
#: setting ownership reference to a resource"; the ARGO_WORKFLOW_UID variable is only in the
#: executor's containers, ``workflow/controller/workflowpod.go``).
WORKFLOW_OWNER_ENV = {
    "KUBETRAIN_OWNER_NAME": "{{workflow.name}}",
    "KUBETRAIN_OWNER_UID": "{{workflow.uid}}",
}


def inputs(name: str) -> str:
    """The Argo expression for one of the template's input parameters."""
    return "{{inputs.parameters." + name + "}}"


def input_parameter(name: str, description: str, default: str | None = None) -> Parameter:
    """An input parameter; without ``default`` the caller must pass it."""
    if default is None:
        return Parameter(name=name, description=description)
    return Parameter(name=name, default=default, description=description)


def output_parameter(name: str, description: str) -> Parameter:
    return Parameter(
        name=name, value_from=ValueFrom(path=f"{OUTPUTS_DIR}/{name}"), description=description
    )


def file_artifact(name: str, path: str) -> Artifact:
    """A single-file output artifact, stored as is (no tarball) so the UI can show it."""
    return Artifact(name=name, path=path, archive=NoneArchiveStrategy())


#: Exit codes a retry cannot change: 2 bad input (``InvalidInput``), 3 a stalled job
#: (``JobStalled``, already stopped).
FINAL_EXIT_CODES = (2, 3)
#: Argo's retry expression (docs/retries.md "Conditional retries": ``lastRetry.exitCode`` is
#: a string, "-1" when the attempt has none, e.g. a lost pod, which is retried).
RETRY_UNLESS_FINAL = " && ".join(
    f"asInt(lastRetry.exitCode) != {code}" for code in FINAL_EXIT_CODES
)


def api_retry(limit: int = 3) -> RetryStrategy:
    """For steps that talk to the Kubernetes API: retried with backoff, the step being
    idempotent (launch adopts the job it created; wait follows it again), except after an
    exit code a retry cannot change (bad input, a stalled job)."""
    return RetryStrategy(
        limit=str(limit),
        retry_policy="Always",
        expression=RETRY_UNLESS_FINAL,
        backoff=Backoff(duration="10s", factor="2", max_duration="5m"),
    )


def pod_retry(limit: int = 3) -> RetryStrategy:
    """Retry only when the pod itself was lost (evicted, node gone), not when the step failed."""
    return RetryStrategy(limit=str(limit), retry_policy="OnError")


def step_template(
    name: str,
    subcommand: list[str],
    args: list[str],
    parameters: list[Parameter],
    outputs: list[Parameter | Artifact] = (),
    *,
    input_artifacts: list[Artifact] = (),
    volume: SharedVolume | None = None,
    retry: RetryStrategy | None = None,
    image: str = COMPONENT_IMAGE,
    env: dict[str, str] | None = None,
) -> Container:
    """A container template running ``kubetrain SUBCOMMAND ARGS``, plus
    ``--output-parameters DIR`` when it has output parameters; ``env``: variables of its
    container (Argo expressions allowed)."""
    if any(isinstance(output, Parameter) for output in outputs):
        args = [*args, OUTPUT_PARAMETERS_OPTION, OUTPUTS_DIR]
    return Container(
        name=name,
        image=image,
        command=["kubetrain", *subcommand],
        args=args,
        inputs=[*parameters, *input_artifacts],
        outputs=outputs,
        volume_mounts=[volume.mount()] if volume is not None else None,
        env=[Env(name=key, value=value) for key, value in env.items()] if env else None,
        retry_strategy=retry,
        security_context=SecurityContext(
            run_as_non_root=True,
            run_as_user=NON_ROOT_UID,
            run_as_group=NON_ROOT_UID,
            allow_privilege_escalation=False,
            capabilities=Capabilities(drop=["ALL"]),
            seccomp_profile=SeccompProfile(type="RuntimeDefault"),
        ),
    )
