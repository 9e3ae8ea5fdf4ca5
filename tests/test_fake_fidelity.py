"""The test doubles hold to what the real systems do: each test names the upstream source of
the rule it checks (kubeflow/trainer v2.3.0, kubernetes-sigs/jobset v0.12.0, kube-apiserver,
argo-workflows, kubeflow/pipelines 2.17.0), so a product bug that only a real cluster would show
fails here too."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.rest import ApiException

from tests.shared_material import shared_file
from tests.support import objects, trainer_build
from tests.support.fake_trainer import FakeTrainer

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
RUNTIME = "fidelity"


@pytest.fixture
def real_crds() -> None:
    """The schema tests need the real Trainer v2.3 CRDs (../shared)."""
    shared_file(objects.TRAINER_CRDS / "trainer.kubeflow.org_trainjobs.yaml", "the CRD schema")


@pytest.fixture
def custom(k8s, real_crds) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(k8s.api_client)


@pytest.fixture
def trainer(k8s, real_crds, tmp_path) -> Iterator[FakeTrainer]:
    with FakeTrainer(k8s.emulator, tmp_path / "nodes") as fake:
        yield fake
    assert fake.errors == []


def trainjob(name: str = "job", runtime: str = RUNTIME, **trainer: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": runtime}, "trainer": trainer},
    }


def create(custom, body: dict[str, Any], **params: Any) -> Any:
    return custom.create_namespaced_custom_object_with_http_info(
        GROUP, VERSION, "default", "trainjobs", body, **params
    )


def refusal(custom, body: dict[str, Any], **params: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(ApiException) as refused:
        create(custom, body, **params)
    return refused.value.status, json.loads(refused.value.body)


def cause_fields(status: dict[str, Any]) -> list[str]:
    return [cause["field"] for cause in status["details"]["causes"]]


# --- kube-apiserver: structural schema, CEL, field validation --------------------------------


@pytest.mark.bad_input
def test_trainjob_crd_schema_types_and_required_fields_are_enforced(custom):
    """trainer v2.3.0 manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml: numNodes is an
    int32, runtimeRef is required; apiextensions-apiserver answers 422 Invalid with causes."""
    code, status = refusal(custom, trainjob(numNodes="two"))
    assert code == 422 and status["reason"] == "Invalid"
    assert cause_fields(status) == ["spec.trainer.numNodes"]
    assert "must be of type integer" in status["message"]
    body = trainjob()
    del body["spec"]["runtimeRef"]
    code, status = refusal(custom, body)
    assert code == 422 and cause_fields(status) == ["spec.runtimeRef"]
    assert "Required value" in status["message"]
    assert (
        custom.list_namespaced_custom_object(GROUP, VERSION, "default", "trainjobs")["items"] == []
    )


@pytest.mark.bad_input
def test_trainjob_crd_cel_rules_are_enforced(custom):
    """The CRD's x-kubernetes-validations (trainer.kubeflow.org_trainjobs.yaml): RFC 1035
    names, managedBy values, storageUri shape."""
    code, status = refusal(custom, trainjob(name="Digits.Run"))
    assert code == 422 and "metadata.name must match RFC 1035 DNS label format" in status["message"]
    body = trainjob()
    body["spec"]["managedBy"] = "someone-else"
    code, status = refusal(custom, body)
    assert code == 422 and cause_fields(status) == ["spec.managedBy"]
    body = trainjob()
    body["spec"]["initializer"] = {"dataset": {"storageUri": "not a uri"}}
    code, status = refusal(custom, body)
    assert cause_fields(status) == ["spec.initializer.dataset.storageUri"]


@pytest.mark.bad_input
def test_runtime_patches_are_checked_against_the_schema(custom):
    """runtimePatches: at most 16, each with a manager (trainer.kubeflow.org_trainjobs.yaml)."""
    body = trainjob()
    body["spec"]["runtimePatches"] = [{"manager": f"m{i}"} for i in range(17)]
    code, status = refusal(custom, body)
    assert code == 422 and "must have at most 16 items" in status["message"]
    body["spec"]["runtimePatches"] = [{"trainingRuntimeSpec": {}}]
    code, status = refusal(custom, body)
    assert cause_fields(status) == ["spec.runtimePatches[0].manager"]


def test_transition_rules_compare_with_the_stored_object(custom):
    """``self == oldSelf`` on spec.trainer (trainer.kubeflow.org_trainjobs.yaml): immutable on
    update, while suspend may change."""
    create(custom, trainjob(numNodes=1))
    with pytest.raises(ApiException) as refused:
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, "default", "trainjobs", "job", {"spec": {"trainer": {"numNodes": 2}}}
        )
    assert refused.value.status == 422 and "field is immutable" in refused.value.body
    patched = custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", "trainjobs", "job", {"spec": {"suspend": True}}
    )
    assert patched["spec"]["suspend"] is True


def test_schema_defaults_are_applied(custom):
    """``default`` values of the CRD (runtimeRef kind/apiGroup, managedBy, suspend)."""
    created, _, _ = create(custom, trainjob())
    assert created["spec"]["runtimeRef"] == {
        "name": RUNTIME,
        "apiGroup": GROUP,
        "kind": "ClusterTrainingRuntime",
    }
    assert created["spec"]["managedBy"] == "trainer.kubeflow.org/trainjob-controller"
    assert created["spec"]["suspend"] is False


def test_unknown_fields_are_pruned_with_a_warning_or_refused_when_strict(custom):
    """kube-apiserver field validation (kubernetes/kubernetes#105916, customresource_handler.go;
    docs "Field validation"): Warn (the default) prunes and answers ``Warning: 299``; Strict
    refuses with 400 "strict decoding error: unknown field"."""
    body = trainjob()
    body["spec"]["trainer"]["numNode"] = 2
    created, _, headers = create(custom, body)
    assert "numNode" not in created["spec"]["trainer"]
    assert headers["Warning"] == '299 - "unknown field \\"spec.trainer.numNode\\""'
    body["metadata"]["name"] = "strict"
    code, status = refusal(custom, body, field_validation="Strict")
    assert code == 400 and status["reason"] == "BadRequest"
    assert status["message"] == (
        'TrainJob in version "v1alpha1" cannot be handled as a TrainJob: strict decoding error: '
        'unknown field "spec.trainer.numNode"'
    )


def test_runtime_crd_cel_rules_are_enforced(k8s, real_crds):
    """trainer.kubeflow.org_clustertrainingruntimes.yaml: only one ML policy may be set."""
    runtime = objects.torch_runtime("two-policies")
    runtime["spec"]["mlPolicy"]["mpi"] = {}
    with pytest.raises(Exception, match="Only one of the policy can be configured"):
        k8s.emulator.create("clustertrainingruntimes", runtime)


# --- Trainer 2.3 + JobSet 0.12: the pods of a TrainJob ----------------------------------------


def install_runtime(k8s, **container: Any) -> None:
    k8s.emulator.create("clustertrainingruntimes", objects.torch_runtime(RUNTIME, **container))


def pods_of(k8s, job: str, count: int, timeout: float = 20) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = [
            pod
            for pod in k8s.emulator.list("pods")
            if pod["metadata"]["labels"].get(objects.JOBSET_NAME) == job
        ]
        if len(pods) >= count:
            return sorted(pods, key=lambda p: p["metadata"]["labels"][objects.COMPLETION_INDEX])
        time.sleep(0.02)
    raise AssertionError(f"no {count} pods for {job}")


def finished(k8s, job: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        obj = k8s.emulator.get("trainjobs", job)
        if (obj.get("status") or {}).get("conditions"):
            return obj
        time.sleep(0.05)
    raise AssertionError(f"{job} did not finish")


def log_of(k8s, pod: dict[str, Any]) -> str:
    core = kubernetes.client.CoreV1Api(k8s.api_client)
    return core.read_namespaced_pod_log(pod["metadata"]["name"], "default")


def test_nil_args_inherit_the_runtimes_and_empty_args_replace_them(k8s, trainer, custom):
    """jobset/builder.go ``Trainer``: the TrainJob's command/args replace the runtime's only when
    set; nil keeps them (a one-word command runs with the runtime's args), [] clears them."""
    install_runtime(k8s, command=["torchrun"], args=["-m", "kubetrain.train"])
    create(custom, trainjob("inherits", command=["echo", "hello"]))
    create(custom, trainjob("replaces", command=["echo", "hello"], args=[]))
    inherits, replaces = pods_of(k8s, "inherits", 1)[0], pods_of(k8s, "replaces", 1)[0]
    assert inherits["spec"]["containers"][0]["args"] == ["-m", "kubetrain.train"]
    assert replaces["spec"]["containers"][0]["args"] == []
    finished(k8s, "inherits"), finished(k8s, "replaces")
    assert "hello -m kubetrain.train" in log_of(k8s, inherits)
    assert log_of(k8s, replaces).strip().endswith("hello")


def test_pods_get_the_torch_plugins_pet_env_and_jobset_names(k8s, trainer, custom):
    """torch.go ``EnforceMLPolicy`` (PET_*; "auto" without GPUs is the CPU request, 2 here),
    constants.go (port 29500), jobset_controller.go (labels; pod ``<job>-node-0-<i>-xxxxx``)."""
    install_runtime(k8s, command=["true"])
    create(
        custom,
        trainjob("pet", numNodes=2, resourcesPerNode={"requests": {"cpu": "1500m"}}),
    )
    pods = pods_of(k8s, "pet", 2)
    env = {
        e["name"]: e.get("value", e.get("valueFrom"))
        for e in pods[0]["spec"]["containers"][0]["env"]
    }
    assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "2"
    assert env["PET_MASTER_ADDR"] == "pet-node-0-0.pet" and env["PET_MASTER_PORT"] == "29500"
    assert env["PET_NODE_RANK"] == {
        "fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        }
    }
    for index, pod in enumerate(pods):
        assert pod["metadata"]["name"].startswith(f"pet-node-0-{index}-")
        assert len(pod["metadata"]["name"]) == len(f"pet-node-0-{index}-") + 5
        assert pod["metadata"]["labels"][objects.REPLICATED_JOB] == "node"
        assert pod["spec"]["containers"][0]["name"] == "node"
        assert pod["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "1500m"}}
    finished(k8s, "pet")


def test_runtime_patches_merge_strategically(k8s, trainer, custom):
    """trainingruntime.go ``mergeRuntimePatches`` (strategic merge on JobSetSpec): volumes by
    name, volumeMounts by mountPath, env by name; replicatedJobs by name (jobset_types.go)."""
    install_runtime(
        k8s,
        command=["true"],
        volumes=[{"name": "shared", "persistentVolumeClaim": {"claimName": "kubetrain-shared"}}],
        mounts=[{"name": "shared", "mountPath": "/mnt/shared"}],
    )
    patch_spec = {
        "replicatedJobs": [
            {
                "name": "node",
                "template": {
                    "spec": {
                        "template": {
                            "spec": {
                                "volumes": [
                                    {
                                        "name": "shared",
                                        "persistentVolumeClaim": {"claimName": "mine"},
                                    },
                                    {"name": "scratch", "emptyDir": {}},
                                ],
                                "containers": [
                                    {
                                        "name": "node",
                                        "volumeMounts": [
                                            {"name": "scratch", "mountPath": "/mnt/shared"},
                                            {"name": "shared", "mountPath": "/data"},
                                        ],
                                    }
                                ],
                            }
                        }
                    }
                },
            }
        ]
    }
    body = trainjob("patched")
    body["spec"]["runtimePatches"] = [
        {"manager": "kubetrain", "trainingRuntimeSpec": {"template": {"spec": patch_spec}}}
    ]
    create(custom, body)
    pod = pods_of(k8s, "patched", 1)[0]
    assert pod["spec"]["volumes"] == [
        {"name": "shared", "persistentVolumeClaim": {"claimName": "mine"}},
        {"name": "scratch", "emptyDir": {}},
    ]
    assert pod["spec"]["containers"][0]["volumeMounts"] == [
        {"name": "scratch", "mountPath": "/mnt/shared"},
        {"name": "shared", "mountPath": "/data"},
    ]
    assert pod["spec"]["containers"][0]["command"] == ["true"]
    finished(k8s, "patched")


def test_strategic_merge_replaces_lists_without_a_merge_key():
    """core/v1 PodSpec: tolerations and args carry no patchMergeKey, so a patch replaces them."""
    runtime = {"tolerations": [{"key": "a"}], "containers": [{"name": "node", "args": ["x"]}]}
    patch = {"tolerations": [{"key": "b"}], "containers": [{"name": "node", "args": ["y"]}]}
    assert trainer_build.strategic_merge(runtime, patch) == {
        "tolerations": [{"key": "b"}],
        "containers": [{"name": "node", "args": ["y"]}],
    }


def events_of(k8s, job: str) -> list[dict[str, Any]]:
    return [e for e in k8s.emulator.list("events") if e["involvedObject"]["name"] == job]


def wait_for_event(k8s, job: str, timeout: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if events := events_of(k8s, job):
            return events[0]
        time.sleep(0.02)
    raise AssertionError(f"no event for {job}")


@pytest.mark.bad_input
def test_a_name_whose_pod_names_pass_63_characters_gets_a_warning_event_and_no_pods(
    k8s, trainer, custom
):
    """jobset_webhook.go ``ValidateCreate`` refuses the JobSet (pod ``<job>-node-0-0-abcde``
    over 63 characters); trainjob_controller.go ``Reconcile`` then only emits a Warning event
    ``TrainJobResourcesCreationFailed``: no condition, no pods."""
    install_runtime(k8s, command=["true"])
    fits, too_long = "a" * 48, "b" * 49
    create(custom, trainjob(too_long))
    create(custom, trainjob(fits))
    event = wait_for_event(k8s, too_long)
    assert event["type"] == "Warning" and event["reason"] == "TrainJobResourcesCreationFailed"
    assert event["message"] == (
        'TrainJob resources reconciliation failed: admission webhook "vjobset.kb.io" denied the '
        f'request: spec.replicatedJobs[0].name: Invalid value: "{too_long}-node-0": JobSet name '
        "is too long, pod names generated for this JobSet will exceed 63 characters"
    )
    assert len(pods_of(k8s, fits, 1)) == 1
    finished(k8s, fits)
    assert [p for p in k8s.emulator.list("pods") if too_long in p["metadata"]["name"]] == []
    assert "status" not in k8s.emulator.get("trainjobs", too_long)


@pytest.mark.bad_input
def test_a_missing_runtime_is_refused_by_the_webhook(k8s, trainer, custom):
    """trainjob_webhook.go ``ValidateCreate`` -> clustertrainingruntime.go ``ValidateObjects``:
    the runtime must exist before the TrainJob is created (controller-runtime: 403 denial)."""
    code, status = refusal(custom, trainjob(runtime="absent"))
    assert code == 403
    assert status["message"].startswith(
        'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: '
    )
    assert (
        "specified clusterTrainingRuntime must be created before the TrainJob"
        in (status["message"])
    )


@pytest.mark.bad_input
def test_a_runtime_missing_at_reconcile_gives_a_warning_event_and_no_pods(k8s, real_crds, tmp_path):
    """Without the webhook (or the runtime deleted after): clustertrainingruntime.go
    ``NewObjects`` fails, trainjob_controller.go emits the Warning event, nothing else."""
    custom = kubernetes.client.CustomObjectsApi(k8s.api_client)
    with FakeTrainer(k8s.emulator, Path(tmp_path) / "nodes", webhook=False) as fake:
        create(custom, trainjob("orphan", runtime="absent"))
        event = wait_for_event(k8s, "orphan")
    assert fake.errors == []
    assert event["message"] == (
        "TrainJob resources reconciliation failed: not found ClusterTrainingRuntime specified in "
        'TrainJob: clustertrainingruntimes.trainer.kubeflow.org "absent" not found'
    )
    assert k8s.emulator.list("pods") == [] and "status" not in k8s.emulator.get(
        "trainjobs", "orphan"
    )


@pytest.mark.bad_input
def test_reserved_pet_env_is_refused_by_the_webhook(k8s, trainer, custom):
    """torch.go ``Validate``: a TrainJob must not set the PET_* variables the plugin owns."""
    install_runtime(k8s, command=["true"])
    code, status = refusal(custom, trainjob(env=[{"name": "PET_NNODES", "value": "3"}]))
    assert code == 403 and "must not have reserved envs" in status["message"]


def test_other_pet_env_is_admitted_and_reaches_the_nodes(k8s, trainer, custom):
    """constants.go ``TorchRunReservedEnvNames`` lists five names: any other PET_* (torchrun's
    own options, e.g. PET_MAX_RESTARTS) is the user's and reaches the node processes."""
    install_runtime(k8s, command=["sh", "-c", 'echo "max=$PET_MAX_RESTARTS rdzv=$PET_RDZV_CONF"'])
    env = [{"name": "PET_MAX_RESTARTS", "value": "2"}, {"name": "PET_RDZV_CONF", "value": "t=9"}]
    create(custom, trainjob("petuser", env=env))
    (pod,) = pods_of(k8s, "petuser", 1)
    assert finished(k8s, "petuser")["status"]["conditions"][-1]["type"] == "Complete"
    assert "max=2 rdzv=t=9" in log_of(k8s, pod)


@pytest.mark.bad_input
def test_an_initializer_needs_the_runtimes_initializer_job(k8s, trainer, custom):
    """plugins/jobset/jobset.go ``Validate``: a dataset initializer needs a runtime with a
    ``dataset-initializer`` job (its container mounting ``initializer``)."""
    install_runtime(k8s, command=["true"])
    body = trainjob("fetches")
    body["spec"]["initializer"] = {"dataset": {"storageUri": "hf://org/digits"}}
    code, status = refusal(custom, body)
    assert code == 403 and status["message"].endswith(
        "must have dataset-initializer job when trainJob is configured with input datasetConfig"
    )
    k8s.emulator.create(
        "clustertrainingruntimes",
        objects.torch_runtime("with-init", command=["true"], initializers=True),
    )
    body["spec"]["runtimeRef"]["name"] = "with-init"
    created, code, _ = create(custom, body)
    assert code == 201 and created["spec"]["initializer"]["dataset"]["storageUri"]


# --- Argo: what a step's pod really gets -----------------------------------------------------


def test_argo_steps_get_only_what_argo_injects_and_pods_owned_by_the_workflow(
    k8s, tmp_path, monkeypatch
):
    """argo-workflows v4.1.2 workflow/controller/workflowpod.go: the main container gets
    ARGO_NODE_ID, ARGO_WORKFLOW_NAME, ARGO_DEADLINE, ARGO_INCLUDE_SCRIPT_OUTPUT,
    ARGO_CONTAINER_NAME, never POD_NAME/POD_UID (only a downward-API env of the template gives
    those); workflow/util/pod_name.go names the pod; the controller owns it by the Workflow."""
    from tests.support.argo_local import fnv32a, run_workflow

    monkeypatch.setenv("POD_NAME", "the-test-runner")
    k8s.emulator.install_crd(objects.workflow_crd())
    show = "import os, json; print(json.dumps({k: v for k, v in os.environ.items()}))"
    document = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "wf-"},
        "spec": {
            "entrypoint": "main",
            "templates": [
                {"name": "main", "dag": {"tasks": [{"name": "step", "template": "env"}]}},
                {
                    "name": "env",
                    "container": {
                        "image": "python",
                        "command": ["python", "-c", show],
                        "env": [
                            {
                                "name": "MY_POD",
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                            },
                            {
                                "name": "MY_UID",
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}},
                            },
                        ],
                    },
                },
            ],
        },
    }
    run = run_workflow(document, workdir=tmp_path, name="wf-x", emulator=k8s.emulator)
    assert run.phase == "Succeeded", run.nodes["step"].log
    env = json.loads(run.nodes["step"].log.splitlines()[-1])
    digest = fnv32a("wf-x.step")
    assert "POD_NAME" not in env and "POD_UID" not in env
    assert env["ARGO_NODE_ID"] == f"wf-x-{digest}" and env["ARGO_WORKFLOW_NAME"] == "wf-x"
    assert env["ARGO_CONTAINER_NAME"] == "main" and env["ARGO_INCLUDE_SCRIPT_OUTPUT"] == "false"
    assert env["MY_POD"] == f"wf-x-env-{digest}"
    pod = k8s.emulator.get("pods", env["MY_POD"])
    workflow = k8s.emulator.get("workflows", "wf-x")
    assert pod["metadata"]["uid"] == env["MY_UID"] and pod["status"]["phase"] == "Succeeded"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == workflow["metadata"]["uid"]
    assert pod["metadata"]["ownerReferences"][0]["controller"] is True


