"""A server that takes the connection and then says nothing, or sends a byte a second and never
finishes, ends each command that talks HTTP with one line naming it and
KUBETRAIN_HTTP_TIMEOUT_SECONDS, within that timeout; it does not hang it. The commands run
as users run them (a subprocess, with a hard timeout, so a hang fails the test rather than
blocks it); the factory's rules (a quiet followed log is not cut, a dripping body is) are
checked on its Kubernetes client directly."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import kubernetes.client
import pytest
import yaml

from kubetrain.backends.http_clients import TIMEOUT_ENV, ServerSilent, kubernetes_api_client

TIMEOUT = 1
#: A hang is a failure after this long (the commands themselves take a few seconds to start).
HARD_LIMIT = 60
#: What a silent or dripping server must make every command say.
SILENT = f"did not answer within {TIMEOUT}s"


class QuietServer:
    """Accepts every connection, then sends nothing (``drip`` None) or the start of an HTTP
    answer one byte every ``drip`` seconds, a header line that never ends."""

    def __init__(self, drip: float | None) -> None:
        self.drip = drip
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.stopped = threading.Event()
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.connections.append(connection)
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        answer = b"HTTP/1.1 200 OK\r\nX-Drip: " + b"a" * 100_000
        for byte in answer:
            if self.stopped.wait(self.drip or 3600):
                return
            try:
                connection.sendall(bytes([byte]))
            except OSError:
                return

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()
        for connection in self.connections:
            connection.close()


@pytest.fixture(params=[None, TIMEOUT / 4], ids=["silent", "dripping"])
def quiet_server(request: pytest.FixtureRequest) -> Iterator[QuietServer]:
    server = QuietServer(request.param)
    yield server
    server.close()


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "quiet", "cluster": {"server": server}}],
                "users": [{"name": "quiet", "user": {"token": "t"}}],
                "contexts": [
                    {
                        "name": "quiet",
                        "context": {"cluster": "quiet", "user": "quiet", "namespace": "team-a"},
                    }
                ],
                "current-context": "quiet",
            }
        )
    )
    return path


def kubetrain(*args: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    """``python -m kubetrain ARGS`` with the timeout set low; (result, seconds it took)."""
    clean = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("ARGO_", "KF_PIPELINES", "KUBERNETES_SERVICE", "KUBECONFIG"))
    }
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "kubetrain", *args],
        capture_output=True,
        text=True,
        timeout=HARD_LIMIT,
        env={**clean, TIMEOUT_ENV: str(TIMEOUT), **env},
    )
    return result, time.monotonic() - started


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one line a failed command printed on stderr (a library's warnings aside: their
    line, then the indented source line that raised them)."""
    lines = [
        line
        for line in result.stderr.splitlines()
        if line and "Warning" not in line and not line.startswith(" ")
    ]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_doctor_reports_a_silent_api_server(quiet_server: QuietServer, tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", quiet_server.url)
    result, _ = kubetrain("doctor", env={"KUBECONFIG": str(kubeconfig)})
    assert result.returncode == 1, result.stderr
    (api_line,) = [line for line in result.stdout.splitlines() if line.startswith("FAIL api")]
    assert f"the Kubernetes API at {quiet_server.url} {SILENT} (asked to get version)" in (api_line)
    assert TIMEOUT_ENV in api_line
    assert result.stdout.splitlines()[-1].startswith("not ready")


def test_launch_ends_on_a_silent_api_server(quiet_server: QuietServer, tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", quiet_server.url)
    result, _ = kubetrain(
        "launch", "--backend", "trainer", "--name", "quiet-job", "--", "python", "-c", "pass",
        env={"KUBECONFIG": str(kubeconfig)},
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    line = error_line(result)
    assert line.startswith("kubetrain launch: error: ")
    assert f"the Kubernetes API at {quiet_server.url} {SILENT} (asked to " in line
    assert TIMEOUT_ENV in line


def test_submit_argo_ends_on_a_silent_argo_server(quiet_server: QuietServer) -> None:
    result, _ = kubetrain("submit", "argo", "--host", quiet_server.url, env={})
    assert result.returncode == 1, result.stderr
    line = error_line(result)
    assert f"could not create the workflow: the Argo Server at {quiet_server.url} {SILENT}" in line
    assert TIMEOUT_ENV in line


@pytest.mark.parametrize(
    "namespace",
    [
        [],  # no namespace: the KFP client asks the server's healthz as it is made
        ["--namespace", "team-a"],  # the first request is the experiment lookup
    ],
    ids=["made", "used"],
)
def test_submit_kfp_ends_on_a_silent_kfp_api(
    quiet_server: QuietServer, namespace: list[str], tmp_path: Path
) -> None:
    result, _ = kubetrain(
        "submit", "kfp", "--host", quiet_server.url, *namespace, env={"HOME": str(tmp_path)}
    )
    assert result.returncode == 1, result.stderr
    line = error_line(result)
    assert f"could not create the run: the KFP API at {quiet_server.url} {SILENT}" in line
    assert TIMEOUT_ENV in line


def test_a_bad_timeout_is_refused_in_one_line(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")
    result, _ = kubetrain("doctor", env={"KUBECONFIG": str(kubeconfig), TIMEOUT_ENV: "soon"})
    assert result.returncode == 2
    assert error_line(result) == (
        f"kubetrain doctor: error: {TIMEOUT_ENV}: 'soon' is not a number of seconds above 0 "
        f"and at most 86400; set it to e.g. 60, or unset it"
    )


# ------------------------------------------------- the factory's Kubernetes client, directly
class SlowLogs(BaseHTTPRequestHandler):
    """A pod's log: followed, quiet for 2.5 s then one line; not followed, a body of 20 bytes
    sent one byte each 0.3 s (no read waits past the timeout, the whole takes 6 s)."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        if "follow=true" in self.path.lower():
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.flush()
            time.sleep(2.5)
            self.wfile.write(b"after a quiet spell\n")
            return
        self.send_header("Content-Length", "20")
        self.end_headers()
        for _ in range(20):
            self.wfile.write(b"x")
            self.wfile.flush()
            time.sleep(0.3)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def logs_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[kubernetes.client.CoreV1Api]:
    monkeypatch.setenv(TIMEOUT_ENV, "1")
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowLogs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    yield kubernetes.client.CoreV1Api(kubernetes_api_client(configuration))
    server.shutdown()


def test_a_followed_log_may_be_quiet_longer_than_the_timeout(logs_api) -> None:
    """A followed log is a stream the kubelet writes to only when the container does: a read
    timeout would cut a healthy stream of a quiet job."""
    response = logs_api.read_namespaced_pod_log("p", "ns", follow=True, _preload_content=False)
    assert response.read() == b"after a quiet spell\n"


@pytest.mark.parametrize("preload", [True, False], ids=["read-by-client", "read-by-caller"])
def test_a_body_that_drips_ends_at_the_timeout(logs_api, preload: bool) -> None:
    started = time.monotonic()
    with pytest.raises(ServerSilent, match=r"the Kubernetes API at http://127\.0\.0\.1:\d+ did"):
        logs_api.read_namespaced_pod_log("p", "ns", _preload_content=preload)
    assert time.monotonic() - started < 3
