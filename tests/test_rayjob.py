"""The rayjob backend (issue 31, item 1): a KubeRay ``ray.io/v1`` RayJob rendered from the job
spec, validated against KubeRay v1.7.0's CRD (tests/support/crds, unknown fields rejected) and
its controller's rules (``utils/validation.go``), and followed on the emulated cluster through
its status (``jobDeploymentStatus``, ``jobStatus``: ``rayjob_controller.go``) and its
submitter pod, whose log is the driver's (``common/job.go``). Here KubeRay's side (status, the
submitter pod and its log) is set by hand, as KubeRay v1.7.0 writes it."""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml
from k8s_schemas import schema_errors
from kmock import resource

from kubetrain.backends import get_backend
from kubetrain.backends.base import COMPLETE, CREATED, FAILED, RUNNING
from kubetrain.backends.kubernetes.kinds import RAYJOB, rayjob_state
from kubetrain.backends.kubernetes.launch import KubeRayNotInstalled
from kubetrain.cli import main as kubetrain_main
from kubetrain.errors import InvalidInput, JobNotFound
from kubetrain.jobspec import Initializer, Resources, Toleration, TrainJobSpec, Volume
from kubetrain.render import render_job
from kubetrain.render.manifests import role_manifests
from kubetrain.render.rayjob import RAY_VERSION, render_rayjob
from tests.support import objects

REPO = Path(__file__).resolve().parent.parent
CRDS = Path(__file__).resolve().parent / "support" / "crds"
RAYJOBS = resource("ray.io", "v1", "rayjobs")
OWNER = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "run-1", "uid": "u-1"}


@functools.cache
def _crd() -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load((CRDS / "ray.io_rayjobs.yaml").read_text(), Loader=loader)


def rayjob_crd() -> dict[str, Any]:
    return copy.deepcopy(_crd())


