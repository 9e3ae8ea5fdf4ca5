"""`kubetrain submit kfp` reads what a KFP server answers as it reads any server's answer: the
health check the KFP client's constructor makes fits in the deadline and is reported as
what it answered, and the links the client prints carry server text, so they are escaped
and held until the run's id is known.

A minimal KFP API answers over HTTP (tests/test_submit_kfp.py's calls: healthz, experiment
lookup and creation, run creation); the real ``kfp.Client`` talks to it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.processes import kubetrain_in_process as run_cli

#: An OSC sequence that would set the terminal's title, in an id the server makes up.
HOSTILE_ID = "exp-1\x1b]0;owned\x07"


class KfpApi(BaseHTTPRequestHandler):
    """Health check: ``healthz_status`` after ``healthz_delay`` seconds; otherwise a KFP API
    whose experiment id is ``HOSTILE_ID``."""

    healthz_status = 200
    healthz_delay = 0.0
    healthz_calls: list[float] = []

    def _reply(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.startswith("/apis/v2beta1/healthz"):
            self.healthz_calls.append(time.monotonic())
            time.sleep(self.healthz_delay)
            self._reply(self.healthz_status, {"multi_user": False})
        else:
            self._reply(200, {"experiments": [], "total_size": 0})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.startswith("/apis/v2beta1/experiments"):
            self._reply(200, {"experiment_id": HOSTILE_ID})
        else:
            self._reply(200, {"run_id": "run-42"})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def kfp_api(monkeypatch) -> Iterator[type[KfpApi]]:
    monkeypatch.setattr(KfpApi, "healthz_calls", [])
    server = ThreadingHTTPServer(("127.0.0.1", 0), KfpApi)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    KfpApi.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield KfpApi
    server.shutdown()
    server.server_close()


def test_a_failing_health_check_is_retried_within_the_deadline(kfp_api, monkeypatch, capsys):
    """The client's 5 attempts keep their count but not its 5 s pauses (20 s in all): they
    share half the deadline, and the line says what the server answered, not that it was
    silent."""
    monkeypatch.setattr(kfp_api, "healthz_status", 500)
    monkeypatch.setenv("KUBETRAIN_HTTP_TIMEOUT_SECONDS", "4")
    started = time.monotonic()
    code, out, err = run_cli(["submit", "kfp", "--host", kfp_api.url], capsys)
    assert code == 1
    assert time.monotonic() - started < 4
    assert len(kfp_api.healthz_calls) == 5
    (line,) = err.splitlines()
    assert f"could not create the run on {kfp_api.url}: " in line
    assert "(the last attempt: 500 Internal Server Error)" in line
    assert "did not answer" not in line
    assert out == ""


def test_a_health_check_slower_than_the_deadline_names_its_last_answer(
    kfp_api, monkeypatch, capsys
):
    """Each attempt answers 500 after 1 s: the attempts outlast the 2 s deadline, and the
    line that says so names what the server answered the last one."""
    monkeypatch.setattr(kfp_api, "healthz_status", 500)
    monkeypatch.setattr(kfp_api, "healthz_delay", 1.0)
    monkeypatch.setenv("KUBETRAIN_HTTP_TIMEOUT_SECONDS", "2")
    code, out, err = run_cli(["submit", "kfp", "--host", kfp_api.url], capsys)
    assert code == 1
    (line,) = err.splitlines()
    assert f"the KFP API at {kfp_api.url} did not answer within 2s" in line
    assert line.endswith("(the last attempt: 500 Internal Server Error)")


def test_the_clients_links_reach_the_terminal_escaped(kfp_api, capsys):
    """kfp.Client prints "Experiment details: URL" with the server's experiment id in it
    (kfp/client/client.py create_experiment); an escape sequence there is shown as text."""
    code, out, err = run_cli(["submit", "kfp", "--host", kfp_api.url], capsys)
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out
    assert f"{kfp_api.url}/#/experiments/details/exp-1\\x1b]0;owned\\x07" in out
    assert out.splitlines()[-1] == "run-42"
