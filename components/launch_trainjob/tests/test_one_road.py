"""One road for launch: the KFP component, `kubetrain launch` (the Argo template's command) and
`kubetrain render trainjob` all turn their options into one ``LaunchRequest`` and plan it with
one function, so render prints exactly what each face creates (on the emulated API server)."""

from __future__ import annotations

import copy
import json
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubetrain.cli import main as kubetrain_main
from kubetrain.components.launch_trainjob.component import launch_trainjob
from kubetrain.jobspec import DEFAULT_RUNTIME

RUN_NAME = "kubetrain-training-2026-11-25-01-30-00-123456"
#: What the KFP pipeline passes to the launch component (pipelines/training_pipeline.py), with
#: the resources, env and placement a GPU job asks for.
PIPELINE_ARGUMENTS: dict[str, Any] = {
    "run_name": RUN_NAME,
    "backend": "trainer",
    "nodes": 3,
    "procs_per_node": 2,
    "strategy": "fsdp",
    "model": "cnn",
    "epochs": 4,
    "batch_size": 64,
    "lr": 0.002,
    "checkpoint_dir": "",
    "image": "",
    "runtime": DEFAULT_RUNTIME,
    "namespace": "default",
    "shared_pvc": "kubetrain-shared",
    "service_account": "trainer-sa",
    "storage": "",
    "storage_secret": "kubetrain-storage",
    "max_restarts": 0,
    "cpu": "4",
    "memory": "16Gi",
    "gpu": 2,
    "env": {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4"},
    "node_selector": {"nvidia.com/gpu.product": "H100"},
    "tolerations": ["nvidia.com/gpu:NoSchedule", "team=ml:NoExecute"],
}
#: Fields the API server sets on what it stores.
SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")


def cli_options(data: str, shared_mount: str) -> list[str]:
    """The same request as `kubetrain launch` / `render trainjob` options."""
    a = PIPELINE_ARGUMENTS
    options = [
        "--backend", a["backend"], "--namespace", a["namespace"], "--run-name", a["run_name"],
        "--nodes", str(a["nodes"]), "--procs-per-node", str(a["procs_per_node"]),
        "--strategy", a["strategy"], "--model", a["model"], "--epochs", str(a["epochs"]),
        "--batch-size", str(a["batch_size"]), "--lr", str(a["lr"]),
        "--runtime", a["runtime"], "--shared-pvc", a["shared_pvc"],
        "--shared-mount", shared_mount, "--service-account", a["service_account"],
        "--storage-secret", a["storage_secret"], "--cpu", a["cpu"], "--memory", a["memory"],
        "--gpu", str(a["gpu"]), "--data", data,
    ]  # fmt: skip
    for key, value in a["env"].items():
        options += ["--env", f"{key}={value}"]
    for key, value in a["node_selector"].items():
        options += ["--node-selector", f"{key}={value}"]
    for toleration in a["tolerations"]:
        options += ["--toleration", toleration]
    return options


def rendered(options: list[str], capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert kubetrain_main(["render", "trainjob", "--trainer-version", "2.3", *options]) == 0
    return list(yaml.safe_load_all(capsys.readouterr().out))


#: What the API server defaults from the TrainJob CRD's schema (kubeflow/trainer v2.3.0
#: manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml: spec.managedBy's and
#: spec.suspend's defaults).
SCHEMA_DEFAULTS = {"managedBy": "trainer.kubeflow.org/trainjob-controller", "suspend": False}


def as_created(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored object without what the server added, to compare with what was rendered."""
    created = copy.deepcopy(stored)
    created.pop("status", None)
    for field in SERVER_FIELDS:
        created["metadata"].pop(field, None)
    spec = created.get("spec") or {}
    for field, default in SCHEMA_DEFAULTS.items():
        if created["kind"] == "TrainJob" and spec.get(field) == default:
            del spec[field]
    return created


@pytest.fixture
def cluster(k8s, tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(k8s.emulator.write_kubeconfig(tmp_path / "kubeconfig")))
    return k8s


def test_render_prints_what_the_kfp_component_creates(cluster, digits_dir, tmp_path, capsys):
    shared = tmp_path / "shared"
    dataset = types.SimpleNamespace(path=str(digits_dir))  # what KFP hands the step
    outputs = launch_trainjob.python_func(
        dataset=dataset, shared_mount=str(shared), **PIPELINE_ARGUMENTS
    )
    (trainjob,) = [as_created(t) for t in cluster.emulator.list("trainjobs")]
    assert trainjob["metadata"]["name"] == outputs.job_name
    assert (shared / "datasets" / outputs.job_name / "manifest.json").is_file()  # staged
    (printed,) = rendered(cli_options(str(digits_dir), str(shared)), capsys)
    assert yaml.safe_dump(printed) == yaml.safe_dump(trainjob)
    # What a GPU job needs reached the TrainJob.
    text = yaml.safe_dump(trainjob)
    for expected in ("nvidia.com/gpu: '2'", "NCCL_DEBUG", "H100", "NoExecute", "16Gi"):
        assert expected in text


def test_render_prints_what_kubetrain_launch_creates(cluster, digits_dir, tmp_path, capsys):
    """`kubetrain launch` is the Argo template's command: the same request, the same objects."""
    shared = tmp_path / "shared"
    options = cli_options(str(digits_dir), str(shared))
    assert kubetrain_main(["launch", "--trainer-version", "2.3", *options]) == 0
    (trainjob,) = [as_created(t) for t in cluster.emulator.list("trainjobs")]
    (printed,) = rendered(options, capsys)
    assert yaml.safe_dump(printed) == yaml.safe_dump(trainjob)


def test_a_script_renders_its_configmap_first_as_launch_creates_it(cluster, tmp_path: Path, capsys):
    script = tmp_path / "train.py"
    script.write_text("print('hello from a node')\n")
    options = ["--backend", "trainer", "--name", "scripted", "--script", str(script)]
    options += ["--data", "/mnt/shared/data"]  # render's default, so launch's too
    command = ["--", "torchrun", "train.py"]
    assert kubetrain_main(["launch", "--trainer-version", "2.3", *options, *command]) == 0
    configmap = as_created(cluster.emulator.get("configmaps", "scripted-script"))
    trainjob = as_created(cluster.emulator.get("trainjobs", "scripted"))
    printed = rendered([*options, *command], capsys)
    assert yaml.safe_dump(printed) == yaml.safe_dump([configmap, trainjob])


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"env": {"EPOCHS": 3}}, "env"),  # a number, where Kubernetes takes text
        ({"node_selector": ["gpu=h100"]}, "node_selector"),  # not a mapping
        ({"tolerations": [{"key": "nvidia.com/gpu"}]}, "tolerations"),  # not KEY[=VALUE][:EFFECT]
        ({"tolerations": ["bad key!:NoSchedule"]}, "tolerations.key"),
        ({"gpu": -1}, "resources_per_node.gpu"),
    ],
)
def test_the_component_refuses_a_bad_placement_before_creating_anything(
    cluster, digits_dir, tmp_path, bad, field
):
    from kubetrain.errors import InvalidInput

    dataset = types.SimpleNamespace(path=str(digits_dir))
    arguments = {**PIPELINE_ARGUMENTS, "shared_mount": str(tmp_path / "shared"), **bad}
    with pytest.raises(InvalidInput) as refused:
        launch_trainjob.python_func(dataset=dataset, **arguments)
    assert refused.value.field == field
    assert "\n" not in str(refused.value)
    assert cluster.emulator.list("trainjobs") == []
    assert not (tmp_path / "shared").exists()  # nothing staged either