def crd_schema() -> dict[str, Any]:
    (version,) = [v for v in _crd()["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


def spec(name: str = "demo", **fields: Any) -> TrainJobSpec:
    fields.setdefault("command", ("python", "-m", "kubetrain.train.ray"))
    fields.setdefault("args", ("--num-workers", "2"))
    return TrainJobSpec(name=name, launcher="ray", **fields)


RENDERED = {
    "one-node": {},
    "gpu": {"num_nodes": 2, "procs_per_node": 8,
            "resources_per_node": Resources(cpu="16", memory="64Gi", gpu=8),
            "node_selector": {"nvidia.com/gpu.product": "H100"},
            "tolerations": (Toleration(key="nvidia.com/gpu", operator="Exists",
                                       effect="NoSchedule"),)},
    "volumes-and-account": {"volumes": (Volume("shared", "kubetrain-shared", "/mnt/shared"),),
                            "service_account": "kubetrain", "storage_secret": "s3-creds",
                            "labels": {"team": "vision"}, "pod_labels": {"a": "b"},
                            "env": {"NCCL_DEBUG": "INFO"}},
    "suspend-deadline-restarts": {"num_nodes": 3, "suspend": True, "max_restarts": 2,
                                  "active_deadline_seconds": 600, "working_dir": "/mnt/work"},
}  # fmt: skip


@pytest.mark.parametrize("fields", RENDERED.values(), ids=RENDERED.keys())
def test_every_rendered_rayjob_is_valid_against_the_kuberay_v1_7_crd(fields):
    job = render_rayjob(spec(**fields), owner=OWNER)
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    assert schema_errors(job, crd_schema()) == []


def test_the_rayjob_is_shaped_as_kuberay_needs_it():
    job = render_rayjob(
        spec(num_nodes=3, procs_per_node=2, resources_per_node=Resources(cpu="4", gpu=2),
             active_deadline_seconds=900, suspend=True, max_restarts=1)
    )["spec"]  # fmt: skip
    assert job["entrypoint"] == "python -m kubetrain.train.ray --num-workers 2"
    assert (job["submissionMode"], job["shutdownAfterJobFinishes"]) == ("K8sJobMode", True)
    assert job["ttlSecondsAfterFinished"] == 60
    assert (job["activeDeadlineSeconds"], job["suspend"], job["backoffLimit"]) == (900, True, 1)
    cluster = job["rayClusterSpec"]
    assert cluster["rayVersion"] == RAY_VERSION
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"] == {"num-cpus": "0", "dashboard-host": "0.0.0.0"}
    (group,) = cluster["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (3, 3, 3)
    assert group["rayStartParams"] == {"num-cpus": "2", "num-gpus": "2"}
    assert "resources" not in group  # KubeRay refuses it next to num-cpus (validation.go)
    (worker,) = group["template"]["spec"]["containers"]
    assert worker["resources"]["limits"] == {"cpu": "4", "nvidia.com/gpu": "2"}
    assert "command" not in worker  # KubeRay writes `ray start` from rayStartParams
    (submitter,) = job["submitterPodTemplate"]["spec"]["containers"]
    assert submitter["name"] == "ray-job-submitter" and "command" not in submitter
    for template in (head["template"], group["template"], job["submitterPodTemplate"]):
        assert template["metadata"]["labels"]["kubetrain.io/job-name"] == "demo"
        assert template["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
        assert template["spec"]["securityContext"]["runAsNonRoot"] is True
    # One run: no suspend, deadline or retries unless asked.
    plain = render_rayjob(spec())["spec"]
    assert not {"suspend", "activeDeadlineSeconds", "backoffLimit"} & set(plain)


def test_env_storage_and_volumes_reach_head_and_workers_not_the_submitter():
    job = render_rayjob(
        spec(env={"A": "1"}, storage_secret="s3", volumes=(Volume("shared", "pvc", "/mnt/s"),))
    )["spec"]
    cluster = job["rayClusterSpec"]
    for template in (cluster["headGroupSpec"]["template"],
                     cluster["workerGroupSpecs"][0]["template"]):  # fmt: skip
        (container,) = template["spec"]["containers"]
        assert {"name": "A", "value": "1"} in container["env"]
        assert container["envFrom"] == [{"secretRef": {"name": "s3"}}]
        assert container["volumeMounts"] == [{"name": "shared", "mountPath": "/mnt/s"}]
        assert template["spec"]["volumes"][0]["persistentVolumeClaim"] == {"claimName": "pvc"}
    submitter = job["submitterPodTemplate"]["spec"]
    assert "volumes" not in submitter and "env" not in submitter["containers"][0]


def test_a_shipped_script_is_mounted_and_the_entrypoint_runs_it_quoted(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    configmap, job = render_job(
        spec(command=("python", "train.py"), args=("--tag", "a b;rm -rf /"), script=str(script),
             working_dir="/mnt/work dir"),
        "rayjob", "default", "",
    )  # fmt: skip
    assert configmap["kind"] == "ConfigMap" and job["kind"] == "RayJob"
    assert schema_errors(job, crd_schema()) == []
    inner = (
        "mkdir -p -- '/mnt/work dir' && cd -- '/mnt/work dir' && python /workspace/train.py "
        "--tag 'a b;rm -rf /'"
    )
    assert job["spec"]["entrypoint"] == shlex.join(["sh", "-c", inner])
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["volumes"] == [{"name": "kubetrain-script", "configMap": {"name": "demo-script"}}]


def test_ray_version_is_the_installed_and_pinned_ray():
    assert importlib.metadata.version("ray") == RAY_VERSION
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert f"ray[default,train]=={RAY_VERSION}" in extras["optional-dependencies"]["ray"]


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"name": "a" * 48}, r"name: 'a{48}' is 48 characters: KubeRay fails .* at most 47"),
        ({"env": {"RAY_ADDRESS": "x:1"}}, r"env: RAY_ADDRESS is set by KubeRay itself"),
        ({"env": {"RAY_REDIS_ADDRESS": "r:6379"}}, r"env: RAY_REDIS_ADDRESS makes KubeRay fail"),
        ({"active_deadline_seconds": 2**31},
         r"active_deadline_seconds: 2147483648 is more than a RayJob takes \(2147483647"),
        ({"dataset_initializer": Initializer("hf://org/set")},
         r"dataset_initializer: needs Kubeflow Trainer's initializers, which a RayJob"),
        ({"launcher": "mpi"}, r"launcher: 'mpi' is not run by backend rayjob"),
    ],
)  # fmt: skip
def test_what_a_rayjob_cannot_do_is_refused_in_one_line(fields, match):
    fields = dict(fields)
    name = fields.pop("name", "demo")
    launcher = fields.pop("launcher", "ray")
    bad = TrainJobSpec(name=name, command=("python", "x.py"), launcher=launcher, **fields)
    with pytest.raises(InvalidInput, match=match) as refused:
        render_rayjob(bad)
    assert "\n" not in str(refused.value)
    assert len(render_rayjob(spec("a" * 47))["metadata"]["name"]) == 47


def test_render_rayjob_on_the_cli_prints_a_valid_job(capsys):
    argv = ["render", "rayjob", "--name", "cli-ray", "--nodes", "2", "--procs-per-node", "2"]
    assert kubetrain_main(argv) == 0
    (job,) = list(yaml.safe_load_all(capsys.readouterr().out))
    assert job["kind"] == "RayJob" and job["metadata"]["name"] == "cli-ray"
    assert schema_errors(job, crd_schema()) == []
    assert job["spec"]["entrypoint"].startswith("python -m kubetrain.train.ray ")
    assert job["spec"]["entrypoint"].endswith("--num-workers 4")


@pytest.mark.bad_input
def test_render_rayjob_refuses_another_backend(capsys):
    assert kubetrain_main(["render", "rayjob", "--backend", "job"]) == 2
    assert "--backend: 'job' is not a RayJob" in capsys.readouterr().err


def test_rbac_grants_the_rayjob_backend_its_verbs():
    role, _ = role_manifests()
    rules = [r for r in role["rules"] if r["apiGroups"] == ["ray.io"]]
    assert rules == [{"apiGroups": ["ray.io"], "resources": ["rayjobs"],
                      "verbs": ["create", "get", "list", "watch", "patch", "delete"]}]  # fmt: skip


# ------------------------------------------------------------------------- status mapping
def _job(deployment: str = "", job_status: str = "", reason: str = "", message: str = ""):
    status = {"jobDeploymentStatus": deployment, "jobStatus": job_status, "reason": reason,
              "message": message}  # fmt: skip
    return {"spec": {}, "status": {k: v for k, v in status.items() if v}}


DRIVER_FAILED = (
    "Job entrypoint command failed with exit code 3, last available logs (truncated to 20,000 "
    "chars):\nTraceback (most recent call last):\nValueError: boom"
)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (_job(), (CREATED, "", "")),
        (_job("Initializing", "PENDING"), (CREATED, "", "")),
        (_job("Running", "PENDING"), (CREATED, "", "")),
        (_job("Running", "RUNNING"), (RUNNING, "", "")),
        (_job("Retrying"), (CREATED, "", "")),
        (_job("Suspended"), (CREATED, "Suspended", "the RayJob is suspended")),
        (_job("Complete", "SUCCEEDED", message="Job finished successfully."),
         (COMPLETE, "SUCCEEDED", "Job finished successfully.")),
        (_job("Complete", "STOPPED"),
         (FAILED, "STOPPED", "the Ray job was stopped (ray job stop) before it finished")),
        (_job("Failed", "FAILED", "AppFailed", DRIVER_FAILED),
         (FAILED, "AppFailed", "Job entrypoint command failed with exit code 3, last available "
          "logs (truncated to 20,000 chars):")),
        (_job("Failed", "RUNNING", "DeadlineExceeded", "The RayJob has passed the "
              "activeDeadlineSeconds."),
         (FAILED, "DeadlineExceeded", "The RayJob has passed the activeDeadlineSeconds.")),
        (_job("ValidationFailed", reason="ValidationFailed", message="The RayJob spec is "
              "invalid: x"), (FAILED, "ValidationFailed", "The RayJob spec is invalid: x")),
    ],
)  # fmt: skip
def test_the_rayjob_state_follows_kuberays_deployment_and_job_status(status, expected):
    assert rayjob_state(status) == expected
    assert RAYJOB.state(status) == expected


