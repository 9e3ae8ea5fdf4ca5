"""Launch turns a request into a job spec running torchrun -m kubetrain.train."""

from __future__ import annotations

import json
import sys

import pytest

from kubetrain.components.launch_trainjob.launch import (
    LaunchRequest,
    TrainingOptions,
    launch,
    parse_pairs,
    resolve_job_name,
)
from kubetrain.errors import InvalidInput


def test_launch_records_a_torchrun_spec_and_returns_at_once(local_root, digits_dir):
    result = launch(
        LaunchRequest(
            TrainingOptions(data_dir=str(digits_dir), strategy="fsdp", epochs=1),
            name="fsdp-one",
            nodes=2,
            procs_per_node=2,
        )
    )
    assert result.job_name == "fsdp-one"
    assert result.checkpoint_dir == str(local_root / "fsdp-one" / "checkpoints")
    spec = json.loads((local_root / "fsdp-one" / "job.json").read_text())["spec"]
    assert spec["command"] == ["torchrun", "-m", "kubetrain.train"]
    args = spec["args"]
    assert args[args.index("--strategy") + 1] == "fsdp"
    assert args[args.index("--data") + 1] == str(digits_dir)
    assert (spec["num_nodes"], spec["procs_per_node"]) == (2, 2)
    from kubetrain.backends.local.backend import LocalBackend

    LocalBackend().delete("fsdp-one")


def test_names_derive_from_the_run_so_a_retry_finds_its_job():
    assert resolve_job_name("", "run-1") == resolve_job_name("", "run-1")
    assert resolve_job_name("mine", "run-1") == "mine"
    assert resolve_job_name("", "").startswith("kubetrain-")


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"data_dir": ""}, "data"),
        ({"strategy": "zero3"}, "strategy"),
        ({"epochs": 0}, "epochs"),
        ({"batch_size": 0}, "batch_size"),
        ({"lr": 0.0}, "lr"),
        ({"keep_checkpoints": -1}, "keep_checkpoints"),
    ],
)
def test_bad_training_options_create_nothing(local_root, options, field):
    with pytest.raises(InvalidInput) as refused:
        launch(LaunchRequest(TrainingOptions(**{"data_dir": "/data", **options}), name="never"))
    assert refused.value.field == field
    assert not (local_root / "never").exists()


def test_keep_checkpoints_reaches_the_trainer_from_the_cli_and_the_argo_template():
    from kubetrain.cli import build_parser
    from kubetrain.components.launch_trainjob.cli import request_from_args
    from kubetrain.components.launch_trainjob.template import launch_trainjob_template

    def kept(*extra: str) -> str:
        args = build_parser().parse_args(["launch", "--data", "/data", *extra])
        trainer_args = request_from_args(args).training.trainer_args("/ckpt")
        return trainer_args[trainer_args.index("--keep-checkpoints") + 1]

    assert (kept(), kept("--keep-checkpoints", "0")) == ("3", "0")
    template = launch_trainjob_template()
    (default,) = [p.default for p in template.inputs if p.name == "keep_checkpoints"]
    argv = template.args
    assert default == "3"
    assert argv[argv.index("--keep-checkpoints") + 1] == "{{inputs.parameters.keep_checkpoints}}"


def test_bad_topology_creates_nothing(local_root):
    with pytest.raises(InvalidInput, match="nodes"):
        launch(LaunchRequest(TrainingOptions(data_dir="/data"), name="never", nodes=0))
    assert not (local_root / "never").exists()


def test_the_pipeline_face_refuses_what_local_nodes_would(local_root, digits_dir, tmp_path):
    """launch (the KFP component's road too) refuses what our trainer's local nodes would."""
    (tmp_path / "a-file").write_text("not a folder\n")
    cases = [
        ({"data_dir": str(tmp_path)}, "data"),
        ({"data_dir": str(digits_dir), "model": "kt_no_such_module:build"}, "model"),
        ({"data_dir": str(digits_dir), "checkpoint_dir": str(tmp_path / "a-file" / "c")},
         "checkpoint_dir"),
    ]  # fmt: skip
    for options, field in cases:
        with pytest.raises(InvalidInput) as refused:
            launch(LaunchRequest(TrainingOptions(**options), name="never"))
        assert refused.value.field == field
    assert not (local_root / "never").exists()


def test_env_pairs_must_be_key_value():
    assert parse_pairs(["A=1", "B=x=y"], "--env") == {"A": "1", "B": "x=y"}
    with pytest.raises(InvalidInput, match="--env"):
        parse_pairs(["NOVALUE"], "--env")


