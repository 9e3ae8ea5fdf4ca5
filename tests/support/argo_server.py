"""A small Argo Server (the ``argo server`` REST API) on 127.0.0.1:<free port>, for tests.

It answers the calls ``kubetrain submit argo`` makes through Hera's ``WorkflowsService`` the
way Argo does (paths, bodies, status codes and Argo's ``{"code", "message"}`` error shape),
keeps the objects it was given, and records every request so tests can check what went over
the wire (and that refused input sent nothing):

* ``POST /api/v1/workflows/{ns}``: create a Workflow (``generateName`` gets a suffix);
* ``POST /api/v1/workflows/{ns}/submit``: create a Workflow from a WorkflowTemplate;
* ``GET /api/v1/workflows/{ns}[/{name}]``: list or get Workflows;
* ``POST /api/v1/workflow-templates/{ns}``, ``GET``/``PUT .../{name}``: WorkflowTemplates.

``ArgoServer(token="t")`` answers 401 to requests without ``Authorization: Bearer t``;
``fail(status, body)`` answers the next matching request with an error of one's choosing.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

#: What Argo answers when the token is missing or wrong (gRPC code 16, Unauthenticated).
UNAUTHENTICATED = {
    "code": 16,
    "message": "token not valid. see https://argo-workflows.readthedocs.io/en/latest/faq/",
}

WORKFLOWS = re.compile(r"^/api/v1/workflows/(?P<ns>[^/]+)(?:/(?P<name>[^/]+))?$")
TEMPLATES = re.compile(r"^/api/v1/workflow-templates/(?P<ns>[^/]+)(?:/(?P<name>[^/]+))?$")


@dataclass(frozen=True)
class ArgoRequest:
    """One request as received: ``headers`` keeps repeated headers (each ``(name, value)``)."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: list[tuple[str, str]]
    body: Any

    def header(self, name: str) -> list[str]:
        """Every value of header ``name`` (case-insensitive), in the order sent."""
        return [value for key, value in self.headers if key.lower() == name.lower()]


@dataclass
class ArgoFault:
    """Answer the next ``times`` requests whose method and path match with ``status``/``body``
    (``body`` as text is sent as is, e.g. a proxy's HTML page)."""

    status: int
    body: dict[str, Any] | str
    method: str | None = None
    path_prefix: str = ""
    times: int = 1
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        return (
            self.hits < self.times
            and self.method in (None, method)
            and path.startswith(self.path_prefix)
        )


class ArgoError(Exception):
    """An error answer in Argo's shape: HTTP status plus the gRPC code and message."""

    GRPC_CODES = {400: 3, 401: 16, 403: 7, 404: 5, 409: 6, 500: 13}

    def __init__(self, status: int, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"code": code or self.GRPC_CODES.get(status, 2), "message": message}


def not_found(kind: str, name: str) -> ArgoError:
    return ArgoError(404, f'{kind}.argoproj.io "{name}" not found')


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ArgoState:
    """The server's objects: (namespace, name) -> object, for Workflows and WorkflowTemplates."""

    workflows: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    templates: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    resource_version: int = 0

    def stamp(self, obj: dict[str, Any], namespace: str) -> dict[str, Any]:
        """Fill in what the API server sets on a stored object."""
        self.resource_version += 1
        meta = obj.setdefault("metadata", {})
        meta["namespace"] = namespace
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now())
        meta["resourceVersion"] = str(self.resource_version)
        return obj

    def name_of(self, obj: dict[str, Any], kind: str, store: dict) -> str:
        meta = obj.setdefault("metadata", {})
        if meta.get("name"):
            return meta["name"]
        if not meta.get("generateName"):
            raise ArgoError(400, f"{kind}.argoproj.io: metadata.name or generateName is required")
        while True:  # the API server's five random lowercase characters
            name = meta["generateName"] + "".join(
                secrets.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5)
            )
            if (meta.get("namespace", ""), name) not in store:
                return name

    def create_workflow(self, namespace: str, workflow: Any) -> dict[str, Any]:
        if not isinstance(workflow, dict) or not isinstance(workflow.get("spec"), dict):
            raise ArgoError(400, "workflow: spec is required")
        workflow = copy.deepcopy(workflow)
        name = self.name_of(workflow, "workflows", self.workflows)
        if (namespace, name) in self.workflows:
            raise ArgoError(409, f'workflows.argoproj.io "{name}" already exists')
        workflow["metadata"]["name"] = name
        workflow.setdefault("apiVersion", "argoproj.io/v1alpha1")
        workflow.setdefault("kind", "Workflow")
        workflow["status"] = {"phase": "Pending", "startedAt": now()}
        self.workflows[(namespace, name)] = self.stamp(workflow, namespace)
        return workflow

    def submit(self, namespace: str, request: dict[str, Any]) -> dict[str, Any]:
        """Argo's ``argo submit --from workflowtemplate/NAME``: a Workflow referring to it."""
        kind, name = request.get("resourceKind"), request.get("resourceName")
        if kind not in ("WorkflowTemplate", "workflowtemplate"):
            raise ArgoError(400, f"resource kind {kind!r} is not supported")
        if not name:
            raise ArgoError(400, "resourceName is required")
        if (namespace, name) not in self.templates:
            raise not_found("workflowtemplates", name)
        options = request.get("submitOptions") or {}
        parameters = []
        for pair in options.get("parameters") or []:
            key, sep, value = pair.partition("=")
            if not sep:
                raise ArgoError(
                    400, "expected parameter of the form: NAME=VALUE. Received: " + pair
                )
            parameters.append({"name": key, "value": value})
        labels = dict(
            item.split("=", 1) for item in (options.get("labels") or "").split(",") if "=" in item
        )
        labels["workflows.argoproj.io/workflow-template"] = name
        workflow: dict[str, Any] = {
            "metadata": {
                "generateName": options.get("generateName") or f"{name}-",
                "labels": labels,
            },
            "spec": {"workflowTemplateRef": {"name": name}},
        }
        if options.get("name"):
            workflow["metadata"]["name"] = options["name"]
        if parameters:
            workflow["spec"]["arguments"] = {"parameters": parameters}
        return self.create_workflow(namespace, workflow)

    def create_template(self, namespace: str, template: Any) -> dict[str, Any]:
        if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
            raise ArgoError(400, "template: spec is required")
        template = copy.deepcopy(template)
        name = self.name_of(template, "workflowtemplates", self.templates)
        if (namespace, name) in self.templates:
            raise ArgoError(409, f'workflowtemplates.argoproj.io "{name}" already exists')
        template["metadata"]["name"] = name
        template.setdefault("apiVersion", "argoproj.io/v1alpha1")
        template.setdefault("kind", "WorkflowTemplate")
        self.templates[(namespace, name)] = self.stamp(template, namespace)
        return template

    def update_template(self, namespace: str, name: str, template: Any) -> dict[str, Any]:
        current = self.templates.get((namespace, name))
        if current is None:
            raise not_found("workflowtemplates", name)
        if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
            raise ArgoError(400, "template: spec is required")
        template = copy.deepcopy(template)
        version = template.get("metadata", {}).get("resourceVersion")
        if not version:
            raise ArgoError(
                400, "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
            )
        if version != current["metadata"]["resourceVersion"]:
            raise ArgoError(
                409,
                f'Operation cannot be fulfilled on workflowtemplates.argoproj.io "{name}": the '
                "object has been modified; please apply your changes to the latest version and "
                "try again",
                code=10,
            )
        template["metadata"].update(name=name, uid=current["metadata"]["uid"])
        template["metadata"]["creationTimestamp"] = current["metadata"]["creationTimestamp"]
        self.templates[(namespace, name)] = self.stamp(template, namespace)
        return template