def test_render_prints_what_the_kfp_component_creates_for_a_users_program(
    cluster, digits_dir, tmp_path, capsys
):
    """A user's program (KFP: a list; CLI: --command-json, as the Argo template passes it)."""
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    dataset = types.SimpleNamespace(path=str(digits_dir))
    arguments = {**PIPELINE_ARGUMENTS, "shared_mount": str(tmp_path / "shared")}
    command = ["torchrun", "train.py", "--epochs", "3"]
    outputs = launch_trainjob.python_func(
        dataset=dataset, command=command, script=str(script), **arguments
    )
    stored = [as_created(cluster.emulator.get("configmaps", f"{name}-script")) for name in
              [t["metadata"]["name"] for t in cluster.emulator.list("trainjobs")]]  # fmt: skip
    (trainjob,) = [as_created(t) for t in cluster.emulator.list("trainjobs")]
    options = cli_options(str(digits_dir), str(tmp_path / "shared"))
    printed = rendered(
        [*options, "--script", str(script), "--command-json", json.dumps(command)], capsys
    )
    assert yaml.safe_dump(printed) == yaml.safe_dump([*stored, trainjob])
    # It runs in its checkpoint folder on the claim (IN_FOLDER), the shipped script mounted.
    from kubetrain.render.script import IN_FOLDER

    trainer = trainjob["spec"]["trainer"]
    assert trainer["command"] == list(IN_FOLDER)
    assert trainer["args"][1:] == ["torchrun", "/workspace/train.py", "--epochs", "3"]
    assert trainer["args"][0] == str(tmp_path / "shared" / "checkpoints" / outputs.job_name)
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["KUBETRAIN_CHECKPOINT_DIR"] == trainer["args"][0]
    assert env["KUBETRAIN_DATA_DIR"] == str(tmp_path / "shared" / "datasets" / outputs.job_name)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("options", "field"),
    [
        (["--command-json", '["torchrun", "a.py"]', "--", "torchrun", "b.py"], "--command-json"),
        (["--command-json", "torchrun a.py"], "--command-json"),  # not JSON
        (["--command-json", '["torchrun", 1]'], "--command-json"),  # not texts
        (["--env", '{"EPOCHS": 3}'], "--env"),  # a number where Kubernetes takes text
        (["--toleration", '["nvidia.com/gpu:NoSchedule", 1]'], "--toleration"),  # not texts
        (["--suspend", "maybe"], "--suspend"),
        (["--active-deadline-seconds", "soon"], "--active-deadline-seconds"),
        # a user's program runs in its checkpoint folder: on a cluster it must be absolute
        (["--checkpoint-dir", "ckpt", "--command-json", '["python3", "x.py"]'], "checkpoint_dir"),
    ],
)
def test_bad_json_and_flag_options_are_refused_before_anything_is_created(
    cluster, tmp_path, capfd, options, field
):
    from tests.reliability.test_bad_input import assert_one_line_error

    try:
        code = kubetrain_main(["launch", "--backend", "trainer", "--name", "never", *options])
    except SystemExit as exited:  # argparse's usage error
        code = exited.code
    assert code in (1, 2)
    assert_one_line_error(capfd.readouterr().err, "kubetrain launch", field)
    assert cluster.emulator.list("trainjobs") == []