# ------------------------------------------------------------------- on the emulated cluster
@pytest.fixture
def ray_cluster(k8s):
    k8s.emulator.install_crd(rayjob_crd())
    return k8s


def submitter_pod(emulator, job: dict[str, Any], name: str = "") -> str:
    """``rayjob_submitter_pod``, created and running."""
    return ray_pod(emulator, rayjob_submitter_pod(job, name))


def rayjob_submitter_pod(job: dict[str, Any], name: str = "") -> dict[str, Any]:
    """The submitter Job's pod as KubeRay v1.7.0 (``getSubmitterTemplate`` labels) and the Job
    controller make it from the RayJob's submitterPodTemplate."""
    template = job["spec"]["submitterPodTemplate"]
    labels = {**template["metadata"]["labels"], "ray.io/originated-from-cr-name":
              job["metadata"]["name"], "ray.io/originated-from-crd": "RayJob",
              "batch.kubernetes.io/job-name": job["metadata"]["name"]}  # fmt: skip
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name or f"{job['metadata']['name']}-x7k2p",
                        "namespace": "default", "labels": labels},
           "spec": copy.deepcopy(template["spec"])}  # fmt: skip
    return pod


def ray_pod(emulator, pod: dict[str, Any]) -> str:
    name = emulator.create_pod(pod)["metadata"]["name"]
    image = pod["spec"]["containers"][0]["image"]
    container = pod["spec"]["containers"][0]["name"]
    status = objects.container_status(image, objects.running(), name=container)
    emulator.set_pod_status(name, objects.pod_status("Running", [status]))
    return name