def test_a_shared_volume_gets_the_dataset_and_the_checkpoints(
    k8s, digits_dir, tmp_path, monkeypatch
):
    """On a cluster backend, a local dataset is copied onto the claim the step shares with the
    nodes, which mount it at the same path; checkpoints default to it too."""
    from kubetrain.artifacts.datasets import read_manifest
    from kubetrain.jobspec import Volume

    monkeypatch.setenv("KUBECONFIG", str(k8s.emulator.write_kubeconfig(tmp_path / "kubeconfig")))
    shared = tmp_path / "shared"
    volume = Volume(name="shared", claim_name="kubetrain-shared", mount_path=str(shared))
    run_name = "kubetrain-training-2026-11-23-09-10-00-685339"
    request = LaunchRequest(
        TrainingOptions(data_dir=str(digits_dir), epochs=1),
        name="staged",
        nodes=1,
        shared_volume=volume,
        run_name=run_name,
    )
    result = launch(request, backend="trainer")
    staged = shared / "datasets" / "staged"
    assert read_manifest(staged) == read_manifest(digits_dir)
    assert result.checkpoint_dir == str(shared / "checkpoints" / "staged")
    trainjob = k8s.emulator.get("trainjobs", "staged")
    args = trainjob["spec"]["trainer"]["args"]
    assert args[args.index("--data") + 1] == str(staged)
    assert args[args.index("--checkpoint-dir") + 1] == result.checkpoint_dir
    assert "kubetrain-shared" in json.dumps(trainjob["spec"]["runtimePatches"])
    assert trainjob["metadata"]["labels"]["kubetrain.io/run-name"] == run_name


def test_a_dataset_already_on_the_shared_volume_is_not_copied(k8s, tmp_path, monkeypatch):
    """The Argo workflow's prep step writes onto the claim: launch uses it where it is."""
    from kubetrain.backends import get_backend
    from kubetrain.components.launch_trainjob.launch import plan_launch
    from kubetrain.jobspec import Volume

    volume = Volume(name="shared", claim_name="c", mount_path="/mnt/shared")
    request = LaunchRequest(
        TrainingOptions(data_dir="/mnt/shared/datasets/run-1"), name="j", shared_volume=volume
    )
    plan = plan_launch(request, "trainer", get_backend("trainer"))
    assert (plan.stage_from, plan.stage_to) == ("", "")
    assert plan.spec.args[plan.spec.args.index("--data") + 1] == "/mnt/shared/datasets/run-1"
    assert plan.checkpoint_dir == "/mnt/shared/checkpoints/j"
    local = plan_launch(request, "local", get_backend("local"))
    assert local.spec.volumes == () and local.checkpoint_dir.endswith("/j/checkpoints")


def test_a_users_program_runs_in_its_checkpoint_folder_and_is_told_the_folders(
    local_root, digits_dir, tmp_path, monkeypatch, capsys
):
    """An unmodified script that saves into its working directory saves where collect reads;
    it finds the dataset and the checkpoint folder in KUBETRAIN_DATA_DIR/CHECKPOINT_DIR, and
    `python save.py` still finds save.py (resolved in the folder launch ran in)."""
    from kubetrain.backends.local.backend import LocalBackend
    from kubetrain.cli import main as kubetrain_main

    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "save.py").write_text(
        "import json, os\n"
        "seen = {k: os.environ[k] for k in ('KUBETRAIN_DATA_DIR', 'KUBETRAIN_CHECKPOINT_DIR')}\n"
        "seen['cwd'] = os.getcwd()\n"
        "open('model.pt', 'w').write(json.dumps(seen))\n"
    )
    monkeypatch.chdir(workspace)
    options = ["--name", "own-program", "--nodes", "1", "--data", str(digits_dir)]
    assert kubetrain_main(["launch", *options, "--", sys.executable, "save.py"]) == 0
    assert LocalBackend().wait("own-program", timeout=60).state == "Complete"
    checkpoints = local_root / "own-program" / "checkpoints"
    seen = json.loads((checkpoints / "model.pt").read_text())
    assert seen == {
        "KUBETRAIN_DATA_DIR": str(digits_dir),
        "KUBETRAIN_CHECKPOINT_DIR": str(checkpoints),
        "cwd": str(checkpoints),
    }
    assert not (workspace / "model.pt").exists()
    out, err = capsys.readouterr()
    assert out == "own-program\n"  # JOB=$(kubetrain launch ...) gets the name alone
    assert f"checkpoints: {checkpoints}" in err
    LocalBackend().delete("own-program")
