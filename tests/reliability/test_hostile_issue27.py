"""Hostile review of issue 27's surfaces, written from the user documentation only (README
"Backends", "From the CLI", "Object storage", "From Kubeflow Pipelines", "From Argo
Workflows", runtimes/README.md, components/promote_model/README.md and the ``--help`` of
promote, delete, render runtimes, run, submit argo, wait and launch).

Seven classes: bad input (one line naming the field, nothing created), atomicity (nothing
half-written is read), races and idempotency, security (path traversal, URL tricks, links,
shell strings), cluster states (the exit handler's rule against a job in each state, a
missing job, a job of another kind; wait's restart rule), consistency across faces (render,
the pods, the Argo workflow, KFP's exit task) and packaging (runtimes/ as kustomize builds
it, and as the wheel ships it). A case that BROKE asserts the documented behaviour and is
marked ``xfail(strict=True)`` with what was observed.

Tiny models (a 64-8-10 MLP, collected by ``kubetrain collect`` from ``torch.save``) are
promoted in process through ``kubetrain.cli.main``; subprocesses only where the process
boundary is the point (racing promotes, a local job's processes, kubectl, the wheel).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn

from kubetrain.cli import main
from tests.support import objects
from tests.support.processes import kubetrain_in_process as run_cli
from tests.support.processes import run_kubetrain
from tests.test_kubernetes_backend import complete, make_spec, node_pod, set_container

REPO = Path(__file__).resolve().parents[2]
BUCKET = "kubetrain-hostile-27"
HANG_SECONDS = 20
ISTIO = "sidecar.istio.io/inject"
RESERVED = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
            "PET_MASTER_PORT")  # fmt: skip


# ------------------------------------------------------------------------------- helpers
def one_line(err: str, prog: str, *needles: str) -> str:
    """The single error line ``PROG: error: ...`` naming each needle."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{err}"
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]}"
    assert "internal error" not in lines[0] and "Traceback" not in lines[0]
    return lines[0]


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (hidden ones too) with its bytes."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def visible(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


def card_sha(model: Path) -> str:
    return json.loads((model / "model.json").read_text())["sha256"]