def end_pod(emulator, name: str, image: str, code: int = 0) -> None:
    status = objects.container_status(image, objects.terminated(code), name="ray-job-submitter")
    emulator.set_pod_status(name, objects.pod_status("Succeeded" if not code else "Failed",
                                                     [status]))  # fmt: skip


def test_launch_creates_the_rayjob_and_adopts_it_on_retry(ray_cluster):
    backend = ray_cluster.backend("rayjob")
    assert backend.launch(spec("ray-a")) == "ray-a"
    created = ray_cluster.emulator.get(RAYJOBS, "ray-a")
    assert created["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 1
    notes: list[str] = []
    backend.warn = notes.append
    assert backend.launch(spec("ray-a")) == "ray-a"
    assert notes == [
        "kubetrain: RayJob ray-a already exists with this spec (a retried launch); using it "
        "(state Created)"
    ]
    with pytest.raises(InvalidInput, match=r"name: a RayJob named 'ray-a' already exists .*"
                       r"num_nodes: 1 -> 2"):  # fmt: skip
        backend.launch(spec("ray-a", num_nodes=2))


@pytest.mark.bad_input
def test_a_cluster_without_kuberay_is_named_before_anything_is_created(k8s):
    backend = k8s.backend("rayjob")
    with pytest.raises(KubeRayNotInstalled, match=r"KubeRay is not installed .*rayjobs\.ray\.io"):
        backend.launch(spec("no-ray"))
    with pytest.raises(KubeRayNotInstalled):
        backend.status("no-ray")
    assert not k8s.emulator.names("configmaps")


def test_wait_streams_the_drivers_log_and_ends_complete(ray_cluster):
    emulator, backend = ray_cluster.emulator, ray_cluster.backend("rayjob")
    backend.launch(spec("ray-ok", num_nodes=2))
    job = emulator.get(RAYJOBS, "ray-ok")
    # A RayCluster pod carries our label too, but is not the driver's (no originated-from).
    head = copy.deepcopy(job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"])
    head["metadata"]["labels"].update({"ray.io/node-type": "head", "ray.io/is-ray-node": "yes"})
    ray_pod(emulator, {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "ray-ok-abcde-head-x", "namespace": "default", **head["metadata"]},
        "spec": head["spec"]})  # fmt: skip
    emulator.patch_status(RAYJOBS, "ray-ok", {"jobDeploymentStatus": "Running",
                                                "jobStatus": "RUNNING"})  # fmt: skip
    pod = submitter_pod(emulator, job)
    emulator.append_log(pod, ["epoch 1 loss 0.5", "done"], container="ray-job-submitter")
    assert backend.status("ray-ok").state == RUNNING
    end_pod(emulator, pod, job["spec"]["submitterPodTemplate"]["spec"]["containers"][0]["image"])
    emulator.patch_status(RAYJOBS, "ray-ok", {"jobDeploymentStatus": "Complete",
                                                "jobStatus": "SUCCEEDED"})  # fmt: skip
    lines: list[str] = []
    status = backend.wait("ray-ok", 30, lines.append)
    assert status.state == COMPLETE and lines == ["epoch 1 loss 0.5", "done"]
    assert [node.log for node in status.nodes] == [pod]
    assert list(backend.logs("ray-ok")) == ["epoch 1 loss 0.5", "done"]
    (row,) = backend.list_jobs()
    assert (row.name, row.state, row.nodes) == ("ray-ok", COMPLETE, 2)


def test_a_failed_driver_fails_wait_with_its_exit_code(ray_cluster):
    emulator, backend = ray_cluster.emulator, ray_cluster.backend("rayjob")
    backend.launch(spec("ray-bad"))
    job = emulator.get(RAYJOBS, "ray-bad")
    pod = submitter_pod(emulator, job)
    emulator.append_log(pod, ["ValueError: boom"], container="ray-job-submitter")
    end_pod(emulator, pod, job["spec"]["submitterPodTemplate"]["spec"]["containers"][0]["image"])
    emulator.patch_status(RAYJOBS, "ray-bad", {"jobDeploymentStatus": "Failed",
                          "jobStatus": "FAILED", "reason": "AppFailed",
                          "message": DRIVER_FAILED})  # fmt: skip
    status = backend.wait("ray-bad", 30, None)
    assert (status.state, status.reason, status.failed_rank) == (FAILED, "AppFailed", 0)
    assert status.failed_node.exit_code == 3
    again = backend.status("ray-bad")
    assert again.state == FAILED and again.failed_node.exit_code == 3


def test_cancel_suspends_the_rayjob_and_delete_removes_it(ray_cluster):
    emulator = ray_cluster.emulator
    backend = ray_cluster.backend("rayjob", on_cancel="suspend")
    backend.launch(spec("ray-stop"))
    assert backend.release("ray-stop").startswith("suspended RayJob ray-stop")
    assert emulator.get(RAYJOBS, "ray-stop")["spec"]["suspend"] is True
    assert backend.status("ray-stop").reason == "Suspended"
    backend.delete("ray-stop")
    assert emulator.get(RAYJOBS, "ray-stop") is None
    with pytest.raises(JobNotFound):
        backend.delete("ray-stop")


def test_the_backend_is_the_cluster_rayjob_kind():
    assert get_backend("rayjob").kind is RAYJOB


# ---------------------------------------------------- the RayCluster's own pods (wait fails early)
CLUSTER = "ray-pods-k8x2q"


def cluster_pod(emulator, job: dict[str, Any], node_type: str, status: dict[str, Any],
                cluster: str = CLUSTER) -> str:  # fmt: skip
    """A RayCluster pod as KubeRay v1.7.0 makes it from the RayJob's head or worker template
    (``common/pod.go`` ``labelPod``: the template's labels, ours among them, plus KubeRay's),
    with ``status``."""
    cluster_spec = job["spec"]["rayClusterSpec"]
    group = cluster_spec["headGroupSpec"] if node_type == "head" else \
        cluster_spec["workerGroupSpecs"][0]  # fmt: skip
    template = copy.deepcopy(group["template"])
    labels = {**template["metadata"]["labels"], "ray.io/is-ray-node": "yes",
              "ray.io/cluster": cluster, "ray.io/node-type": node_type,
              "ray.io/group": "headgroup" if node_type == "head" else "workers"}  # fmt: skip
    name = f"{cluster}-{node_type}-{len(emulator.names('pods'))}"
    emulator.create_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "spec": template["spec"],
            "metadata": {"name": name, "namespace": "default", "labels": labels},
        }
    )
    emulator.set_pod_status(name, status)
    return name


