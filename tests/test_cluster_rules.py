"""What a real cluster does around a TrainJob (issue 17): Kubeflow Trainer v2.3, JobSet v0.12,
KFP 2.14-2.17 and Argo 3.6/4.1, as their sources say, held against the backend, the renderers
and the launch and wait steps. Each test names the upstream file its rule comes from.

Cluster behaviour is scripted through the emulator (real HTTP, the official client); the
grace periods are injected so that no test waits more than a second or two.
"""

from __future__ import annotations

import json
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubetrain import rules
from kubetrain.backends import BackendOptions
from kubetrain.backends.base import COMPLETE, FAILED
from kubetrain.backends.kubernetes import wait as kube_wait
from kubetrain.backends.kubernetes.backend import KubernetesBackend
from kubetrain.backends.kubernetes.client import RBAC_FIX, resolve_namespace
from kubetrain.backends.kubernetes.launch import TrainerNotInstalled, version_from_crd
from kubetrain.cli import build_parser
from kubetrain.cli.param_option import check_value
from kubetrain.components._shared.argo_steps import WORKFLOW_OWNER_ENV
from kubetrain.components.launch_trainjob.component import launch_trainjob
from kubetrain.components.launch_trainjob.launch import LaunchRequest, render_launch
from kubetrain.components.launch_trainjob.template import launch_trainjob_template
from kubetrain.components.wait_trainjob.component import delete_trainjob, wait_trainjob
from kubetrain.components.wait_trainjob.wait import unschedulable_grace
from kubetrain.errors import InvalidInput, JobNotFound
from kubetrain.jobspec import Initializer, Resources, RuntimeRef, TrainJobSpec
from kubetrain.names import MAX_DERIVED_LENGTH, derive_job_name
from kubetrain.render import render_indexed_job, render_trainjob
from tests.support import KubeEmulator, objects, trainer_build
from tests.test_kubernetes_backend import (
    FAST_RETRY,
    Waiter,
    complete,
    make_spec,
    node_pod,
    set_container,
)

#: The environment a step's container may have that names its pipeline run.
OWNER_ENV = (
    "KUBETRAIN_OWNER_NAME", "KUBETRAIN_OWNER_UID", "KUBETRAIN_OWNER_KIND",
    "KUBETRAIN_OWNER_API_VERSION", "KFP_POD_NAME", "KFP_POD_UID", "ARGO_WORKFLOW_NAME",
    "ARGO_NODE_ID", "POD_NAME", "POD_NAMESPACE",
)  # fmt: skip


@pytest.fixture(autouse=True)
def no_pipeline_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests say themselves which pipeline step they run in."""
    for name in OWNER_ENV:
        monkeypatch.delenv(name, raising=False)


def kubeconfig_with(k8s: Any, path: Path, namespace: str | None) -> Path:
    config = k8s.emulator.kubeconfig()
    for context in config["contexts"]:
        context["context"].pop("namespace", None)
        if namespace is not None:
            context["context"]["namespace"] = namespace
    path.write_text(yaml.safe_dump(config))
    return path


# --------------------------------------------------------------- 2: the namespace we run in
def test_an_empty_namespace_is_the_pods_own_service_account_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KFP and Argo run a step's pod in the run's namespace; the kubelet writes it to the
    ServiceAccount's namespace file, as kubectl's in-cluster config reads it."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    in_pod = tmp_path / "namespace"
    in_pod.write_text("team-a\n")
    assert resolve_namespace("", str(in_pod)) == "team-a"
    assert resolve_namespace("given", str(in_pod)) == "given"


def test_an_explicit_kubeconfig_names_the_namespace_even_in_a_pod(
    k8s, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """load_api_client talks to $KUBECONFIG's cluster when it is set, even in a pod: the
    namespace is that cluster's context's, not the pod's."""
    in_pod = tmp_path / "namespace"
    in_pod.write_text("team-a\n")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_with(k8s, tmp_path / "with", "team-b")))
    assert resolve_namespace("", str(in_pod)) == "team-b"