def test_a_kfp_step_pod_is_owned_by_its_workflow_and_knows_only_its_name_and_uid(k8s):
    """kubeflow/pipelines 2.17.0 backend/src/v2/compiler/argocompiler/common.go: KFP_POD_NAME
    and KFP_POD_UID (downward API) are all the step's container gets of its pod."""
    k8s.emulator.install_crd(objects.workflow_crd())
    workflow = k8s.emulator.create(
        "workflows",
        {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {"name": "run-1"},
            "spec": {},
        },
    )
    pod = k8s.emulator.create_pod(objects.step_pod(workflow, "run-1-launch-1"))
    assert objects.kfp_step_env(pod) == {
        "KFP_POD_NAME": "run-1-launch-1",
        "KFP_POD_UID": pod["metadata"]["uid"],
    }
    assert pod["metadata"]["ownerReferences"][0]["uid"] == workflow["metadata"]["uid"]


@pytest.mark.bad_input
def test_the_trainer_webhook_also_checks_updates(k8s, trainer, custom):
    """trainjob_webhook.go ``ValidateUpdate`` runs the same runtime check as on create: once
    the runtime is gone, even suspending the TrainJob is refused."""
    install_runtime(k8s, command=["sleep", "30"])
    create(custom, trainjob("later"))
    pods_of(k8s, "later", 1)
    k8s.emulator.delete("clustertrainingruntimes", RUNTIME, namespace="")
    with pytest.raises(ApiException) as refused:
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, "default", "trainjobs", "later", {"spec": {"suspend": True}}
        )
    assert refused.value.status == 403 and "must be created before" in refused.value.body


