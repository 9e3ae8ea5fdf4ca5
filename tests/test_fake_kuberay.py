"""The fake KubeRay operator (tests/support/fake_kuberay.py, KubeRay v1.7.0): its rules at unit
level (names, ``ray start`` and ``ray job submit`` commands, validation, status transitions),
and through the emulated API server with the real ``kubernetes`` client (validation, suspend,
deletion, a Ray container that exits). Its one real Ray Train run (K8sJobMode end to end,
checked against Ray's own JobSubmissionClient and ``ray.train.Result``, the RayCluster deleted
after ttlSecondsAfterFinished) is tests/test_rayjob_e2e.py's, through `kubetrain`.

``kuberay_cluster`` is the fixture other tests use (as ``operator_cluster`` in
test_pytorchjob.py): the emulator with the fake operator, KUBECONFIG pointing at it; it fails a
test that leaves a reconcile error or a Ray process behind."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import psutil
import pytest
import yaml

from tests.support.fake_kuberay import (
    FINALIZER,
    FakeKubeRay,
    check_active_deadline,
    count_outcome,
    generate_ray_cluster_name,
    generate_ray_job_id,
    head_service,
    pod_name_prefix,
    ray_pod,
    running_outcome,
    shutdown_at,
    submit_command,
    submitter_job,
)

GROUP, VERSION = "ray.io", "v1"
#: A RayJob as KubeRay's ray-operator/config/samples/ray-job.sample.yaml writes one (v1.7.0).
SAMPLE = """
apiVersion: ray.io/v1
kind: RayJob
metadata:
  name: rayjob-sample
spec:
  entrypoint: python /home/ray/samples/sample_code.py
  shutdownAfterJobFinishes: true
  ttlSecondsAfterFinished: 4
  rayClusterSpec:
    rayVersion: '2.60.0'
    headGroupSpec:
      rayStartParams:
        num-cpus: "0"
      template:
        spec:
          containers:
            - name: ray-head
              image: rayproject/ray:2.60.0
              ports:
                - containerPort: 6379
                  name: gcs-server
                - containerPort: 8265
                  name: dashboard
                - containerPort: 10001
                  name: client
              resources:
                limits:
                  cpu: "1"
                  memory: "2Gi"
    workerGroupSpecs:
      - replicas: 2
        minReplicas: 2
        maxReplicas: 2
        groupName: small-group
        rayStartParams: {}
        template:
          spec:
            containers:
              - name: ray-worker
                image: rayproject/ray:2.60.0
                resources:
                  limits:
                    cpu: "1"
                    memory: "1Gi"
"""


def sample(name: str = "rayjob-sample", **spec: Any) -> dict[str, Any]:
    body = yaml.safe_load(SAMPLE)
    body["metadata"]["name"] = name
    body["spec"].update(spec)
    return body


def cluster_of(rayjob: dict[str, Any], name: str = "rayjob-sample-abcde") -> dict[str, Any]:
    """The RayCluster object KubeRay makes for ``rayjob`` (as the API server returns it)."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": "u-cluster",
            "labels": {"ray.io/originated-from-crd": "RayJob"},
        },
        "spec": rayjob["spec"]["rayClusterSpec"],
    }