def test_outside_a_pod_an_empty_namespace_is_the_kubeconfig_contexts_else_default(
    k8s, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    absent = str(tmp_path / "no-such-file")
    kubeconfig = kubeconfig_with(k8s, tmp_path / "with", "team-b")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    assert resolve_namespace("", absent) == "team-b"
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_with(k8s, tmp_path / "without", None)))
    assert resolve_namespace("", absent) == "default"


def test_a_backend_with_an_empty_namespace_launches_into_its_pods_namespace(
    k8s, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    in_pod = tmp_path / "namespace"
    in_pod.write_text("team")
    backend = KubernetesBackend(
        "trainer", BackendOptions(namespace=""), k8s.api_client, namespace_file=str(in_pod)
    )
    backend.launch(make_spec())
    assert k8s.emulator.names("trainjobs", "team") == {"demo"}
    with pytest.raises(JobNotFound, match="no TrainJob named 'nope' in namespace team;"):
        backend.get_job("nope")


def test_every_face_defaults_the_namespace_to_the_one_it_runs_in() -> None:
    for component in (launch_trainjob, wait_trainjob, delete_trainjob):
        assert component.component_spec.inputs["namespace"].default == ""
    parser = build_parser()
    for argv in (["wait", "job"], ["delete", "job"], ["launch", "--data", "d"]):
        assert parser.parse_args(argv).namespace == ""
    check_value("namespace", "", "--param namespace")  # the pipeline's default is ""
    with pytest.raises(InvalidInput, match="namespace"):
        check_value("namespace", "Not_A_Namespace", "--param namespace")


# ------------------------------------------- 3: names JobSet cannot give pods, jobs without pods
def test_the_pod_name_rule_is_jobsets_webhook() -> None:
    """jobset v0.12.0 pkg/webhooks/jobset_webhook.go: placement.GenPodName(jobset, replicated
    job, replicas-1, completions-1) + "-abcde" must be a DNS-1035 label (63 characters)."""
    assert rules.jobset_pod_name("job", "node", 1, 4) == "job-node-0-3-abcde"
    nodes = [("node", 1, 2)]
    fits = "a" * (63 - len("-node-0-1-abcde"))
    assert rules.jobset_pod_names(fits, nodes, "name") == fits
    with pytest.raises(InvalidInput, match=r"a-node-0-1-abcde \(64 characters, more than 63\)"):
        rules.jobset_pod_names(fits + "a", nodes, "name")


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("fields", "longest"),
    [
        ({}, "-node-0-1-abcde"),
        ({"dataset_initializer": Initializer("hf://org/data")}, "-dataset-initializer-0-0-abcde"),
    ],
    ids=["nodes", "dataset-initializer"],
)
def test_a_name_jobset_cannot_name_pods_for_is_refused_before_any_request(
    k8s, fields: dict[str, Any], longest: str
) -> None:
    emulator, backend = k8s.emulator, k8s.backend()
    name = "a" * (64 - len(longest))
    since = time.monotonic()
    with pytest.raises(InvalidInput) as refused:
        backend.launch(make_spec(name, **fields))
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"name: '{name}' is {len(name)} characters")
    assert f"{name}{longest}" in message
    assert message.endswith(f"use a name of at most {len(name) - 1} characters")
    assert emulator.requests(since=since) == [], "refused before anything is asked of the cluster"


@pytest.mark.bad_input
def test_a_runtimes_own_longer_replicated_job_is_measured_too(k8s) -> None:
    """The JobSet holds every replicated job of the runtime; the webhook checks each."""
    runtime = objects.torch_runtime("with-launcher")
    jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    jobs.append({"name": "a-much-longer-launcher", "template": {"spec": {"template": {
        "spec": {"containers": [{"name": "launcher", "image": "img:1"}]}}}}})  # fmt: skip
    k8s.emulator.create("clustertrainingruntimes", runtime)
    name = "a" * 35  # fits "-node-0-1-abcde", not "-a-much-longer-launcher-0-0-abcde"
    with pytest.raises(InvalidInput, match="a-much-longer-launcher-0-0-abcde"):
        k8s.backend().launch(make_spec(name, runtime=RuntimeRef("with-launcher")))
    assert k8s.emulator.names("trainjobs") == set()


