"""`kubetrain submit argo`: create a run of the training workflow on an Argo Server through
Hera's ``WorkflowsService``, or submit one from an installed WorkflowTemplate."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from kubetrain import rules
from kubetrain.cli.param_option import check_value, split_param
from kubetrain.errors import InvalidInput, KubetrainError, terminal_text
from kubetrain.user_files import MIB, read_user_file

if TYPE_CHECKING:
    import requests


#: Where `kubectl port-forward` puts the Argo Server; quoted in the missing-host error.
ARGO_PORT_FORWARD = "kubectl -n argo port-forward svc/argo-server 2746:2746"
# Argo puts the workflow's name in pod labels (≤ 63) and the API server appends 5 characters.
GENERATE_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,56}[-.a-z0-9])?")
#: The most a token or a package file may hold; anything larger is not one (and is not read).
MAX_TOKEN_BYTES = MIB
MAX_PACKAGE_BYTES = 16 * MIB
TEMPLATE_HINT = (
    "create it with `kubetrain submit argo --create-template` or "
    "`argo template create pipelines/compiled/training_workflow_template.yaml`"
)


class ArgoServerError(KubetrainError):
    """The Argo Server refused a request; ``status`` is its HTTP status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def register(targets: argparse._SubParsersAction) -> None:
    argo = targets.add_parser(
        "argo",
        help="create a workflow on an Argo Server",
        description=(
            "Create a run of the training Workflow on an Argo Server (the same as `argo submit`), "
            "or submit one from a WorkflowTemplate (`argo submit --from workflowtemplate/NAME`), "
            "with parameters checked against the workflow's before anything is sent. The "
            "connection follows the argo CLI's environment: ARGO_SERVER, ARGO_SECURE, "
            "ARGO_BASE_HREF, ARGO_INSECURE_SKIP_VERIFY, ARGO_TOKEN, ARGO_NAMESPACE."
        ),
    )
    argo.add_argument(
        "--host",
        default=None,
        help="Argo Server URL, e.g. https://localhost:2746 (HOST:PORT means https unless "
        "ARGO_SECURE=false); default $ARGO_SERVER",
    )
    argo.add_argument(
        "--namespace", default=None, help="namespace to run in; default $ARGO_NAMESPACE or default"
    )
    argo.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="workflow parameter (like `argo submit -p`), e.g. --param nodes=4; repeatable",
    )
    argo.add_argument(
        "--package",
        type=Path,
        default=None,
        metavar="FILE",
        help="compiled Argo YAML: a Workflow, or a WorkflowTemplate with --from-template; "
        "default the training workflow built in-process",
    )
    argo.add_argument(
        "--from-template",
        nargs="?",
        const="",
        default=None,
        metavar="NAME",
        help="submit from the WorkflowTemplate NAME already on the server (default "
        "kubetrain-training) instead of sending the whole workflow",
    )
    argo.add_argument(
        "--create-template",
        action="store_true",
        help="create (or update) the WorkflowTemplate from --package or the built-in one "
        "first; implies --from-template",
    )
    argo.add_argument(
        "--generate-name",
        default=None,
        metavar="PREFIX",
        help="metadata.generateName of the new workflow, e.g. digits-fsdp-; default the "
        "workflow's (kubetrain-training-)",
    )
    argo.add_argument(
        "--token-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="file holding the Argo token, bare or as 'Bearer TOKEN'; default $ARGO_TOKEN",
    )
    argo.add_argument(
        "--insecure",
        action="store_true",
        help="do not verify the server's TLS certificate (argo --insecure-skip-verify, "
        "also ARGO_INSECURE_SKIP_VERIFY=true)",
    )
    argo.set_defaults(handler=run_argo)


def env_flag(name: str, default: bool = False) -> bool:
    value = os.environ.get(name, "").strip().lower()
    return default if not value else value in ("1", "true", "yes", "on")


