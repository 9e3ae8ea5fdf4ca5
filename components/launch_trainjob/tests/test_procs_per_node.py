"""``procs_per_node`` auto (issue 18 (3)), every launch face's default: one process per GPU
when the nodes ask for GPUs, else 1, resolved to a number before anything is rendered (Kubeflow
Trainer's own auto would start one per CPU without GPUs: trainer v2.3.0
pkg/runtime/framework/plugins/torch/torch.go EnforceMLPolicy). An explicit number that differs
from the GPUs is warned about, not refused; a bad one is refused in one line."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from kubetrain.cli import main as kubetrain_main
from kubetrain.components.launch_trainjob.component import launch_trainjob
from kubetrain.components.launch_trainjob.template import launch_trainjob_template
from kubetrain.errors import InvalidInput
from kubetrain.jobspec import AUTO_PROCS, resolve_procs_per_node
from kubetrain.pipelines.training_pipeline import training_pipeline
from kubetrain.pipelines.training_workflow import PARAMETERS


def render(capsys: pytest.CaptureFixture[str], *options: str) -> tuple[int, Any, str]:
    """`kubetrain render trainjob OPTIONS`: its exit code, numProcPerNode and stderr."""
    capsys.readouterr()
    code = kubetrain_main(
        ["render", "trainjob", "--name", "demo", "--namespace", "default", *options]
    )
    out, err = capsys.readouterr()
    procs = yaml.safe_load(out)["spec"]["trainer"]["numProcPerNode"] if code == 0 else None
    return code, procs, err


@pytest.mark.parametrize(
    ("options", "procs"),
    [
        ((), 1),  # auto without GPUs: one process per node
        (("--gpu", "4"), 4),  # auto: one per GPU
        (("--gpu", "4", "--procs-per-node", "auto"), 4),
        (("--procs-per-node", "3"), 3),
        (("--gpu", "2", "--procs-per-node", "2"), 2),
    ],
)
def test_auto_is_one_process_per_gpu_else_one_rendered_as_a_number(capsys, options, procs):
    code, rendered, err = render(capsys, *options)
    assert (code, rendered) == (0, procs), err
    assert "warning" not in err


@pytest.mark.parametrize(
    ("procs", "warning"),
    [
        ("1", "--procs-per-node 1 with --gpu 4 leaves 3 GPU(s) per node idle"),
        ("8", "--procs-per-node 8 with --gpu 4 starts more processes than GPUs per node"),
    ],
)
def test_a_number_that_differs_from_the_gpus_is_warned_about_not_refused(capsys, procs, warning):
    code, rendered, err = render(capsys, "--gpu", "4", "--procs-per-node", procs)
    assert (code, rendered) == (0, int(procs))
    assert err.splitlines() == [f"kubetrain: warning: {warning}"]


@pytest.mark.bad_input
@pytest.mark.parametrize("bad", ["0", "-1", "x", "1.5", "Auto", ""])
def test_a_bad_procs_per_node_is_one_line_naming_the_field(capsys, bad):
    code, _, err = render(capsys, "--procs-per-node", bad)
    assert code == 2
    (line,) = err.splitlines()
    assert line.startswith("kubetrain render: error: procs_per_node: "), line
    assert "auto" in line  # the fix names the default


@pytest.mark.bad_input
@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_a_bad_procs_per_node_from_a_pipeline_is_refused(bad):
    """KFP passes text, a Python caller of the component a number: both are checked."""
    with pytest.raises(InvalidInput) as refused:
        resolve_procs_per_node(bad, 0)
    assert refused.value.field == "procs_per_node"
    assert "\n" not in str(refused.value)


def test_every_launch_face_defaults_to_auto():
    """The CLI (`launch`, `render`, `run`), the KFP component and pipeline, the Argo template
    and workflow."""
    from kubetrain.cli import build_parser

    parser = build_parser()
    for command in (["launch"], ["render", "trainjob"], ["run"]):
        assert parser.parse_args(command).procs_per_node == AUTO_PROCS, command
    component_input = launch_trainjob.component_spec.inputs["procs_per_node"]
    assert component_input.default == AUTO_PROCS
    pipeline_input = training_pipeline.pipeline_spec.root.input_definitions.parameters
    assert pipeline_input["procs_per_node"].default_value.string_value == AUTO_PROCS
    template = launch_trainjob_template()
    (argo_input,) = [p for p in template.inputs if p.name == "procs_per_node"]
    assert argo_input.default == AUTO_PROCS
    assert PARAMETERS["procs_per_node"][0] == AUTO_PROCS