def test_derived_names_fit_whatever_the_launch_asks_for() -> None:
    """A name derived from a run is shortened to fit, not refused, and is the same whatever
    the options, so `kubetrain delete --run-name` finds it."""
    run = "kubetrain-training-pipeline-" + "x" * 80
    name = derive_job_name(run)
    assert len(name) <= MAX_DERIVED_LENGTH
    worst = [("dataset-initializer", 1, 1), ("model-initializer", 1, 1), ("node", 1, 10_000)]
    rules.jobset_pod_names(name, worst, "name")
    request = LaunchRequest(
        command=("hostname",),
        run_name=run,
        nodes=1000,
        dataset_initializer=Initializer("hf://org/data"),
    )
    (trainjob,) = render_launch(request, options=BackendOptions(namespace="default"))
    assert trainjob["metadata"]["name"] == name


def test_wait_fails_with_the_trainers_warning_event_when_the_job_gets_no_pods(k8s) -> None:
    """trainer v2.3.0 pkg/controller/trainjob_controller.go Reconcile: a JobSet that cannot be
    built is only a Warning event TrainJobResourcesCreationFailed on the TrainJob, no
    condition; wait used to follow such a job forever."""
    emulator = k8s.emulator
    backend = k8s.backend(no_pods_grace=0.2, retry=FAST_RETRY)
    backend.launch(make_spec())
    refusal = trainer_build.event_message(
        'admission webhook "vjobset.kb.io" denied the request: spec.replicatedJobs[0].name: '
        "Invalid value: ...: JobSet name is too long, pod names generated for this JobSet will "
        "exceed 63 characters"
    )
    emulator.add_event(
        emulator.get("trainjobs", "demo"), "TrainJobResourcesCreationFailed", refusal
    )
    started = time.monotonic()
    status = backend.wait("demo", timeout=10, on_log_line=None)
    assert time.monotonic() - started < 2
    assert (status.state, status.reason) == (FAILED, "TrainJobResourcesCreationFailed")
    assert refusal in status.message and "has no pods after" in status.message
    assert status.failed_rank is None
    assert emulator.get("trainjobs", "demo") is None, "released: nothing is left behind"


def test_a_job_with_no_pods_and_no_warning_is_waited_for_and_said_so(k8s) -> None:
    warnings: list[str] = []
    backend = k8s.backend(no_pods_grace=0.1, retry=FAST_RETRY, warn=warnings.append)
    backend.launch(make_spec())
    waiter = Waiter(backend, "demo")
    waiter.start()
    time.sleep(0.6)
    assert waiter.is_alive()
    complete(k8s.emulator, "demo")
    assert waiter.result().state == COMPLETE
    (said,) = [w for w in warnings if "has no pods" in w]
    assert "no Warning event says why; still waiting" in said


def assert_waits_on_then_completes(backend: KubernetesBackend, emulator: KubeEmulator) -> None:
    """wait goes on past the no-pods grace, then sees the job complete."""
    waiter = Waiter(backend, "demo")
    waiter.start()
    time.sleep(0.8)
    assert waiter.is_alive()
    complete(emulator, "demo")
    assert waiter.result().state == COMPLETE


def test_a_job_whose_initializer_runs_first_is_not_a_job_without_pods(k8s) -> None:
    """Runtimes with initializers start the node job after them (trainer v2.3.0 runtimes'
    JobSet dependsOn): a long download is no reason to fail, whatever Warning is around."""
    emulator = k8s.emulator
    backend = k8s.backend(no_pods_grace=0.1, retry=FAST_RETRY)
    backend.launch(make_spec())
    emulator.create_pod({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "demo-dataset-initializer-0-0-abcde", "namespace": "default",
                     "labels": {"jobset.sigs.k8s.io/jobset-name": "demo",
                                "jobset.sigs.k8s.io/replicatedjob-name": "dataset-initializer"}},
        "spec": {"containers": [{"name": "dataset-initializer", "image": "i"}]},
    })  # fmt: skip
    emulator.add_event(emulator.get("trainjobs", "demo"), "SomethingSlow", "still pulling")
    assert_waits_on_then_completes(backend, emulator)