def initializing(emulator, name: str, job_status: str = "PENDING") -> None:
    """The RayJob as KubeRay leaves it while its cluster is not Ready (``initRayJobStatusIfNeed``
    names the cluster)."""
    emulator.patch_status(RAYJOBS, name, {"jobDeploymentStatus": "Initializing",
                          "jobStatus": job_status, "rayClusterName": CLUSTER})  # fmt: skip


def ray_container(image: str, state: dict[str, Any], node_type: str = "head", **fields: Any):
    return objects.container_status(image, state, name=f"ray-{node_type}", **fields)


CRASHING = {"restart_count": 2, "last_state": objects.terminated(127)}
CLUSTER_PROBLEMS = {
    "head-image-pull": ("head", lambda image: objects.pod_status("Pending", [ray_container(
        image, objects.waiting("ErrImagePull", f'pull access denied for {image}'))]),
        "ErrImagePull", ["the Ray head pod", "cannot pull image", "--image", RAY_VERSION]),
    "worker-unschedulable": ("worker", lambda image: objects.unschedulable(
        "0/3 nodes are available: 3 Insufficient cpu."),
        "Unschedulable", ["the Ray worker pod", "cannot be scheduled", "Insufficient cpu",
                          "lower --cpu, --memory, --gpu or --nodes"]),
    "head-crash-loop": ("head", lambda image: objects.pod_status("Running", [ray_container(
        image, objects.waiting("CrashLoopBackOff", "back-off 20s"), **CRASHING)]),
        "CrashLoopBackOff", ["the Ray head pod", "keeps crashing", "last exit code 127",
                             "ray start", "kubectl logs --previous"]),
    "worker-config-error": ("worker", lambda image: objects.pod_status("Pending", [ray_container(
        image, objects.waiting("CreateContainerConfigError", 'secret "s3-creds" not found'),
        "worker")]),
        "CreateContainerConfigError", ["the Ray worker pod", "cannot be created",
                                       'secret "s3-creds" not found', "create what the pod"]),
    "worker-oom": ("worker", lambda image: objects.pod_status("Running", [ray_container(
        image, objects.waiting("CrashLoopBackOff", "back-off 10s"), "worker", restart_count=1,
        last_state=objects.terminated(137, "OOMKilled"))]),
        "OOMKilled", ["the Ray worker pod", "ran out of memory", "--memory"]),
}  # fmt: skip


