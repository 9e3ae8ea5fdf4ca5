"""Rendering a TrainJobSpec: TrainJob (v2.3 and v2.1 forms), script ConfigMap, Indexed Job +
headless Service, and `kubetrain render trainjob`.

TrainJobs are checked against the vendored v2.3 CRD (skipped without ../shared, failed
under CI=true) and always round-trip through the kubeflow_trainer_api models; core kinds are
checked with kubernetes-validate. The v2.1 CRD is not vendored: its podTemplateOverrides entry
is checked structurally, against the v2.1 Go type's fields, and its pod patch against the v2.3
pod patch schema (the same Kubernetes types).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from k8s_schemas import REPO_ROOT, TRAINJOB_CRD, crd_schema, schema_errors, subschema
from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob

from kubetrain.cli import main
from kubetrain.errors import InvalidInput
from kubetrain.jobspec import (
    DEFAULT_RUNTIME,
    MAX_SCRIPT_BYTES,
    Initializer,
    Resources,
    RuntimeRef,
    Toleration,
    TrainJobSpec,
    Volume,
)
from kubetrain.render import render_indexed_job, render_script_configmap, render_trainjob
from kubetrain.render.metadata import (
    JOB_NAME_LABEL,
    MANAGED_BY_LABEL,
    SCRIPT_SHA256_ANNOTATION,
    SPEC_ANNOTATION,
    SPEC_SHA256_ANNOTATION,
)
from tests.support import objects, trainer_build

K8S_VERSION = "1.30"
OWNER = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "run-1", "uid": "u-1"}
#: What every node pod carries, as KFP's run pods do (kubeflow/pipelines 2.17.0
#: backend/src/apiserver/template/v2_template.go ~170).
ISTIO_OPT_OUT = {"sidecar.istio.io/inject": "false"}
# PodTemplateSpecOverride and ContainerOverride of Trainer v2.1 (pkg/apis/trainer/v1alpha1).
V21_POD_SPEC_FIELDS = {
    "serviceAccountName",
    "nodeSelector",
    "affinity",
    "tolerations",
    "volumes",
    "initContainers",
    "containers",
    "schedulingGates",
    "imagePullSecrets",
}
V21_CONTAINER_FIELDS = {"name", "env", "volumeMounts"}


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("import torch.distributed as dist\n\nprint('hello from', dist)\n")
    return path


def default_spec() -> TrainJobSpec:
    return TrainJobSpec(name="demo", command=("torchrun", "-m", "kubetrain.train"))


def full_spec(script: Path | None = None) -> TrainJobSpec:
    """Every field set."""
    return TrainJobSpec(
        name="full-job",
        command=("torchrun",),
        args=("train.py", "--epochs", "3") if script else ("-m", "kubetrain.train"),
        image="registry.example.com/team/trainer:1.2",
        env={"NCCL_DEBUG": "INFO", "EMPTY": ""},
        num_nodes=4,
        procs_per_node=8,
        resources_per_node=Resources(cpu="16", memory="64Gi", gpu=8),
        runtime=RuntimeRef(name="torch-ddp-gpu", kind="TrainingRuntime"),
        volumes=(
            Volume("shared", "kubetrain-shared", "/mnt/shared"),
            Volume("refdata", "reference-data", "/mnt/ref", read_only=True),
        ),
        labels={"team": "vision", "example.com/cost-center": "42"},
        pod_labels={"sidecar.istio.io/inject": "false"},
        node_selector={"nvidia.com/gpu.product": "H100"},
        tolerations=(
            Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
            Toleration(key="dedicated", value="training", effect="NoExecute"),
        ),
        service_account="kubetrain",
        suspend=True,
        active_deadline_seconds=3600,
        dataset_initializer=Initializer("hf://org/dataset", "hf-token"),
        model_initializer=Initializer("s3://bucket/model"),
        script=str(script) if script else "",
    )


def assert_valid_trainjob(trainjob: dict) -> None:
    assert schema_errors(trainjob, crd_schema(TRAINJOB_CRD)) == []


def assert_round_trips(trainjob: dict) -> None:
    assert TrainerV1alpha1TrainJob.from_dict(trainjob).to_dict() == trainjob


def node_pod_patch(trainjob: dict) -> dict:
    (patch,) = trainjob["spec"]["runtimePatches"]
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == "node"
    return job["template"]["spec"]["template"]


def validate_core(obj: dict) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# --- TrainJob, v2.3 form ------------------------------------------------------------------


@pytest.mark.parametrize(
    "form", ["default", "every option", "v2.1 minus podTemplateOverrides", "script"]
)
def test_rendered_trainjobs_are_valid_against_the_v2_3_crd(form, script):
    if form == "default":
        trainjob = render_trainjob(default_spec())
    elif form == "every option":
        trainjob = render_trainjob(full_spec(), namespace="team-a", owner=OWNER)
    elif form == "script":
        trainjob = render_trainjob(full_spec(script))
    else:
        trainjob = render_trainjob(v2_1_spec(), trainer_version="2.1")
        trainjob["spec"].pop("podTemplateOverrides")
    assert_valid_trainjob(trainjob)


def test_default_trainjob_is_minimal():
    trainjob = render_trainjob(default_spec())
    assert trainjob["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert trainjob["kind"] == "TrainJob"
    assert trainjob["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": DEFAULT_RUNTIME,
    }
    trainer = trainjob["spec"]["trainer"]
    assert trainer["command"] == ["torchrun", "-m", "kubetrain.train"]
    # args: [] explicitly, so the runtime's own args are not kept (see the args test).
    assert trainer["args"] == [] and "resourcesPerNode" not in trainer and "env" not in trainer
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (1, 1)
    for absent in ("suspend", "activeDeadlineSeconds", "initializer", "podTemplateOverrides"):
        assert absent not in trainjob["spec"]
    # The node pods always carry our labels, so the backend finds them (and rank 0), and no
    # Istio sidecar.
    assert node_pod_patch(trainjob) == {
        "metadata": {
            "labels": {MANAGED_BY_LABEL: "kubetrain", JOB_NAME_LABEL: "demo"},
            "annotations": ISTIO_OPT_OUT,
        }
    }
    assert "None" not in json.dumps(trainjob) and "null" not in json.dumps(trainjob["spec"])
    assert_round_trips(trainjob)


def test_every_option_maps_to_the_trainjob():
    spec = full_spec()
    trainjob = render_trainjob(spec, namespace="team-a", owner=OWNER)
    assert_round_trips(trainjob)
    metadata, body = trainjob["metadata"], trainjob["spec"]
    assert (metadata["name"], metadata["namespace"]) == ("full-job", "team-a")
    assert metadata["labels"] == {
        "team": "vision",
        "example.com/cost-center": "42",
        MANAGED_BY_LABEL: "kubetrain",
        JOB_NAME_LABEL: "full-job",
    }
    assert metadata["ownerReferences"] == [
        {**OWNER, "controller": True, "blockOwnerDeletion": False}
    ]
    assert body["runtimeRef"]["kind"] == "TrainingRuntime"
    assert body["suspend"] is True and body["activeDeadlineSeconds"] == 3600
    trainer = body["trainer"]
    assert trainer["image"] == "registry.example.com/team/trainer:1.2"
    assert trainer["env"] == [
        {"name": "NCCL_DEBUG", "value": "INFO"},
        {"name": "EMPTY", "value": ""},
    ]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (4, 8)
    assert trainer["resourcesPerNode"] == {
        "requests": {"cpu": "16", "memory": "64Gi"},
        "limits": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "8"},
    }
    # Secrets only by reference.
    assert body["initializer"] == {
        "dataset": {"storageUri": "hf://org/dataset", "secretRef": {"name": "hf-token"}},
        "model": {"storageUri": "s3://bucket/model"},
    }
    template = node_pod_patch(trainjob)
    assert template["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"
    pod = template["spec"]
    assert pod["serviceAccountName"] == "kubetrain"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoExecute"},
    ]
    assert pod["volumes"] == [
        {"name": "shared", "persistentVolumeClaim": {"claimName": "kubetrain-shared"}},
        {
            "name": "refdata",
            "persistentVolumeClaim": {"claimName": "reference-data", "readOnly": True},
        },
    ]
    assert pod["containers"] == [
        {
            "name": "node",
            "volumeMounts": [
                {"name": "shared", "mountPath": "/mnt/shared"},
                {"name": "refdata", "mountPath": "/mnt/ref", "readOnly": True},
            ],
        }
    ]
    assert trainjob["spec"]["runtimePatches"][0]["manager"] == "kubetrain.io/manager"


def test_spec_annotations_identify_the_spec():
    spec = full_spec()
    annotations = render_trainjob(spec)["metadata"]["annotations"]
    text = annotations[SPEC_ANNOTATION]
    assert text == json.dumps(spec.to_dict(), sort_keys=True, separators=(",", ":"))
    assert annotations[SPEC_SHA256_ANNOTATION] == hashlib.sha256(text.encode()).hexdigest()
    assert TrainJobSpec.from_dict(json.loads(text)) == spec
    other = render_trainjob(TrainJobSpec.from_dict({**spec.to_dict(), "num_nodes": 2}))
    assert (
        other["metadata"]["annotations"][SPEC_SHA256_ANNOTATION]
        != annotations[SPEC_SHA256_ANNOTATION]
    )
    # The same spec renders byte-identically (a retried step compares these).
    assert render_trainjob(spec) == render_trainjob(spec)


def test_the_node_pods_of_any_runtime_opt_out_of_istio():
    """Through runtimePatches, so a runtime that is not ours (here one shaped like the
    Trainer's torch-distributed, which has no such annotation) gets it too: the Trainer merges
    the patch into the runtime's JobSet spec (kubeflow/trainer v2.3.0
    pkg/runtime/core/trainingruntime.go mergeRuntimePatches, a strategic merge)."""
    trainjob = render_trainjob(default_spec())
    runtime = objects.torch_runtime()
    jobset = runtime["spec"]["template"]["spec"]
    (patch,) = trainjob["spec"]["runtimePatches"]
    merged = trainer_build.strategic_merge(jobset, patch["trainingRuntimeSpec"]["template"]["spec"])
    (node,) = merged["replicatedJobs"]
    pod_metadata = node["template"]["spec"]["template"]["metadata"]
    assert pod_metadata["annotations"] == ISTIO_OPT_OUT
    assert pod_metadata["labels"][JOB_NAME_LABEL] == "demo"


@pytest.mark.parametrize("version", ["2.2", "2.3"])
def test_runtime_patches_form_for_2_2_and_later(version):
    trainjob = render_trainjob(full_spec(), trainer_version=version)
    assert "runtimePatches" in trainjob["spec"] and "podTemplateOverrides" not in trainjob["spec"]


def test_owner_needs_its_identity():
    with pytest.raises(InvalidInput, match=r"^owner: has no uid"):
        render_trainjob(default_spec(), owner={"apiVersion": "v1", "kind": "Pod", "name": "p"})


@pytest.mark.parametrize("version", ["auto", "2.0", "3"])
def test_unresolved_or_unknown_trainer_version_is_refused(version):
    with pytest.raises(InvalidInput, match=r"^trainer_version: "):
        render_trainjob(default_spec(), trainer_version=version)


# --- TrainJob, v2.1 form ------------------------------------------------------------------


def v2_1_spec() -> TrainJobSpec:
    """Every field Trainer v2.1 has (no activeDeadlineSeconds)."""
    return TrainJobSpec.from_dict({**full_spec().to_dict(), "active_deadline_seconds": None})


def test_v2_1_form_uses_pod_template_overrides():
    trainjob = render_trainjob(v2_1_spec(), trainer_version="2.1")
    body = trainjob["spec"]
    assert "runtimePatches" not in body and "activeDeadlineSeconds" not in body
    (override,) = body.pop("podTemplateOverrides")
    assert override["targetJobs"] == [{"name": "node"}]
    assert set(override) == {"targetJobs", "metadata", "spec"}
    # v2.1.0 merges both into the pod template (pkg/runtime/core/trainingruntime.go
    # mergePodTemplateOverrides).
    assert set(override["metadata"]) == {"labels", "annotations"}
    assert override["metadata"]["annotations"] == ISTIO_OPT_OUT
    assert set(override["spec"]) <= V21_POD_SPEC_FIELDS
    assert all(set(c) <= V21_CONTAINER_FIELDS for c in override["spec"]["containers"])
    assert (
        override["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "kubetrain-shared"
    )
    assert_round_trips(trainjob)


def test_v2_1_pod_template_override_has_the_shape_of_the_v2_3_pod_patch():
    """The v2.1 override's pod fields are the same Kubernetes types as v2.3's PodSpecPatch."""
    (override,) = render_trainjob(v2_1_spec(), trainer_version="2.1")["spec"][
        "podTemplateOverrides"
    ]
    pod_template_schema = subschema(
        crd_schema(TRAINJOB_CRD),
        *("spec", "runtimePatches", "[]", "trainingRuntimeSpec", "template", "spec"),
        *("replicatedJobs", "[]", "template", "spec", "template"),
    )
    pod_template = {"metadata": override["metadata"], "spec": override["spec"]}
    assert schema_errors(pod_template, pod_template_schema) == []


def test_active_deadline_on_v2_1_is_refused_naming_the_field_and_fix():
    with pytest.raises(InvalidInput) as caught:
        render_trainjob(full_spec(), trainer_version="2.1")
    assert caught.value.field == "active_deadline_seconds"
    assert "v2.2" in str(caught.value) and "--active-deadline-seconds" in str(caught.value)


# --- a shipped script ---------------------------------------------------------------------


def test_script_ships_as_a_configmap_mounted_at_workspace(script):
    spec = full_spec(script)
    configmap = render_script_configmap(spec, "team-a", owner=OWNER)
    validate_core(configmap)
    assert configmap["metadata"]["name"] == "full-job-script"
    assert configmap["metadata"]["namespace"] == "team-a"
    assert configmap["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert configmap["immutable"] is True
    assert configmap["data"] == {"train.py": script.read_text()}
    digest = hashlib.sha256(script.read_bytes()).hexdigest()
    assert configmap["metadata"]["annotations"][SCRIPT_SHA256_ANNOTATION] == digest

    trainjob = render_trainjob(spec)
    assert_round_trips(trainjob)
    assert trainjob["metadata"]["annotations"][SCRIPT_SHA256_ANNOTATION] == digest
    # The command names the script as run locally; the pod runs the mounted copy.
    assert trainjob["spec"]["trainer"]["command"] == ["torchrun"]
    assert trainjob["spec"]["trainer"]["args"] == ["/workspace/train.py", "--epochs", "3"]
    pod = node_pod_patch(trainjob)["spec"]
    assert {"name": "kubetrain-script", "configMap": {"name": "full-job-script"}} in pod["volumes"]
    mounts = pod["containers"][0]["volumeMounts"]
    assert {"name": "kubetrain-script", "mountPath": "/workspace", "readOnly": True} in mounts


@pytest.mark.parametrize("written", ["train.py", "./train.py", "{dir}/train.py"])
def test_any_spelling_of_the_script_path_is_rewritten(script, written):
    mention = written.format(dir=script.parent)
    spec = TrainJobSpec(name="s", command=("python", mention), script=str(script))
    assert render_trainjob(spec)["spec"]["trainer"]["command"] == ["python", "/workspace/train.py"]


def test_a_command_that_never_runs_the_script_is_refused(script):
    spec = TrainJobSpec(name="s", command=("torchrun", "other.py"), script=str(script))
    with pytest.raises(InvalidInput, match=r"^script: no argument of the command names train.py"):
        render_trainjob(spec)


def test_a_script_over_1_mib_is_refused(tmp_path):
    big = tmp_path / "big.py"
    big.write_text("#" * (MAX_SCRIPT_BYTES + 1))
    spec = TrainJobSpec(name="s", command=("python", "big.py"), script=str(big))
    with pytest.raises(InvalidInput, match=r"^script: .* more than a ConfigMap's"):
        render_script_configmap(spec)


def test_a_volume_on_the_script_mount_is_refused(script):
    spec = TrainJobSpec(
        name="s",
        command=("python", "train.py"),
        script=str(script),
        volumes=(Volume("code", "code-pvc", "/workspace"),),
    )
    with pytest.raises(InvalidInput, match=r"^volumes.mount_path: /workspace"):
        render_trainjob(spec)


# --- Indexed Job + headless Service -------------------------------------------------------


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container["env"]}


def test_indexed_job_and_headless_service_give_the_trainer_environment():
    spec = TrainJobSpec.from_dict(
        {**full_spec().to_dict(), "dataset_initializer": None, "model_initializer": None}
    )
    service, job = render_indexed_job(spec, namespace="team-a", owner=OWNER)
    validate_core(service)
    validate_core(job)

    assert service["kind"] == "Service" and service["metadata"]["name"] == "full-job"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert [p["port"] for p in service["spec"]["ports"]] == [29500]
    assert service["metadata"]["ownerReferences"] == job["metadata"]["ownerReferences"]

    body = job["spec"]
    assert body["completionMode"] == "Indexed"
    assert body["completions"] == body["parallelism"] == 4
    assert body["backoffLimit"] == 0
    assert body["suspend"] is True and body["activeDeadlineSeconds"] == 3600
    assert job["metadata"]["annotations"][SPEC_ANNOTATION] == json.dumps(
        spec.to_dict(), sort_keys=True, separators=(",", ":")
    )
    pod = body["template"]
    labels = pod["metadata"]["labels"]
    assert all(labels[k] == v for k, v in service["spec"]["selector"].items())
    assert labels["sidecar.istio.io/inject"] == "false"
    assert pod["metadata"]["annotations"] == ISTIO_OPT_OUT
    assert pod["spec"]["subdomain"] == service["metadata"]["name"]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["serviceAccountName"] == "kubetrain"
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert len(pod["spec"]["tolerations"]) == 2
    (container,) = pod["spec"]["containers"]
    assert container["name"] == "node"
    assert (container["image"], container["command"]) == (spec.image, ["torchrun"])
    assert container["args"] == ["-m", "kubetrain.train"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"/mnt/shared", "/mnt/ref", "/dev/shm"}  # a GPU pod's shared memory
    env = env_of(container)
    assert env["NCCL_DEBUG"]["value"] == "INFO"
    assert env["KUBETRAIN_JOB_NAME"]["value"] == "full-job"  # the report's run name
    assert env["PET_NNODES"]["value"] == "4"
    assert env["PET_NPROC_PER_NODE"]["value"] == "8"
    assert env["PET_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    # Pod <job>-0 under the Service <job>.
    assert env["PET_MASTER_ADDR"]["value"] == "full-job-0.full-job"
    assert env["PET_MASTER_PORT"]["value"] == "29500"


def test_indexed_job_pods_opt_out_of_istio_without_being_asked():
    _, job = render_indexed_job(default_spec())
    assert job["spec"]["template"]["metadata"]["annotations"] == ISTIO_OPT_OUT


def test_indexed_job_mounts_a_shipped_script(script):
    spec = TrainJobSpec.from_dict(
        {**full_spec(script).to_dict(), "dataset_initializer": None, "model_initializer": None}
    )
    _, job = render_indexed_job(spec)
    validate_core(job)
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"][0] == "/workspace/train.py"
    assert {"name": "kubetrain-script", "configMap": {"name": "full-job-script"}} in pod["volumes"]


def test_indexed_job_refuses_the_trainers_initializers():
    with pytest.raises(InvalidInput, match=r"^dataset_initializer: .*--backend trainer"):
        render_indexed_job(full_spec())


def test_indexed_job_refuses_names_too_long_for_pod_hostnames():
    spec = TrainJobSpec(name="a" * 62, command=("torchrun",), num_nodes=10)
    with pytest.raises(InvalidInput, match=r"^name: .* at most 61 characters"):
        render_indexed_job(spec)


# --- `kubetrain render trainjob` ----------------------------------------------------------


def render_cli(*args: str) -> list[dict]:
    result = subprocess.run(
        [sys.executable, "-m", "kubetrain", "render", "trainjob", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(result.stdout))


def test_cli_renders_a_valid_trainjob_with_launch_defaults():
    (trainjob,) = render_cli("--name", "demo", "--nodes", "2", "--procs-per-node", "1")
    assert_round_trips(trainjob)
    trainer = trainjob["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 1)
    assert trainer["command"] == ["torchrun", "-m", "kubetrain.train"]
    args = trainer["args"]
    assert args[args.index("--data") + 1] == "/mnt/shared/data"
    assert args[args.index("--checkpoint-dir") + 1] == "/mnt/shared/checkpoints/demo"
    assert "runtimePatches" in trainjob["spec"]
    assert_valid_trainjob(trainjob)


def test_cli_renders_the_v2_1_form():
    (trainjob,) = render_cli("--name", "demo", "--trainer-version", "2.1")
    assert "runtimePatches" not in trainjob["spec"]
    (override,) = trainjob["spec"]["podTemplateOverrides"]
    assert override["targetJobs"] == [{"name": "node"}]


def test_cli_renders_the_job_backend_and_a_script_configmap_first(script):
    docs = render_cli(
        "--backend", "job", "--name", "demo", "--nodes", "3", "--script", str(script),
        "--", "torchrun", "train.py",
    )  # fmt: skip
    assert [d["kind"] for d in docs] == ["ConfigMap", "Service", "Job"]
    configmap, service, job = docs
    assert configmap["data"]["train.py"] == script.read_text()
    assert service["spec"]["clusterIP"] == "None"
    container = job["spec"]["template"]["spec"]["containers"][0]
    # The program runs in its checkpoint folder (launch.IN_FOLDER: no workingDir in a TrainJob).
    assert container["command"][:2] == ["python3", "-c"]
    assert container["args"] == ["/mnt/shared/checkpoints/demo", "torchrun", "/workspace/train.py"]
    assert env_of(container)["PET_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    for obj in docs:
        validate_core(obj)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (
            ("--trainer-version", "2.1", "--active-deadline-seconds", "60"),
            "active_deadline_seconds",
        ),
        (("--backend", "local"), "backend"),
        (("--nodes", "0"), "nodes"),
        (("--trainer-version", "9"), "trainer_version"),
    ],
)
def test_cli_bad_input_fails_with_one_line_naming_the_field(capsys, args, field):
    assert main(["render", "trainjob", "--name", "demo", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"kubetrain render: error: {field}: ")


def test_cli_refuses_a_script_over_1_mib(capsys, tmp_path):
    big = tmp_path / "big.py"
    big.write_text("#" * (MAX_SCRIPT_BYTES + 1))
    argv = ["render", "trainjob", "--name", "demo", "--script", str(big), "--", "python", "big.py"]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("kubetrain render: error: script: ")


def test_offline_render_for_trainer_2_2_warns_that_it_cannot_merge_the_runtimes_resources(
    capsys,
):
    """Trainer <= 2.2 replaces the runtime's resources (kubeflow/trainer v2.2.0
    pkg/runtime/core/trainingruntime.go); launch merges them, render cannot read the runtime."""
    assert (
        main(["render", "trainjob", "--name", "demo", "--trainer-version", "2.2", "--cpu", "2"])
        == 0
    )
    (warning,) = capsys.readouterr().err.strip().splitlines()
    assert "Trainer 2.2 replaces the runtime's resources" in warning
    assert main(["render", "trainjob", "--name", "demo", "--cpu", "2"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("backend", ["job", "pytorchjob"])
def test_gpu_pods_without_a_runtime_get_shared_memory(backend):
    """NCCL's shared-memory transport and DataLoader workers outgrow a container's 64Mi
    /dev/shm; the Trainer's pods get it from our GPU runtimes, the renderers with no runtime
    give it themselves, to GPU pods only."""
    from kubetrain.render import render_job

    def pod_specs(gpu: int) -> list[dict]:
        spec = TrainJobSpec(
            name="gpu-job",
            command=("torchrun", "train.py"),
            num_nodes=2,
            resources_per_node=Resources(gpu=gpu),
        )
        objects = render_job(spec, backend, namespace="default", trainer_version="2.3")
        return [
            found for found in _walk(objects) if isinstance(found, dict) and "containers" in found
        ]

    for pod_spec in pod_specs(gpu=4):
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in (
            pod_spec["volumes"]
        )
        mounts = pod_spec["containers"][0]["volumeMounts"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in mounts
    assert "dshm" not in json.dumps(pod_specs(gpu=0))


def _walk(node):
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for child in children:
        yield from _walk(child)


# --- PET_* env ----------------------------------------------------------------------------


def test_torchrun_options_in_pet_variables_reach_every_backend():
    """Only the five variables the Trainer's torch plugin sets are refused (kubeflow/trainer
    v2.3.0 pkg/constants/constants.go ~300 TorchRunReservedEnvNames, torch.go Validate): other
    PET_* are torchrun options (PET_MAX_RESTARTS is --max-restarts) a user may set."""
    env = {"PET_MAX_RESTARTS": "2", "PET_RDZV_TIMEOUT": "600"}
    spec = TrainJobSpec(name="demo", command=("torchrun", "train.py"), env=env)
    trainer_env = render_trainjob(spec)["spec"]["trainer"]["env"]
    assert trainer_env == [{"name": k, "value": v} for k, v in env.items()]
    _, job = render_indexed_job(spec)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert {k: env_of(container)[k]["value"] for k in env} == env


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "name",
    ["PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"],
)
def test_the_variables_the_trainer_sets_are_refused(name):
    spec = TrainJobSpec(name="demo", command=("torchrun", "train.py"), env={name: "1"})
    with pytest.raises(InvalidInput) as refused:
        render_trainjob(spec)
    assert str(refused.value) == (
        f"env: {name} is set by the Trainer itself; use --nodes/--procs-per-node instead of "
        "PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT"
    )