def test_a_warning_left_by_an_earlier_job_of_the_same_name_is_not_this_jobs(k8s) -> None:
    """Events outlive their object (an hour by default): one whose involvedObject.uid is not
    this TrainJob's says nothing about it."""
    emulator = k8s.emulator
    backend = k8s.backend(no_pods_grace=0.1, retry=FAST_RETRY)
    backend.launch(make_spec())
    earlier = emulator.get("trainjobs", "demo")
    earlier = {**earlier, "metadata": {**earlier["metadata"], "uid": "uid-of-an-earlier-demo"}}
    emulator.add_event(earlier, "TrainJobResourcesCreationFailed", "an old refusal")
    assert_waits_on_then_completes(backend, emulator)


def test_a_quota_refusal_on_the_jobsets_job_fails_the_wait(k8s) -> None:
    """The Job controller reports a pod it may not create (ResourceQuota, Pod Security) as a
    FailedCreate Warning on the Job (<jobset>-<replicatedJob>-<index>), not on the TrainJob."""
    emulator = k8s.emulator
    backend = k8s.backend(no_pods_grace=0.1, retry=FAST_RETRY)
    backend.launch(make_spec())
    child = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "demo-node-0", "namespace": "default", "uid": "job-uid"},
    }
    quota = 'pods "demo-node-0-0-x" is forbidden: exceeded quota: team-a, requested: cpu=2'
    emulator.add_event(child, "FailedCreate", quota)
    status = backend.wait("demo", timeout=10, on_log_line=None)
    assert (status.state, status.reason) == (FAILED, "FailedCreate")
    assert quota in status.message


# ------------------------------------------------------------------- 4: who owns the job
def pipeline_run(k8s) -> dict[str, Any]:
    k8s.emulator.install_crd(objects.workflow_crd())
    workflow = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow"}
    return k8s.emulator.create("workflows", {**workflow, "metadata": {"name": "run-1"}})


def kfp_step_pod(k8s, workflow: dict[str, Any]) -> dict[str, str]:
    """A KFP step's pod (a KFP run is an Argo Workflow, which owns its pods) and the env KFP
    gives its container (kubeflow/pipelines 2.17.0 backend/src/v2/compiler/argocompiler/
    common.go commonEnvs: KFP_POD_NAME, KFP_POD_UID; no namespace)."""
    pod = k8s.emulator.create_pod({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "run-1-system-container-impl-1", "namespace": "default",
                     "ownerReferences": [objects.owner_reference(workflow)]},
        "spec": {"containers": [{"name": "main", "image": "img:1"}]},
    })  # fmt: skip
    return {"KFP_POD_NAME": pod["metadata"]["name"], "KFP_POD_UID": pod["metadata"]["uid"]}


OWNER_ENVS = {
    "kfp": kfp_step_pod,
    # argo-workflows v4.1.2 workflow/controller/workflowpod.go: main gets ARGO_WORKFLOW_NAME
    # and ARGO_NODE_ID; ARGO_WORKFLOW_UID is only in the executor's containers (createEnvVars).
    "argo-4.1": lambda k8s, wf: {"ARGO_WORKFLOW_NAME": "run-1", "ARGO_NODE_ID": "run-1-42"},
    # v3.6.9 workflowpod.go: main gets ARGO_NODE_ID only, "<workflow>-<fnv32 hash>"
    # (pkg/apis/workflow/v1alpha1/workflow_types.go NodeID).
    "argo-3.6": lambda k8s, wf: {"ARGO_NODE_ID": "run-1-3641583743"},
    # Our Argo launch template: {{workflow.name}}/{{workflow.uid}} (docs/variables.md).
    "template": lambda k8s, wf: {
        key: value.replace("{{workflow.name}}", "run-1").replace(
            "{{workflow.uid}}", wf["metadata"]["uid"]
        )
        for key, value in WORKFLOW_OWNER_ENV.items()
    },
}


