"""The Kubeflow SDK (the `kubeflow` 0.5 package, its own code) reads what we put on a cluster:
every runtime we ship (``list_runtimes``, ``get_runtime``) and every TrainJob we render
(``list_jobs``, ``get_job``), over HTTP from the emulated API server.

Installing our runtimes once made the SDK's ``list_runtimes()`` fail for the whole cluster:
it takes a runtime's device from the node container's limits (kubeflow/trainer/backends/
kubernetes/utils.py ``get_container_devices``) and raises "Unknown device type" on limits that
hold memory only, as torch-ddp-cpu's did. ``get_job`` reads the same from the job's pods, so
the pods are made as Trainer v2.3 + JobSet v0.12 make them: JobSet's labels (the SDK selects
``jobset.sigs.k8s.io/replicatedjob-name in (dataset-initializer, model-initializer, launcher,
node)``), the runtime's container resources merged key by key with the TrainJob's
``resourcesPerNode`` (kubeflow/trainer v2.3.0 ``pkg/runtime/core/trainingruntime.go`` with
``pkg/util/trainingruntime`` MergeResourceRequirements) and ``PET_NPROC_PER_NODE`` from
``numProcPerNode`` (``pkg/runtime/framework/plugins/torch/torch.go``). Nothing here waits: the
SDK's waits poll every 2 s.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from k8s_schemas import CLUSTER_RUNTIME_CRD, TRAINER_SCHEMAS, TRAINJOB_CRD
from kubeflow.common.types import KubernetesBackendConfig
from kubeflow.trainer import TrainerClient

from kubetrain.jobspec import Initializer, Resources, RuntimeRef, TrainJobSpec
from kubetrain.render import render_job
from kubetrain.render.manifests import RUNTIME_NAMES, runtime_manifests
from tests.shared_material import shared_file
from tests.support import KubeEmulator, objects

NAMESPACE = "default"
RUNTIME_CRD = "trainer.kubeflow.org_trainingruntimes.yaml"
GPU_RUNTIMES = ("torch-ddp-gpu", "torch-fsdp-gpu", "torch-ddp-gpu-gang")
#: A copy of torch-ddp-cpu with the Trainer's initializer jobs, shaped as in kubeflow/trainer
#: v2.3.0 manifests/base/runtimes/torchtune/llama3_2/llama3_2_1B.yaml: what a TrainJob with
#: --dataset-uri/--model-uri needs (the JobSet plugin's Validate refuses it otherwise).
WITH_INITIALIZERS = "torch-ddp-cpu-initializers"
INITIALIZERS = ("dataset-initializer", "model-initializer")


def initializer_runtime() -> dict[str, Any]:
    (runtime,) = [r for r in runtime_manifests() if r["metadata"]["name"] == "torch-ddp-cpu"]
    runtime = copy.deepcopy(runtime)
    runtime["metadata"]["name"] = WITH_INITIALIZERS
    jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    for step in reversed(INITIALIZERS):
        container = {"name": step, "image": f"ghcr.io/kubeflow/trainer/{step}"}
        pod = {"spec": {"restartPolicy": "Never", "containers": [container]}}
        labels = {"trainer.kubeflow.org/trainjob-ancestor-step": step}
        jobs.insert(0, {"name": step, "template": {"metadata": {"labels": labels},
                                                   "spec": {"template": pod}}})  # fmt: skip
    jobs[-1]["dependsOn"] = [{"name": step, "status": "Complete"} for step in INITIALIZERS]
    return runtime


@dataclass
class Case:
    """A TrainJob we render, and what the SDK must read back from it."""

    spec: TrainJobSpec
    device: str
    device_count: str
    steps: list[str] = field(default_factory=list)


def spec(name: str, runtime: str = "torch-ddp-cpu", **fields: Any) -> TrainJobSpec:
    return TrainJobSpec(name=name, command=fields.pop("command", ("python", "train.py")),
                        runtime=RuntimeRef(name=runtime), **fields)  # fmt: skip


CASES = {
    "user-command": Case(spec("sdk-command", args=("--epochs", "2")), "cpu", "1", ["node-0"]),
    "one-word-command": Case(spec("sdk-hostname", command=("hostname",)), "cpu", "1", ["node-0"]),
    "several-nodes-memory": Case(
        spec("sdk-nodes", num_nodes=3, resources_per_node=Resources(memory="4Gi")),
        "cpu",
        "1",
        ["node-0", "node-1", "node-2"],
    ),
    "gpu": Case(
        spec(
            "sdk-gpu",
            "torch-ddp-gpu",
            num_nodes=2,
            procs_per_node=4,
            resources_per_node=Resources(memory="64Gi", gpu=4),
        ),
        "gpu",
        "4",
        ["node-0", "node-1"],
    ),  # fmt: skip
    "fsdp-gang": Case(
        spec(
            "sdk-gang",
            "torch-ddp-gpu-gang",
            num_nodes=2,
            procs_per_node=2,
            resources_per_node=Resources(gpu=2),
        ),
        "gpu",
        "2",
        ["node-0", "node-1"],
    ),  # fmt: skip
    "initializers": Case(
        spec(
            "sdk-init",
            WITH_INITIALIZERS,
            dataset_initializer=Initializer("hf://tatsu-lab/alpaca"),
            model_initializer=Initializer("s3://models/base", secret_name="s3-creds"),
        ),
        "cpu",
        "1",
        ["dataset-initializer", "model-initializer", "node-0"],
    ),  # fmt: skip
    "script": Case(
        spec("sdk-script", command=("python", "train.py"), script="train.py", env={"SEED": "1"}),
        "cpu",
        "1",
        ["node-0"],
    ),  # fmt: skip
}


def merged_resources(runtime: dict[str, Any], trainjob: dict[str, Any]) -> dict[str, Any]:
    """The node container's resources as Trainer v2.3 builds them: the runtime's, overridden
    key by key (a strategic merge of two maps) by the TrainJob's resourcesPerNode."""
    container = node_container(runtime, "node")
    base = container.get("resources", {})
    override = trainjob["spec"].get("trainer", {}).get("resourcesPerNode", {})
    return {
        key: {**base.get(key, {}), **override.get(key, {})}
        for key in ("requests", "limits")
        if base.get(key) or override.get(key)
    }