# --- JobSet 0.12 + the Job controller: restarts ----------------------------------------------


def pod_history(k8s) -> tuple[list[tuple[str, str, int, str]], Any]:
    """Every pod change as (event, pod, restartCount, state), in order; and the unsubscribe."""
    seen: list[tuple[str, str, int, str]] = []

    def record(plural: str, event: dict[str, Any]) -> None:
        if plural != "pods":
            return
        pod = event["object"]
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            state = status.get("state") or {}
            kind = next(iter(state), "")
            detail = (state.get(kind) or {}).get("reason", "") if kind != "running" else ""
            seen.append(
                (
                    event["type"],
                    pod["metadata"]["name"],
                    status["restartCount"],
                    f"{kind} {detail}".strip(),
                )
            )

    return seen, k8s.emulator.on_event(record)


def restarting_runtime(
    k8s, backoff_limit: int | None = None, restart_policy: str | None = None
) -> None:
    """A runtime whose node always exits 3, with the Job's backoffLimit and pod restartPolicy
    given (else none, as the Trainer's torch-distributed)."""
    runtime = objects.torch_runtime(RUNTIME, command=["sh", "-c", "echo ran; exit 3"])
    node_job = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    if backoff_limit is not None:
        node_job["backoffLimit"] = backoff_limit
    if restart_policy is not None:
        node_job["template"]["spec"]["restartPolicy"] = restart_policy
    k8s.emulator.create("clustertrainingruntimes", runtime)


