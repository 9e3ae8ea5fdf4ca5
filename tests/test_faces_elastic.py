"""Issue 30 (1, 4, 5): `--nodes MIN:MAX` and `--max-restarts` on every face (`kubetrain launch`,
`render`, `run`, `submit kfp|argo`, the KFP component and pipeline, the Argo template and
workflow), each reaching the one ``LaunchRequest`` launch plans from; an elastic job refused in
one line where it cannot run (Kubeflow Trainer v2.3 and an Indexed Job have none, mpirun's world
is fixed, no restarts, a ZeRO checkpoint), before anything is created."""

from __future__ import annotations

import re

import pytest
import yaml

from kubetrain.cli import build_parser
from kubetrain.cli import main as kubetrain_main
from kubetrain.cli.param_option import VALUE_RULES, check_elastic_values
from kubetrain.components.launch_trainjob import launch as launch_module
from kubetrain.components.launch_trainjob.cli import request_from_args
from kubetrain.components.launch_trainjob.component import launch_trainjob
from kubetrain.components.launch_trainjob.launch import (
    LaunchRequest,
    TrainingOptions,
    render_launch,
)
from kubetrain.components.launch_trainjob.template import launch_trainjob_template
from kubetrain.errors import InvalidInput
from kubetrain.jobspec import (
    DEFAULT_ELASTIC_RESTARTS,
    ELASTIC_BACKENDS,
    TrainJobSpec,
    resolve_nodes,
)
from kubetrain.pipelines.training_workflow import PARAMETERS
from tests.support.faces import (
    accepted,
    component_requests,
    pipeline_parameters_of_run,
    refused,
    refused_run,
)

ELASTIC = ["--nodes", "1:4", "--max-restarts", "3"]


def elastic(request: LaunchRequest) -> tuple[int | str, int]:
    return (request.nodes, request.max_restarts)


def test_launch_and_render_turn_the_options_into_the_request():
    parser = build_parser()
    for command in (["launch"], ["render", "trainjob"], ["render", "pytorchjob"]):
        assert elastic(request_from_args(parser.parse_args([*command, *ELASTIC]))) == ("1:4", 3)
        assert elastic(request_from_args(parser.parse_args(command))) == ("2", 0), command


def test_the_kfp_component_turns_its_inputs_into_the_request(monkeypatch, tmp_path):
    requests = component_requests(monkeypatch, tmp_path, {"nodes": "1:4", "max_restarts": 3}, {})
    assert [elastic(r) for r in requests] == [("1:4", 3), ("2", 0)]


def test_the_argo_template_passes_its_parameters_to_the_cli():
    template = launch_trainjob_template()
    defaults = {p.name: p.default for p in template.inputs}
    assert (defaults["nodes"], defaults["max_restarts"]) == ("2", "0")
    values = {
        **{name: value or "1" for name, value in defaults.items()},
        "nodes": "1:4", "max_restarts": "3", "command": "[]", "env": "{}",
        "node_selector": "{}", "tolerations": "[]", "volumes": "[]", "labels": "{}",
        "pod_labels": "{}", "active_deadline_seconds": "", "procs_per_node": "1",
    }  # fmt: skip
    argv = [
        re.sub(r"\{\{inputs\.parameters\.(\w+)\}\}", lambda m: values[m[1]], arg)
        for arg in template.args
    ]
    assert elastic(request_from_args(build_parser().parse_args(["launch", *argv]))) == ("1:4", 3)


def test_the_kfp_pipeline_and_the_argo_workflow_declare_them_with_the_defaults():
    from kubetrain.pipelines.training_pipeline import training_pipeline

    pipeline = training_pipeline.pipeline_spec.root.input_definitions.parameters
    assert pipeline["nodes"].default_value.string_value == "2"  # a STRING: 1:4 is no integer
    assert pipeline["max_restarts"].default_value.number_value == 0
    inputs = launch_trainjob.component_spec.inputs
    assert (inputs["nodes"].default, inputs["max_restarts"].default) == ("2", 0)
    assert (PARAMETERS["nodes"][0], PARAMETERS["max_restarts"][0]) == ("2", "0")


def test_kubetrain_run_gives_them_to_the_pipeline(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(tmp_path / "jobs"))
    given = pipeline_parameters_of_run(monkeypatch, ["run", *ELASTIC, "--output", "runs"])
    assert (given["nodes"], given["max_restarts"]) == ("1:4", 3)


