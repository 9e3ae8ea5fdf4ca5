"""`kubetrain submit argo` creates workflows through Hera's ``WorkflowsService`` over real HTTP.

No Argo Server runs here, so ``tests.support.argo_server.ArgoServer`` answers the calls
the way Argo does and records what it was sent; nothing in Hera or requests is replaced.
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kubetrain.cli import build_parser, main
from kubetrain.cli.compile import argo_yaml
from tests.support.argo_server import ArgoServer

REPO = Path(__file__).resolve().parents[1]
COMPILED = REPO / "pipelines" / "compiled"
SECRET = "tok-3f9a1c"
# Hera 7.1's service serializes requests with pydantic's deprecated ``.json()``.
pytestmark = pytest.mark.filterwarnings("ignore:The `json` method is deprecated")


@pytest.fixture(autouse=True)
def no_argo_environment(monkeypatch):
    """The argo CLI's variables of whoever runs the tests must not leak in."""
    for name in list(os.environ):
        if name.startswith("ARGO_"):
            monkeypatch.delenv(name)


@pytest.fixture
def server():
    with ArgoServer() as running:
        yield running


def submit(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["submit", "argo", *args])
    out, err = capsys.readouterr()
    return code, out, err


def compiled(stem: str) -> dict:
    return yaml.safe_load((COMPILED / f"{stem}.yaml").read_text())


def built(kind: str) -> dict:
    """The workflow `kubetrain submit argo` sends without --package: as `kubetrain compile`
    writes it (tests/test_pipeline.py keeps the committed YAML equal to it)."""
    return yaml.safe_load(argo_yaml(kind))


def with_values(document: dict, **values: str) -> dict:
    document = copy.deepcopy(document)
    for parameter in document["spec"]["arguments"]["parameters"]:
        if parameter["name"] in values:
            parameter["value"] = values.pop(parameter["name"])
    assert values == {}, f"not parameters of the workflow: {values}"
    return document


def test_default_submit_creates_the_training_workflow_with_the_overrides(server, capsys):
    code, out, err = submit(capsys, "--host", server.url, "--namespace", "ml",
                            "--param", "nodes=4", "--param", "strategy=fsdp")  # fmt: skip
    assert code == 0, err
    (request,) = server.requests
    assert (request.method, request.path) == ("POST", "/api/v1/workflows/ml")
    assert request.body["namespace"] == "ml"
    expected = with_values(built("Workflow"), nodes="4", strategy="fsdp")
    assert request.body["workflow"] == expected
    assert request.header("Authorization") == []
    ((namespace, name),) = server.workflows
    assert namespace == "ml" and name.startswith("kubetrain-training-")
    assert out.splitlines()[-1] == name
    assert f"workflow {name} created in namespace ml" in out
    assert f"argo watch -n ml {name}" in out


def test_host_and_namespace_come_from_the_argo_environment(server, capsys, monkeypatch):
    monkeypatch.setenv("ARGO_SERVER", server.url.removeprefix("http://"))
    monkeypatch.setenv("ARGO_SECURE", "false")
    monkeypatch.setenv("ARGO_NAMESPACE", "team-a")
    code, out, err = submit(capsys)
    assert code == 0, err
    assert [r.path for r in server.requests] == ["/api/v1/workflows/team-a"]


def test_a_compiled_package_is_sent_as_it_is_with_a_new_generate_name(server, capsys):
    package = COMPILED / "training_workflow.yaml"
    code, out, err = submit(capsys, "--host", server.url, "--package", str(package),
                            "--generate-name", "digits-fsdp-", "--param", "epochs=3")  # fmt: skip
    assert code == 0, err
    (request,) = server.requests
    expected = with_values(compiled("training_workflow"), epochs="3")
    expected["metadata"]["generateName"] = "digits-fsdp-"
    assert request.body["workflow"] == expected
    assert out.splitlines()[-1].startswith("digits-fsdp-")