@pytest.mark.parametrize("case", CLUSTER_PROBLEMS.values(), ids=CLUSTER_PROBLEMS.keys())
def test_a_ray_node_that_cannot_start_fails_wait_early_naming_it(ray_cluster, case):
    """KubeRay submits (makes the submitter, our node 0) only once the RayCluster is Ready, so
    a head or worker that cannot start left wait with no pod of ours to diagnose: it ran to
    its timeout with the RayJob Initializing."""
    node_type, status_of, reason, expected = case
    emulator = ray_cluster.emulator
    backend = ray_cluster.backend("rayjob", image_pull_grace=0.3, unschedulable_grace=0.3)
    backend.launch(spec("ray-pods", num_nodes=2, image="ghcr.io/example/ray:2.60.0"))
    job = emulator.get(RAYJOBS, "ray-pods")
    initializing(emulator, "ray-pods")
    cluster_pod(
        emulator,
        job,
        "head" if node_type == "worker" else "worker",
        objects.pod_status("Running", [ray_container("img", objects.running())]),
    )
    image = "ghcr.io/example/ray:2.60.0"
    crashed = reason in ("CrashLoopBackOff", "OOMKilled")
    if crashed:  # its first run printed why it ended
        started = objects.pod_status(
            "Running", [ray_container(image, objects.running(), node_type)]
        )
        pod = cluster_pod(emulator, job, node_type, started)
        emulator.append_log(pod, ["ray: command not found"], container=f"ray-{node_type}")
        emulator.set_pod_status(pod, status_of(image))
    else:
        pod = cluster_pod(emulator, job, node_type, status_of(image))
    status = backend.wait("ray-pods", 8, None)
    assert (status.state, status.reason, status.failed_rank) == (FAILED, reason, None)
    for text in [pod, *expected, "deleted RayJob ray-pods"]:
        assert text in status.message
    assert "\n" not in status.message
    assert emulator.get(RAYJOBS, "ray-pods") is None, "released: its cluster holds nodes"
    if crashed:  # the Ray container's log, not the submitter's
        assert status.log_tail == ["ray: command not found"]