def promote(capsys, model: Path | str, registry: Path | str, version: str, *extra: str):
    return run_cli(["promote", "--model", model, "--registry", registry, "--version", version,
                    *extra], capsys)  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Two different collected models (seeds 0 and 1), as `kubetrain collect` publishes them."""
    root = tmp_path_factory.mktemp("models")
    made = {}
    for name, seed in (("a", 0), ("b", 1)):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10))
        (root / f"ck-{name}").mkdir()
        torch.save(net.state_dict(), root / f"ck-{name}" / "model.pt")
        code = main(["collect", "--checkpoint-dir", str(root / f"ck-{name}"),
                     "--output", str(root / name)])  # fmt: skip
        assert code == 0
        made[name] = root / name
    assert card_sha(made["a"]) != card_sha(made["b"])
    return made


def render(capsys, kind: str, *args: str) -> list[dict]:
    code, out, err = run_cli(["render", kind, *args], capsys)
    assert code == 0, err
    return [doc for doc in yaml.safe_load_all(out) if doc]


def pod_templates(doc: dict) -> list[dict]:
    """The pod template(s) of a rendered TrainJob (its patch or override), Job or PyTorchJob,
    or runtime, as {"metadata": ..., "spec": ...} (spec may be absent in a patch)."""
    kind, spec = doc["kind"], doc["spec"]
    if kind == "TrainJob":
        if "runtimePatches" in spec:
            found = []
            for patch in spec["runtimePatches"]:
                jobset = patch["trainingRuntimeSpec"]["template"]["spec"]
                found += [rj["template"]["spec"]["template"] for rj in jobset["replicatedJobs"]]
            return found
        return [{"metadata": o.get("metadata", {})} for o in spec["podTemplateOverrides"]]
    if kind == "Job":
        return [spec["template"]]
    if kind == "PyTorchJob":
        return [r["template"] for r in spec["pytorchReplicaSpecs"].values()]
    if kind == "ClusterTrainingRuntime":
        jobset = spec["template"]["spec"]
        return [rj["template"]["spec"]["template"] for rj in jobset["replicatedJobs"]]
    return []


def node_env(doc: dict) -> dict[str, Any]:
    if doc["kind"] == "TrainJob":
        return {e["name"]: e.get("value") for e in doc["spec"]["trainer"].get("env", [])}
    containers = [c for t in pod_templates(doc) for c in t["spec"]["containers"]]
    return {e["name"]: e.get("value") for c in containers for e in c.get("env", [])}


RENDERS = {
    "trainjob-2.3": ("trainjob", "--trainer-version", "2.3"),
    "trainjob-2.1": ("trainjob", "--trainer-version", "2.1"),
    "job": ("trainjob", "--backend", "job"),
    "pytorchjob": ("pytorchjob",),
}


# ============================================================= 1. bad input: one line, nothing
@pytest.mark.bad_input
@pytest.mark.parametrize("name", RESERVED)
def test_1a_each_reserved_pet_name_is_refused_on_every_render(capsys, name):
    """README: only the five PET_* names the Trainer sets are refused in --env."""
    for kind, *args in RENDERS.values():
        code, out, err = run_cli(["render", kind, *args, "--name", "demo",
                                  "--env", f"{name}=3"], capsys)  # fmt: skip
        assert code == 2 and out == "", (kind, args, out)
        one_line(err, "kubetrain render", name)


@pytest.mark.bad_input
def test_1b_a_reserved_name_inside_a_json_env_object_is_refused(capsys):
    env = json.dumps({"FOO": "1", "PET_MASTER_PORT": "1234"})
    code, out, err = run_cli(["render", "trainjob", "--name", "demo", "--env", env], capsys)
    assert code == 2 and out == ""
    one_line(err, "kubetrain render", "PET_MASTER_PORT")


@pytest.mark.bad_input
def test_1c_local_launch_refuses_a_reserved_name_before_any_job_folder(local_root, capsys):
    code, out, err = run_cli(["launch", "--name", "reserved", "--env", "PET_NODE_RANK=1", "--",
                              sys.executable, "-c", "pass"], capsys)  # fmt: skip
    assert code == 2
    one_line(err, "kubetrain launch", "PET_NODE_RANK")
    assert not (local_root / "reserved").exists()


@pytest.mark.bad_input
@pytest.mark.parametrize("accuracy", ["nan", "1.5", "-0.1", "ninety", "inf"])
def test_1d_promote_refuses_an_accuracy_that_is_not_a_fraction(models, tmp_path, capsys, accuracy):
    code, out, err = promote(capsys, models["a"], tmp_path / "reg", "v1", "--accuracy", accuracy)
    assert code == 2
    one_line(err, "kubetrain promote", "accuracy")
    assert not (tmp_path / "reg").exists()


@pytest.mark.bad_input
def test_1e_promote_refuses_a_missing_model_in_one_line(tmp_path, capsys):
    code, out, err = promote(capsys, tmp_path / "nothing-here", tmp_path / "reg", "v1")
    assert code in (1, 2)
    one_line(err, "kubetrain promote", "model")
    assert not (tmp_path / "reg").exists()


@pytest.mark.bad_input
def test_1f_promote_refuses_an_unknown_protocol_naming_the_registry(models, tmp_path, capsys):
    code, out, err = promote(capsys, models["a"], "nosuch://bucket/models", "v1")
    assert code == 2
    one_line(err, "kubetrain promote", "registry", "nosuch://bucket/models")


@pytest.mark.bad_input
def test_1g_an_s3_url_without_a_bucket_is_refused_not_written_to_a_local_folder(
    models, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    code, out, err = promote(capsys, models["a"], "s3://", "v1")
    assert list(tmp_path.iterdir()) == [], "nothing on the local disk"
    assert code == 2
    one_line(err, "kubetrain promote", "registry")


@pytest.mark.bad_input
def test_1h_a_read_only_fsspec_registry_is_refused_naming_the_registry(models, capsys):
    code, out, err = promote(capsys, models["a"], "http://example.invalid/models", "v1")
    assert code == 2
    one_line(err, "kubetrain promote", "registry")


@pytest.mark.bad_input
def test_1i_an_s3_url_with_an_empty_bucket_is_refused_naming_the_registry(models, s3_env, capsys):
    code, out, err = promote(capsys, models["a"], "s3:///models", "v1")
    assert code == 2
    one_line(err, "kubetrain promote", "registry")


@pytest.mark.bad_input
def test_1j_run_refuses_a_bad_registry_before_any_step(tmp_path, capsys, local_root):
    """README: `kubetrain run` checks what it can before any step runs."""
    started = time.monotonic()
    result = run_kubetrain("run", "--registry", "nosuch://bucket/models", "--epochs", "1",
                           "--output", str(tmp_path / "runs"), cwd=tmp_path,
                           env={"KUBETRAIN_LOCAL_ROOT": str(local_root)}, timeout=30)  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    one_line(result.stderr, "kubetrain run", "--registry", "nosuch://bucket/models")
    assert time.monotonic() - started < 15
    assert not (tmp_path / "runs").exists() and not local_root.exists()


@pytest.fixture
def argo(monkeypatch):
    from tests.support.argo_server import ArgoServer

    for name in list(os.environ):
        if name.startswith("ARGO_"):
            monkeypatch.delenv(name)
    with ArgoServer() as running:
        yield running


@pytest.mark.bad_input
@pytest.mark.filterwarnings("ignore:The `json` method is deprecated")
@pytest.mark.parametrize(
    "registry",
    ["/mnt/shared", "/mnt/shared/", "/mnt//shared/registry", "/mnt/shared/./registry",
     "/mnt/registry-pvc/../shared/registry", "file:///mnt/shared/registry",
     "/mnt/shared/registry/../../shared/r"],
)  # fmt: skip
def test_1k_submit_argo_refuses_every_spelling_of_the_run_claim(argo, capsys, registry):
    code, out, err = run_cli(["submit", "argo", "--host", argo.url,
                              "--param", f"model_registry={registry}"], capsys)  # fmt: skip
    assert code == 2, out
    one_line(err, "kubetrain submit", "model_registry", "run's own claim")
    assert argo.requests == []


@pytest.mark.bad_input
@pytest.mark.filterwarnings("ignore:The `json` method is deprecated")
@pytest.mark.parametrize("claim", ["", "Team_Registry", "a" * 254])
def test_1l_submit_argo_refuses_a_registry_pvc_that_is_no_claim_name(argo, capsys, claim):
    """The promote step mounts registry_pvc (README: it must exist): a value that is no
    claim name would leave the step's pod unschedulable."""
    code, out, err = run_cli(["submit", "argo", "--host", argo.url,
                              "--param", f"registry_pvc={claim}"], capsys)  # fmt: skip
    assert code == 2, out
    one_line(err, "kubetrain submit", "registry_pvc")
    assert argo.requests == []


@pytest.mark.bad_input
@pytest.mark.filterwarnings("ignore:The `json` method is deprecated")
def test_1l2_the_registry_pvc_refusals_fix_names_a_claim_not_a_secret(argo, capsys):
    code, out, err = run_cli(["submit", "argo", "--host", argo.url,
                              "--param", "registry_pvc=Team_Registry"], capsys)  # fmt: skip
    line = one_line(err, "kubetrain submit", "registry_pvc")
    assert "secret" not in line.lower(), line