def argo_server_url(host: str | None) -> str:
    """The Argo Server's base URL, ending in ``/`` (Hera joins ``api/v1/...`` onto it)."""
    field = "--host" if host else "ARGO_SERVER"
    text = (host or os.environ.get("ARGO_SERVER", "")).strip()
    if not text:
        raise InvalidInput(
            "--host", "no Argo Server given",
            f"pass --host https://HOST:2746 or set ARGO_SERVER=HOST:2746 (e.g. after "
            f"`{ARGO_PORT_FORWARD}`)",
        )  # fmt: skip
    if "://" not in text:
        text = ("https://" if env_flag("ARGO_SECURE", default=True) else "http://") + text
    url = urlsplit(text)
    if "@" in url.netloc:
        raise InvalidInput(
            field, "the URL carries credentials", "put the token in ARGO_TOKEN or --token-file"
        )
    try:
        url.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        url = url._replace(netloc="")
    if url.scheme not in ("http", "https") or not url.hostname or url.query or url.fragment:
        raise InvalidInput(
            field, f"{text!r} is not an http(s) URL", "give e.g. https://localhost:2746"
        )
    path = url.path.strip("/") or os.environ.get("ARGO_BASE_HREF", "").strip("/")
    return urlunsplit((url.scheme, url.netloc, f"/{path}/" if path else "/", "", ""))


def argo_token(token_file: Path | None) -> str | None:
    """``"Bearer TOKEN"`` (or ``"Basic ..."`` as given) from --token-file or ARGO_TOKEN, never
    doubling the scheme; errors never quote the token."""
    if token_file is not None:
        field, fix = "--token-file", "give a file holding the token"
        data = read_user_file(token_file, field, MAX_TOKEN_BYTES, fix)
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise InvalidInput(field, f"cannot read {token_file}: not a text file", fix) from None
        if not text.strip():
            raise InvalidInput(field, f"{token_file} is empty", "write the token into it")
    else:
        field, text = "ARGO_TOKEN", os.environ.get("ARGO_TOKEN", "")
        if not text.strip():
            return None
    parts = text.split()
    if len(parts) == 2 and parts[0].lower() in ("bearer", "basic"):
        scheme, credential = parts[0].capitalize(), parts[1]
    elif len(parts) == 1:
        scheme, credential = "Bearer", parts[0]
    else:
        raise InvalidInput(
            field, "the token is not one word", "give the token alone or as 'Bearer TOKEN'"
        )
    if not all(33 <= ord(char) < 127 for char in credential):
        raise InvalidInput(
            field, "the token has characters an HTTP header cannot carry",
            "give the token exactly as `argo auth token` or `kubectl create token` prints it",
        )  # fmt: skip
    return f"{scheme} {credential}"


def load_argo_package(package: Path, kind: str) -> dict[str, Any]:
    """The one Argo ``kind`` document in ``package``, as a dict."""
    import yaml

    fix = (
        "give a compiled " + kind + " such as pipelines/compiled/"
        + ("training_workflow.yaml" if kind == "Workflow" else "training_workflow_template.yaml")
    )  # fmt: skip
    data = read_user_file(package, "--package", MAX_PACKAGE_BYTES, fix)
    try:
        documents = [d for d in yaml.safe_load_all(data.decode()) if d is not None]
    except UnicodeDecodeError:
        raise InvalidInput("--package", f"{package} is not a text file", fix) from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise InvalidInput("--package", f"{package} is not YAML{line}: {problem}", fix) from None
    for document in documents or [None]:
        is_dict = isinstance(document, dict)
        found = document.get("kind") if is_dict else None
        if not is_dict or not str(document.get("apiVersion", "")).startswith("argoproj.io/"):
            raise InvalidInput("--package", f"{package} is not an Argo {kind}", fix)
        if found != kind:
            raise InvalidInput("--package", f"{package} is an Argo {found}, not a {kind}", fix)
        if not isinstance(document.get("spec"), dict):
            raise InvalidInput("--package", f"{package} has no spec", fix)
    if len(documents) != 1:
        raise InvalidInput("--package", f"{package} holds {len(documents)} {kind}s", fix)
    (document,) = documents
    return document


