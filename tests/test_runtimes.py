"""Deployment manifests: our ClusterTrainingRuntimes (the top-level runtimes/ folder, a
kustomization, installed as the package kubetrain.runtimes) and RBAC (package data), printed by
`kubetrain render runtimes|rbac`, and the Dockerfiles.

Runtimes are checked against the vendored v2.3 ClusterTrainingRuntime CRD (skipped without
../shared, failed under CI=true), always round-trip through the kubeflow_trainer_api models,
and their pod template is checked as a batch/v1 Job with kubernetes-validate. The wheel is built
here (offline, from a copy of the sources) and its runtimes compared with the folder.
"""

from __future__ import annotations

import importlib.resources
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from k8s_schemas import CLUSTER_RUNTIME_CRD, REPO_ROOT, crd_schema, schema_errors
from kubeflow_trainer_api.models.trainer_v1alpha1_cluster_training_runtime import (
    TrainerV1alpha1ClusterTrainingRuntime,
)

from kubetrain.images import DEEPSPEED_IMAGE
from kubetrain.jobspec import MPI_RUNTIME
from kubetrain.render.manifests import (
    KFP_SERVICE_ACCOUNTS,
    RUNTIME_NAMES,
    RUNTIMES_PACKAGE,
    rbac_manifests,
    runtime_manifests,
)

IMAGES = REPO_ROOT / "images"
GPU_RUNTIMES = ("torch-ddp-gpu", "torch-fsdp-gpu", "torch-ddp-gpu-gang")
TORCH_RUNTIMES = tuple(name for name in RUNTIME_NAMES if name != MPI_RUNTIME)
K8S_VERSION = "1.30"
OUR_TRAINER_IMAGE = "ghcr.io/kubetrain/kubetrain-trainer:0.1.0"
MANIFESTS = "kubetrain.render.manifests"
RUNTIMES = REPO_ROOT / "runtimes"
ISTIO_OPT_OUT = {"sidecar.istio.io/inject": "false"}
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"


def load_runtime(name: str) -> dict:
    (runtime,) = [r for r in runtime_manifests() if r["metadata"]["name"] == name]
    return runtime


def render(*args: str) -> list[dict]:
    """`kubetrain render ARGS`'s documents, run as a user runs it."""
    result = subprocess.run(
        [sys.executable, "-m", "kubetrain", "render", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT.parent,  # not the checkout: the installed package's data
    )
    assert result.returncode == 0, result.stderr
    return [document for document in yaml.safe_load_all(result.stdout) if document]


def replicated_jobs(runtime: dict) -> list[dict]:
    return runtime["spec"]["template"]["spec"]["replicatedJobs"]


def node_job(runtime: dict) -> dict:
    (job,) = replicated_jobs(runtime)
    return job


def job_container(job: dict) -> dict:
    (container,) = job["template"]["spec"]["template"]["spec"]["containers"]
    return container


def node_container(runtime: dict) -> dict:
    return job_container(node_job(runtime))


def trainer_container(runtime: dict) -> dict:
    """The container the TrainJob's trainer goes to: the `node` container of the replicated job
    labelled as the trainer's (the launcher of an MPI runtime)."""
    (job,) = [
        job
        for job in replicated_jobs(runtime)
        if job["template"].get("metadata", {}).get("labels", {}).get(ANCESTOR) == "trainer"
    ]
    return job_container(job)


@pytest.mark.parametrize("name", RUNTIME_NAMES)
def test_runtime_round_trips_through_the_trainer_models(name):
    runtime = load_runtime(name)
    assert TrainerV1alpha1ClusterTrainingRuntime.from_dict(runtime).to_dict() == runtime


@pytest.mark.parametrize("name", RUNTIME_NAMES)
def test_runtime_is_valid_against_the_v2_3_crd(name):
    assert schema_errors(load_runtime(name), crd_schema(CLUSTER_RUNTIME_CRD)) == []


@pytest.mark.parametrize("name", RUNTIME_NAMES)
def test_runtime_pod_template_is_a_valid_job_template(name):
    for job in replicated_jobs(load_runtime(name)):
        kubernetes_validate.validate(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name},
                **job["template"],
            },
            K8S_VERSION,
            strict=True,
        )