@pytest.mark.bad_input
def test_1m_delete_without_a_name_or_run_name_says_what_to_give(capsys):
    code, out, err = run_cli(["delete", "--keep-complete", "--backend", "trainer"], capsys)
    assert code == 2
    one_line(err, "kubetrain delete", "--run-name")


# ============================================================ 2. atomicity / half-written
def test_2a_an_s3_version_without_its_card_is_published_over(models, s3_env, capsys):
    """A promote killed after the model file (no model.json) leaves nothing a reader takes,
    and the next promote publishes the version whole, card last."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3_env.endpoint_url)
    client.put_object(Bucket=BUCKET, Key="half/v1/model.safetensors", Body=b"torn upload")
    registry = f"s3://{BUCKET}/half"
    code, out, err = promote(capsys, models["b"], registry, "v1")
    assert code == 0, err
    assert out == f"promoted v1 (sha256 {card_sha(models['b'])}) to {registry}/v1\n"
    body = client.get_object(Bucket=BUCKET, Key="half/v1/model.safetensors")["Body"].read()
    assert body == (models["b"] / "model.safetensors").read_bytes()
    pointer = json.loads(client.get_object(Bucket=BUCKET, Key="half/PROMOTED")["Body"].read())
    assert (pointer["version"], pointer["sha256"]) == ("v1", card_sha(models["b"]))


def test_2b_a_damaged_s3_version_is_reported_never_replaced(models, s3_env, capsys):
    import boto3

    client = boto3.client("s3", endpoint_url=s3_env.endpoint_url)
    registry = f"s3://{BUCKET}/damaged"
    assert promote(capsys, models["a"], registry, "v1")[0] == 0
    client.put_object(Bucket=BUCKET, Key="damaged/v1/model.safetensors", Body=b"bit rot")
    pointer = client.get_object(Bucket=BUCKET, Key="damaged/PROMOTED")["Body"].read()
    code, out, err = promote(capsys, models["a"], registry, "v1")
    assert code == 1
    one_line(err, "kubetrain promote", "v1")
    assert "damaged" in err or "does not match" in err, err
    assert (
        client.get_object(Bucket=BUCKET, Key="damaged/v1/model.safetensors")["Body"].read()
        == b"bit rot"
    )
    assert client.get_object(Bucket=BUCKET, Key="damaged/PROMOTED")["Body"].read() == pointer


def test_2c_a_foreign_empty_local_version_folder_is_not_published_into(models, tmp_path, capsys):
    registry = tmp_path / "reg"
    (registry / "v1").mkdir(parents=True)
    code, out, err = promote(capsys, models["a"], registry, "v1")
    assert code == 1, out
    one_line(err, "kubetrain promote", "v1")
    assert list((registry / "v1").iterdir()) == [] and visible(registry) == ["v1"]


def test_2d_a_corrupt_model_leaves_the_registry_and_pointer_as_they_were(models, tmp_path, capsys):
    registry = tmp_path / "reg"
    assert promote(capsys, models["a"], registry, "v1")[0] == 0
    before = tree(registry)
    broken = tmp_path / "broken"
    shutil.copytree(models["b"], broken)
    data = bytearray((broken / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (broken / "model.safetensors").write_bytes(bytes(data))
    code, out, err = promote(capsys, broken, registry, "v2")
    assert code == 1
    one_line(err, "kubetrain promote", "model.safetensors")
    assert tree(registry) == before and visible(registry) == ["PROMOTED", "v1"]


def test_2e_another_model_under_a_taken_version_leaves_everything_as_it_was(
    models, tmp_path, capsys
):
    registry = tmp_path / "reg"
    assert promote(capsys, models["a"], registry, "v1", "--accuracy", "0.9")[0] == 0
    before = tree(registry)
    code, out, err = promote(capsys, models["b"], registry, "v1")
    assert code == 1
    one_line(err, "kubetrain promote", "v1", "new version")
    assert tree(registry) == before


# ============================================================= 3. races and idempotency
def test_3a_two_promotes_racing_to_one_local_version_leave_one_winner(models, tmp_path):
    """README: another model under an existing version is refused, locally even when two
    promotes race."""
    registry = tmp_path / "reg"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kubetrain",
                "promote",
                "--model",
                str(models[name]),
                "--registry",
                str(registry),
                "--version",
                "v1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for name in ("a", "b", "a", "b")
    ]
    results = [(p.wait(60), *p.communicate()) for p in procs]
    published = card_sha(registry / "v1")
    winner = "a" if published == card_sha(models["a"]) else "b"
    for name, (code, out, err) in zip("abab", results, strict=True):
        if name == winner:
            assert code == 0, err
        else:
            assert code == 1, out
            one_line(err, "kubetrain promote", "v1 already exists")
    from kubetrain.storage.integrity import sha256_file

    assert sha256_file(registry / "v1" / "model.safetensors") == published
    assert json.loads((registry / "PROMOTED").read_text())["sha256"] == published
    assert visible(registry) == ["PROMOTED", "v1"]


def test_3b_promoting_the_same_model_again_to_s3_is_a_no_op(models, s3_env, capsys):
    import boto3

    client = boto3.client("s3", endpoint_url=s3_env.endpoint_url)
    registry = f"s3://{BUCKET}/again"
    assert promote(capsys, models["a"], registry, "v1", "--accuracy", "0.97")[0] == 0
    pointer = client.get_object(Bucket=BUCKET, Key="again/PROMOTED")["Body"].read()
    time.sleep(1.1)  # a rewritten pointer would carry another promoted_at
    code, out, err = promote(capsys, models["a"], registry, "v1", "--accuracy", "0.97")
    assert code == 0, err
    assert client.get_object(Bucket=BUCKET, Key="again/PROMOTED")["Body"].read() == pointer


def test_3c_promoting_an_older_version_again_is_a_rollback(models, tmp_path, capsys):
    registry = tmp_path / "reg"
    for name, version in (("a", "v1"), ("b", "v2"), ("a", "v1")):
        assert promote(capsys, models[name], registry, version)[0] == 0
    pointer = json.loads((registry / "PROMOTED").read_text())
    assert (pointer["version"], pointer["sha256"]) == ("v1", card_sha(models["a"]))
    assert visible(registry) == ["PROMOTED", "v1", "v2"]


RUN = "kubetrain-training-h27xy"


def trainjob_of_run(k8s) -> str:
    from kubetrain.names import derive_job_name

    name = derive_job_name(RUN)
    k8s.backend().launch(make_spec(name))
    return name


def delete_cli(capsys, *args: str, backend: str = "trainer") -> tuple[int, str, str]:
    return run_cli(["delete", "--backend", backend, "--namespace", "default", *args], capsys)


def test_3d_the_exit_handler_run_twice_deletes_once_and_then_finds_nothing(kubeconfig, capsys):
    k8s = kubeconfig
    name = trainjob_of_run(k8s)
    set_container(k8s.emulator, node_pod(k8s.emulator, name), objects.running())
    args = ("--run-name", RUN, "--ignore-not-found", "--keep-complete")
    assert delete_cli(capsys, *args)[:2] == (0, f"deleted {name}\n")
    code, out, err = delete_cli(capsys, *args)
    assert code == 0, err
    assert "no TrainJob named" in out
    assert k8s.emulator.names("trainjobs") == set()


def test_3e_a_complete_job_survives_the_exit_handler_run_twice(kubeconfig, capsys):
    k8s = kubeconfig
    name = trainjob_of_run(k8s)
    complete(k8s.emulator, name)
    for _ in range(2):
        code, out, err = delete_cli(capsys, "--run-name", RUN, "--keep-complete")
        assert (code, out) == (0, f"job {name} completed, kept with its status and logs\n"), err
    assert k8s.emulator.names("trainjobs") == {name}
    assert k8s.emulator.requests("delete", "trainjobs") == []


# ============================================================================ 4. security
@pytest.mark.security
@pytest.mark.parametrize(
    "version",
    ["../escape", "..", ".", "a/b", "v1/..", "%2e%2e", "v1?x=1", "v1#frag", "v1\x00", "~root",
     "v 1", "Promoted", "\u2024\u2024"],
)  # fmt: skip
def test_4a_a_version_never_leaves_its_registry(models, tmp_path, capsys, version):
    registry = tmp_path / "box" / "reg"
    code, out, err = promote(capsys, models["a"], registry, version)
    assert code == 2, out
    one_line(err, "kubetrain promote", "version")
    assert tree(tmp_path) == {}


@pytest.mark.security
@pytest.mark.parametrize("version", ["../escape", "v1?versionId=1", "a/b"])
def test_4b_a_version_never_leaves_an_s3_registry(models, s3_env, capsys, version):
    code, out, err = promote(capsys, models["a"], f"s3://{BUCKET}/sec/reg", version)
    assert code == 2
    one_line(err, "kubetrain promote", "version")
    assert s3_env.keys(BUCKET, "sec/") == []


@pytest.mark.security
def test_4c_a_symlink_into_the_run_claim_is_refused(models, tmp_path, capsys):
    claim = tmp_path / "claim"
    claim.mkdir()
    (tmp_path / "lasting").symlink_to(claim)
    code, out, err = promote(capsys, models["a"], tmp_path / "lasting" / "registry", "v1",
                             "--run-claim-mount", str(claim))  # fmt: skip
    assert tree(claim) == {}, "nothing promoted onto the claim the run deletes"
    assert code == 2
    one_line(err, "kubetrain promote", "registry", "run's own claim")


@pytest.mark.security
def test_4d_a_sibling_folder_sharing_the_claims_prefix_is_not_the_claim(models, tmp_path, capsys):
    claim, sibling = tmp_path / "shared", tmp_path / "shared-registry"
    claim.mkdir()
    code, out, err = promote(capsys, models["a"], sibling / "reg", "v1",
                             "--run-claim-mount", str(claim))  # fmt: skip
    assert code == 0, err
    assert (sibling / "reg" / "v1" / "model.json").is_file()


@pytest.mark.security
def test_4e_a_relative_registry_inside_the_claim_is_refused(models, tmp_path, capsys, monkeypatch):
    claim = tmp_path / "claim"
    (claim / "work").mkdir(parents=True)
    monkeypatch.chdir(claim / "work")
    code, out, err = promote(capsys, models["a"], "../registry", "v1",
                             "--run-claim-mount", str(claim))  # fmt: skip
    assert code == 2
    one_line(err, "kubetrain promote", "registry", "run's own claim")
    assert tree(claim) == {}


@pytest.mark.security
def test_4f_a_model_file_linking_out_of_its_folder_is_never_read(models, tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(models["a"] / "model.json", model / "model.json")
    outside = tmp_path / "secret.safetensors"
    shutil.copy(models["a"] / "model.safetensors", outside)  # same bytes: a check would pass
    (model / "model.safetensors").symlink_to(outside)
    code, out, err = promote(capsys, model, tmp_path / "reg", "v1")
    assert code != 0, out
    one_line(err, "kubetrain promote", "model.safetensors")
    assert not (tmp_path / "reg" / "v1").exists()


@pytest.mark.security
@pytest.mark.usefixtures("no_hang")
def test_4g_a_fifo_model_file_fails_in_one_line_without_blocking(models, tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(models["a"] / "model.json", model / "model.json")
    os.mkfifo(model / "model.safetensors")
    code, out, err = promote(capsys, model, tmp_path / "reg", "v1")
    assert code != 0
    one_line(err, "kubetrain promote", "model.safetensors")


@pytest.mark.security
def test_4h_argo_promote_and_exit_templates_run_no_shell():
    """Parameters reach the CLI as argv entries, never through `sh -c`."""
    document = yaml.safe_load((REPO / "pipelines/compiled/training_workflow.yaml").read_text())
    for template in document["spec"]["templates"]:
        container = template.get("container") or template.get("script")
        if not container:
            continue
        command = [*container.get("command", []), *container.get("args", [])]
        assert not {"sh", "bash", "/bin/sh", "/bin/bash"} & set(container.get("command", [])), (
            template["name"]
        )
        assert not any(arg in ("-c", "-ec", "-xc") for arg in command), template["name"]


@pytest.mark.security
def test_4i_a_run_name_with_shell_metacharacters_deletes_nothing_else(kubeconfig, capsys):
    k8s = kubeconfig
    name = trainjob_of_run(k8s)
    code, out, err = delete_cli(capsys, "--run-name", f"{RUN}; kubectl delete trainjobs --all",
                                "--ignore-not-found", "--keep-complete")  # fmt: skip
    assert k8s.emulator.names("trainjobs") == {name}
    if code != 0:
        one_line(err, "kubetrain delete", "run")


# ======================================================================= 5. cluster states
def trainjob_in(k8s, state: str) -> str:
    name = trainjob_of_run(k8s)
    if state == "Running":
        set_container(k8s.emulator, node_pod(k8s.emulator, name), objects.running())
    elif state == "Suspended":
        k8s.emulator.patch("trainjobs", name, {"spec": {"suspend": True}})
        k8s.emulator.set_conditions(
            "trainjobs", name, [objects.condition("Suspended", reason="Suspended")]
        )
    elif state == "Failed":
        k8s.emulator.set_conditions(
            "trainjobs", name, [objects.condition("Failed", reason="FailedJobs", message="x")]
        )
    elif state == "CompleteFalse":  # a Complete condition that is not true
        k8s.emulator.set_conditions("trainjobs", name, [objects.condition("Complete", "False")])
    elif state == "FailedAfterComplete":  # stale Complete=False, then Failed
        k8s.emulator.set_conditions(
            "trainjobs",
            name,
            [objects.condition("Complete", "False"), objects.condition("Failed", reason="X")],
        )
    return name


@pytest.mark.parametrize(
    "state", ["Pending", "Running", "Suspended", "Failed", "CompleteFalse", "FailedAfterComplete"]
)
def test_5a_keep_complete_deletes_a_trainjob_in_any_other_state(kubeconfig, capsys, state):
    k8s = kubeconfig
    name = trainjob_in(k8s, state)
    code, out, err = delete_cli(capsys, "--run-name", RUN, "--keep-complete")
    assert (code, out) == (0, f"deleted {name}\n"), err
    assert k8s.emulator.names("trainjobs") == set()


def test_5b_keep_complete_keeps_a_complete_trainjob_by_name(kubeconfig, capsys):
    k8s = kubeconfig
    name = trainjob_of_run(k8s)
    complete(k8s.emulator, name)
    code, out, err = delete_cli(capsys, name, "--keep-complete")
    assert (code, out) == (0, f"job {name} completed, kept with its status and logs\n"), err
    assert k8s.emulator.names("trainjobs") == {name}


def test_5c_a_missing_job_fails_in_one_line_unless_ignored(kubeconfig, capsys):
    code, out, err = delete_cli(capsys, "--run-name", RUN, "--keep-complete")
    assert code != 0
    one_line(err, "kubetrain delete")
    code, out, err = delete_cli(capsys, "--run-name", RUN, "--keep-complete", "--ignore-not-found")
    assert code == 0, err


def test_5d_job_backend_complete_is_kept_running_is_deleted_with_its_service(kubeconfig, capsys):
    k8s = kubeconfig
    backend = k8s.backend("job")
    backend.launch(make_spec("done"))
    complete(k8s.emulator, "done", "jobs")
    backend.launch(make_spec("busy"))
    set_container(k8s.emulator, node_pod(k8s.emulator, "busy", 0, kind="job"), objects.running())
    code, out, err = delete_cli(capsys, "done", "--keep-complete", backend="job")
    assert (code, out) == (0, "job done completed, kept with its status and logs\n"), err
    code, out, err = delete_cli(capsys, "busy", "--keep-complete", backend="job")
    assert (code, out) == (0, "deleted busy\n"), err
    assert k8s.emulator.names("jobs") == {"done"}
    assert k8s.emulator.names("services") == {"done"}


def test_5e_pytorchjob_succeeded_is_kept_running_is_deleted(kubeconfig, capsys):
    k8s = kubeconfig
    k8s.emulator.install_training_operator()
    backend = k8s.backend("pytorchjob")
    backend.launch(make_spec("done"))
    k8s.emulator.set_conditions("pytorchjobs", "done", [objects.condition("Succeeded")])
    backend.launch(make_spec("busy"))
    k8s.emulator.set_conditions("pytorchjobs", "busy", [objects.condition("Running")])
    code, out, err = delete_cli(capsys, "done", "--keep-complete", backend="pytorchjob")
    assert (code, out) == (0, "job done completed, kept with its status and logs\n"), err
    code, out, err = delete_cli(capsys, "busy", "--keep-complete", backend="pytorchjob")
    assert (code, out) == (0, "deleted busy\n"), err
    assert k8s.emulator.names("pytorchjobs") == {"done"}


def test_5f_another_backends_name_finds_nothing_and_touches_the_trainjob_not(kubeconfig, capsys):
    k8s = kubeconfig
    name = trainjob_in(k8s, "Running")
    code, out, err = delete_cli(capsys, name, "--ignore-not-found", "--keep-complete",
                                backend="job")  # fmt: skip
    assert code == 0, err
    assert k8s.emulator.names("trainjobs") == {name}
    assert k8s.emulator.requests("delete", "trainjobs") == []


def kfp_exit(status_state: str, tmp_path: Path) -> None:
    from kfp.dsl.executor import Executor

    from kubetrain.components.wait_trainjob.component import delete_trainjob

    executor_input = {
        "inputs": {"parameterValues": {
            "run_name": RUN, "backend": "trainer", "namespace": "default",
            "status": {"state": status_state, "pipelineTaskName": "exit-handler-1",
                       "pipelineJobResourceName": RUN, "error": {}},
        }},
        "outputs": {"outputFile": str(tmp_path / "executor" / "executor_output.json")},
    }  # fmt: skip
    Executor(json.loads(json.dumps(executor_input)), delete_trainjob.python_func).execute()


@pytest.mark.parametrize(
    ("kfp_says", "job_state", "kept"),
    [("SUCCEEDED", "Running", False), ("FAILED", "Complete", True), ("CANCELED", "Complete", True),
     ("SUCCEEDED", "Failed", False), ("RUNNING", "Suspended", False)],
)  # fmt: skip
def test_5g_kfp_exit_task_decides_from_the_job_not_the_status_string(
    kubeconfig, tmp_path, capsys, kfp_says, job_state, kept
):
    k8s = kubeconfig
    name = trainjob_of_run(k8s) if job_state == "Complete" else trainjob_in(k8s, job_state)
    if job_state == "Complete":
        complete(k8s.emulator, name)
    kfp_exit(kfp_says, tmp_path)
    assert (k8s.emulator.names("trainjobs") == {name}) is kept, capsys.readouterr().out


def restarting_wait(k8s, restart_counts: list[int], oom_node: int):
    """Launch on an upstream-like runtime (no restartPolicy: JobSet's OnFailure; no
    backoffLimit: 6), then give each node a pod with its restart count, node ``oom_node``'s
    last run OOMKilled. Returns (thread, result, warnings)."""
    from kubetrain.backends.kubernetes.client import RetryPolicy
    from kubetrain.jobspec import RuntimeRef, TrainJobSpec

    k8s.emulator.create("clustertrainingruntimes", objects.torch_runtime("upstream"))
    warnings: list[str] = []
    backend = k8s.backend(warn=warnings.append, retry=RetryPolicy(attempts=2, first_delay=0.01))
    backend.launch(TrainJobSpec(name="demo", command=("true",), num_nodes=len(restart_counts),
                                runtime=RuntimeRef("upstream")))  # fmt: skip
    result: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: result.update(status=backend.wait("demo", 20, None)), daemon=True
    )
    thread.start()
    owner = k8s.emulator.get("trainjobs", "demo")
    for index, count in enumerate(restart_counts):
        pod = objects.node_pod("demo", index, owner=owner)
        created = k8s.emulator.create_pod(pod)["metadata"]["name"]
        if index == oom_node:
            state = objects.terminated(137, "OOMKilled")
        else:
            state = objects.running()
        status = objects.container_status(objects.DEFAULT_IMAGE, state, restart_count=count)
        k8s.emulator.set_pod_status(created, objects.pod_status("Running", [status]))
    return thread, result, warnings


def test_5h_an_oom_kill_within_the_backoff_limit_waits_for_the_restart(k8s):
    thread, result, warnings = restarting_wait(k8s, [2, 2], oom_node=1)
    time.sleep(2)
    assert thread.is_alive(), result
    assert any("OOMKilled" in w and "restarts it in place" in w for w in warnings), warnings
    k8s.emulator.set_conditions("trainjobs", "demo", [objects.condition("Failed", reason="X")])
    thread.join(10)


def test_5i_an_oom_kill_once_the_nodes_restarts_reach_backoff_limit_fails_early(k8s):
    """README: restarts in place until the restarts reach the Job's backoffLimit (6 when
    unset), counted over every node: 3 + 3 reached it, so no restart comes."""
    from kubetrain.backends.base import FAILED

    thread, result, warnings = restarting_wait(k8s, [3, 3], oom_node=1)
    thread.join(12)
    assert not thread.is_alive(), f"still waiting; said {warnings}"
    assert (result["status"].state, result["status"].reason) == (FAILED, "OOMKilled")


def test_5j_a_webhook_denial_on_launch_is_its_message_not_missing_rbac(kubeconfig, capsys):
    """A policy webhook (Gatekeeper's message shape) refuses the TrainJob: the API server
    answers 403 Forbidden with the webhook's words (kube_api.webhook_denial); launch must say
    those words in one line, not report a permission the ServiceAccount lacks."""
    from tests.support.kube_api import webhook_denial

    k8s = kubeconfig
    said = '[require-team-label] you must provide labels: {"team"}'

    def gatekeeper(resource: Any, obj: dict, old: dict | None) -> None:
        if resource.plural == "trainjobs" and "team" not in obj["metadata"].get("labels", {}):
            raise webhook_denial("validation.gatekeeper.sh", said)

    k8s.emulator.call(k8s.emulator.api.admission.append, gatekeeper)
    code, out, err = run_cli(["launch", "--backend", "trainer", "--name", "denied",
                              "--", "true"], capsys)  # fmt: skip
    assert code != 0
    line = one_line(err, "kubetrain launch", said, "validation.gatekeeper.sh")
    assert "permission denied" not in line and "render rbac" not in line, line
    assert k8s.emulator.names("trainjobs") == set()
    code, out, err = run_cli(["launch", "--backend", "trainer", "--name", "allowed",
                              "--label", "team=ml", "--", "true"], capsys)  # fmt: skip
    assert code == 0, err


# ========================================================== 6. consistency across faces
@pytest.mark.parametrize("face", list(RENDERS))
def test_6a_every_rendered_node_pod_opts_out_of_istio(capsys, face):
    kind, *args = RENDERS[face]
    (doc,) = [d for d in render(capsys, kind, *args, "--name", "demo") if d["kind"] != "Service"]
    templates = pod_templates(doc)
    assert templates
    for template in templates:
        assert template["metadata"]["annotations"][ISTIO] == "false"


@pytest.mark.parametrize("face", list(RENDERS))
def test_6b_the_istio_label_brings_the_sidecar_back_on_every_face(capsys, face):
    kind, *args = RENDERS[face]
    docs = render(capsys, kind, *args, "--name", "demo", "--pod-label", f"{ISTIO}=true")
    (doc,) = [d for d in docs if d["kind"] != "Service"]
    for template in pod_templates(doc):
        assert template["metadata"]["labels"][ISTIO] == "true"


def test_6c_every_shipped_runtime_opts_out_of_istio_with_our_restart_rule(capsys):
    runtimes = render(capsys, "runtimes")
    assert {r["metadata"]["name"] for r in runtimes} == {
        "torch-ddp-cpu", "torch-ddp-gpu", "torch-fsdp-gpu", "torch-ddp-gpu-gang",
        "kubetrain-deepspeed-mpi"}  # fmt: skip
    for runtime in runtimes:
        assert runtime["metadata"]["labels"]["app.kubernetes.io/part-of"] == "kubetrain"
        jobset = runtime["spec"]["template"]["spec"]
        assert "failurePolicy" not in jobset
        for rj in jobset["replicatedJobs"]:
            assert rj["template"]["spec"]["backoffLimit"] == 0
            pod = rj["template"]["spec"]["template"]
            assert pod["spec"]["restartPolicy"] == "Never"
            assert pod["metadata"]["annotations"][ISTIO] == "false"


@pytest.mark.parametrize("face", list(RENDERS))
def test_6d_pet_max_restarts_is_passed_on_every_face(capsys, face):
    kind, *args = RENDERS[face]
    docs = render(capsys, kind, *args, "--name", "demo", "--env", "PET_MAX_RESTARTS=3",
                  "--env", "PET_RDZV_BACKEND=c10d")  # fmt: skip
    (doc,) = [d for d in docs if d["kind"] != "Service"]
    env = node_env(doc)
    assert env.get("PET_MAX_RESTARTS") == "3" and env.get("PET_RDZV_BACKEND") == "c10d", env


SHOW_ENV = "import os; print('seen PET_MAX_RESTARTS=' + os.environ.get('PET_MAX_RESTARTS', '-'))"


def test_6e_pet_max_restarts_reaches_the_local_processes(local_root, capsys):
    code, out, err = run_cli(["launch", "--name", "petenv", "--nodes", "1",
                              "--env", "PET_MAX_RESTARTS=3", "--",
                              sys.executable, "-c", SHOW_ENV], capsys)  # fmt: skip
    assert code == 0, err
    code, out, err = run_cli(["wait", "petenv", "--timeout", "30"], capsys)
    assert code == 0, err
    assert "seen PET_MAX_RESTARTS=3" in out


def test_6f_trainjob_pods_carry_the_opt_out_and_pet_max_restarts_reaches_them(
    kubeconfig, tmp_path, capsys, monkeypatch
):
    """The TrainJobs launch creates, on our runtime and on an upstream-like one without the
    annotation, give the node pod template the opt-out once the Trainer merges their
    runtimePatches into the runtime (strategically, as trainer_build does); the label is
    there where asked for; PET_MAX_RESTARTS reaches the process (through the fake Trainer).
    The fake Trainer's pods carry no template annotations (objects.node_pod takes none), so
    the merged template is checked, not its pods."""
    from tests.support.fake_trainer import FakeTrainer
    from tests.support.trainer_build import strategic_merge

    k8s = kubeconfig
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    k8s.emulator.create("clustertrainingruntimes", objects.torch_runtime("upstream"))
    launch = ["launch", "--backend", "trainer", "--nodes", "1", "--env", "PET_MAX_RESTARTS=3"]
    cases = {"ours": [], "theirs": ["--runtime", "upstream"],
             "labelled": ["--runtime", "upstream", "--pod-label", f"{ISTIO}=true"]}  # fmt: skip
    with FakeTrainer(k8s.emulator, tmp_path / "nodes") as trainer:
        for name, extra in cases.items():
            code, out, err = run_cli([*launch, *extra, "--name", name, "--",
                                      "python", "-c", SHOW_ENV], capsys)  # fmt: skip
            assert code == 0, err
        code, out, err = run_cli(["wait", "--backend", "trainer", "--timeout", "60", "theirs"],
                                 capsys)  # fmt: skip
        assert code == 0, err
        assert "seen PET_MAX_RESTARTS=3" in out, out
    assert trainer.errors == []
    for name in cases:
        trainjob = k8s.emulator.get("trainjobs", name)
        runtime = k8s.emulator.get(
            "clustertrainingruntimes", trainjob["spec"]["runtimeRef"]["name"], namespace=""
        )
        spec = runtime["spec"]
        for patch in trainjob["spec"]["runtimePatches"]:
            spec = strategic_merge(spec, patch["trainingRuntimeSpec"])
        (node,) = [rj for rj in spec["template"]["spec"]["replicatedJobs"] if rj["name"] == "node"]
        metadata = node["template"]["spec"]["template"]["metadata"]
        assert metadata["annotations"][ISTIO] == "false", name
        assert (metadata["labels"].get(ISTIO) == "true") is (name == "labelled"), name
        pods = [
            pod
            for pod in k8s.emulator.list("pods")
            if pod["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name
        ]
        assert pods, name  # the pods JobSet made carry the merged template's annotation
        assert all(pod["metadata"]["annotations"][ISTIO] == "false" for pod in pods), name


def test_6g_argo_workflow_promotes_off_the_run_claim_and_the_template_on_its_claim():
    """README: the Workflow mounts registry_pvc at /mnt/registry-pvc, model_registry defaults
    to /mnt/registry-pvc/registry and the run's claim is passed as run_claim_mount; the
    WorkflowTemplate keeps /mnt/shared/registry."""
    compiled = REPO / "pipelines" / "compiled"
    workflow = yaml.safe_load((compiled / "training_workflow.yaml").read_text())
    template = yaml.safe_load((compiled / "training_workflow_template.yaml").read_text())

    def params(doc: dict) -> dict[str, str]:
        return {p["name"]: p.get("value") for p in doc["spec"]["arguments"]["parameters"]}

    assert params(workflow)["registry_pvc"] == "kubetrain-shared"
    assert params(workflow)["model_registry"] == "/mnt/registry-pvc/registry"
    assert params(template)["model_registry"] == "/mnt/shared/registry"
    volumes = workflow["spec"].get("volumes", [])
    claims = [
        v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v
    ]
    assert "{{workflow.parameters.registry_pvc}}" in claims

    def promote_task(doc: dict) -> dict[str, str]:
        for t in doc["spec"]["templates"]:
            for task in (t.get("dag") or {}).get("tasks", []):
                if "promote" in task["name"]:
                    return {a["name"]: a.get("value") for a in task["arguments"]["parameters"]}
        raise AssertionError("no promote task")

    assert promote_task(workflow)["run_claim_mount"] == "/mnt/shared"
    assert promote_task(template).get("run_claim_mount", "") in ("", None)


@pytest.mark.filterwarnings("ignore:The `json` method is deprecated")
def test_6h_submit_argo_and_promote_agree_on_what_is_the_run_claim(argo, models, capsys):
    """A registry submit argo sends (a sibling of the claim mount) promote also accepts, and
    one promote refuses (on the claim) submit argo refuses too."""
    sibling = "/mnt/shared-registry/r"
    code, out, err = run_cli(["submit", "argo", "--host", argo.url,
                              "--param", f"model_registry={sibling}"], capsys)  # fmt: skip
    assert code == 0, err
    code, out, err = promote(capsys, models["a"], "/mnt/shared/./r", "v1",
                             "--run-claim-mount", "/mnt/shared")  # fmt: skip
    assert code == 2
    code, out, err = run_cli(["submit", "argo", "--host", argo.url,
                              "--param", "model_registry=/mnt/shared/./r"], capsys)  # fmt: skip
    assert code == 2


def test_6i_promote_output_and_parameters_match_the_readme(models, tmp_path, capsys):
    registry = tmp_path / "reg"
    outputs = ["--accuracy", "0.969", "--output-parameters", str(tmp_path / "o")]
    code, out, err = promote(capsys, models["a"], f"file://{registry}", "2024-06-01", *outputs)
    assert code == 0, err
    sha = card_sha(models["a"])
    assert out == f"promoted 2024-06-01 (sha256 {sha}) to {registry}/2024-06-01\n"
    assert (tmp_path / "o" / "promoted_to").read_text() == f"{registry}/2024-06-01"
    assert (tmp_path / "o" / "sha256").read_text() == sha
    pointer = json.loads((registry / "PROMOTED").read_text())
    assert pointer["format"] == "kubetrain.promoted/v1" and pointer["accuracy"] == 0.969
    assert pointer["promoted_at"].endswith("+00:00")


# ============================================================================ 7. packaging
def kustomized() -> list[dict]:
    built = subprocess.run(["/usr/bin/kubectl", "kustomize", str(REPO / "runtimes")],
                           capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return [d for d in yaml.safe_load_all(built.stdout) if d]


def by_name(docs: list[dict]) -> dict[str, dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.mark.skipif(not Path("/usr/bin/kubectl").exists(), reason="needs kubectl")
def test_7a_kubectl_kustomize_builds_what_render_runtimes_prints(capsys):
    assert by_name(kustomized()) == by_name(render(capsys, "runtimes"))


def test_7b_every_runtime_file_is_in_the_kustomization():
    listed = yaml.safe_load((REPO / "runtimes" / "kustomization.yaml").read_text())["resources"]
    files = {p.name for p in (REPO / "runtimes").glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(listed) == sorted(files)


@pytest.mark.skipif(not Path("/usr/bin/kubectl").exists(), reason="needs kubectl")
def test_7c_the_wheels_runtimes_folder_builds_with_kustomize_as_the_checkout_does(tmp_path):
    """`kubectl apply -k` on the installed package's runtimes folder (no checkout)."""
    pytest.importorskip("setuptools", minversion="68")
    source = tmp_path / "source"
    for folder in ("kubetrain", "components", "pipelines", "runtimes"):
        shutil.copytree(REPO / folder, source / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet",
                    "wheel", "--no-deps", "--no-index", "--no-build-isolation",
                    "-w", str(tmp_path / "wheels"), str(source)],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    (wheel,) = (tmp_path / "wheels").glob("kubetrain-*.whl")
    unpacked = tmp_path / "unpacked"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    built = subprocess.run(["/usr/bin/kubectl", "kustomize", str(unpacked / "kubetrain/runtimes")],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert by_name([d for d in yaml.safe_load_all(built.stdout) if d]) == by_name(kustomized())