def node_container(runtime: dict[str, Any], job: str) -> dict[str, Any]:
    (replicated,) = [j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]
                     if j["name"] == job]  # fmt: skip
    (container,) = replicated["template"]["spec"]["template"]["spec"]["containers"]
    return container


def step_pod(trainjob: dict[str, Any], runtime: dict[str, Any], job: str, index: int) -> dict:
    """Pod ``index`` of replicated job ``job`` of the TrainJob, as JobSet names and labels it."""
    name = trainjob["metadata"]["name"]
    pod = objects.node_pod(name, index)
    if job == "node":
        container = pod["spec"]["containers"][0]
        container["resources"] = merged_resources(runtime, trainjob)
        procs = str(trainjob["spec"]["trainer"].get("numProcPerNode", 1))
        container["env"] = [{"name": "PET_NPROC_PER_NODE", "value": procs}]
        phase = "Running"
    else:
        pod["metadata"]["name"] = f"{name}-{job}-0-0-x1y2z"
        pod["metadata"]["labels"][objects.REPLICATED_JOB] = job
        pod["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] = job
        pod["spec"]["containers"] = [dict(node_container(runtime, job))]
        phase = "Succeeded"
    pod["status"] = objects.pod_status(phase, [])
    return pod


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEmulator]:
    """Our runtimes (and one with initializers) and every case's TrainJob, ConfigMap and pods,
    on an emulated cluster with the Trainer's v2.3 CRDs (vendored in ../shared: their schemas
    keep every field the SDK reads) and its public version ConfigMap (the SDK reads it on
    start: kubeflow/trainer v2.3.0
    charts/kubeflow-trainer/templates/manager/public-configmap.yaml)."""
    with KubeEmulator(namespace=NAMESPACE) as emulator:
        for crd in (TRAINJOB_CRD, CLUSTER_RUNTIME_CRD, RUNTIME_CRD):
            path = shared_file(TRAINER_SCHEMAS / crd, "the Kubeflow Trainer v2.3 CRDs")
            emulator.install_crd(yaml.safe_load(path.read_text()))
        runtimes = {}
        for runtime in [*runtime_manifests(), initializer_runtime()]:
            emulator.create("clustertrainingruntimes", runtime)
            runtimes[runtime["metadata"]["name"]] = runtime
        public = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "kubeflow-trainer-public"},
                  "data": {"kubeflow_trainer_version": "v2.3.0"}}  # fmt: skip
        emulator.create("configmaps", public, namespace="kubeflow-system")
        scripts = tmp_path_factory.mktemp("scripts")
        for case in CASES.values():
            job_spec = case.spec
            if job_spec.script:  # shipped from a local file, as --script is
                (scripts / job_spec.script).write_text("print('trained')\n")
                job_spec = dataclasses.replace(job_spec, script=str(scripts / job_spec.script))
            rendered = render_job(job_spec, "trainer", NAMESPACE, "2.3")
            for document in rendered[:-1]:
                emulator.create("configmaps", document)
            trainjob = emulator.create("trainjobs", rendered[-1])
            runtime = runtimes[case.spec.runtime.name]
            for step in case.steps:
                job, _, index = step.rpartition("-") if step.startswith("node-") else (step, 0, 0)
                emulator.create_pod(step_pod(trainjob, runtime, job, int(index)))
        yield emulator