@pytest.mark.parametrize("name", TORCH_RUNTIMES)
def test_runtime_runs_our_trainer_under_torchrun_on_the_shared_volume(name):
    runtime = load_runtime(name)
    assert runtime["kind"] == "ClusterTrainingRuntime"
    assert runtime["metadata"]["name"] == name
    assert runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch"
    # The torch plugin injects PET_* into the container named `node` of the trainer job.
    assert "torch" in runtime["spec"]["mlPolicy"]
    job = node_job(runtime)
    assert job["name"] == "node"
    labels = job["template"]["metadata"]["labels"]
    assert labels["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
    container = node_container(runtime)
    assert container["name"] == "node"
    assert container["image"] == OUR_TRAINER_IMAGE
    assert container["command"] == ["torchrun"]
    assert container["args"][:2] == ["-m", "kubetrain.train"]
    assert {"name": "shared", "mountPath": "/mnt/shared"} in container["volumeMounts"]
    pod = job["template"]["spec"]["template"]["spec"]
    assert {"name": "shared", "persistentVolumeClaim": {"claimName": "kubetrain-shared"}} in pod[
        "volumes"
    ]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    gpus = container["resources"].get("limits", {}).get("nvidia.com/gpu")
    assert (gpus is not None) == (name in GPU_RUNTIMES)


@pytest.mark.parametrize("name", RUNTIME_NAMES)
def test_runtime_pods_opt_out_of_istio_as_kfp_run_pods_do(name):
    """In a Kubeflow profile's namespace (Istio injection on) a sidecar breaks torchrun's
    rendezvous and keeps a finished pod Running (kubeflow/trainer#2794, #2872); KFP opts its run
    pods out (kubeflow/pipelines 2.17.0 backend/src/apiserver/template/v2_template.go ~170)."""
    for job in replicated_jobs(load_runtime(name)):
        pod_template = job["template"]["spec"]["template"]
        assert pod_template["metadata"]["annotations"] == ISTIO_OPT_OUT, job["name"]


def test_fsdp_and_gang_variants():
    assert "fsdp" in node_container(load_runtime("torch-fsdp-gpu"))["args"]
    assert "ddp" in node_container(load_runtime("torch-ddp-gpu"))["args"]
    gang = load_runtime("torch-ddp-gpu-gang")
    assert gang["spec"]["podGroupPolicy"] == {"volcano": {}}
    assert node_job(gang)["template"]["spec"]["template"]["spec"]["schedulerName"] == "volcano"
    for name in ("torch-ddp-cpu", "torch-ddp-gpu", "torch-fsdp-gpu"):
        assert "podGroupPolicy" not in load_runtime(name)["spec"]


# --- the MPI runtime -----------------------------------------------------------------------

#: What our DeepSpeed image's sshd and ssh are set up for (images/deepspeed.Dockerfile).
SSH_PORT = 2222
SSH_HOME = "/home/kubetrain"


def mpi_jobs() -> dict[str, dict]:
    return {job["name"]: job for job in replicated_jobs(load_runtime(MPI_RUNTIME))}


def pod_spec(job: dict) -> dict:
    return job["template"]["spec"]["template"]["spec"]


def test_mpi_runtime_has_the_shape_of_trainer_deepspeed_distributed():
    """As kubeflow/trainer v2.3.0 manifests/base/runtimes/deepspeed_distributed.yaml: an MPI
    policy (OpenMPI, sshAuthMountPath, runLauncherAsNode), a `node` job running sshd and a
    `launcher` job, labelled as the trainer's, that waits for the nodes to be Ready; the JobSet
    succeeds with the launcher and publishes the nodes' names before they are Ready."""
    runtime = load_runtime(MPI_RUNTIME)
    assert runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "deepspeed"
    policy = runtime["spec"]["mlPolicy"]
    assert "torch" not in policy
    assert policy["mpi"] == {
        "numProcPerNode": 1,
        "mpiImplementation": "OpenMPI",
        "sshAuthMountPath": f"{SSH_HOME}/.ssh",
        "runLauncherAsNode": True,
    }
    jobset = runtime["spec"]["template"]["spec"]
    assert jobset["network"] == {"publishNotReadyAddresses": True}
    assert jobset["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["launcher"]}
    # JobSet lets a job depend only on one listed before it (jobset v0.12.0
    # pkg/webhooks/jobset_webhook.go ValidateCreate), so the nodes come first.
    assert [job["name"] for job in replicated_jobs(runtime)] == ["node", "launcher"]
    jobs = mpi_jobs()
    assert "dependsOn" not in jobs["node"]
    assert jobs["launcher"]["dependsOn"] == [{"name": "node", "status": "Ready"}]
    # The Trainer puts the TrainJob's command in the trainer's job; its MPI plugin mounts the
    # hostfile and sets OMPI_MCA_* in that job's container named `node`
    # (pkg/runtime/framework/plugins/mpi/mpi.go EnforceMLPolicy).
    assert jobs["launcher"]["template"]["metadata"]["labels"] == {ANCESTOR: "trainer"}
    assert ANCESTOR not in jobs["node"]["template"].get("metadata", {}).get("labels", {})
    for job in jobs.values():
        container = job_container(job)
        assert container["name"] == "node"
        assert container["image"] == DEEPSPEED_IMAGE
        assert job["template"]["spec"]["backoffLimit"] == 0
        pod = pod_spec(job)
        assert pod["securityContext"]["runAsNonRoot"] is True
        # The ssh-auth Secret's private key is root's, mode 0640: readable through fsGroup.
        assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts == {"/mnt/shared": "shared", "/dev/shm": "dshm"}
    launcher = job_container(jobs["launcher"])
    assert "command" not in launcher  # the TrainJob's mpirun
    node = job_container(jobs["node"])
    assert node["command"] == ["/usr/sbin/sshd"]
    assert node["args"] == ["-De", "-f", f"{SSH_HOME}/.sshd_config"]
    assert node["readinessProbe"]["tcpSocket"] == {"port": SSH_PORT}


def test_the_deepspeed_image_runs_the_sshd_the_mpi_runtime_expects():
    """The runtime and the image agree: sshd's config where the node's command reads it, its
    port the readiness probe's, its host key the Trainer's private key file in
    sshAuthMountPath (trainer v2.3.0 pkg/constants/constants.go MPISSHPrivateKeyFile "id_rsa"),
    the runtime's uid the image's user, whose home holds ~/.ssh."""
    steps = instructions("deepspeed.Dockerfile")
    runs = " ".join(args for op, args in steps if op == "RUN")
    mount = load_runtime(MPI_RUNTIME)["spec"]["mlPolicy"]["mpi"]["sshAuthMountPath"]
    for line in (f"Port {SSH_PORT}", f"HostKey {mount}/id_rsa", "StrictModes no", "UsePAM no"):
        assert f"'{line}'" in runs
    assert f"> {SSH_HOME}/.sshd_config" in runs
    assert '"SetEnv PATH=$PATH"' in runs  # prted and python in every ssh session
    assert "'    Port 2222'" in runs and "'    StrictHostKeyChecking no'" in runs
    assert "rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_*" in runs  # no baked host keys
    assert "usermod --shell /bin/bash kubetrain" in runs
    assert "openmpi==" in runs and "mpi4py==" in runs
    assert "--no-build-isolation deepspeed==" in runs
    uid = int([args for op, args in steps if op == "USER"][-1].split(":")[0])
    for job in mpi_jobs().values():
        assert pod_spec(job)["securityContext"]["runAsUser"] == uid
    assert [args for op, args in steps if op == "FROM"] == [OUR_TRAINER_IMAGE]
    readme = (IMAGES / "README.md").read_text()
    assert DEEPSPEED_IMAGE in readme and "deepspeed.Dockerfile" in readme


# --- RBAC ---------------------------------------------------------------------------------

# Exactly what the steps need; a change here is a change of privileges, made on purpose.
EXPECTED_ROLE_RULES = [
    {
        "apiGroups": ["trainer.kubeflow.org"],
        "resources": ["trainjobs"],
        "verbs": ["create", "get", "list", "watch", "patch", "delete"],
    },
    {
        "apiGroups": ["kubeflow.org"],
        "resources": ["pytorchjobs"],
        "verbs": ["create", "get", "list", "watch", "patch", "delete"],
    },
    {
        "apiGroups": ["ray.io"],
        "resources": ["rayjobs"],
        "verbs": ["create", "get", "list", "watch", "patch", "delete"],
    },
    {
        "apiGroups": ["trainer.kubeflow.org"],
        "resources": ["trainingruntimes"],
        "verbs": ["get", "list"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "delete"]},
    {
        "apiGroups": ["batch"],
        "resources": ["jobs"],
        "verbs": ["create", "get", "list", "watch", "patch", "delete"],
    },
    {"apiGroups": [""], "resources": ["services"], "verbs": ["create", "get", "delete"]},
    {
        "apiGroups": ["argoproj.io"],
        "resources": ["workflowtaskresults"],
        "verbs": ["create", "patch"],
    },
    {"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["get"]},
]
EXPECTED_CLUSTER_RULES = [
    {
        "apiGroups": ["trainer.kubeflow.org"],
        "resources": ["clustertrainingruntimes"],
        "verbs": ["get", "list"],
    },
    {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "resourceNames": ["trainjobs.trainer.kubeflow.org"],
        "verbs": ["get"],
    },
]


def rbac_documents(namespace: str = "default", **options) -> dict[str, dict]:
    docs = rbac_manifests(namespace, **options)
    by_kind = {doc["kind"]: doc for doc in docs}
    assert len(by_kind) == len(docs) == 5
    return by_kind


def test_rbac_manifests_are_valid():
    for doc in rbac_documents().values():
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def subjects(*names: str, namespace: str = "default") -> list[dict]:
    return [{"kind": "ServiceAccount", "name": n, "namespace": namespace} for n in names]


def test_rbac_grants_exactly_the_least_privilege_the_steps_need():
    docs = rbac_documents()
    assert docs["ServiceAccount"]["metadata"]["name"] == "kubetrain"
    assert docs["Role"]["rules"] == EXPECTED_ROLE_RULES
    assert docs["ClusterRole"]["rules"] == EXPECTED_CLUSTER_RULES
    for binding, role in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
        assert docs[binding]["subjects"] == subjects("kubetrain", *KFP_SERVICE_ACCOUNTS)
        assert docs[binding]["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role,
            "name": docs[role]["metadata"]["name"],
        }


def test_rbac_binds_the_accounts_kfp_runs_steps_as():
    """KFP runs a step as the run's account, by default pipeline-runner (kubeflow/pipelines
    2.17.0 backend/src/apiserver/common/const.go), default-editor in multi-user mode
    (manifests/kustomize/base/installs/multi-user/api-service/params.env); KFP's own Role for
    it (manifests/kustomize/base/pipeline/pipeline-runner-role.yaml) has nothing in
    trainer.kubeflow.org. The old rbac.yaml bound kubetrain only, so a KFP launch step was
    forbidden to create its TrainJob."""
    assert KFP_SERVICE_ACCOUNTS == ("pipeline-runner", "default-editor")
    docs = rbac_documents("kubeflow", service_accounts=("kubetrain", "pipeline-runner"))
    assert docs["RoleBinding"]["subjects"] == subjects(
        "kubetrain", "pipeline-runner", namespace="kubeflow"
    )
    assert docs["ClusterRoleBinding"]["subjects"] == docs["RoleBinding"]["subjects"]
    assert {
        docs[k]["metadata"]["namespace"] for k in ("ServiceAccount", "Role", "RoleBinding")
    } == {"kubeflow"}
    # Cluster-scoped: one binding per namespace, so rendering for team-b keeps team-a's.
    assert docs["ClusterRoleBinding"]["metadata"]["name"] == "kubetrain-cluster-reads-kubeflow"
    assert "namespace" not in docs["ClusterRoleBinding"]["metadata"]


def test_rbac_has_no_wildcards_and_no_secrets():
    for kind in ("Role", "ClusterRole"):
        for rule in rbac_documents()[kind]["rules"]:
            for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert not any("*" in value for value in rule.get(key, [])), (kind, rule)
            assert "secrets" not in rule["resources"]
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


# --- package data and `kubetrain render runtimes|rbac` ------------------------------------


def yaml_names(package: str) -> set[str]:
    return {
        f.name for f in importlib.resources.files(package).iterdir() if f.name.endswith(".yaml")
    }


def test_the_manifests_are_package_data():
    """In the package (so in the wheel: pyproject.toml's package-data), not only in the
    checkout: the runtimes are the folder runtimes/ installed as kubetrain.runtimes, the RBAC
    stays in kubetrain.render.manifests, and no runtime has a second copy there."""
    assert yaml_names(RUNTIMES_PACKAGE) == {f"{n}.yaml" for n in RUNTIME_NAMES} | {
        "kustomization.yaml"
    }
    assert yaml_names(MANIFESTS) == {"rbac.yaml"}
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert f'"{RUNTIMES_PACKAGE}" = "runtimes"' in pyproject  # [tool.setuptools.package-dir]
    assert f'"{RUNTIMES_PACKAGE}" = ["*.yaml", "README.md"]' in pyproject
    assert f'"{MANIFESTS}" = ["*.yaml"]' in pyproject
    for package in (MANIFESTS, RUNTIMES_PACKAGE):
        assert f'"{package}",' in pyproject  # in [tool.setuptools] packages


def folder_files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}


def run_ok(command: list[str], **options) -> str:
    """``command``'s stdout; its stderr in the failure if it fails."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, **options)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_wheel_ships_the_runtimes_folder_and_renders_them(tmp_path):
    """The wheel's kubetrain/runtimes/ is runtimes/ byte for byte (the build backend's file
    mapping, no second copy in git), and `kubetrain render runtimes` from that wheel, installed
    on its own and run outside the checkout, prints them. Built offline (no build isolation)
    from a copy of the sources, so a stale build/ in the checkout cannot add removed files."""
    pytest.importorskip("setuptools", minversion="68", reason="pyproject.toml's build backend")
    source = tmp_path / "source"
    for folder in ("kubetrain", "components", "pipelines", "runtimes"):
        shutil.copytree(
            REPO_ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    offline = ["--no-deps", "--no-index"]
    wheels = tmp_path / "wheels"
    build = [*pip, "wheel", *offline, "--no-build-isolation", "-w", str(wheels), str(source)]
    run_ok(build)
    (wheel,) = wheels.glob("kubetrain-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {
            name.removeprefix("kubetrain/runtimes/"): archive.read(name)
            for name in archive.namelist()
            if name.startswith("kubetrain/runtimes/")
        }
        manifests = {
            name.rpartition("/")[2]
            for name in archive.namelist()
            if name.startswith("kubetrain/render/manifests/")
        }
    assert shipped == folder_files(RUNTIMES)
    assert manifests == {"__init__.py", "rbac.yaml"}

    installed, outside = tmp_path / "installed", tmp_path / "outside"
    outside.mkdir()
    install = [*pip, "install", *offline, "--target", str(installed), str(wheel)]
    run_ok(install)
    env = {**os.environ, "PYTHONPATH": str(installed)}
    script = "import kubetrain.runtimes as r; print(r.__file__)"
    where = run_ok([sys.executable, "-c", script], env=env, cwd=outside)
    assert Path(where.strip()).parent == installed / "kubetrain" / "runtimes"
    rendered = run_ok(
        [sys.executable, "-m", "kubetrain", "render", "runtimes"], env=env, cwd=outside
    )
    assert [d for d in yaml.safe_load_all(rendered) if d] == runtime_manifests()


def by_name(documents: list[dict]) -> dict[str, dict]:
    return {document["metadata"]["name"]: document for document in documents}


def test_the_kustomization_lists_every_runtime_in_the_order_render_prints_them():
    kustomization = yaml.safe_load((RUNTIMES / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    assert kustomization["resources"] == [f"{name}.yaml" for name in RUNTIME_NAMES]
    assert {p.name for p in RUNTIMES.glob("*.yaml")} == {
        "kustomization.yaml",
        *kustomization["resources"],
    }


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_builds_the_runtimes_render_prints():
    """What `kubectl apply -k runtimes/` applies from a checkout is what a pip install's
    `kubetrain render runtimes` prints (kustomize sorts them by name)."""
    built = subprocess.run(
        ["kubectl", "kustomize", str(RUNTIMES)], capture_output=True, text=True, timeout=60
    )
    assert built.returncode == 0, built.stderr
    documents = [d for d in yaml.safe_load_all(built.stdout) if d]
    assert len(documents) == len(RUNTIME_NAMES)
    assert by_name(documents) == by_name(runtime_manifests())


def test_render_runtimes_prints_every_runtime_valid_against_the_crd():
    documents = render("runtimes")
    assert [d["metadata"]["name"] for d in documents] == list(RUNTIME_NAMES)
    assert documents == runtime_manifests()
    schema = crd_schema(CLUSTER_RUNTIME_CRD)
    for document in documents:
        assert schema_errors(document, schema) == [], document["metadata"]["name"]


def test_render_rbac_prints_valid_rbac_for_the_namespace_and_accounts():
    documents = render("rbac", "--namespace", "team-a", "--service-account", "ci-runner")
    for document in documents:
        kubernetes_validate.validate(document, K8S_VERSION, strict=True)
    by_kind = {d["kind"]: d for d in documents}
    expected = subjects("kubetrain", *KFP_SERVICE_ACCOUNTS, "ci-runner", namespace="team-a")
    assert by_kind["RoleBinding"]["subjects"] == expected
    assert by_kind["ClusterRoleBinding"]["subjects"] == expected
    assert by_kind["Role"]["metadata"]["namespace"] == "team-a"
    only_ours = {d["kind"]: d for d in render("rbac", "--no-kfp-accounts")}
    assert only_ours["RoleBinding"]["subjects"] == subjects("kubetrain")


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--namespace", "Team_A"],
         "--namespace: 'Team_A' is not a namespace name; give the namespace the steps run in, "
         "e.g. kubeflow"),
        (["--service-account", "CI runner"],
         "--service-account: 'CI runner' is not a DNS-1123 subdomain; give a ServiceAccount's "
         "name, e.g. pipeline-runner"),
    ],
)  # fmt: skip
def test_render_rbac_refuses_bad_names_in_one_line(args, line):
    result = subprocess.run(
        [sys.executable, "-m", "kubetrain", "render", "rbac", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == f"kubetrain render: error: {line}\n"


def test_the_runtimes_readme_gives_both_ways_to_install_them():
    """From a checkout (`kubectl apply -k runtimes/`) and from a pip install (`kubetrain
    render runtimes`); the RBAC, which depends on the namespace, from `kubetrain render rbac`."""
    readme = (RUNTIMES / "README.md").read_text()
    assert "kubectl apply -k runtimes/" in readme
    assert "kubetrain render runtimes | kubectl apply -f -" in readme
    assert "kubetrain render rbac --namespace" in readme
    # kfp-kubernetes 2.17 has no set_service_account (kfp/kubernetes/__init__.py).
    assert "set_service_account" not in readme


def test_every_runtime_names_a_device_the_kubeflow_sdk_knows():
    """The Kubeflow SDK (kubeflow 0.5, trainer/backends/kubernetes/utils.py
    get_container_devices) takes the device from the node container's limits and raises
    "Unknown device type" on limits without cpu or an accelerator, failing list_runtimes() for
    the whole cluster: torch-ddp-cpu's limits held memory only. GPU counts are quoted, or the
    SDK reports "1.0" GPUs. (tests/test_kubeflow_sdk.py runs the SDK itself.)"""
    for name in RUNTIME_NAMES:
        limits = trainer_container(load_runtime(name))["resources"]["limits"]
        device = "nvidia.com/gpu" if name in GPU_RUNTIMES else "cpu"
        assert limits[device] == "1", name


def test_a_cpu_request_never_exceeds_the_runtime_cpu_limit():
    """Trainer v2.3 merges resourcesPerNode into the runtime's resources key by key (kubeflow/
    trainer v2.3.0 pkg/util/trainingruntime/trainingruntime.go MergeResourceRequirements): --cpu 4
    on torch-ddp-cpu (limits.cpu 1) must not make requests > limits, an invalid pod."""
    from kubetrain.jobspec import Resources
    from kubetrain.render.pod import resource_requirements

    rendered = resource_requirements(Resources(cpu="4"))
    runtime = node_container(load_runtime("torch-ddp-cpu"))["resources"]
    merged = {key: {**runtime.get(key, {}), **rendered.get(key, {})} for key in runtime}
    assert float(merged["requests"]["cpu"]) <= float(merged["limits"]["cpu"])


# --- Dockerfiles --------------------------------------------------------------------------


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (IMAGES / dockerfile).read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


@pytest.mark.parametrize(
    "dockerfile", ["trainer.Dockerfile", "components.Dockerfile", "deepspeed.Dockerfile"]
)
def test_dockerfile_pins_its_base_and_runs_as_a_numeric_non_root_user(dockerfile):
    steps = instructions(dockerfile)
    bases = [args.split()[0] for op, args in steps if op == "FROM"]
    assert bases
    for base in bases:
        name, _, tag = base.partition(":")
        assert tag and tag != "latest" and re.search(r"\d+\.\d+", tag), base
    users = [args for op, args in steps if op == "USER"]
    assert users, "no USER: the image would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    runs = " ".join(args for op, args in steps if op == "RUN")
    assert "| sh" not in runs and "| bash" not in runs


def test_trainer_image_lets_the_trainer_set_the_command():
    steps = instructions("trainer.Dockerfile")
    assert not [op for op, _ in steps if op in ("ENTRYPOINT", "CMD")]
    assert [args for op, args in steps if op == "WORKDIR"][-1] == "/workspace"
    assert "pytorch/pytorch" in next(args for op, args in steps if op == "FROM")


def test_components_image_installs_kubetrain_and_kfp():
    steps = instructions("components.Dockerfile")
    assert next(args for op, args in steps if op == "FROM").startswith("python:3.11")
    runs = " ".join(args for op, args in steps if op == "RUN")
    assert 'pip install "/tmp/kubetrain[train]" kfp' in runs
    readme = (IMAGES / "README.md").read_text()
    assert "KUBETRAIN_COMPONENT_IMAGE" in readme and "KUBETRAIN_TRAINER_IMAGE" in readme