def test_render_pytorchjob_plans_an_elastic_spec():
    """What render_launch hands the renderer: MAX nodes, MIN kept, restarts kept."""
    request = LaunchRequest(
        training=TrainingOptions(data_dir="/mnt/shared/data"), name="demo", nodes="1:4",
        max_restarts=3,
    )  # fmt: skip
    plan = launch_module.plan_launch(request, "pytorchjob", launch_module.get_backend("pytorchjob"))
    assert (plan.spec.min_nodes, plan.spec.num_nodes, plan.spec.max_restarts) == (1, 4, 3)
    assert plan.spec.elastic and plan.spec.nodes_text == "1:4"
    fixed = launch_module.plan_launch(
        LaunchRequest(training=TrainingOptions(data_dir="/d"), name="demo", nodes=" 3 "),
        "pytorchjob",
        launch_module.get_backend("pytorchjob"),
    )
    assert (fixed.spec.min_nodes, fixed.spec.num_nodes, fixed.spec.elastic) == (None, 3, False)


TRAINER_HAS_NONE = "Kubeflow Trainer v2.3 has no elastic training"
USE_ELASTIC = "use backend local or pytorchjob"


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("options", "line"),
    [
        (["--nodes", "3:2", "--max-restarts", "3"],
         "nodes: MIN 3 is more than MAX 2 in 3:2; give MIN:MAX with 1 <= MIN <= MAX"),
        (["--nodes", "0:2", "--max-restarts", "3"], "nodes: MIN 0 in 0:2 is below 1"),
        (["--nodes=-1:2", "--max-restarts", "3"], "nodes: MIN -1 in -1:2 is below 1"),
        (["--nodes", "1:2:3"], "nodes: '1:2:3' is not N nor MIN:MAX"),
        (["--nodes", "1:"], "nodes: '1:' is not N nor MIN:MAX"),
        (["--nodes", "two"], "nodes: 'two' is not N nor MIN:MAX"),
        (["--nodes", "0"], "nodes: 0 is below 1"),
        (["--nodes", "1:2", "--max-restarts", "3", "--launcher", "mpi", "--procs-per-node", "1"],
         "nodes: 1:2 is elastic, and mpirun starts a fixed world of ranks"),
        (["--nodes", "1:2", "--max-restarts", "3", "--strategy", "deepspeed"],
         "strategy: deepspeed with elastic nodes 1:2: a ZeRO checkpoint resumes only at the"),
        (["--nodes", "1:100000", "--max-restarts", "3", "--", "python", "-c", "pass"],
         "nodes: MAX 100000 of 1:100000 node(s) x 1 process(es) = 100000 processes on this "
         "machine, more than the local limit"),
        (["--nodes", "1:2", "--max-restarts", "3", "--backend", "trainer"], TRAINER_HAS_NONE),
        (["--nodes", "1:2", "--max-restarts", "3", "--backend", "job"],
         "an Indexed Job starts a fixed number of pods"),
    ],
)  # fmt: skip
def test_launch_refuses_bad_values_in_one_line_creating_nothing(
    capsys, monkeypatch, tmp_path, options, line
):
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(tmp_path / "jobs"))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    (tmp_path / "data").mkdir()
    got = refused(capsys, ["launch", "--data", str(tmp_path / "data"), *options])
    assert line in got and got.startswith("kubetrain launch"), got
    assert not (tmp_path / "jobs").exists()