def test_onfailure_restarts_in_place_until_the_backoff_limit_fails_the_job(k8s, trainer, custom):
    """jobset_webhook.go ``Default`` (~124): no restartPolicy in the runtime is OnFailure; the
    kubelet restarts the container in place, with CrashLoopBackOff from the second restart
    (kuberuntime_manager.go ``doBackOff``); job_controller.go ``pastBackoffLimitOnFailure``:
    the restarts reaching backoffLimit 2 fail the Job and delete its pods; no failurePolicy:
    the JobSet (and so the TrainJob, jobset.go ``Status``) fails FailedJobs."""
    restarting_runtime(k8s, backoff_limit=2)
    history, unsubscribe = pod_history(k8s)
    create(custom, trainjob("crashing"))
    pod = pods_of(k8s, "crashing", 1)[0]
    assert pod["spec"]["restartPolicy"] == "OnFailure"
    condition = finished(k8s, "crashing")["status"]["conditions"][-1]
    unsubscribe()
    assert (condition["type"], condition["reason"]) == ("Failed", "FailedJobs")
    assert condition["message"] == (
        "jobset failed due to one or more job failures (first failed job: crashing-node-0)"
    )
    name = pod["metadata"]["name"]
    states = [(count, state) for _, pod_name, count, state in history if pod_name == name]
    changes = [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]]
    assert changes == [
        (0, "waiting ContainerCreating"),
        (0, "running"),
        (0, "terminated Error"),
        (1, "running"),
        (1, "terminated Error"),
        (1, "waiting CrashLoopBackOff"),
    ], changes
    assert history[-1][0] == "DELETED" and k8s.emulator.list("pods") == []