def ray_processes(temp_dirs: list[str]) -> list[int]:
    """PIDs of live processes naming one of ``temp_dirs`` (every Ray process of a node does:
    raylet, GCS, dashboard, agents, workers)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            line = " ".join(process.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if any(folder in line for folder in temp_dirs):
            found.append(process.pid)
    return found


@pytest.fixture
def kuberay_cluster(k8s, tmp_path, monkeypatch) -> Iterator[Any]:
    """The emulated cluster with the fake KubeRay operator (``k8s.operator``), reached through
    KUBECONFIG; no reconcile error and no Ray process may be left at the end."""
    monkeypatch.setenv("KUBECONFIG", str(k8s.emulator.write_kubeconfig(tmp_path / "kubeconfig")))
    with FakeKubeRay(k8s.emulator, tmp_path / "kuberay") as operator:
        k8s.operator = operator
        yield k8s
    assert operator.errors == []
    assert ray_processes(operator.temp_dirs) == []


def custom(cluster: Any) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(cluster.api_client)


def get(cluster: Any, plural: str, name: str) -> dict[str, Any] | None:
    try:
        return custom(cluster).get_namespaced_custom_object(GROUP, VERSION, "default", plural, name)
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return None
        raise


def wait_for(what: Any, timeout: float, step: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := what():
            return value
        time.sleep(step)
    raise TimeoutError(f"not within {timeout:g} s")


def status_of(cluster: Any, name: str) -> dict[str, Any]:
    return (get(cluster, "rayjobs", name) or {}).get("status") or {}


# --------------------------------------------------------------------------------- unit level
def test_generated_names_follow_kuberays_utils():
    alphabet = "[bcdfghjklmnpqrstvwxz2456789]{5}"
    assert re.fullmatch(f"demo-{alphabet}", generate_ray_cluster_name("demo"))
    assert re.fullmatch(f"demo-{alphabet}", generate_ray_job_id("demo"))
    assert pod_name_prefix("demo-abcde", "head") == "demo-abcde-head-"
    assert pod_name_prefix("x" * 60, "worker") == "x" * 50 + "-worker-"


def test_ray_pods_run_ray_start_built_from_ray_start_params():
    """pod.go: the generated command, sorted flags, num-cpus/memory from the limits (rounded
    up), the workers' address the head Service's; the labels and env KubeRay sets."""
    body = sample()
    worker = body["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    worker["template"]["spec"]["containers"][0]["resources"]["limits"].update(
        {"cpu": "500m", "nvidia.com/gpu": 1}
    )
    cluster = cluster_of(body)
    head, _ = ray_pod(cluster, "head", cluster["spec"]["headGroupSpec"])
    assert head["spec"]["containers"][0]["command"] == ["/bin/bash", "-c", "--"]
    assert head["spec"]["containers"][0]["args"] == [
        "ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536}; ray start --head  --block "
        " --dashboard-agent-listen-port=52365  --dashboard-host=0.0.0.0 "
        " --memory=2147483648  --metrics-export-port=8080  --num-cpus=0 "
    ]
    pod, params = ray_pod(cluster, "worker", worker, 1)
    (container,) = pod["spec"]["containers"]
    fqdn = "rayjob-sample-abcde-head-svc.default.svc.cluster.local"
    assert container["args"][0].endswith(
        f"ray start  --address={fqdn}:6379  --block  --dashboard-agent-listen-port=52365 "
        " --memory=1073741824  --metrics-export-port=8080  --num-cpus=1  --num-gpus=1 "
    )
    assert params["num-cpus"] == "1"
    assert pod["metadata"]["generateName"] == "rayjob-sample-abcde-small-group-worker-"
    assert pod["metadata"]["labels"] == {
        "ray.io/is-ray-node": "yes",
        "ray.io/cluster": "rayjob-sample-abcde",
        "ray.io/node-type": "worker",
        "ray.io/group": "small-group",
        "ray.io/identifier": "rayjob-sample-abcde-worker",
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
        "ray.io/worker-group-replica-index": "1",
    }
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RAY_ADDRESS"] == f"{fqdn}:6379" and env["FQ_RAY_IP"] == fqdn
    assert {e["name"]: e.get("value") for e in head["spec"]["containers"][0]["env"]}[
        "RAY_ADDRESS"
    ] == "127.0.0.1:6379"
    assert pod["spec"]["initContainers"][0]["name"] == "wait-gcs-ready"
    assert container["readinessProbe"]["httpGet"] == {"path": "/api/healthz", "port": 52365}
    service = head_service(cluster)
    assert service["metadata"]["name"] == "rayjob-sample-abcde-head-svc"
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [
        ("client", 10001),
        ("dashboard", 8265),
        ("gcs-server", 6379),
        ("metrics", 8080),
    ]


def test_submit_command_is_kuberays():
    """common/job_test.go TestBuildJobSubmitCommandWithK8sJobMode (v1.7.0), ported."""
    rayjob = {
        "spec": {
            "runtimeEnvYAML": "test: test",
            "metadata": {"testKey": "testValue"},
            "rayClusterSpec": {"rayVersion": "2.6.0"},
            "entrypoint": "echo no quote 'single quote' \"double quote\"",
            "entrypointNumCpus": 1,
            "entrypointNumGpus": 0.5,
            "entrypointResources": '{"Custom_1": 1, "Custom_2": 5.5}',
        },
        "status": {"dashboardURL": "http://127.0.0.1:8265", "jobId": "testJobId"},
    }
    address = "http://127.0.0.1:8265"
    health = (
        "python -c \"import urllib.request; r=urllib.request.urlopen('"
        f"{address}/api/gcs_healthz', timeout=10); exit(0 if b'success' in r.read() else 1)\""
    )
    assert submit_command(rayjob) == [
        "until", health, ">/dev/null", "2>&1", ";",
        "do", "echo", f'"Waiting for Ray Dashboard GCS to become healthy at {address} ..."',
        ";", "sleep", "2", ";", "done", ";",
        "if", "!", "ray", "job", "status", "--address", address, "testJobId", ">/dev/null",
        "2>&1", ";", "then",
        "ray", "job", "submit", "--address", address, "--no-wait",
        "--runtime-env-json", '"{\\"test\\":\\"test\\"}"',
        "--metadata-json", '"{\\"testKey\\":\\"testValue\\"}"',
        "--submission-id", "testJobId",
        "--entrypoint-num-cpus", "1.000000",
        "--entrypoint-num-gpus", "0.500000",
        "--entrypoint-resources", '"{\\"Custom_1\\": 1, \\"Custom_2\\": 5.5}"',
        "--", "echo no quote 'single quote' \"double quote\"",
        ";", "fi", ";",
        "ray", "job", "logs", "--address", address, "--follow", "testJobId",
    ]  # fmt: skip


def test_the_submitter_job_is_named_as_the_rayjob_and_runs_the_command_in_bash():
    rayjob = sample()
    rayjob["metadata"].update(namespace="default", uid="u-job")
    rayjob["status"] = {"dashboardURL": "svc.default.svc.cluster.local:8265", "jobId": "j-1"}
    job = submitter_job(rayjob, cluster_of(rayjob))
    assert job["metadata"]["name"] == "rayjob-sample" and job["spec"]["backoffLimit"] == 2
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert (container["name"], container["image"]) == ("ray-job-submitter", "rayproject/ray:2.60.0")
    assert container["command"] == ["/bin/bash", "-ce", "--"] and pod["restartPolicy"] == "Never"
    assert (
        " --submission-id j-1 -- python /home/ray/samples/sample_code.py ; fi ;"
        in (container["args"][0])
    )
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {
        "PYTHONUNBUFFERED": "1",
        "RAY_DASHBOARD_ADDRESS": "svc.default.svc.cluster.local:8265",
        "RAY_JOB_SUBMISSION_ID": "j-1",
    }


def test_deadlines_outcomes_retries_and_shutdown_follow_the_rayjob_controller():
    rayjob = sample(activeDeadlineSeconds=5)
    status = {"jobDeploymentStatus": "Running", "startTime": "2026-01-01T00:00:00Z"}
    start = 1767225600.0
    assert not check_active_deadline(rayjob, dict(status), start + 4)
    assert check_active_deadline(rayjob, status, start + 5)
    assert (status["jobDeploymentStatus"], status["reason"]) == ("Failed", "DeadlineExceeded")
    assert status["message"] == (
        "The RayJob has passed the activeDeadlineSeconds. StartTime: 2026-01-01 00:00:00 +0000 "
        "UTC. ActiveDeadlineSeconds: 5"
    )
    pre = sample(preRunningDeadlineSeconds=1)
    running = {"jobDeploymentStatus": "Running", "startTime": "2026-01-01T00:00:00Z"}
    assert not check_active_deadline(pre, running, start + 60), "only before Running"
    # A terminal Ray job is the RayJob's end only once the submitter Job has finished too.
    assert running_outcome("SUCCEEDED", False) == ("Running", "")
    assert running_outcome("SUCCEEDED", True) == ("Complete", "")
    assert running_outcome("STOPPED", True) == ("Complete", "")
    assert running_outcome("FAILED", True) == ("Failed", "AppFailed")
    assert running_outcome("RUNNING", True) == ("Running", "")
    retried = {"jobDeploymentStatus": "Failed", "reason": "AppFailed"}
    count_outcome(sample(backoffLimit=1), retried)
    assert (retried["jobDeploymentStatus"], retried["failed"]) == ("Retrying", 1)
    again = {**retried, "jobDeploymentStatus": "Failed"}
    count_outcome(sample(backoffLimit=1), again)
    assert (again["jobDeploymentStatus"], again["failed"]) == ("Failed", 2)
    late = {"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded"}
    count_outcome(sample(backoffLimit=3), late)
    assert late["jobDeploymentStatus"] == "Failed", "a deadline is never retried"
    done = sample()
    done["status"] = {"endTime": "2026-01-01T00:00:00Z"}
    assert shutdown_at(done) == start + 4
    assert shutdown_at(sample(shutdownAfterJobFinishes=False, ttlSecondsAfterFinished=0)) is None


# ---------------------------------------------------------------------- through the emulator
INVALID = {
    "suspend-without-shutdown": (
        {"suspend": True, "shutdownAfterJobFinishes": False, "ttlSecondsAfterFinished": 0},
        "The RayJob spec is invalid: a RayJob with shutdownAfterJobFinishes set to false is not "
        "allowed to be suspended",
    ),
    "ttl-without-shutdown": (
        {"shutdownAfterJobFinishes": False, "ttlSecondsAfterFinished": 10},
        "The RayJob spec is invalid: a RayJob with shutdownAfterJobFinishes set to false cannot "
        "have TTLSecondsAfterFinished",
    ),
    "zero-deadline": (
        {"activeDeadlineSeconds": 0},
        "The RayJob spec is invalid: activeDeadlineSeconds must be a positive integer",
    ),
    "min-above-max": (
        {"workers": {"minReplicas": 3, "maxReplicas": 2}},
        "The RayJob spec is invalid: worker group small-group has minReplicas 3 greater than "
        "maxReplicas 2",
    ),
    "resources-twice": (
        {"workers": {"rayStartParams": {"num-cpus": "1"}, "resources": {"cpu": "1"}}},
        "The RayJob spec is invalid: resource fields should not be set in both rayStartParams "
        "and Resources for small-group group; please use only one",
    ),
}


def test_invalid_rayjobs_fail_validation_with_kuberays_messages(kuberay_cluster):
    """Each invalid RayJob: ValidationFailed with the rule's message, a Warning event, and no
    RayCluster (one emulator for all: each is judged on its own)."""
    for case, (fields, _) in INVALID.items():
        fields = dict(fields)
        body = sample(case)
        body["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].update(fields.pop("workers", {}))
        body["spec"].update(fields)
        custom(kuberay_cluster).create_namespaced_custom_object(
            GROUP, VERSION, "default", "rayjobs", body
        )
    events = {}
    for case, (_, message) in INVALID.items():
        status = wait_for(
            lambda name=case: (
                (s := status_of(kuberay_cluster, name)).get("jobDeploymentStatus") and s
            ),
            10,
        )
        assert status == {
            "jobDeploymentStatus": "ValidationFailed",
            "reason": "ValidationFailed",
            "message": message,
            "failed": 0,  # the CRD's defaults
            "succeeded": 0,
        }, case
        events[case] = ("Warning", "InvalidRayJobSpec", f"default/{case}: {message}")
    found = kuberay_cluster.emulator.list("events")
    assert {e["involvedObject"]["name"]: (e["type"], e["reason"], e["message"]) for e in found} == (
        events
    )
    assert kuberay_cluster.emulator.list("rayclusters") == []


def test_the_crds_are_enforced(kuberay_cluster):
    body = sample("bad-ttl", ttlSecondsAfterFinished="soon")
    with pytest.raises(kubernetes.client.ApiException) as caught:
        custom(kuberay_cluster).create_namespaced_custom_object(
            GROUP, VERSION, "default", "rayjobs", body
        )
    assert caught.value.status == 422 and "spec.ttlSecondsAfterFinished" in caught.value.body


def test_a_suspended_rayjob_makes_nothing_until_resumed_and_deletion_cleans_up(kuberay_cluster):
    """Suspended: no RayCluster; resumed: the cluster is made (named, labelled and owned as
    KubeRay does), its head pod runs; deleting the RayJob removes the finalizer, and the API
    server collects the cluster, its pods and Services (their processes stop: the fixture
    checks none is left)."""
    api = custom(kuberay_cluster)
    api.create_namespaced_custom_object(
        GROUP, VERSION, "default", "rayjobs", sample("paused", suspend=True)
    )
    wait_for(
        lambda: status_of(kuberay_cluster, "paused").get("jobDeploymentStatus") == "Suspended", 10
    )
    rayjob = get(kuberay_cluster, "rayjobs", "paused")
    assert rayjob["metadata"]["finalizers"] == [FINALIZER]
    assert "rayClusterName" not in rayjob["status"] and not kuberay_cluster.emulator.list(
        "rayclusters"
    )
    api.patch_namespaced_custom_object(
        GROUP, VERSION, "default", "rayjobs", "paused", {"spec": {"suspend": False}}
    )
    name = wait_for(lambda: status_of(kuberay_cluster, "paused").get("rayClusterName"), 10)
    assert re.fullmatch(r"paused-[bcdfghjklmnpqrstvwxz2456789]{5}", name)
    assert re.fullmatch(
        r"paused-[bcdfghjklmnpqrstvwxz2456789]{5}", status_of(kuberay_cluster, "paused")["jobId"]
    )
    cluster = wait_for(lambda: get(kuberay_cluster, "rayclusters", name), 10)
    assert cluster["metadata"]["labels"] == {
        "ray.io/originated-from-cr-name": "paused",
        "ray.io/originated-from-crd": "RayJob",
        "ray.io/job-submission-mode": "K8sJobMode",
    }
    (owner,) = cluster["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("RayJob", "paused", True)
    head = wait_for(
        lambda: [p for p in kuberay_cluster.emulator.list("pods")
                 if p["metadata"]["labels"].get("ray.io/node-type") == "head"
                 and p["status"]["phase"] == "Running"],
        20,
    )  # fmt: skip
    assert head[0]["metadata"]["name"].startswith(f"{name}-head-")
    assert f"{name}-head-svc" in kuberay_cluster.emulator.names("services")
    api.delete_namespaced_custom_object(GROUP, VERSION, "default", "rayjobs", "paused")
    wait_for(lambda: get(kuberay_cluster, "rayjobs", "paused") is None, 10)
    assert kuberay_cluster.emulator.list("rayclusters") == []
    assert kuberay_cluster.emulator.list("pods") == []
    assert kuberay_cluster.emulator.names("services") == set()


def test_a_ray_container_that_exits_restarts_in_place_and_its_pod_is_remade_under_never(
    kuberay_cluster,
):
    """A head whose ``ray start`` fails (an unknown flag): under the default restartPolicy
    Always the kubelet restarts it in place (restartCount, lastState, the previous log); under
    Never the pod fails and KubeRay deletes it and makes another (``shouldDeletePod``)."""
    core = kubernetes.client.CoreV1Api(kuberay_cluster.api_client)
    for name, policy in (("always", None), ("never", "Never")):
        body = cluster_of(sample(), name)
        del body["metadata"]["uid"], body["metadata"]["labels"]
        head = body["spec"]["headGroupSpec"]
        head["rayStartParams"] = {"no-such-flag": "1"}
        body["spec"]["workerGroupSpecs"] = []
        if policy:
            head["template"]["spec"]["restartPolicy"] = policy
        custom(kuberay_cluster).create_namespaced_custom_object(
            GROUP, VERSION, "default", "rayclusters", body
        )

    def heads(cluster: str) -> list[Any]:
        selector = f"ray.io/cluster={cluster},ray.io/node-type=head"
        return core.list_namespaced_pod("default", label_selector=selector).items

    restarted = wait_for(
        lambda: [p for p in heads("always") if p.status.container_statuses[0].restart_count], 60
    )
    (status,) = restarted[0].status.container_statuses
    assert status.last_state.terminated.exit_code == 2
    previous = core.read_namespaced_pod_log(restarted[0].metadata.name, "default", previous=True)
    assert "No such option '--no-such-flag'" in previous
    first = wait_for(lambda: heads("never"), 10)[0].metadata.name
    wait_for(lambda: [p for p in heads("never") if p.metadata.name != first], 60)
    assert len(heads("always")) == 1