@pytest.mark.parametrize("shape", sorted(OWNER_ENVS))
def test_the_pipeline_run_owns_its_job_from_the_env_its_step_really_has(
    k8s, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    workflow = pipeline_run(k8s)
    for key, value in OWNER_ENVS[shape](k8s, workflow).items():
        monkeypatch.setenv(key, value)
    k8s.backend().launch(make_spec())
    (owner,) = k8s.emulator.get("trainjobs", "demo")["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Workflow",
        "run-1",
        workflow["metadata"]["uid"],
    )
    k8s.emulator.delete("workflows", "run-1")
    assert k8s.emulator.names("trainjobs") == set(), "deleting the run deletes its TrainJob"


def test_the_argo_launch_template_passes_the_workflow_as_owner() -> None:
    env = {item.name: item.value for item in launch_trainjob_template().env}
    assert env == {
        "KUBETRAIN_OWNER_NAME": "{{workflow.name}}",
        "KUBETRAIN_OWNER_UID": "{{workflow.uid}}",
    }


def test_pod_name_is_not_an_owner_nor_a_step_in_another_namespace(
    k8s, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing sets POD_NAME in KFP's or Argo's step containers; an owner must share the job's
    namespace (a step in another one leaves the job unowned, and says so)."""
    workflow = pipeline_run(k8s)
    monkeypatch.setenv("POD_NAME", kfp_step_pod(k8s, workflow)["KFP_POD_NAME"])
    k8s.backend().launch(make_spec("unowned"))
    assert "ownerReferences" not in k8s.emulator.get("trainjobs", "unowned")["metadata"]
    monkeypatch.setenv("ARGO_WORKFLOW_NAME", "run-1")
    in_pod = tmp_path / "namespace"
    in_pod.write_text("pipelines")
    warnings: list[str] = []
    k8s.backend(namespace_file=str(in_pod), warn=warnings.append).launch(make_spec("elsewhere"))
    assert "ownerReferences" not in k8s.emulator.get("trainjobs", "elsewhere")["metadata"]
    assert any("runs in namespace pipelines, the job goes to default" in w for w in warnings)


# --------------------------------------------------------------- 6: delete in the background
def test_a_trainjob_is_deleted_in_the_background(k8s) -> None:
    """trainer v2.3.0 pkg/controller/trainjob_controller.go Reconcile has no deletionTimestamp
    guard: under foreground deletion it can build the JobSet again (cf. jobset#561)."""
    backend = k8s.backend()
    backend.launch(make_spec())
    backend.delete("demo")
    (request,) = k8s.emulator.requests("delete", "trainjobs")
    assert request.params.get("propagationPolicy") == "Background"
    assert k8s.emulator.get("trainjobs", "demo") is None


def test_creates_ask_for_strict_field_validation(k8s, tmp_path: Path) -> None:
    """kubectl's default: a field the CRD lacks is an error, not silently pruned."""
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = make_spec(script=str(script))  # its command, torchrun train.py, names the script
    k8s.backend().launch(spec)
    for resource in ("trainjobs", "configmaps"):
        (request,) = k8s.emulator.requests("create", resource)
        assert request.params.get("fieldValidation") == "Strict", resource


# ---------------------------------------------------------- 8: a command with no arguments
def test_a_one_word_command_does_not_inherit_the_runtimes_args() -> None:
    """trainer v2.3.0 pkg/runtime/framework/plugins/jobset/builder.go Trainer: `if args :=
    jobTrainer.Args; args != nil` — nil keeps the runtime's args (`hostname -m kubetrain.train`)."""
    trainjob = render_trainjob(TrainJobSpec("demo", command=("hostname",)))
    assert trainjob["spec"]["trainer"]["args"] == []
    runtime = objects.torch_runtime(command=["torchrun"], args=["-m", "kubetrain.train"])
    node = trainer_build.build(trainjob, runtime).container
    assert (node["command"], node.get("args")) == (["hostname"], [])


# -------------------------------------------------------- 9: unschedulable is not failure
def gang_runtime(k8s) -> RuntimeRef:
    runtime = objects.torch_runtime("gang")
    runtime["spec"]["podGroupPolicy"] = {"volcano": {}}
    k8s.emulator.create("clustertrainingruntimes", runtime)
    return RuntimeRef("gang")


UNSCHEDULABLE = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


def unschedulable_wait(k8s, spec_fields: dict[str, Any], **backend: Any) -> tuple[Waiter, list]:
    warnings: list[str] = []
    waiting = k8s.backend(retry=FAST_RETRY, warn=warnings.append, **backend)
    waiting.launch(make_spec(**spec_fields))
    waiter = Waiter(waiting, "demo")
    waiter.start()
    pod = node_pod(k8s.emulator, "demo")
    k8s.emulator.set_pod_status(pod, objects.unschedulable(UNSCHEDULABLE))
    return waiter, warnings


def test_by_default_an_unschedulable_node_fails_the_job_after_the_grace_and_says_why(
    k8s, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube_wait, "UNSCHEDULABLE_GRACE_SECONDS", 0.3)
    waiter, warnings = unschedulable_wait(k8s, {})
    status = waiter.result()
    assert (status.state, status.reason) == (FAILED, "Unschedulable")
    assert UNSCHEDULABLE in status.message and "(still after 0.3s)" in status.message
    (said,) = [w for w in warnings if "cannot be scheduled" in w]
    assert UNSCHEDULABLE in said and "waiting up to 0.3s" in said


@pytest.mark.parametrize("how", ["gang-runtime", "no-limit-option"])
def test_a_gang_runtime_or_no_limit_waits_for_the_scheduler(
    k8s, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A gang (trainer v2.3.0 runtime spec.podGroupPolicy: coscheduling, volcano) is
    Unschedulable until the whole group fits; an autoscaler takes minutes."""
    monkeypatch.setattr(kube_wait, "UNSCHEDULABLE_GRACE_SECONDS", 0.2)
    if how == "gang-runtime":
        waiter, warnings = unschedulable_wait(k8s, {"runtime": gang_runtime(k8s)})
    else:
        waiter, warnings = unschedulable_wait(k8s, {}, unschedulable_grace=0)
    time.sleep(1.0)
    assert waiter.is_alive(), "still waiting for the scheduler"
    complete(k8s.emulator, "demo")
    assert waiter.result().state == COMPLETE
    (said,) = [w for w in warnings if "cannot be scheduled" in w]
    assert UNSCHEDULABLE in said and "with no time limit" in said
    assert ("gang" in said) == (how == "gang-runtime")


@pytest.mark.bad_input
def test_the_unschedulable_grace_option_reads_auto_empty_or_seconds() -> None:
    assert [unschedulable_grace(t) for t in ("auto", "", "0", "12.5")] == [None, 0, 0, 12.5]
    for bad in ("-1", "nan", "inf", "soon"):
        with pytest.raises(InvalidInput, match="^unschedulable_grace_seconds: "):
            unschedulable_grace(bad)
    with pytest.raises(InvalidInput, match="unschedulable_grace_seconds"):
        BackendOptions(unschedulable_grace=-1.0).validate()


# ----------------------------------------------------- 10: an empty storage Secret is none
def test_an_empty_storage_secret_renders_no_secret_reference() -> None:
    """A secretKeyRef with name "" is an invalid pod (and KFP <= 2.14 ignores `optional`)."""
    for rendered in (
        [render_trainjob(make_spec())],
        render_indexed_job(make_spec()),
    ):
        text = json.dumps(rendered)
        assert "secretKeyRef" not in text and "secretRef" not in text
    named = json.dumps(render_trainjob(make_spec(storage_secret="s3-creds")))
    assert '"secretKeyRef": {"key": "AWS_ACCESS_KEY_ID", "name": "s3-creds"' in named


# ------------------------------------------------- 13: Trainer <= 2.2 replaces resources
GPU_RUNTIME_RESOURCES = {
    "requests": {"cpu": "4"},
    "limits": {"nvidia.com/gpu": "1", "memory": "32Gi"},
}


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        # v2.2.0 pkg/runtime/core/trainingruntime.go: Resources = ResourcesPerNode.DeepCopy().
        (
            "2.2",
            {
                "requests": {"cpu": "2"},
                "limits": {"cpu": "2", "nvidia.com/gpu": "1", "memory": "32Gi"},
            },
        ),
        (
            "2.1",
            {
                "requests": {"cpu": "2"},
                "limits": {"cpu": "2", "nvidia.com/gpu": "1", "memory": "32Gi"},
            },
        ),
        # v2.3.0 merges them itself (MergeResourceRequirements): ours only.
        ("2.3", {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}),
    ],
)
def test_old_trainers_get_the_full_resource_set(version: str, expected: dict[str, Any]) -> None:
    spec = make_spec(resources_per_node=Resources(cpu="2"))
    trainjob = render_trainjob(
        spec, trainer_version=version, runtime_resources=GPU_RUNTIME_RESOURCES
    )
    assert trainjob["spec"]["trainer"]["resourcesPerNode"] == expected


def test_on_a_2_2_cluster_cpu_on_a_gpu_runtime_keeps_the_gpu() -> None:
    with KubeEmulator(namespace="default") as emulator:
        emulator.install_trainer(version="2.2")
        runtime = objects.torch_runtime("gpu")
        node = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
        node["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] = (
            GPU_RUNTIME_RESOURCES
        )
        emulator.create("clustertrainingruntimes", runtime)
        spec = make_spec(resources_per_node=Resources(cpu="2"), runtime=RuntimeRef("gpu"))
        with emulator.api_client() as api_client:
            KubernetesBackend("trainer", BackendOptions("default"), api_client).launch(spec)
        resources = emulator.get("trainjobs", "demo")["spec"]["trainer"]["resourcesPerNode"]
    assert resources["limits"]["nvidia.com/gpu"] == "1" and resources["requests"]["cpu"] == "2"


def test_the_crd_tells_2_2_from_2_3() -> None:
    """kubeflow/trainer manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml: v2.3.0's
    runtimePatches patch terminationGracePeriodSeconds, v2.2.0's do not."""
    assert version_from_crd(objects.trainjob_crd("2.2"), print) == "2.2"
    assert version_from_crd(objects.trainjob_crd("2.1"), print) == "2.1"
    real = objects.real_trainer_crd("trainjobs")
    if real is not None:
        assert version_from_crd(real, print) == "2.3"


# -------------------------------------------- 14: initializers need runtimes that have them
@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("field", "option", "job"),
    [
        ("dataset_initializer", "dataset_uri", "dataset-initializer"),
        ("model_initializer", "model_uri", "model-initializer"),
    ],
)
def test_an_initializer_against_a_runtime_without_it_is_refused_before_creating(
    k8s, field: str, option: str, job: str
) -> None:
    """trainer v2.3.0 pkg/runtime/framework/plugins/jobset/jobset.go Validate: "must have
    dataset-initializer job when trainJob is configured with input datasetConfig"."""
    before = k8s.emulator.object_keys()
    with pytest.raises(InvalidInput) as refused:
        k8s.backend().launch(make_spec(**{field: Initializer("hf://org/thing")}))
    message = str(refused.value)
    assert message.startswith(f"{option}: ClusterTrainingRuntime torch-ddp-cpu has no {job} job")
    assert f"--{option.replace('_', '-')}" in message and "\n" not in message
    assert k8s.emulator.object_keys() == before


@pytest.mark.bad_input
def test_an_initializer_container_without_the_initializer_mount_is_refused(k8s) -> None:
    """jobset.go Validate: "must have volumeMount with name - initializer in container
    dataset-initializer of the dataset-initializer job"; refused before anything is created."""
    runtime = objects.torch_runtime("no-mount")
    runtime["spec"]["template"]["spec"]["replicatedJobs"].insert(0, {
        "name": "dataset-initializer",
        "template": {"spec": {"template": {"spec": {"containers": [{
            "name": "dataset-initializer", "image": "ghcr.io/kubeflow/dataset-initializer"}]}}}},
    })  # fmt: skip
    k8s.emulator.create("clustertrainingruntimes", runtime)
    before = k8s.emulator.object_keys()
    spec = make_spec(runtime=RuntimeRef("no-mount"), dataset_initializer=Initializer("hf://o/d"))
    with pytest.raises(InvalidInput) as refused:
        k8s.backend().launch(spec)
    assert str(refused.value).startswith(
        "dataset_uri: ClusterTrainingRuntime no-mount mounts no 'initializer' volume in its "
        "dataset-initializer container"
    )
    assert k8s.emulator.object_keys() == before


def test_a_runtime_with_the_initializer_takes_it(k8s) -> None:
    runtime = objects.torch_runtime("with-data", initializers=True)
    k8s.emulator.create("clustertrainingruntimes", runtime)
    spec = make_spec(runtime=RuntimeRef("with-data"), dataset_initializer=Initializer("hf://o/d"))
    k8s.backend().launch(spec)
    assert k8s.emulator.names("trainjobs") == {"demo"}


# ---------------------------------------------- 15: OOMKilled with restarts is the runtime's
@pytest.mark.parametrize("asked", [2, 0])
def test_an_oom_kill_with_restarts_allowed_is_left_to_the_runtime(k8s, asked: int) -> None:
    """JobSet restarts every node after a failure up to failurePolicy.maxRestarts; the job's
    Failed condition says when they run out."""
    runtime = objects.torch_runtime("restarting")
    runtime["spec"]["template"]["spec"]["failurePolicy"] = {"maxRestarts": 2}
    k8s.emulator.create("clustertrainingruntimes", runtime)
    backend = k8s.backend(retry=FAST_RETRY)
    # asked for none (a KFP run has no max_restarts), the runtime's failurePolicy still restarts
    backend.launch(make_spec(max_restarts=asked, runtime=RuntimeRef("restarting")))
    waiter = Waiter(backend, "demo")
    waiter.start()
    pod = node_pod(k8s.emulator, "demo", 1)
    set_container(k8s.emulator, pod, objects.terminated(137, "OOMKilled"), "Failed")
    time.sleep(1.0)
    assert waiter.is_alive(), "the runtime restarts the nodes"
    failed = objects.condition("Failed", reason="FailedMaxRestarts", message="restarts ran out")
    k8s.emulator.set_conditions("trainjobs", "demo", [failed])
    status = waiter.result()
    assert (status.state, status.reason) == (FAILED, "FailedMaxRestarts")


# ------------------------------------------------------ 5, 18, 11: the KFP components
@pytest.mark.usefixtures("kubeconfig")
def test_the_exit_handler_ignores_a_run_whose_launch_created_nothing(k8s, capsys) -> None:
    status = types.SimpleNamespace(state="FAILED")
    delete_trainjob.python_func(run_name="never-launched", status=status, namespace="default")
    assert "no TrainJob named" in capsys.readouterr().out


def test_the_kfp_components_default_to_a_cluster_backend() -> None:
    for component in (launch_trainjob, wait_trainjob, delete_trainjob):
        assert component.component_spec.inputs["backend"].default == "trainer"


@pytest.mark.usefixtures("kubeconfig")
def test_the_kfp_wait_hands_on_the_checkpoint_dir_once_the_job_is_complete(k8s) -> None:
    """So the pipeline's collect takes it from wait and cannot run while training runs."""
    k8s.backend().launch(make_spec())
    outputs: list[Any] = []
    waiting = threading.Thread(
        target=lambda: outputs.append(
            wait_trainjob.python_func(
                job_name="demo", namespace="default", checkpoint_dir="/mnt/shared/ckpt/demo"
            )
        ),
        daemon=True,
    )
    waiting.start()
    time.sleep(0.3)
    assert waiting.is_alive() and not outputs
    complete(k8s.emulator, "demo")
    waiting.join(20)
    (result,) = outputs
    assert (result.state, result.checkpoint_dir) == (COMPLETE, "/mnt/shared/ckpt/demo")
    assert "checkpoint_dir" in wait_trainjob.component_spec.outputs


# ------------------------------------------------------ errors point at what is shipped
def test_errors_point_at_the_manifests_in_the_package() -> None:
    assert "`kubetrain render runtimes | kubectl apply -f -`" in str(TrainerNotInstalled())
    assert "`kubetrain render rbac --namespace NS | kubectl apply -f -`" in RBAC_FIX