def test_failure_policy_restarts_every_pod_until_max_restarts(k8s, trainer, custom):
    """failure_policy.go ``restartJobSetActionApplier``: a failed Job (restartPolicy Never,
    backoffLimit 0) makes JobSet delete every Job and make them again, labelled restart-attempt
    = status.restarts, until maxRestarts; then ReachedMaxRestarts."""
    runtime = objects.torch_runtime(RUNTIME, command=["sh", "-c", "exit 3"])
    spec = runtime["spec"]["template"]["spec"]
    spec["failurePolicy"] = {"maxRestarts": 1}
    node_job = spec["replicatedJobs"][0]["template"]["spec"]
    node_job["backoffLimit"] = 0
    node_job["template"]["spec"]["restartPolicy"] = "Never"
    k8s.emulator.create("clustertrainingruntimes", runtime)
    history, unsubscribe = pod_history(k8s)
    create(custom, trainjob("twice", numNodes=2))
    condition = finished(k8s, "twice")["status"]["conditions"][-1]
    unsubscribe()
    assert (condition["type"], condition["reason"]) == ("Failed", "ReachedMaxRestarts")
    assert condition["message"] == (
        "jobset failed due to reaching max number of restarts (first failed job: twice-node-0)"
    )
    made = list(dict.fromkeys(name for event, name, *_ in history if event == "ADDED"))
    deleted = {name for event, name, *_ in history if event == "DELETED"}
    assert len(made) == 4 and deleted == set(made[:2]), (made, deleted)
    pods = pods_of(k8s, "twice", 2)
    assert [p["metadata"]["labels"][objects.RESTART_ATTEMPT] for p in pods] == ["1", "1"]
    assert [p["status"]["phase"] for p in pods] == ["Failed", "Failed"]