def declared_parameters(document: dict[str, Any]) -> dict[str, list[str] | None]:
    """Name → allowed values (None: any) of the workflow's ``spec.arguments.parameters``."""
    parameters = (document["spec"].get("arguments") or {}).get("parameters") or []
    return {p["name"]: p.get("enum") for p in parameters if isinstance(p, dict) and "name" in p}


def workflow_defaults(document: dict[str, Any]) -> dict[str, str]:
    """Name → value of the workflow's parameters that have one: what a run gets unless
    --param sets it."""
    parameters = (document["spec"].get("arguments") or {}).get("parameters") or []
    return {
        p["name"]: str(p["value"])
        for p in parameters
        if isinstance(p, dict) and "name" in p and "value" in p
    }


def parse_workflow_arguments(
    pairs: list[str], declared: dict[str, list[str] | None]
) -> dict[str, str]:
    """--param NAME=VALUE pairs checked against the workflow's parameters (Argo's are strings)."""
    arguments: dict[str, str] = {}
    for pair in pairs:
        name, value = split_param(pair, declared, "workflow")
        allowed = declared[name]
        if allowed and value not in allowed:
            raise InvalidInput(
                f"--param {name}", f"{value!r} is not allowed", f"use one of {', '.join(allowed)}"
            )
        check_value(name, value, f"--param {name}")
        arguments[name] = value
    return arguments


def with_arguments(document: dict[str, Any], arguments: dict[str, str]) -> dict[str, Any]:
    """``document`` with ``arguments`` set as the values of its workflow parameters."""
    import copy

    document = copy.deepcopy(document)
    for parameter in document["spec"]["arguments"]["parameters"] if arguments else []:
        if parameter.get("name") in arguments:
            parameter["value"] = arguments[parameter["name"]]
            parameter.pop("valueFrom", None)
    return document


