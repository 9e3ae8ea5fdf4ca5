"""Issue 31 (1, 3, 4, 7): `--launcher ray` and `--backend rayjob` on every face (`kubetrain
launch`, `render`, `run`, `submit kfp|argo`, the KFP component, the Argo template), each reaching
the one ``LaunchRequest`` launch plans from; what Ray cannot run refused in one line before
anything is created: ray off a RayJob or this machine, mpi on a RayJob, elastic nodes, a program
that starts ranks itself as the Ray entrypoint."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from kubetrain.cli import build_parser
from kubetrain.cli.param_option import check_launcher
from kubetrain.components.launch_trainjob import launch as launch_module
from kubetrain.components.launch_trainjob.cli import request_from_args
from kubetrain.components.launch_trainjob.launch import LaunchRequest, TrainingOptions
from kubetrain.components.launch_trainjob.template import launch_trainjob_template
from kubetrain.errors import InvalidInput
from kubetrain.jobspec import TrainJobSpec
from kubetrain.render import launcher_for, refuse_launcher
from kubetrain.train.options import RAY_TRAINER_COMMAND
from tests.support.faces import (
    accepted,
    component_requests,
    pipeline_parameters_of_run,
    refused,
    refused_run,
)

BACKENDS = ("local", "trainer", "job", "pytorchjob", "rayjob")
LAUNCHERS = ("torchrun", "mpi", "ray")


def test_launch_and_render_turn_the_option_into_the_request():
    parser = build_parser()
    for command in (["launch"], ["render", "trainjob"]):
        request = request_from_args(parser.parse_args([*command, "--launcher", "ray"]))
        assert request.launcher == "ray", command


def test_the_kfp_component_and_the_argo_template_pass_it(monkeypatch, tmp_path):
    (request,) = component_requests(monkeypatch, tmp_path, {"launcher": "ray"})
    assert request.launcher == "ray"
    template = launch_trainjob_template()
    assert "--launcher" in template.args and "{{inputs.parameters.launcher}}" in template.args


def test_kubetrain_run_gives_it_to_the_pipeline(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(tmp_path / "jobs"))
    given = pipeline_parameters_of_run(monkeypatch, ["run", "--launcher", "ray", "--output", "r"])
    assert (given["launcher"], given["backend"]) == ("ray", "local")


def test_our_trainer_runs_as_the_ray_entrypoint_with_every_nodes_workers():
    """Under ray our trainer is the Ray job's driver (one), and Ray Train's workers are every
    node's processes: `--num-workers NODES x PROCS`, `--use-gpu` with GPUs."""
    request = LaunchRequest(
        training=TrainingOptions(data_dir="/mnt/shared/data", checkpoint_dir="/mnt/shared/ck"),
        name="demo",
        nodes=3,
        procs_per_node=2,
        launcher="ray",
    )
    plan = launch_module.plan_launch(request, "local", launch_module.get_backend("local"))
    spec = plan.spec
    assert (spec.launcher, spec.command) == ("ray", RAY_TRAINER_COMMAND)
    assert spec.args[-2:] == ("--num-workers", "6"), spec.args
    assert "--use-gpu" not in spec.args
    assert spec.ray_entrypoint.startswith("python -m kubetrain.train.ray --data /mnt/shared/data")


