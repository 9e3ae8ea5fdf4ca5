"""The exit handler's delete on its CLI and Argo faces: one rule with the KFP component
(tests/test_kfp_exit_state.py), decided from the job: `--keep-complete` keeps a Complete job
with its status and logs and deletes any other; without it every job goes (a workflow whose
claim Argo deletes after the exit handler)."""

from __future__ import annotations

import re

import pytest

from kubetrain.cli import build_parser
from kubetrain.cli import main as kubetrain_main
from kubetrain.components.wait_trainjob.template import delete_trainjob_template
from kubetrain.names import derive_job_name
from tests.support import objects
from tests.test_kubernetes_backend import complete, make_spec, node_pod, set_container

RUN = "kubetrain-training-abcde"
INPUT = re.compile(r"\{\{inputs\.parameters\.([a-z_]+)\}\}")


def runs_job(k8s, complete_it: bool) -> str:
    name = derive_job_name(RUN)
    k8s.backend().launch(make_spec(name))
    if complete_it:
        complete(k8s.emulator, name)
    else:
        set_container(k8s.emulator, node_pod(k8s.emulator, name), objects.running())
    return name


def delete(*options: str) -> int:
    return kubetrain_main(["delete", "--backend", "trainer", "--namespace", "default", *options])


@pytest.mark.usefixtures("kubeconfig")
@pytest.mark.parametrize("by_run", [True, False], ids=["--run-name", "NAME"])
def test_keep_complete_keeps_a_complete_job_with_its_status(k8s, capsys, by_run: bool) -> None:
    name = runs_job(k8s, complete_it=True)
    assert delete("--keep-complete", *(["--run-name", RUN] if by_run else [name])) == 0
    assert capsys.readouterr().out == f"job {name} completed, kept with its status and logs\n"
    assert k8s.emulator.names("trainjobs") == {name}
    assert k8s.emulator.requests("delete", "trainjobs") == []


@pytest.mark.usefixtures("kubeconfig")
def test_keep_complete_deletes_a_running_job(k8s, capsys) -> None:
    name = runs_job(k8s, complete_it=False)
    assert delete("--run-name", RUN, "--ignore-not-found", "--keep-complete") == 0
    assert capsys.readouterr().out == f"deleted {name}\n"
    assert k8s.emulator.names("trainjobs") == set()


@pytest.mark.usefixtures("kubeconfig")
def test_without_keep_complete_a_complete_job_is_deleted_too(k8s, capsys) -> None:
    name = runs_job(k8s, complete_it=True)
    assert delete("--run-name", RUN, "--ignore-not-found") == 0
    assert capsys.readouterr().out == f"deleted {name}\n"
    assert k8s.emulator.names("trainjobs") == set()


@pytest.mark.usefixtures("kubeconfig")
def test_keep_complete_with_no_job_and_ignore_not_found_says_so(k8s, capsys) -> None:
    assert delete("--run-name", RUN, "--ignore-not-found", "--keep-complete") == 0
    assert "no TrainJob named" in capsys.readouterr().out


@pytest.mark.parametrize("keep_complete", [True, False])
def test_the_argo_template_runs_the_cli_with_the_rule_it_is_given(keep_complete: bool) -> None:
    """The exit template keeps a Complete job by default, as the KFP component does;
    keep_complete=False is for a workflow whose claim Argo deletes after the exit handler."""
    template = delete_trainjob_template(keep_complete=keep_complete)
    values = {"run_name": RUN, "backend": "trainer", "namespace": "default"}
    argv = [INPUT.sub(lambda match: values[match.group(1)], arg) for arg in template.args]
    args = build_parser().parse_args([*template.command[1:], *argv])
    assert (args.run_name, args.ignore_not_found) == (RUN, True)
    assert args.keep_complete is keep_complete


@pytest.mark.parametrize(("kind", "keeps"), [("Workflow", False), ("WorkflowTemplate", True)])
def test_the_training_workflows_exit_handler_keeps_a_complete_job_unless_the_claim_goes(
    kind: str, keeps: bool
) -> None:
    """The Workflow's claim is its own, which Argo deletes after the exit handler while a
    kept job's finished pods would still mount it: there the job goes whatever its state.
    The WorkflowTemplate's claim stays: the job decides, as on KFP."""
    from kubetrain.pipelines.training_workflow import EXIT_HANDLER, build_training_workflow

    document = build_training_workflow(kind).to_dict()
    templates = {t["name"]: t for t in document["spec"]["templates"]}
    (task,) = templates[EXIT_HANDLER]["dag"]["tasks"]
    args = templates[task["template"]]["container"]["args"]
    assert ("--keep-complete" in args) is keeps
