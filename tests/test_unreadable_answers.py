"""A server that answers success with something no API client can read (a proxy's login page,
JSON that is cut off, bytes that are not UTF-8, a 5000-digit number) ends each command that
talks to it with one line naming the server, not a traceback nor a run "None" created: every
answer passes kubetrain.backends.http_clients.check_answer, which reads JSON with the bounded
reader (kubetrain.bounded_json)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kubetrain.backends.http_clients import check_answer
from tests.support.processes import kubetrain_in_process
from tests.test_http_timeouts import write_kubeconfig

#: name -> (Content-Type, body) of every answer, each with status 200.
ANSWERS = {
    "html": ("text/html; charset=utf-8", b"<html><body>Sign in to continue</body></html>"),
    "cut-json": ("application/json", b'{"kind": "Status", "items": ['),
    "not-utf8": ("application/json", b'{"kind": "\xff\xfe"}'),
    "huge-number": ("application/json", b'{"kind": "X", "count": ' + b"9" * 5000 + b"}"),
}
SAYS = {
    "html": "answered with a text/html page, not the API's JSON",
    "cut-json": "answered with unreadable JSON",
    "not-utf8": "answered with ",  # bytes that are not UTF-8 / unreadable JSON (not UTF-8)
    "huge-number": "answered with unreadable JSON (an integer of more than 40 digits)",
}


class Answering(BaseHTTPRequestHandler):
    content_type = ""
    body = b""

    def _answer(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer  # noqa: N815

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture(params=sorted(ANSWERS))
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    content_type, body = ANSWERS[request.param]
    handler = type("Handler", (Answering,), {"content_type": content_type, "body": body})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", request.param
    httpd.shutdown()
    httpd.server_close()


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(" ")]
    assert len(lines) == 1, err
    return lines[0]


def test_kubernetes_commands_name_the_server(
    server: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    url, kind = server
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", url)))
    for args in (
        ["launch", "--backend", "trainer", "--name", "proxied", "--", "python", "-c", "pass"],
        ["launch", "--backend", "pytorchjob", "--name", "proxied", "--", "python", "-c", "pass"],
        ["list", "--backend", "trainer"],
    ):
        code, _, err = kubetrain_in_process(args, capsys)
        assert code == 1, (args, err)
        line = one_line(err)
        assert f"the Kubernetes API at {url} " in line and SAYS[kind] in line, (args, line)
    code, out, _ = kubetrain_in_process(["doctor"], capsys)
    assert code == 1
    (api_line,) = [line for line in out.splitlines() if line.startswith("FAIL api")]
    assert SAYS[kind] in api_line


def test_submit_kfp_names_the_server(
    server: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    url, kind = server
    monkeypatch.setenv("HOME", str(tmp_path))
    code, out, err = kubetrain_in_process(["submit", "kfp", "--host", url], capsys)
    assert code == 1, out
    assert "None" not in out  # was: "run None created"
    line = one_line(err)
    assert f"the KFP API at {url} " in line and SAYS[kind] in line, line


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("text/plain", b"a pod's log line\n"),  # logs are text
        ("application/octet-stream", b"a log \xff line\n"),  # bytes not said to be JSON
        ("", b"anything"),  # no type said: left to the client
        ("application/json", b""),  # an empty answer (a DELETE's)
        ("application/merge-patch+json", b'{"a": 1}'),
    ],
)
def test_answers_a_client_can_read_pass(content_type: str, body: bytes) -> None:
    check_answer("Kubernetes API", "http://h/api", 200, content_type, body)


def test_an_error_status_is_left_to_the_client() -> None:
    check_answer("Kubernetes API", "http://h/api", 502, "text/html", b"<html>bad gateway</html>")


def test_a_crd_answered_as_a_json_array_names_the_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """JSON, but no object: launch's CRD read names the request and the server."""
    handler = type("Handler", (Answering,), {"content_type": "application/json", "body": b"[1, 2]"})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", url)))
        args = ["launch", "--backend", "trainer", "--name", "arrayed", "--", "python", "-c", "1"]
        code, _, err = kubetrain_in_process(args, capsys)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert code == 1
    line = one_line(err)
    assert f"the API server at {url} to get customresourcedefinitions" in line, line
    assert "is JSON array, not an object" in line, line
