"""`kubetrain submit kfp` creates a run through the real KFP client over HTTP.

No KFP server runs here, so a minimal one answers the four calls a run needs (healthz,
experiment lookup and creation, run creation) and records what it was sent.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class FakeKfpApi(BaseHTTPRequestHandler):
    received: list[tuple[str, str, dict]] = []

    def _reply(self, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.received.append(("GET", self.path, {}))
        if self.path.startswith("/apis/v2beta1/healthz"):
            self._reply({"multi_user": False})
        else:
            self._reply({"experiments": [], "total_size": 0})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        self.received.append(("POST", self.path, body))
        if self.path.startswith("/apis/v2beta1/experiments"):
            self._reply({"experiment_id": "exp-1", "display_name": body.get("display_name")})
        else:
            self._reply({"run_id": "run-42", "display_name": body.get("display_name")})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def kfp_api():
    FakeKfpApi.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeKfpApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", FakeKfpApi.received
    server.shutdown()


def submit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kubetrain", "submit", "kfp", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_submit_creates_a_run_with_typed_parameters(kfp_api):
    host, received = kfp_api
    result = submit("--host", host, "--param", "nodes=4", "--param", "strategy=fsdp",
                    "--param", "lr=0.01", "--run-name", "digits-fsdp")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "run-42"
    ((_, _, run),) = [r for r in received if r[0] == "POST" and "/runs" in r[1]]
    assert run["display_name"] == "digits-fsdp"
    assert run["pipeline_spec"]["pipeline_spec"]["pipelineInfo"]["name"] == "kubetrain-training"
    assert "pvcMount" in json.dumps(run["pipeline_spec"]["platform_spec"])
    assert run["runtime_config"]["parameters"] == {"nodes": "4", "strategy": "fsdp", "lr": 0.01}
    assert run["experiment_id"] == "exp-1"
    # by default the server's account (pipeline-runner or default-editor), which `render rbac`
    # binds and which has what KFP's launcher reads (its artifact Secret, kfp-launcher), unlike
    # our kubetrain account (kubeflow/pipelines 2.17.0 backend/src/v2/objectstore/object_store.go)
    assert "service_account" not in run


def test_service_account_is_the_runs(kfp_api):
    """--service-account reaches the run (kfp 2.17 create_run_from_pipeline_package's
    service_account); '' sends none, so the server uses its default: pipeline-runner, or
    default-editor in a multi-user profile (kubeflow/pipelines 2.17.0
    backend/src/apiserver/template/template.go setDefaultServiceAccount)."""
    host, received = kfp_api
    assert submit("--host", host, "--service-account", "trainer-bot").returncode == 0
    assert submit("--host", host, "--service-account", "").returncode == 0
    named, default = [r[2] for r in received if r[0] == "POST" and "/runs" in r[1]]
    assert named["service_account"] == "trainer-bot"
    assert "service_account" not in default


@pytest.mark.bad_input
def test_bad_service_account_is_refused_before_contacting_the_server(kfp_api):
    host, received = kfp_api
    result = submit("--host", host, "--service-account", "Trainer_Bot")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--service-account" in result.stderr
    assert received == []


def test_your_program_is_a_list_parameter(kfp_api):
    """`-p command=JSON`: the pipeline's LIST parameter reaches the run as a list."""
    host, received = kfp_api
    command = ["torchrun", "/mnt/shared/code/train.py"]
    result = submit("--host", host, "--param", f"command={json.dumps(command)}",
                    "--param", "model=netdef:build")  # fmt: skip
    assert result.returncode == 0, result.stderr
    ((_, _, run),) = [r for r in received if r[0] == "POST" and "/runs" in r[1]]
    assert run["runtime_config"]["parameters"]["command"] == command


def test_an_empty_namespace_is_the_runs_own(kfp_api):
    """Issue 17 (2): the pipeline's `namespace` empty = the steps' own, where KFP runs them."""
    host, received = kfp_api
    assert submit("--host", host, "--param", "namespace=").returncode == 0
    ((_, _, run),) = [r for r in received if r[0] == "POST" and "/runs" in r[1]]
    assert run["runtime_config"]["parameters"] == {"namespace": ""}


@pytest.mark.parametrize(
    ("param", "message"),
    [("gpus=2", "no parameter 'gpus'"), ("nodes=two", "nodes: 'two' is not N nor MIN:MAX"),
     ("epochs=two", "epochs: 'two' is not a number_integer"),
     ("nodes", "is not NAME=VALUE"), ("command=torchrun x.py", "is not a list"),
     ("command={}", "is not a list")],
)  # fmt: skip
def test_bad_parameters_are_refused_before_contacting_the_server(kfp_api, param, message):
    host, received = kfp_api
    result = submit("--host", host, "--param", param)
    assert result.returncode == 2
    assert message in result.stderr
    assert received == []