def test_never_replaces_a_failed_pod_within_the_backoff_limit(k8s, trainer, custom):
    """job_controller.go ``syncJob``: restartPolicy Never, backoffLimit 1: the failed index
    gets a new pod; the second failure exceeds the limit and fails the Job."""
    restarting_runtime(k8s, backoff_limit=1, restart_policy="Never")
    create(custom, trainjob("replaced"))
    condition = finished(k8s, "replaced")["status"]["conditions"][-1]
    assert (condition["type"], condition["reason"]) == ("Failed", "FailedJobs")
    pods = pods_of(k8s, "replaced", 2)
    assert [p["status"]["phase"] for p in pods] == ["Failed", "Failed"]
    assert [p["status"]["containerStatuses"][0]["restartCount"] for p in pods] == [0, 0]


def test_a_webhook_denial_is_the_api_servers_answer(k8s, trainer, custom):
    """controller-runtime v0.24.1 validator_custom.go/response.go: Denied is 403 Forbidden with
    the validator's message; apiserver statuserror.go ``ToStatusErr`` prefixes the webhook's
    name and adds no details."""
    code, status = refusal(custom, trainjob(runtime="absent"))
    assert (code, status["reason"], status["status"]) == (403, "Forbidden", "Failure")
    assert "details" not in status
