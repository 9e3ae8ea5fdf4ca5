"""Issue 29 (5, 7): `--strategy deepspeed`, `--zero-stage`, `--deepspeed-config` and
`--launcher` on every face (`kubetrain launch`, `render`, `run`, `submit kfp|argo`, the KFP
component and pipeline, the Argo template and workflow), each reaching the one
``LaunchRequest`` launch plans from; bad values refused in one line before anything starts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from kubetrain.cli import build_parser
from kubetrain.cli import main as kubetrain_main
from kubetrain.cli.param_option import VALUE_RULES, check_launcher
from kubetrain.components.launch_trainjob.cli import request_from_args
from kubetrain.components.launch_trainjob.component import launch_trainjob
from kubetrain.components.launch_trainjob.launch import (
    LaunchRequest,
    TrainingOptions,
    render_launch,
)
from kubetrain.components.launch_trainjob.template import launch_trainjob_template
from kubetrain.jobspec import MPI_RUNTIME, TrainJobSpec
from kubetrain.pipelines.training_workflow import PARAMETERS
from kubetrain.render import MPI_BACKENDS
from kubetrain.rules import DEFAULT_ZERO_STAGE, LAUNCHERS, ZERO_STAGES
from tests.support.faces import (
    accepted,
    component_requests,
    pipeline_parameters_of_run,
    refused,
    refused_run,
)

CONFIG = '{"gradient_clipping": 1.0}'
#: The options of issue 29 as `kubetrain launch` takes them, and what the request then holds.
CHOSEN = [
    "--strategy", "deepspeed", "--zero-stage", "3", "--deepspeed-config", CONFIG,
    "--launcher", "mpi", "--procs-per-node", "2",
]  # fmt: skip


def chosen(request: LaunchRequest) -> tuple[str, int, str, str]:
    training = request.training
    return (training.strategy, training.zero_stage, training.deepspeed_config, request.launcher)


EXPECTED = ("deepspeed", 3, CONFIG, "mpi")


def test_launch_and_render_turn_the_options_into_the_request():
    parser = build_parser()
    for command in (["launch"], ["render", "trainjob"], ["render", "pytorchjob"]):
        assert chosen(request_from_args(parser.parse_args([*command, *CHOSEN]))) == EXPECTED
        defaults = request_from_args(parser.parse_args(command))
        assert chosen(defaults) == ("ddp", DEFAULT_ZERO_STAGE, "", "torchrun"), command


def test_the_kfp_component_turns_its_inputs_into_the_request(monkeypatch, tmp_path):
    chosen_inputs = {
        "strategy": "deepspeed", "zero_stage": 3, "deepspeed_config": CONFIG, "launcher": "mpi",
        "procs_per_node": "2",
    }  # fmt: skip
    requests = component_requests(monkeypatch, tmp_path, chosen_inputs, {})
    assert [chosen(r) for r in requests] == [EXPECTED, ("ddp", DEFAULT_ZERO_STAGE, "", "torchrun")]


def test_the_argo_template_passes_its_parameters_to_the_cli():
    template = launch_trainjob_template()
    defaults = {p.name: p.default for p in template.inputs}
    assert (defaults["zero_stage"], defaults["deepspeed_config"], defaults["launcher"]) == (
        str(DEFAULT_ZERO_STAGE), "", "torchrun",
    )  # fmt: skip
    values = {
        **{name: value or "1" for name, value in defaults.items()},
        "strategy": "deepspeed", "zero_stage": "3", "deepspeed_config": CONFIG,
        "launcher": "mpi", "procs_per_node": "2", "command": "[]", "env": "{}",
        "node_selector": "{}", "tolerations": "[]", "volumes": "[]", "labels": "{}",
        "pod_labels": "{}", "active_deadline_seconds": "",
    }  # fmt: skip
    argv = [
        re.sub(r"\{\{inputs\.parameters\.(\w+)\}\}", lambda m: values[m[1]], arg)
        for arg in template.args
    ]
    assert chosen(request_from_args(build_parser().parse_args(["launch", *argv]))) == EXPECTED


def test_the_kfp_pipeline_and_the_argo_workflow_declare_them_with_the_defaults():
    from kubetrain.pipelines.training_pipeline import training_pipeline

    pipeline = training_pipeline.pipeline_spec.root.input_definitions.parameters
    assert pipeline["zero_stage"].default_value.number_value == DEFAULT_ZERO_STAGE
    assert pipeline["deepspeed_config"].default_value.string_value == ""
    assert pipeline["launcher"].default_value.string_value == "torchrun"
    inputs = launch_trainjob.component_spec.inputs
    assert (inputs["zero_stage"].default, inputs["launcher"].default) == (
        DEFAULT_ZERO_STAGE, "torchrun",
    )  # fmt: skip
    assert PARAMETERS["zero_stage"][0] == str(DEFAULT_ZERO_STAGE)
    assert (PARAMETERS["deepspeed_config"][0], PARAMETERS["launcher"][0]) == ("", "torchrun")


def test_kubetrain_run_gives_them_to_the_pipeline(monkeypatch, tmp_path):
    """`kubetrain run`'s options are the pipeline's parameters (which reach the launch step:
    test_faces_parity.py); a config file goes as its JSON text, read here (the steps need not
    run in this folder)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(tmp_path / "jobs"))
    Path("ds.json").write_text(CONFIG)
    given = pipeline_parameters_of_run(
        monkeypatch,
        ["run", "--strategy", "deepspeed", "--zero-stage", "1", "--deepspeed-config", "ds.json",
         "--launcher", "mpi", "--procs-per-node", "2", "--output", str(tmp_path / "runs")],
    )  # fmt: skip
    assert (given["strategy"], given["zero_stage"], given["launcher"]) == ("deepspeed", 1, "mpi")
    assert json.loads(given["deepspeed_config"]) == json.loads(CONFIG)
    defaults = build_parser().parse_args(["run"])
    assert (defaults.zero_stage, defaults.deepspeed_config, defaults.launcher) == (
        DEFAULT_ZERO_STAGE, "", "torchrun",
    )  # fmt: skip