def test_ray_node_problems_are_not_the_jobs_once_it_runs_or_of_an_earlier_cluster(ray_cluster):
    """A worker crash-looping while the Ray job runs is Ray's to survive (the RayJob's status
    ends it), and a pod of a retried job's earlier cluster is no problem of the current one."""
    emulator = ray_cluster.emulator
    backend = ray_cluster.backend("rayjob", image_pull_grace=0.1)
    backend.launch(spec("ray-pods"))
    job = emulator.get(RAYJOBS, "ray-pods")
    initializing(emulator, "ray-pods", job_status="RUNNING")
    cluster_pod(
        emulator,
        job,
        "worker",
        objects.pod_status(
            "Running",
            [
                ray_container(
                    "img", objects.waiting("CrashLoopBackOff", "back-off 10s"), "worker", **CRASHING
                )
            ],
        ),
    )
    cluster_pod(emulator, job, "head", objects.pod_status("Pending", [ray_container(
        "img", objects.waiting("ErrImagePull"))]), cluster="ray-pods-old01")  # fmt: skip
    submitter = submitter_pod(emulator, job)
    notes: list[str] = []
    backend.warn = notes.append
    status = {}
    waiter = threading.Thread(target=lambda: status.update(s=backend.wait("ray-pods", 8, None)))
    waiter.start()
    time.sleep(1.0)  # longer than the image-pull grace: the old cluster's pod is not looked at
    end_pod(emulator, submitter, "img")
    emulator.patch_status(RAYJOBS, "ray-pods", {"jobDeploymentStatus": "Complete",
                                                  "jobStatus": "SUCCEEDED"})  # fmt: skip
    waiter.join(10)
    assert status["s"].state == COMPLETE
    (note,) = [n for n in notes if "Ray worker pod" in n]
    assert "keeps crashing" in note and "the Ray job runs on" in note


@pytest.mark.parametrize(
    ("verb", "says"),
    [
        ("list", "--backend trainer|pytorchjob|job|rayjob"),
        ("logs", "--backend rayjob: one node, the RayJob's submitter pod"),
        ("delete", "a RayJob: KubeRay's RayCluster, its head and workers, and the submitter"),
    ],
)
def test_the_job_verbs_help_names_the_rayjob_backend(capsys, verb, says):
    with pytest.raises(SystemExit):
        kubetrain_main([verb, "--help"])
    assert says in " ".join(capsys.readouterr().out.split())


#: The tail of KubeRay v1.7.0's submitter line (``common/job.go`` ``BuildJobSubmitCommand``
#: ~205: ``"--", entrypoint, ";"``, the words joined with spaces and run by ``/bin/bash -ce``,
#: ``rayjob_controller.go`` ``configureSubmitterContainer``), with ``ray`` doing what Ray
#: 2.60's ``ray job submit`` does with the words after ``--``: ``shlex.join`` them into the
#: entrypoint its job supervisor runs with a shell (``dashboard/modules/job/cli.py`` submit).
SUBMITTER_LINE = (
    'ray() {{ while [ "$1" != "--" ]; do shift; done; shift; '
    '{python} -c "import shlex, sys; print(shlex.join(sys.argv[1:]))" "$@"; }}\n'
    "ray job submit --address http://head:8265 --no-wait --submission-id job-x -- {entrypoint} ;"
)


def test_the_entrypoint_survives_kuberays_submitter_shell(tmp_path):
    """The entrypoint passes two shells: the submitter's bash, where KubeRay pastes it, then
    Ray's; the job's command must run whole, in its working folder."""
    work = tmp_path / "work dir"
    shown = "import os; print('ran in', os.getcwd())"
    job = render_rayjob(spec(command=(sys.executable, "-c", shown), working_dir=str(work)))
    line = SUBMITTER_LINE.format(python=shlex.quote(sys.executable),
                                 entrypoint=job["spec"]["entrypoint"])  # fmt: skip
    submitted = subprocess.run(["bash", "-ce", "--", line], capture_output=True, text=True,
                               cwd=tmp_path, check=False)  # fmt: skip
    ray_runs = submitted.stdout.strip()
    ran = subprocess.run(["sh", "-c", ray_runs], capture_output=True, text=True, cwd=tmp_path)
    assert ran.stdout.strip() == f"ran in {work}", (ray_runs, submitted.stderr)