class ArgoServer:
    """A running emulated Argo Server; use as a context manager (or ``start``/``stop``)."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self.state = ArgoState()
        self.requests: list[ArgoRequest] = []
        self.faults: list[ArgoFault] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> ArgoServer:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> ArgoServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: what ``--host`` (or ``ARGO_SERVER``) is given."""
        assert self._server is not None, "the server is not running"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # ------------------------------------------------------------------ scripting
    @property
    def workflows(self) -> dict[tuple[str, str], dict[str, Any]]:
        return self.state.workflows

    @property
    def templates(self) -> dict[tuple[str, str], dict[str, Any]]:
        return self.state.templates

    def add_template(self, template: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
        """Store a WorkflowTemplate as if ``argo template create`` had (no request recorded)."""
        with self._lock:
            return copy.deepcopy(self.state.create_template(namespace, template))

    def fail(
        self,
        status: int,
        body: dict[str, Any] | str | None = None,
        method: str | None = None,
        path_prefix: str = "",
        times: int = 1,
    ) -> ArgoFault:
        """Answer the next ``times`` matching requests with ``status`` and ``body``."""
        fault = ArgoFault(
            status, body if body is not None else ArgoError(status, "injected").body,
            method, path_prefix, times,
        )  # fmt: skip
        with self._lock:
            self.faults.append(fault)
        return fault

    # ------------------------------------------------------------------ serving
    def handle(self, request: ArgoRequest) -> tuple[int, dict[str, Any] | str]:
        """(status, body) for one request; runs under the lock."""
        self.requests.append(request)
        for fault in self.faults:
            if fault.matches(request.method, request.path):
                fault.hits += 1
                return fault.status, fault.body
        if self.token is not None and request.header("Authorization") != [f"Bearer {self.token}"]:
            return 401, UNAUTHENTICATED
        try:
            return 200, self.route(request)
        except ArgoError as exc:
            return exc.status, exc.body

    def route(self, request: ArgoRequest) -> Any:
        method, path, body = request.method, request.path, request.body
        state = self.state
        if method == "POST" and path.endswith("/submit"):
            match = WORKFLOWS.match(path[: -len("/submit")])
            if match and not match["name"]:
                return state.submit(match["ns"], body or {})
        if match := WORKFLOWS.match(path):
            namespace, name = match["ns"], match["name"]
            if method == "POST" and not name:
                return state.create_workflow(namespace, (body or {}).get("workflow"))
            if method == "GET" and name:
                if (namespace, name) not in state.workflows:
                    raise not_found("workflows", name)
                return state.workflows[(namespace, name)]
            if method == "GET":
                items = [w for (ns, _), w in state.workflows.items() if ns == namespace]
                return {"metadata": {}, "items": items or None}
        if match := TEMPLATES.match(path):
            namespace, name = match["ns"], match["name"]
            if method == "POST" and not name:
                return state.create_template(namespace, (body or {}).get("template"))
            if method == "GET" and name:
                if (namespace, name) not in state.templates:
                    raise not_found("workflowtemplates", name)
                return state.templates[(namespace, name)]
            if method == "PUT" and name:
                return state.update_template(namespace, name, (body or {}).get("template"))
        raise ArgoError(404, "Not Found")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                request = ArgoRequest(
                    self.command, url.path, parse_qs(url.query), list(self.headers.items()), body
                )
                with server._lock:
                    status, payload = server.handle(request)
                    payload = copy.deepcopy(payload)
                if isinstance(payload, str):
                    data, content_type = payload.encode(), "text/html"
                else:
                    data, content_type = json.dumps(payload).encode(), "application/json"
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _serve  # noqa: N815 (http.server's naming)

            def log_message(self, *args: object) -> None:
                pass

        return Handler
