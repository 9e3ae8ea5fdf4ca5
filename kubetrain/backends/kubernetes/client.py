"""Reaching the cluster: client configuration, bounded retries, and API errors turned into
messages a user can act on (which permission is missing, what is not installed)."""

from __future__ import annotations

import json
import os
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import kubernetes.client
import kubernetes.config
import urllib3.exceptions
from kubernetes.client.rest import ApiException

from kubetrain import bounded_json
from kubetrain.backends.http_clients import ServerSilent, kubernetes_api_client, origin
from kubetrain.errors import KubetrainError, reading
from kubetrain.user_files import MIB, check_regular_file

T = TypeVar("T")

#: What fixes a 403: the ServiceAccount and Role the steps are meant to run with.
RBAC_FIX = (
    "grant it with `kubetrain render rbac --namespace NS | kubectl apply -f -` and run as the "
    "ServiceAccount it binds"
)
RETRIABLE_STATUSES = (429, 500, 502, 503, 504)
#: How the API server words a validating webhook's denial, a 403 with reason Forbidden as an
#: RBAC refusal has (kubernetes staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/
#: errors/statuserror.go ToStatusErr; the code and reason are the webhook's, 403 Forbidden
#: from controller-runtime's Denied: v0.24.1 pkg/webhook/admission/response.go
#: ValidationResponse), where RBAC's says '... is forbidden: User "..." cannot ...'
#: (apiserver pkg/endpoints/handlers/responsewriters/errors.go forbiddenMessage).
WEBHOOK_DENIAL = re.compile(r'admission webhook "[^"]*" denied the request')
#: A kubeconfig larger than this is not one (they hold a few certificates and tokens).
MAX_KUBECONFIG_BYTES = 16 * MIB
#: Connection-level failures worth retrying (dropped connections, refused, timeouts).
TRANSIENT_ERRORS = (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)
#: Where the kubelet puts the namespace of the pod's ServiceAccount (so of the pod itself).
SERVICE_ACCOUNT_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
#: What kubectl uses when neither the pod nor the kubeconfig's context names a namespace.
DEFAULT_NAMESPACE = "default"


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff for 5xx/429 answers and dropped connections, with jitter
    (so that many clients failed by one event do not come back at once) and the server's
    ``Retry-After`` honoured on 429/503.

    ``sleep`` is how a pause is taken: None sleeps for real (interruptibly in the watch and
    log threads); a test may record the pauses instead."""

    attempts: int = 5
    first_delay: float = 0.5
    max_delay: float = 8.0
    #: Each pause is the backoff delay less up to this fraction of it, at random.
    jitter: float = 0.5
    #: The most a server's Retry-After may make us wait at once.
    max_retry_after: float = 60.0
    sleep: Callable[[float], Any] | None = field(default=None, compare=False)
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def delays(self) -> Iterator[float]:
        """The backoff delays between attempts (one fewer than ``attempts``), before jitter."""
        delay = self.first_delay
        for _ in range(self.attempts - 1):
            yield delay
            delay = min(delay * 2, self.max_delay)

    def pause_seconds(self, delay: float, error: BaseException | None = None) -> float:
        """How long to pause after ``error`` at backoff ``delay``: the delay with jitter, or
        the server's Retry-After (capped) plus the jitter part."""
        spread = delay * self.jitter * self.rng.random()
        server = retry_after(error)
        if server is not None:
            return min(server, self.max_retry_after) + spread
        return delay - spread

    def pause(
        self,
        delay: float,
        error: BaseException | None = None,
        wait: Callable[[float], Any] = time.sleep,
    ) -> None:
        seconds = self.pause_seconds(delay, error)
        (self.sleep or wait)(seconds)


def retry_after(error: BaseException | None) -> float | None:
    """The seconds of a 429/503 answer's ``Retry-After`` header (None without one; the HTTP
    date form is not sent by the API server, which writes seconds)."""
    if not isinstance(error, ApiException) or error.status not in (429, 503):
        return None
    value = (error.headers or {}).get("Retry-After")
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None


