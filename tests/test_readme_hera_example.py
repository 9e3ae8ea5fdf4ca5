"""The README's "use the steps in your own Hera workflow" example, run as a user would: its code
builds a workflow whose YAML is valid Argo and which really trains with the local backend."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from argo_schema import argo_schema_errors

from kubetrain.backends.local.supervisor import program_path
from tests.support.argo_local import run_workflow

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = re.compile(r"<!-- readme-example: hera -->\n```python\n(.*?)```", re.DOTALL)


def readme_example() -> str:
    match = EXAMPLE.search((REPO / "README.md").read_text())
    assert match, "README.md lost its Hera example (<!-- readme-example: hera -->)"
    return match.group(1)


@pytest.fixture(scope="module")
def example_workflow(tmp_path_factory) -> dict:
    script = tmp_path_factory.mktemp("example") / "my_workflow.py"
    script.write_text(readme_example())
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=script.parent,
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_example_compiles_to_valid_argo(example_workflow):
    assert example_workflow["kind"] == "Workflow"
    assert argo_schema_errors(example_workflow) == []


def test_example_trains_with_the_local_backend(example_workflow, tmp_path):
    run = run_workflow(
        example_workflow,
        workdir=tmp_path / "argo",
        arguments={"backend": "local", "epochs": "2"},
        env={"KUBETRAIN_LOCAL_ROOT": str(tmp_path / "local"), "PATH": program_path()},
    )
    assert run.phase == "Succeeded", {name: node.log[-2000:] for name, node in run.nodes.items()}
    assert [node.phase for node in run.nodes.values()] == ["Succeeded"] * 4
    assert run.nodes["wait"].outputs["state"] == "Complete"
    model = run.nodes["collect"].artifacts["model"]
    assert (model / "model.safetensors").is_file()
    assert int(run.nodes["collect"].outputs["epoch"]) == 2