def test_the_ray_entrypoint_is_quoted_word_by_word():
    """Ray runs a job's entrypoint with a shell: a word of the user's command is never code."""
    spec = TrainJobSpec(
        name="demo",
        command=("python", "train.py"),
        args=("--tag", "$(rm -rf ~); `id` | x"),
        working_dir="/mnt/shared/run one",
        launcher="ray",
    ).validate()
    assert spec.ray_entrypoint == (
        "mkdir -p -- '/mnt/shared/run one' && cd -- '/mnt/shared/run one' && "
        "python train.py --tag '$(rm -rf ~); `id` | x'"
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_the_launcher_check_agrees_with_launch(backend, launcher):
    """`submit`'s and `run`'s check (check_launcher) refuses exactly what plan_launch refuses
    (procs given: mpi's auto rule is another test's)."""
    values = {"launcher": launcher, "backend": backend, "procs_per_node": "1"}
    checked = accepted(lambda: check_launcher(values, str))
    planned = accepted(lambda: refuse_launcher(SimpleNamespace(launcher=launcher), backend))
    allowed = {
        "torchrun": set(BACKENDS),  # on a RayJob it means the backend's own: ray
        "mpi": {"trainer", "local"},
        "ray": {"rayjob", "local"},
    }[launcher]
    assert checked == planned == (backend in allowed), (launcher, backend)
    if planned:
        assert launcher_for(launcher, backend) == ("ray" if backend == "rayjob" else launcher)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("options", "line"),
    [
        (["--launcher", "ray", "--backend", "trainer"],
         "launcher: ray is not run by backend 'trainer'; use backend rayjob or local"),
        (["--launcher", "ray", "--backend", "pytorchjob"],
         "launcher: ray is not run by backend 'pytorchjob'"),
        (["--launcher", "ray", "--backend", "job"], "launcher: ray is not run by backend 'job'"),
        (["--launcher", "mpi", "--backend", "rayjob", "--procs-per-node", "1"],
         "launcher: 'mpi' is not run by backend rayjob: a RayJob's workers are started by Ray "
         "Train; leave the launcher out (rayjob runs ray), or use backend trainer or local"),
        (["--launcher", "ray", "--nodes", "1:2", "--max-restarts", "2"],
         "nodes: 1:2 is elastic, and kubetrain runs a Ray job on a fixed worker group"),
        (["--backend", "rayjob", "--nodes", "1:2", "--max-restarts", "2"],
         "nodes: 1:2 asks for an elastic job, and kubetrain runs a RayJob on a fixed worker"),
        (["--launcher", "ray", "--", "torchrun", "train.py"],
         "command: runs torchrun, which starts ranks itself, and under Ray, Ray Train starts "
         "the workers"),
        (["--launcher", "ray", "--", "python", "-m", "torch.distributed.run", "train.py"],
         "command: runs python -m torch.distributed.run, which starts ranks itself"),
        (["--launcher", "rays"], "launcher: 'rays' is unknown; use torchrun (the default), mpi "
         "or ray"),
    ],
)  # fmt: skip
def test_launch_refuses_what_ray_cannot_run_in_one_line_creating_nothing(
    capsys, monkeypatch, tmp_path, options, line
):
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(tmp_path / "jobs"))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    (tmp_path / "data").mkdir()
    got = refused(capsys, ["launch", "--data", str(tmp_path / "data"), *options])
    assert line in got and got.startswith("kubetrain launch"), got
    assert not (tmp_path / "jobs").exists()


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("options", "line"),
    [
        (["--launcher", "ray", "--backend", "trainer", "--storage", "s3://bucket/runs"],
         "--launcher: ray is not run by backend 'trainer'"),
        (["--launcher", "mpi", "--backend", "rayjob", "--storage", "s3://bucket/runs"],
         "--launcher: 'mpi' is not run by backend rayjob"),
        (["--launcher", "ray", "--nodes", "1:2", "--max-restarts", "2"],
         "--nodes: 1:2 is elastic, and kubetrain runs a Ray job on a fixed worker group"),
        (["--backend", "rayjob"], "--storage: it is not given: "),
    ],
)  # fmt: skip
def test_run_refuses_them_before_any_step(capsys, monkeypatch, tmp_path, options, line):
    got = refused_run(capsys, monkeypatch, tmp_path, options)
    assert line in got, got


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("params", "line"),
    [
        (["launcher=ray"], "--param launcher: ray is not run by backend 'trainer'"),
        (["launcher=mpi", "backend=rayjob", "procs_per_node=1"],
         "--param launcher: 'mpi' is not run by backend rayjob"),
        (["backend=rayjob", "nodes=1:2", "max_restarts=1"],
         "--param nodes: 1:2 asks for an elastic job, and kubetrain runs a RayJob"),
        (["launcher=ray", "backend=local", "nodes=1:2", "max_restarts=1"],
         "--param nodes: 1:2 is elastic, and kubetrain runs a Ray job on a fixed worker group"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("target", ["kfp", "argo"])
def test_submit_refuses_them_before_contacting_the_server(capsys, target, params, line):
    """127.0.0.1:9 (discard) answers nothing: a value let through would fail differently."""
    argv = ["submit", target, "--host", "http://127.0.0.1:9"]
    got = refused(capsys, [*argv, *[f"--param={p}" for p in params]])
    assert line in got, got


@pytest.mark.bad_input
def test_a_spec_made_without_launch_is_refused_too():
    """The spec's own rules (a program starting ranks, elastic nodes) hold for a RayJob spec
    built by hand, as render and the backends get it."""
    for spec, message in (
        (TrainJobSpec(name="d", command=("deepspeed", "t.py"), launcher="ray"),
         "command: runs deepspeed, which starts ranks itself"),
        (TrainJobSpec(name="d", command=("python", "t.py"), launcher="ray", num_nodes=2,
                      min_nodes=1, max_restarts=1),
         "nodes: 1:2 is elastic, and kubetrain runs a Ray job"),
    ):  # fmt: skip
        with pytest.raises(InvalidInput, match=re.escape(message)):
            spec.validate()


@pytest.mark.parametrize(
    ("program", "starter"),
    [
        (["python", "-m", "torch.distributed.run", "t.py"], "python -m torch.distributed.run"),
        (["python", "-mtorch.distributed.run", "t.py"], "python -m torch.distributed.run"),
        (["python3", "-u", "-mdeepspeed.launcher.runner"], "python -m deepspeed.launcher.runner"),
        (["python", "-mmy_ray_driver"], ""),
        (["python", "-m", "my_ray_driver"], ""),
        (["python", "train.py", "-mtorch.distributed.run"], ""),  # the script's own argument
    ],
)
def test_a_module_glued_to_dash_m_is_read_as_python_reads_it(program, starter):
    """`python -mMODULE` runs MODULE as `python -m MODULE` does (hostile review, issue 31)."""
    from kubetrain.jobspec import rank_starter

    assert rank_starter(program) == starter