@pytest.mark.bad_input
@pytest.mark.parametrize("backend", ["trainer", "job"])
def test_render_refuses_elastic_on_a_backend_without_it(capsys, backend):
    """Named: why (Trainer v2.3 has no elastic training; an Indexed Job's ranks are fixed) and
    the backends that have it."""
    line = refused(
        capsys,
        ["render", "trainjob", "--backend", backend, "--nodes", "1:2", "--max-restarts", "3"],
    )
    assert line.startswith("kubetrain render: error: nodes: 1:2 asks for an elastic job"), line
    assert USE_ELASTIC in line and "or a fixed --nodes 2" in line, line
    assert (TRAINER_HAS_NONE in line) == (backend == "trainer"), line


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("options", "line"),
    [
        (["--nodes", "1:2", "--max-restarts", "3", "--backend", "trainer", "--storage",
          "s3://bucket/runs"], f"--nodes: 1:2 asks for an elastic job, and {TRAINER_HAS_NONE}"),
        (["--nodes", "2:1", "--max-restarts", "3"], "--nodes: MIN 2 is more than MAX 1"),
        (["--nodes", "1:2", "--max-restarts", "3", "--strategy", "deepspeed"],
         "--strategy: deepspeed with elastic nodes 1:2"),
        (["--nodes", "1:2", "--max-restarts", "3", "--launcher", "mpi", "--procs-per-node", "1"],
         "--nodes: 1:2 is elastic, and mpirun starts a fixed world of ranks"),
        (["--max-restarts", "101"], "--max-restarts: 101 is more than 100"),
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
        (["nodes=1:2", "max_restarts=3"], f"--param nodes: 1:2 asks for an elastic job, and "
         f"{TRAINER_HAS_NONE}"),  # the pipeline's default backend is trainer
        (["nodes=3:2", "backend=pytorchjob"], "--param nodes: MIN 3 is more than MAX 2"),
        (["nodes=1:2", "backend=pytorchjob", "max_restarts=3", "strategy=deepspeed"],
         "--param strategy: deepspeed with elastic nodes 1:2"),
        (["max_restarts=-1"], "--param max_restarts: -1 is below 0"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("target", ["kfp", "argo"])
def test_submit_refuses_bad_values_before_contacting_the_server(capsys, target, params, line):
    """127.0.0.1:9 (discard) answers nothing: a value let through would fail differently."""
    argv = ["submit", target, "--host", "http://127.0.0.1:9"]
    got = refused(capsys, [*argv, *[f"--param={p}" for p in params]])
    assert line in got, got


def test_an_elastic_job_asking_no_restarts_gets_three_and_is_told(capsys):
    """Every face's --max-restarts defaults to 0, which would end an elastic job at its first
    lost node: launch gives it DEFAULT_ELASTIC_RESTARTS and says so on stderr; a number asked
    for is kept, and a spec made without launch still needs one."""
    assert kubetrain_main(["render", "pytorchjob", "--name", "el", "--nodes", "1:4"]) == 0
    out, err = capsys.readouterr()
    (job,) = [d for d in yaml.safe_load_all(out) if d]
    assert job["spec"]["elasticPolicy"]["maxRestarts"] == DEFAULT_ELASTIC_RESTARTS == 3
    assert err == (
        "kubetrain: note: --nodes 1:4 is elastic: --max-restarts 3 (each lost or rejoining node "
        "takes one); give --max-restarts N for another number\n"
    )
    assert kubetrain_main(["render", "pytorchjob", "--nodes", "1:4", "--max-restarts", "1"]) == 0
    out, err = capsys.readouterr()
    assert "maxRestarts: 1" in out and err == ""
    spec = TrainJobSpec(name="el", command=("torchrun", "t.py"), num_nodes=2, min_nodes=1)
    with pytest.raises(InvalidInput, match="max_restarts: is 0 with elastic nodes 1:2"):
        spec.validate()


def test_a_users_program_may_be_elastic_whatever_the_strategy():
    """``strategy`` is our trainer's: with the user's program it is not used, so deepspeed there
    refuses nothing (their program decides how it checkpoints)."""
    values = {"nodes": "1:2", "backend": "pytorchjob", "strategy": "deepspeed"}
    check_elastic_values(values, str, own_program=True)
    with pytest.raises(InvalidInput, match="strategy: deepspeed with elastic"):
        check_elastic_values(values, str)


@pytest.mark.parametrize(
    "nodes", ["2", "1:2", "2:2", "1:4", " 1:4 ", "0:2", "3:2", "x", "1:", ":2"]
)
def test_the_parameter_rule_agrees_with_the_spec(nodes):
    """`submit`'s and `run`'s check of ``nodes`` accepts exactly what the spec accepts."""

    def spec() -> None:
        min_nodes, max_nodes = resolve_nodes(nodes)
        TrainJobSpec(
            name="demo", command=("torchrun", "t.py"), num_nodes=max_nodes, min_nodes=min_nodes,
            max_restarts=3,
        ).validate()  # fmt: skip

    assert VALUE_RULES["nodes"].accepts(nodes) == accepted(spec), nodes


@pytest.mark.parametrize("backend", ["trainer", "job", "pytorchjob"])
@pytest.mark.parametrize(("nodes", "restarts"), [("1:2", 3), ("1:2", 0), ("2", 0), ("2:2", 1)])
def test_the_elastic_check_agrees_with_launch(backend, nodes, restarts):
    """check_elastic_values (submit, run) refuses exactly what render_launch refuses."""
    request = LaunchRequest(
        training=TrainingOptions(data_dir="/mnt/shared/data"), name="demo", nodes=nodes,
        max_restarts=restarts,
    )  # fmt: skip
    values = {"nodes": nodes, "backend": backend, "max_restarts": restarts}
    ours = accepted(lambda: check_elastic_values(values, str))
    assert ours == accepted(lambda: render_launch(request, backend)), values
    assert ours == (":" not in nodes or backend in ELASTIC_BACKENDS)
