"""An API server (or what stands in its place) answering readable JSON of the wrong shape: a
list whose ``items`` are no objects, an object without ``metadata``, a watch event that is no
event or whose object is a string. Each command ends with one line naming the request and the
server (kubetrain.backends.kubernetes.client.answer_fault, checked where every answer passes),
not an internal error far from the request. Sent through the real ``kubernetes`` client over
HTTP, from a stub answering by path: no API server sends these, so no emulator can."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import kubetrain_in_process
from tests.test_http_timeouts import write_kubeconfig

#: A TrainJob as the API server sends one, in the stub kubeconfig's namespace.
TRAINJOB = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "demo", "namespace": "team-a", "resourceVersion": "7"},
    "spec": {"trainer": {"numNodes": 1}},
}


def a_list(*items: Any, kind: str = "TrainJobList") -> bytes:
    return json.dumps({"kind": kind, "metadata": {"resourceVersion": "7"}, "items": items}).encode()


def events(*lines: Any) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


#: What the stub answers: (is a watch, resource in the path) -> body.
Answers = dict[tuple[bool, str], bytes]


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Answers], str]]:
    """``api(answers)``: a stub API server answering each GET by ``answers`` (200, JSON; any
    other request or resource: an empty list), with KUBECONFIG naming it; returns its URL."""
    servers: list[ThreadingHTTPServer] = []
    monkeypatch.setenv("KUBETRAIN_HTTP_TIMEOUT_SECONDS", "5")

    def start(answers: Answers) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                resource = self.path.split("?")[0].rstrip("/").split("/")[-1]
                if resource == "demo":  # a get of the TrainJob
                    resource = "trainjobs/demo"
                body = answers.get(("watch=True" in self.path, resource), a_list())
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", url)))
        return url

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def one_line(err: str, prog: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    assert "internal error" not in lines[0] and "bug" not in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (b'{"kind": "TrainJobList", "items": "nope"}', "its items are JSON string, not an array"),
        (a_list(1, "x", None), "item 0 of its items is JSON number, not an object"),
        (a_list(TRAINJOB, {"metadata": "m"}), "item 1 of its items is an object whose metadata"),
        (a_list({"metadata": {}}), "item 0 of its items is an object without a metadata.name"),
        (b'"TrainJobList"', "it is JSON string, not an object"),
    ],
)
def test_list_names_a_list_of_the_wrong_shape(
    api: Callable[[Answers], str], capsys: pytest.CaptureFixture[str], answer: bytes, says: str
) -> None:
    url = api({(False, "trainjobs"): answer})
    code, _, err = kubetrain_in_process(["list", "--backend", "trainer"], capsys)
    assert code == 1
    line = one_line(err, "kubetrain list")
    assert f"the answer of the API server at {url} to list trainjobs.trainer.kubeflow.org " in line
    assert f"is unreadable: {says}" in line, line


def test_a_list_without_items_has_none(
    api: Callable[[Answers], str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Go writes a nil slice as null: a list with ``items`` null (or none) holds no object."""
    api({(False, "trainjobs"): b'{"kind": "TrainJobList", "items": null}'})
    code, _, err = kubetrain_in_process(["list", "--backend", "trainer"], capsys)
    assert code == 0, err


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (b'"a string"', "it is JSON string, not an object"),
        (b'{"metadata": 3}', "it is an object whose metadata is JSON number, not an object"),
    ],
)
def test_a_get_names_an_object_of_the_wrong_shape(
    api: Callable[[Answers], str], capsys: pytest.CaptureFixture[str], answer: bytes, says: str
) -> None:
    url = api({(False, "trainjobs/demo"): answer})
    code, _, err = kubetrain_in_process(["logs", "--backend", "trainer", "demo"], capsys)
    assert code == 1
    line = one_line(err, "kubetrain logs")
    assert f"at {url} to get trainjobs.trainer.kubeflow.org demo in namespace team-a " in line
    assert f"is unreadable: {says}" in line, line


def test_a_typed_list_whose_items_are_no_objects_is_named(
    api: Callable[[Answers], str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The client decodes a pod list into models: an item that was not an object comes out
    as a V1Pod without metadata (was: AttributeError on ``pod.metadata.uid``)."""
    url = api({(False, "trainjobs"): a_list(TRAINJOB), (False, "pods"): a_list(1, kind="PodList")})
    code, _, err = kubetrain_in_process(
        ["wait", "--backend", "trainer", "demo", "--timeout", "5"], capsys
    )
    assert code == 1
    line = one_line(err, "kubetrain wait")
    assert f"at {url} to list pods in namespace team-a is unreadable: item 0 of its items is no " \
        "object with metadata" in line, line  # fmt: skip


@pytest.mark.parametrize(
    ("resource", "stream", "says"),
    [
        ("trainjobs", events({"type": "MODIFIED", "object": "x"}),
         "to watch trainjobs.trainer.kubeflow.org demo in namespace team-a is unreadable: its "
         "MODIFIED event's object is JSON string, not an object"),
        ("trainjobs", events({"type": "ADDED", "object": {"metadata": {"resourceVersion": "8"}}}),
         "its ADDED event's object is an object without a metadata.name"),
        ("trainjobs", events([1]),
         "to watch trainjobs.trainer.kubeflow.org demo in namespace team-a is unreadable: an "
         "event the client cannot decode (TypeError"),
        ("pods", events({"type": "ADDED", "object": "x"}),
         "to watch pods in namespace team-a is unreadable: an event the client cannot decode"),
    ],
)  # fmt: skip
def test_wait_names_a_watch_event_of_the_wrong_shape(
    api: Callable[[Answers], str],
    capsys: pytest.CaptureFixture[str],
    resource: str,
    stream: bytes,
    says: str,
) -> None:
    url = api({(False, "trainjobs"): a_list(TRAINJOB), (True, resource): stream})
    code, _, err = kubetrain_in_process(
        ["wait", "--backend", "trainer", "demo", "--timeout", "10"], capsys
    )
    assert code == 1
    line = one_line(err, "kubetrain wait")
    assert f"the answer of the API server at {url} " in line and says in line, line