def test_from_template_posts_to_the_submit_endpoint(server, capsys):
    server.add_template(compiled("training_workflow_template"))
    code, out, err = submit(capsys, "--host", server.url, "--from-template",
                            "--param", "nodes=4", "--param", "shared_pvc=data")  # fmt: skip
    assert code == 0, err
    (request,) = server.requests
    assert (request.method, request.path) == ("POST", "/api/v1/workflows/default/submit")
    assert request.body == {
        "namespace": "default",
        "resourceKind": "WorkflowTemplate",
        "resourceName": "kubetrain-training",
        "submitOptions": {"parameters": ["nodes=4", "shared_pvc=data"]},
    }
    name = out.splitlines()[-1]
    workflow = server.workflows[("default", name)]
    assert workflow["spec"]["workflowTemplateRef"] == {"name": "kubetrain-training"}
    assert "submitted from workflowtemplate/kubetrain-training" in out


def test_from_a_missing_template_fails_with_one_line(server, capsys):
    code, out, err = submit(capsys, "--host", server.url, "--from-template", "nightly")
    assert code == 1
    assert len(err.strip().splitlines()) == 1
    assert "404" in err and 'workflowtemplates.argoproj.io "nightly" not found' in err
    assert "--create-template" in err
    assert [r.body["resourceName"] for r in server.requests] == ["nightly"]


def test_create_template_creates_then_updates_it_before_submitting(server, capsys):
    for action in ("created", "updated"):
        code, out, err = submit(capsys, "--host", server.url, "--create-template",
                                "--param", "epochs=2")  # fmt: skip
        assert code == 0, err
        assert f"workflowtemplate kubetrain-training {action} in namespace default" in out
    assert [(r.method, r.path) for r in server.requests] == [
        ("POST", "/api/v1/workflow-templates/default"),
        ("POST", "/api/v1/workflows/default/submit"),
        ("POST", "/api/v1/workflow-templates/default"),
        ("GET", "/api/v1/workflow-templates/default/kubetrain-training"),
        ("PUT", "/api/v1/workflow-templates/default/kubetrain-training"),
        ("POST", "/api/v1/workflows/default/submit"),
    ]
    assert server.requests[0].body["template"] == built("WorkflowTemplate")
    assert server.requests[-1].body["submitOptions"] == {"parameters": ["epochs=2"]}
    assert len(server.workflows) == 2


@pytest.mark.parametrize("given", [SECRET, f"Bearer {SECRET}", f"bearer {SECRET}\n"])
@pytest.mark.parametrize("source", ["ARGO_TOKEN", "--token-file"])
def test_the_token_is_sent_once_as_bearer(capsys, monkeypatch, tmp_path, given, source):
    with ArgoServer(token=SECRET) as server:
        args = ["--host", server.url]
        if source == "ARGO_TOKEN":
            monkeypatch.setenv("ARGO_TOKEN", given)
        else:
            (tmp_path / "token").write_text(given)
            args += ["--token-file", str(tmp_path / "token")]
        code, out, err = submit(capsys, *args)
    assert code == 0, err
    (request,) = server.requests
    assert request.header("Authorization") == [f"Bearer {SECRET}"]
    assert SECRET not in out + err


def test_a_refused_token_is_never_printed():
    with ArgoServer(token=SECRET) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARGO_")}
        result = subprocess.run(
            [sys.executable, "-m", "kubetrain", "submit", "argo", "--host", server.url],
            capture_output=True, text=True, timeout=120,
            env={**env, "ARGO_TOKEN": "Bearer wrong-token-77c1"},
        )  # fmt: skip
    assert result.returncode == 1
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert "401" in line and "token not valid" in line and "ARGO_TOKEN" in line
    assert "wrong-token-77c1" not in result.stdout + result.stderr
    assert len(server.requests) == 1


def test_a_server_error_page_becomes_one_line(server, capsys):
    server.fail(502, "<html>\n<body><h1>502 Bad Gateway</h1>\n</body>\n</html>\n")
    code, out, err = submit(capsys, "--host", server.url)
    assert code == 1
    (line,) = err.strip().splitlines()
    assert "answered 502 Bad Gateway: 502 Bad Gateway" in line
    assert server.workflows == {}


def test_tls_to_a_plain_http_server_fails_with_a_hint(server, capsys):
    code, out, err = submit(capsys, "--host", server.url.replace("http://", "https://"))
    assert code == 1
    (line,) = err.strip().splitlines()
    assert "TLS with https://127.0.0.1:" in line and "--insecure" in line
    assert server.workflows == {}