def test_render_trainjob_launcher_mpi_renders_the_mpi_job(capsys):
    """What `render trainjob --launcher mpi` prints is what render_launch plans: our trainer as
    one rank's program on our MPI runtime, with the DeepSpeed options as its arguments."""
    assert kubetrain_main(["render", "trainjob", "--name", "demo", *CHOSEN]) == 0
    (trainjob,) = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert trainjob["spec"]["runtimeRef"]["name"] == MPI_RUNTIME
    trainer = trainjob["spec"]["trainer"]
    argv = [*trainer.get("command", []), *trainer.get("args", [])]
    assert "kubetrain.train" in argv and "torchrun" not in argv
    ours = argv[argv.index("--strategy") :]
    assert ours[:2] == ["--strategy", "deepspeed"]
    assert ours[ours.index("--zero-stage") + 1] == "3"
    assert json.loads(ours[ours.index("--deepspeed-config") + 1]) == json.loads(CONFIG)
    assert trainer["numProcPerNode"] == 2


MPI_AUTO = "is auto with --launcher mpi and no GPU: the hostfile needs the slots per node"
ZERO_FIX = "is unknown; use 1, 2 or 3"


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("options", "line"),
    [
        (["--strategy", "deepspeed", "--zero-stage", "4"], f"zero_stage: 4 {ZERO_FIX}"),
        (["--strategy", "deepspeed", "--zero-stage", "0"], f"zero_stage: 0 {ZERO_FIX}"),
        (["--zero-stage", "two"], "--zero-stage: invalid int value: 'two'; give a whole number"),
        (["--launcher", "mpich", "--procs-per-node", "2"],
         "launcher: 'mpich' is unknown; use torchrun (the default), mpi or ray"),
        (["--launcher", "mpi"], f"procs_per_node: {MPI_AUTO}"),
        (["--strategy", "zero"], "strategy: 'zero' is unknown; use ddp, fsdp or deepspeed"),
    ],
)  # fmt: skip
def test_launch_refuses_bad_values_in_one_line_creating_nothing(
    capsys, monkeypatch, tmp_path, options, line
):
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(tmp_path / "jobs"))
    (tmp_path / "data").mkdir()
    got = refused(capsys, ["launch", "--data", str(tmp_path / "data"), *options])
    assert line in got and got.startswith("kubetrain launch"), got
    assert not (tmp_path / "jobs").exists()


@pytest.mark.bad_input
@pytest.mark.parametrize("backend", ["job", "pytorchjob"])
def test_render_refuses_launcher_mpi_on_a_backend_without_it(capsys, backend):
    """The backends' own refusal (Indexed Job, PyTorchJob: no launcher job, no hostfile),
    reached from the CLI; it names the backends that run mpi."""
    kind = "pytorchjob" if backend == "pytorchjob" else "trainjob"
    line = refused(
        capsys,
        ["render", kind, "--backend", backend, "--launcher", "mpi", "--procs-per-node", "2"],
    )
    assert "mpi" in line and "trainer" in line, line


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("options", "line"),
    [
        (["--zero-stage", "4"], "--zero-stage: invalid choice: 4; use one of 1, 2, 3"),
        (["--launcher", "mpich"],
         "--launcher: invalid choice: 'mpich'; use one of 'torchrun', 'mpi'"),
        (["--launcher", "mpi"], "--procs-per-node: is auto with launcher mpi and no GPU"),
        (["--launcher", "mpi", "--procs-per-node", "2", "--backend", "pytorchjob",
          "--storage", "s3://bucket/runs"],
         "--launcher: mpi is not run by backend 'pytorchjob'; use backend trainer or local"),
        (["--strategy", "deepspeed", "--deepspeed-config", "missing.json"],
         "missing.json does not exist; give a DeepSpeed JSON config file"),
        (["--strategy", "deepspeed", "--deepspeed-config", '{"zero_optimization": {"stage": 0}}'],
         "--deepspeed-config: zero_optimization.stage is 0; use stage 1, 2 or 3"),
        # 7 samples a step cannot be shared by 2 nodes x 1 process
        (["--strategy", "deepspeed", "--deepspeed-config", '{"train_batch_size": 7}'],
         "deepspeed_config: train_batch_size 7 is not a multiple of gradient_accumulation_steps "
         "1 x world size 2"),
        (["--strategy", "deepspeed", "--storage", "s3://bucket/runs"],
         "--storage: s3://bucket/runs is object storage, where DeepSpeed cannot save"),
    ],
)  # fmt: skip
def test_run_refuses_bad_values_in_one_line_before_any_step(
    capsys, monkeypatch, tmp_path, options, line
):
    got = refused_run(capsys, monkeypatch, tmp_path, options)
    assert line in got, got


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("params", "line"),
    [
        (["zero_stage=4"], "--param zero_stage: 4 is unknown; use 1, 2 or 3"),
        (["launcher=mpich"], "--param launcher: 'mpich' is unknown; use one of torchrun, mpi"),
        (["launcher=mpi"], "--param procs_per_node: is auto with launcher mpi and no GPU"),
        (["launcher=mpi", "procs_per_node=2", "backend=job"],
         "--param launcher: mpi is not run by backend 'job'"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("target", ["kfp", "argo"])
def test_submit_refuses_bad_values_before_contacting_the_server(capsys, target, params, line):
    """127.0.0.1:9 (discard) answers nothing: a value let through would fail differently."""
    argv = ["submit", target, "--host", "http://127.0.0.1:9"]
    got = refused(capsys, [*argv, *[f"--param={p}" for p in params]])
    assert line in got, got


def test_submit_takes_launcher_mpi_with_processes_and_a_gpu_on_trainer():
    """The same values pass where launch takes them: a number of processes, or auto with GPUs."""
    option = "--param {}".format
    check_launcher({"launcher": "mpi", "backend": "trainer", "procs_per_node": 2}, option)
    check_launcher({"launcher": "mpi", "backend": "local", "procs_per_node": "2"}, option)
    check_launcher({"launcher": "mpi", "backend": "trainer", "gpu": "1"}, option)
    check_launcher({"launcher": "torchrun", "backend": "job"}, option)


def test_the_parameter_rules_agree_with_the_steps():
    """`submit`'s and `run`'s own checks accept what launch accepts and refuse what it refuses."""
    zero_stage, launcher = VALUE_RULES["zero_stage"], VALUE_RULES["launcher"]
    for stage in (-1, 0, *ZERO_STAGES, 4):
        options = TrainingOptions(data_dir="/data", strategy="deepspeed", zero_stage=stage)
        assert zero_stage.accepts(str(stage)) == accepted(options.validate), stage
    for name in (*LAUNCHERS, "MPI", "mpirun", ""):
        spec = TrainJobSpec(name="demo", command=("python", "train.py"), launcher=name)
        assert launcher.accepts(name) == accepted(spec.validate), name


@pytest.mark.parametrize("backend", ["trainer", "job", "pytorchjob"])
@pytest.mark.parametrize(("procs", "gpu"), [("2", 0), ("auto", 0), ("auto", 1)])
def test_the_launcher_check_agrees_with_launch(backend, procs, gpu):
    """check_launcher (submit, run) refuses exactly what render_launch (launch's plan and the
    backend's rendering) refuses."""
    from kubetrain.jobspec import Resources

    request = LaunchRequest(
        training=TrainingOptions(data_dir="/mnt/shared/data"), name="demo", launcher="mpi",
        procs_per_node=procs, resources=Resources(gpu=gpu),
    )  # fmt: skip
    values = {"launcher": "mpi", "backend": backend, "procs_per_node": procs, "gpu": gpu}
    ours = accepted(lambda: check_launcher(values, str))
    assert ours == accepted(lambda: render_launch(request, backend)), values
    assert ours == (backend in MPI_BACKENDS and (procs != "auto" or gpu > 0))