@pytest.fixture(scope="module")
def client(cluster: KubeEmulator) -> TrainerClient:
    config = KubernetesBackendConfig(
        namespace=NAMESPACE, client_configuration=cluster.configuration()
    )
    return TrainerClient(backend_config=config)


def test_list_runtimes_reads_every_runtime_we_ship(client: TrainerClient) -> None:
    """Failed for the whole cluster on torch-ddp-cpu, whose limits held memory only."""
    listed = {runtime.name: runtime for runtime in client.list_runtimes()}
    assert set(RUNTIME_NAMES) <= set(listed)
    for name in RUNTIME_NAMES:
        trainer = listed[name].trainer
        expected = (
            ("deepspeed", "ghcr.io/kubetrain/kubetrain-deepspeed:0.1.0")
            if name == "kubetrain-deepspeed-mpi"
            else ("torch", "ghcr.io/kubetrain/kubetrain-trainer:0.1.0")
        )
        assert (trainer.framework, trainer.image, trainer.num_nodes) == (*expected, 1), name
        assert trainer.trainer_type.value == "CustomTrainer"
        # "1", not "1.0": a quoted quantity is what the SDK multiplies by the nodes.
        expected = ("gpu", "1") if name in GPU_RUNTIMES else ("cpu", "1")
        assert (trainer.device, trainer.device_count) == expected, name


@pytest.mark.parametrize("name", RUNTIME_NAMES)
def test_get_runtime_reads_each_runtime(client: TrainerClient, name: str) -> None:
    runtime = client.get_runtime(name)
    assert runtime.name == name
    assert runtime.kind.value == "ClusterTrainingRuntime"


def test_list_jobs_reads_every_trainjob_we_render(client: TrainerClient) -> None:
    jobs = {job.name: job for job in client.list_jobs()}
    assert set(jobs) == {case.spec.name for case in CASES.values()}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_get_job_reads_a_trainjob_we_render(client: TrainerClient, case: Case) -> None:
    job = client.get_job(case.spec.name)
    assert job.runtime.name == case.spec.runtime.name
    assert job.num_nodes == case.spec.num_nodes
    assert sorted(step.name for step in job.steps) == sorted(case.steps)
    for step in job.steps:
        if step.name.startswith("node-"):
            assert (step.device, step.device_count) == (case.device, case.device_count)
            assert step.status == "Running"
        else:
            assert step.status == "Succeeded"
    # No condition yet and every node running: the SDK's own "Running".
    assert job.status == "Running"