@dataclass(frozen=True)
class Action:
    """What we asked the API server to do, for error messages: "create trainjobs ..."."""

    verb: str
    resource: str  # as RBAC names it: "trainjobs" or "pods/log"
    group: str = ""
    name: str = ""
    namespace: str = ""

    @property
    def qualified(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource

    def __str__(self) -> str:
        target = f"{self.qualified} {self.name}" if self.name else self.qualified
        where = f" in namespace {self.namespace}" if self.namespace else ""
        return f"{self.verb} {target}{where}"


class ApiError(KubetrainError):
    """The API server refused a request; ``status`` is its HTTP status."""

    def __init__(self, message: str, action: Action, status: int, body: dict[str, Any]) -> None:
        super().__init__(message)
        self.action = action
        self.status = status
        self.reason = body.get("reason", "")
        self.server_message = body.get("message", "")
        self.details = body.get("details") or {}


class PermissionDenied(ApiError):
    """403: the ServiceAccount lacks a verb on a resource."""


class AdmissionDenied(ApiError):
    """403 from a validating admission webhook: the object was refused for what it holds, not
    for who sent it."""


class NotFound(ApiError):
    """404: the object, or the whole resource type, does not exist."""

    @property
    def resource_missing(self) -> bool:
        """True when the API does not serve the resource at all (its CRD is not installed)."""
        return not self.details.get("name")


class AlreadyExists(ApiError):
    """409: an object of that name exists (or changed under us)."""


#: Verbs whose answer is the object asked about (a dict, for a custom object).
OBJECT_VERBS = ("get", "create", "patch")
#: JSON's names of the values ``json.loads`` gives, for messages.
JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
#: The values other than an object that a JSON answer may decode to.
JSON_VALUES = (list, str, int, float, type(None))


def json_type(value: Any) -> str:
    return JSON_TYPES.get(type(value), "number")


def unreadable_answer(action: Action, reason: str, server: str = "") -> ApiError:
    """The error for a success answer no API server sends (``reason`` says what it held), to
    raise as one line naming the request and the server."""
    at = f" at {server}" if server else ""
    return ApiError(
        f"the answer of the API server{at} to {action} is unreadable: {reason}; check that the "
        "kubeconfig names the cluster's API server and not a proxy or another service",
        action,
        200,
        {},
    )


def answered_object(data: bytes | str, action: Action, server: str = "") -> dict[str, Any]:
    """The JSON object a 200 answer read with ``_preload_content=False`` holds. A proxy or a
    server that is no API server may answer 200 with an HTML page (or JSON past the bounded
    reader's limits): one line naming the request, not a traceback."""
    try:
        body = bounded_json.loads(data)
    except json.JSONDecodeError as exc:
        raise unreadable_answer(action, f"it is not JSON ({exc.msg})", server) from None
    if not isinstance(body, dict):
        raise unreadable_answer(action, f"it is JSON {json_type(body)}, not an object", server)
    return body


def object_fault(obj: Any) -> str:
    """What makes ``obj`` no Kubernetes object as the client gives a custom one (a dict);
    empty when it is one. The API server sends every object with ``metadata.name``."""
    if not isinstance(obj, dict):
        return f"JSON {json_type(obj)}, not an object"
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        return f"an object whose metadata is JSON {json_type(metadata)}, not an object"
    if not isinstance(metadata.get("name"), str):
        return "an object without a metadata.name"
    return ""


def answer_fault(answer: Any, verb: str) -> str:
    """What makes ``answer`` no answer to a ``verb`` request (empty when it is one): a list
    holds ``items`` that are objects (absent or null is none: Go writes a nil slice as null),
    and a get, create or patch answers one object. A custom object's answer is the JSON as
    decoded; a typed list (``V1PodList``) is decoded by the client before we see it, and an
    item that was not an object there is a model without metadata. Other answers (a typed
    object, a response read raw, a delete's) are left to their reader."""
    if verb not in (*OBJECT_VERBS, "list"):
        return ""
    if isinstance(answer, JSON_VALUES):
        return f"it is JSON {json_type(answer)}, not an object"
    if isinstance(answer, dict):
        if verb in OBJECT_VERBS:
            fault = object_fault(answer)
            return f"it is {fault}" if fault else ""
        items = answer.get("items")
        if items is not None and not isinstance(items, list):
            return f"its items are JSON {json_type(items)}, not an array"
        faults = [object_fault(item) for item in items or []]
    else:
        items = getattr(answer, "items", None)
        if not isinstance(items, list):
            return ""
        no_metadata = "no object with metadata"
        faults = [no_metadata if getattr(item, "metadata", None) is None else "" for item in items]
    for index, fault in enumerate(faults):
        if fault:
            return f"item {index} of its items is {fault}"
    return ""


def api_server(fn: Callable[..., Any]) -> str:
    """The API server a generated API method (bound to an API object holding its ApiClient)
    sends to, as ``scheme://host:port``; empty for any other callable."""
    api_client = getattr(getattr(fn, "__self__", None), "api_client", None)
    host = getattr(getattr(api_client, "configuration", None), "host", None)
    return origin(host) if isinstance(host, str) and host else ""


def _body(exc: ApiException) -> dict[str, Any]:
    try:
        body = bounded_json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return {"message": str(exc.body or exc.reason or "")}
    return body if isinstance(body, dict) else {}


def translate(exc: ApiException, action: Action) -> ApiError:
    """An ApiException as the error a user can act on."""
    body = _body(exc)
    server = body.get("message") or exc.reason or ""
    status = exc.status or 0
    if status == 403 and WEBHOOK_DENIAL.match(server):
        return AdmissionDenied(
            f"the cluster refused to {action}: {server}; fix what it names (a validating "
            "admission webhook's answer, not a missing permission)",
            action,
            status,
            body,
        )
    if status == 403:
        where = f"namespace {action.namespace}" if action.namespace else "the cluster scope"
        group = action.group or '""'
        return PermissionDenied(
            f"permission denied: cannot {action.verb} {action.qualified} in {where} "
            f"(needs verb {action.verb!r} on resource {action.resource!r} of API group {group}); "
            f"{RBAC_FIX}. The server said: {server}",
            action,
            status,
            body,
        )
    if status == 401:
        return ApiError(
            f"not authenticated to the cluster while trying to {action}: {server}; "
            "refresh the credentials in your kubeconfig",
            action,
            status,
            body,
        )
    in_namespace = f" -n {action.namespace}" if action.namespace else ""
    listing = f"`kubectl get {action.qualified}{in_namespace}`"
    if status == 404:
        return NotFound(
            f"cannot {action}: {server or 'not found'}; check the name and the namespace "
            f"({listing}), and run `kubetrain doctor` to see whether the cluster serves "
            f"{action.qualified}",
            action,
            status,
            body,
        )
    if status == 409:
        fix = (
            f"choose another name, or delete the one there (see {listing})"
            if action.verb == "create"
            else "retry: the object changed while it was written"
        )
        return AlreadyExists(f"cannot {action}: {server}; {fix}", action, status, body)
    fix = (
        "fix what the server names"
        if status < 500 and status != 429
        else "retry once the API server answers again (`kubectl get --raw /readyz`)"
    )
    message = f"the cluster refused to {action} (HTTP {status}): {server}; {fix}"
    return ApiError(message, action, status, body)


def call_with_retries(
    action: Action,
    fn: Callable[..., T],
    *args: Any,
    retry: RetryPolicy | None = None,
    **kwargs: Any,
) -> T:
    """``fn(*args, **kwargs)``, retried on 5xx/429 and dropped connections; API errors are
    raised as ``ApiError`` subclasses, an unreachable server as a KubetrainError, a server
    silent past the timeout at once as ``ServerSilent`` (kubetrain.backends.http_clients).
    Every list, get, create and patch answer passes here, so its shape is checked here
    (``answer_fault``): one of another shape is an ``ApiError`` naming the request and the
    server, not a TypeError where it is used.

    A DELETE that answers 404 after an attempt that failed in transit is a success: the
    earlier attempt deleted the object and its answer was lost (returns None)."""
    policy = retry or RetryPolicy()
    delays = policy.delays()
    failed_in_transit = False
    while True:
        try:
            answer = fn(*args, **kwargs)
        except ApiException as exc:
            if exc.status == 404 and action.verb == "delete" and failed_in_transit:
                return None  # type: ignore[return-value]
            if exc.status in RETRIABLE_STATUSES:
                delay = next(delays, None)
                if delay is not None:
                    failed_in_transit = True
                    policy.pause(delay, exc)
                    continue
                raise KubetrainError(
                    f"the Kubernetes API kept failing to {action} "
                    f"(HTTP {exc.status}: {_body(exc).get('message') or exc.reason}); "
                    "the API server is unhealthy or overloaded: try again later"
                ) from None
            raise translate(exc, action) from None
        except ServerSilent as exc:
            raise exc.asked_to(action) from None
        except TRANSIENT_ERRORS as exc:
            delay = next(delays, None)
            if delay is not None:
                failed_in_transit = True
                policy.pause(delay, exc)
                continue
            raise KubetrainError(
                f"cannot reach the Kubernetes API to {action}: {exc}; check the cluster "
                "address in your kubeconfig (or the pod's network) and try again"
            ) from None
        fault = answer_fault(answer, action.verb)
        if fault:
            raise unreadable_answer(action, fault, api_server(fn))
        return answer


def check_kubeconfig_files(paths: str) -> None:
    """Each kubeconfig of ``paths`` (KUBECONFIG's list) that exists is a regular file of at most
    MAX_KUBECONFIG_BYTES: the client reads it whole, so ``/dev/zero`` would never end and a FIFO
    would hang. Missing ones are skipped, as the client skips them."""
    for path in paths.split(os.pathsep):
        if path and os.path.lexists(path):
            check_regular_file(
                path, "KUBECONFIG", MAX_KUBECONFIG_BYTES, "set KUBECONFIG to a kubeconfig file"
            )


def pod_namespace(service_account_file: str = SERVICE_ACCOUNT_NAMESPACE_FILE) -> str:
    """The namespace of the pod we run in, from its ServiceAccount's namespace file; empty
    outside a pod."""
    try:
        with open(service_account_file, encoding="utf-8") as file:
            return file.read(254).strip()
    except OSError:
        return ""


def resolve_namespace(
    namespace: str, service_account_file: str = SERVICE_ACCOUNT_NAMESPACE_FILE
) -> str:
    """``namespace``, or when it is empty the one we run in, as kubectl finds it: the pod's own
    (its ServiceAccount's namespace file: a pipeline step's pod runs in the run's namespace,
    which KFP and Argo choose), else the kubeconfig's current context's, else ``default``.
    An explicit KUBECONFIG comes first, as in ``load_api_client``: the namespace is then of
    the cluster we talk to."""
    if namespace:
        return namespace
    config_file = os.environ.get("KUBECONFIG") or None
    in_pod = None if config_file else pod_namespace(service_account_file)
    if in_pod:
        return in_pod
    check_kubeconfig_files(
        config_file or os.path.expanduser(kubernetes.config.KUBE_CONFIG_DEFAULT_LOCATION)
    )
    try:
        _, current = kubernetes.config.list_kube_config_contexts(config_file=config_file)
    except (kubernetes.config.ConfigException, OSError, ValueError, TypeError, AttributeError):
        return DEFAULT_NAMESPACE
    context = (current or {}).get("context") or {}
    return context.get("namespace") or DEFAULT_NAMESPACE


def load_api_client() -> kubernetes.client.ApiClient:
    """A client for the cluster we run in (a pod's ServiceAccount), else for $KUBECONFIG or
    ~/.kube/config. An explicit KUBECONFIG wins over the in-cluster config. Its requests have
    timeouts (kubetrain.backends.http_clients)."""
    config = kubernetes.client.Configuration()
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    try:
        if in_cluster and not os.environ.get("KUBECONFIG"):
            kubernetes.config.load_incluster_config(client_configuration=config)
        else:
            # Read KUBECONFIG now: the client reads it once, when it is imported. A file that
            # is not a kubeconfig (corrupt YAML, another shape) is named by the CLI's boundary.
            config_file = os.environ.get("KUBECONFIG") or None
            location = config_file or os.path.expanduser(
                kubernetes.config.KUBE_CONFIG_DEFAULT_LOCATION
            )
            check_kubeconfig_files(location)
            with reading(location):
                kubernetes.config.load_kube_config(
                    config_file=config_file, client_configuration=config
                )
    except (kubernetes.config.ConfigException, OSError) as exc:
        raise KubetrainError(
            f"no Kubernetes configuration: {exc}; set KUBECONFIG to a kubeconfig file, or run "
            "in a pod with a ServiceAccount"
        ) from None
    # We retry ourselves (every method, with backoff); urllib3's own retries would hide
    # dropped connections on GET and never retry a POST.
    config.retries = False
    return kubernetes_api_client(config)