def validated_model(model_class: type, document: dict[str, Any], package: Path | None) -> Any:
    """``document`` as Hera's API model, refusing what Argo's schema would."""
    from pydantic import ValidationError

    try:
        return model_class.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise InvalidInput(
            "--package", f"{package or 'the workflow'} is not a valid {document['kind']}: "
            f"{where}: {first['msg']}", "recompile it with `kubetrain compile`",
        ) from None  # fmt: skip


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(re.sub(r"<[^>]*>", " ", text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ArgoClient:
    """Hera's ``WorkflowsService`` whose failures become one-line ``KubetrainError``s that name
    the status and the server's message (never the token)."""

    def __init__(self, host: str, token: str | None, verify: bool, namespace: str) -> None:
        from kubetrain.backends.http_clients import argo_workflows_service

        self.host, self.namespace = host.rstrip("/"), namespace
        self.secret = token.split()[-1] if token else None
        self.last: requests.Response | None = None
        self.service = argo_workflows_service(host, token, verify, namespace)
        self.service.session.hooks["response"].append(self._remember)

    def _remember(self, response: requests.Response, *args: object, **kwargs: object) -> None:
        self.last = response

    def call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)``; ``what`` ("create the workflow") names it in errors."""
        import requests

        from kubetrain.backends.http_clients import ServerSilent

        self.last = None
        try:
            return method(*args, **kwargs)
        except ServerSilent as exc:
            raise self._error(f"could not {what}: {exc}") from None
        except requests.exceptions.SSLError:
            raise self._error(
                f"could not {what}: TLS with {self.host} failed; pass --insecure for a "
                "self-signed certificate, or http:// for a server without TLS"
            ) from None
        except requests.RequestException as exc:
            raise self._error(
                f"could not {what}: cannot reach the Argo Server at {self.host} "
                f"({type(exc).__name__}); check --host/ARGO_SERVER (e.g. `{ARGO_PORT_FORWARD}`)"
            ) from None
        except Exception as exc:  # Hera raises HeraException, or KeyError on odd error bodies
            response = self.last
            if response is None or response.ok:
                raise self._error(
                    f"could not {what}: {type(exc).__name__}: {one_line(str(exc))}; check that "
                    "--host names the Argo Server's API, not a proxy or another service"
                ) from None
            raise self._server_error(what, response) from None

    def _server_error(self, what: str, response: requests.Response) -> KubetrainError:
        try:
            body = response.json()
            message = body.get("message") if isinstance(body, dict) else None
        except ValueError:
            message = None
        message = one_line(message or response.text or "(no message)")
        status = response.status_code
        if status == 401:
            hint = "give a valid token with ARGO_TOKEN or --token-file (`argo auth token`)"
        elif status == 403:
            hint = (
                f"give a token whose account may do this in namespace {self.namespace}, or "
                "pass the --namespace it may use"
            )
        elif status == 404 and response.request.method == "POST":
            hint = (
                TEMPLATE_HINT
                if response.url.endswith("/submit")
                else "check --host (the Argo Server's URL, with its base path)"
            )
        elif status >= 500:
            hint = (
                "retry once the Argo Server answers again (its log: "
                "`kubectl -n argo logs deploy/argo-server`)"
            )
        else:
            hint = "fix what the server names"
        return self._error(
            f"could not {what}: the Argo Server at {self.host} answered "
            f"{status} {response.reason}: {message}; {hint}",
            status,
        )

    def _error(self, message: str, status: int = 0) -> KubetrainError:
        if self.secret:
            message = message.replace(self.secret, "***")
        message = " ".join(message.split())
        return ArgoServerError(message, status) if status else KubetrainError(message)


def run_argo(args: argparse.Namespace) -> int:
    from kubetrain.pipelines.training_workflow import (
        WORKFLOW_NAME,
        build_training_workflow,
        check_registry_outlives_run,
    )

    # Everything is checked before the first request.
    host = argo_server_url(args.host)
    namespace = args.namespace or os.environ.get("ARGO_NAMESPACE") or "default"
    rules.namespace(
        namespace, "--namespace", "use at most 63 lowercase letters, digits and '-', e.g. argo"
    )
    token = argo_token(args.token_file)
    verify = not (args.insecure or env_flag("ARGO_INSECURE_SKIP_VERIFY"))
    if args.generate_name is not None and not GENERATE_NAME.fullmatch(args.generate_name):
        raise InvalidInput(
            "--generate-name", f"{args.generate_name!r} is not a name prefix",
            "use lowercase letters, digits and '-', at most 58 characters, e.g. digits-fsdp-",
        )  # fmt: skip
    from_template = args.from_template is not None or args.create_template
    kind = "WorkflowTemplate" if from_template else "Workflow"
    if args.package is not None:
        document = load_argo_package(args.package, kind)
    else:
        document = build_training_workflow(kind).to_dict()
    from kubetrain.cli.submit import check_run_parameters

    arguments = parse_workflow_arguments(args.param, declared_parameters(document))
    check_registry_outlives_run(document, arguments)  # else refused only after the training
    check_run_parameters({**workflow_defaults(document), **arguments})
    if not verify:
        import urllib3

        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    if from_template:
        template_name = args.from_template or document["metadata"].get("name") or WORKFLOW_NAME
        return submit_from_template(
            args, host, token, verify, namespace, document, template_name, arguments
        )
    return create_workflow(args, host, token, verify, namespace, document, arguments)


def create_workflow(
    args: argparse.Namespace,
    host: str,
    token: str | None,
    verify: bool,
    namespace: str,
    document: dict[str, Any],
    arguments: dict[str, str],
) -> int:
    """``argo submit``: send the whole Workflow, its parameters set from --param."""
    from hera.workflows.models import Workflow, WorkflowCreateRequest

    document = with_arguments(document, arguments)
    if args.generate_name is not None:
        document["metadata"].pop("name", None)
        document["metadata"]["generateName"] = args.generate_name
    if not (document["metadata"].get("name") or document["metadata"].get("generateName")):
        raise InvalidInput(
            "--package", "the workflow has neither metadata.name nor generateName",
            "pass --generate-name PREFIX",
        )  # fmt: skip
    workflow = validated_model(Workflow, document, args.package)
    client = ArgoClient(host, token, verify, namespace)
    with client.service:
        created = client.call(
            "create the workflow",
            client.service.create_workflow,
            WorkflowCreateRequest(namespace=namespace, workflow=workflow),
            namespace=namespace,
        )
    return report(created, namespace, client.host, "created")


def submit_from_template(
    args: argparse.Namespace,
    host: str,
    token: str | None,
    verify: bool,
    namespace: str,
    document: dict[str, Any],
    template_name: str,
    arguments: dict[str, str],
) -> int:
    """``argo submit --from workflowtemplate/NAME``, after creating or updating the template
    with --create-template."""
    from hera.workflows.models import (
        SubmitOpts,
        WorkflowSubmitRequest,
        WorkflowTemplate,
        WorkflowTemplateCreateRequest,
        WorkflowTemplateUpdateRequest,
    )

    rules.dns1123_label(
        template_name, "--from-template",
        f"use e.g. --from-template {document['metadata'].get('name') or 'kubetrain-training'}",
    )  # fmt: skip
    template = None
    if args.create_template:
        document = dict(document, metadata=dict(document["metadata"], name=template_name))
        document["metadata"].pop("generateName", None)
        template = validated_model(WorkflowTemplate, document, args.package)
    client = ArgoClient(host, token, verify, namespace)
    with client.service:
        service = client.service
        if template is not None:
            try:
                client.call(
                    "create the workflow template",
                    service.create_workflow_template,
                    WorkflowTemplateCreateRequest(namespace=namespace, template=template),
                    namespace=namespace,
                )
                action = "created"
            except ArgoServerError as exc:
                if exc.status != 409:
                    raise
                current = client.call(
                    "read the workflow template",
                    service.get_workflow_template,
                    template_name,
                    namespace=namespace,
                )
                template.metadata.resource_version = current.metadata.resource_version
                client.call(
                    "update the workflow template",
                    service.update_workflow_template,
                    template_name,
                    WorkflowTemplateUpdateRequest(
                        name=template_name, namespace=namespace, template=template
                    ),
                    namespace=namespace,
                )
                action = "updated"
            print(
                terminal_text(f"workflowtemplate {template_name} {action} in namespace {namespace}")
            )
        options = SubmitOpts(
            parameters=[f"{name}={value}" for name, value in arguments.items()] or None,
            generate_name=args.generate_name,
        )
        created = client.call(
            f"submit workflowtemplate/{template_name}",
            service.submit_workflow,
            WorkflowSubmitRequest(
                namespace=namespace,
                resource_kind="WorkflowTemplate",
                resource_name=template_name,
                submit_options=options,
            ),
            namespace=namespace,
        )
    return report(
        created, namespace, client.host, f"submitted from workflowtemplate/{template_name}"
    )


def report(created: Any, namespace: str, host: str, how: str) -> int:
    """Print the new workflow's name and how to follow it; the name is the last line."""
    name = created.metadata.name
    namespace = created.metadata.namespace or namespace
    # the name and namespace are the server's text, the host the user's
    lines = [
        f"workflow {name} {how} in namespace {namespace} on {host}",
        f"  follow it: argo watch -n {namespace} {name}",
        f"  its logs:  argo logs -n {namespace} {name} --follow",
        str(name),
    ]
    print("\n".join(terminal_text(line) for line in lines))
    return 0