@pytest.mark.parametrize(
    ("args", "env", "field", "message"),
    [
        (["--param", "gpus=2"], {}, "--param", "no parameter 'gpus'; use one of accuracy"),
        (["--param", "nodes"], {}, "--param", "'nodes' is not NAME=VALUE"),
        (["--param", "shared_pvc=data"], {}, "--param", "no parameter 'shared_pvc'"),
        # issue 27 (3): the run's own claim goes when it succeeds, and the registry with it
        (["--param", "model_registry=/mnt/shared/registry"], {}, "--param model_registry",
         "is on the run's own claim (mounted at /mnt/shared), which is deleted when the run"),
        (["--package", "missing.yaml"], {}, "--package", "cannot read missing.yaml"),
        (["--package", str(COMPILED / "training_pipeline.yaml")], {}, "--package",
         "is not an Argo Workflow"),
        (["--package", "broken.yaml"], {}, "--package", "broken.yaml is not YAML at line 2"),
        (["--package", "empty.yaml"], {}, "--package", "empty.yaml is not an Argo Workflow"),
        (["--package", str(COMPILED / "training_workflow_template.yaml")], {}, "--package",
         "is an Argo WorkflowTemplate, not a Workflow"),
        (["--from-template", "--package", str(COMPILED / "training_workflow.yaml")], {},
         "--package", "is an Argo Workflow, not a WorkflowTemplate"),
        (["--generate-name", "Digits_FSDP"], {}, "--generate-name", "is not a name prefix"),
        (["--namespace", "ML"], {}, "--namespace", "is not a namespace name"),
        (["--token-file", "missing-token"], {}, "--token-file", "cannot read missing-token"),
        ([], {"ARGO_TOKEN": "Bearer tok en"}, "ARGO_TOKEN", "the token is not one word"),
        ([], {"ARGO_SERVER": "ftp://argo"}, "ARGO_SERVER", "is not an http(s) URL"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_before_any_request(
    server, capsys, monkeypatch, tmp_path, args, env, field, message
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.yaml").write_text("kind: Workflow\nspec: a: b\n")
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    host = [] if "ARGO_SERVER" in env else ["--host", server.url]
    code, out, err = submit(capsys, *host, *args)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert f"error: {field}: " in line and message in line, line
    assert "tok en" not in line
    assert server.requests == []


def test_a_lasting_registry_is_sent_as_given(server, capsys):
    """A registry on the claim registry_pvc names, or in object storage, outlives the run."""
    code, out, err = submit(capsys, "--host", server.url,
                            "--param", "model_registry=s3://bucket/models",
                            "--param", "registry_pvc=team-registry")  # fmt: skip
    assert code == 0, err
    (request,) = server.requests
    expected = with_values(
        built("Workflow"), model_registry="s3://bucket/models", registry_pvc="team-registry"
    )
    assert request.body["workflow"] == expected


def test_a_template_run_may_keep_its_registry_on_its_existing_claim(server, capsys):
    code, out, err = submit(capsys, "--host", server.url, "--create-template",
                            "--param", "model_registry=/mnt/shared/registry")  # fmt: skip
    assert code == 0, err
    assert server.requests[-1].path.endswith("/submit")


def test_a_missing_host_names_the_option_and_the_variable(server, capsys):
    code, out, err = submit(capsys, "--param", "nodes=4")
    assert code == 2
    (line,) = err.strip().splitlines()
    assert "--host: no Argo Server given" in line and "ARGO_SERVER" in line
    assert server.requests == []


def test_every_option_has_help_and_help_does_not_import_hera():
    (submit_action,) = [
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ]
    (targets,) = [
        a
        for a in submit_action.choices["submit"]._actions
        if isinstance(a, argparse._SubParsersAction)
    ]
    argo = targets.choices["argo"]
    assert (argo.description or "").strip()
    options = {o for a in argo._actions for o in a.option_strings}
    assert {"--host", "--namespace", "--param", "--package", "--from-template",
            "--create-template", "--generate-name", "--token-file",
            "--insecure"} <= options  # fmt: skip
    assert all((a.help or "").strip() for a in argo._actions)
    probe = (
        "import sys; from kubetrain.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('hera', 'requests', 'pydantic') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr
