"""Every HTTP client kubetrain makes is built here, and none is built without timeouts: the
Kubernetes API's (kubernetes' ``ApiClient``), the KFP API's (``kfp.Client``) and the Argo
Server's (the requests ``Session`` under Hera's ``WorkflowsService``). tests/test_http_guard.py
reads the source and fails on an HTTP client built anywhere else.

``KUBETRAIN_HTTP_TIMEOUT_SECONDS`` (default 60, kube-apiserver's own ``--request-timeout`` for
a request that is not a watch) bounds an ordinary request three ways: connecting, each read
of the socket (urllib3's connect and read timeouts), and the whole exchange, body included.
The last is kept by a worker thread the caller stops waiting for: a server that sends a byte
a second never trips a read timeout. A server silent past the limit ends the request with
one line naming it and the variable (``ServerSilent``), which is not retried: a silent server
is not a dropped connection, and five tries would make the wait five times the limit.

Long-lived streams (``watch=true``, ``follow=true`` logs) are not ordinary requests. A watch
passes its own timeouts (watch.py: read timeout = its server-side ``timeoutSeconds`` + 30, so
a silent server ends it and it resumes). A followed log gets the connect timeout and no read
timeout: the kubelet writes only what the container writes, and not even the headers before
its first line (kubernetes pkg/kubelet/server/server.go getContainerLogs: a flushing writer,
no WriteHeader first), so any read timeout would cut a healthy stream of a quiet job; the
stream lives in a thread the wait ends, and the wait has its own ``--timeout`` and
``--stall-timeout``.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from kubetrain.errors import InvalidInput, KubetrainError

if TYPE_CHECKING:
    import kfp
    import kubernetes.client
    from hera.workflows.service import WorkflowsService

T = TypeVar("T")

TIMEOUT_ENV = "KUBETRAIN_HTTP_TIMEOUT_SECONDS"
#: kube-apiserver's ``--request-timeout`` default (1m0s: k8s.io/apiserver pkg/server/config.go
#: NewConfig, RequestTimeout), past which the API server itself gives up on a request.
DEFAULT_TIMEOUT_SECONDS = 60.0
MAX_TIMEOUT_SECONDS = 86400.0
#: Query parameters that make a Kubernetes GET a long-lived stream.
STREAM_PARAMETERS = ("watch", "follow")


class ServerSilent(KubetrainError):
    """A server took a request and did not answer it within the timeout."""

    def __init__(self, service: str, server: str, seconds: float, action: str = "") -> None:
        self.service, self.server, self.seconds = service, server, seconds
        asked = f" (asked to {action})" if action else ""
        super().__init__(
            f"the {service} at {server} did not answer within {seconds:g}s{asked}; check that "
            f"it is up and reachable, or set {TIMEOUT_ENV} to wait longer"
        )

    def asked_to(self, action: object) -> ServerSilent:
        """The same error, naming what was asked."""
        return ServerSilent(self.service, self.server, self.seconds, str(action))


#: What a proxy or a login page answers in place of an API.
HTML_TYPES = ("text/html", "application/xhtml+xml")


class AnswerUnreadable(KubetrainError):
    """A server answered a request with success but not with the API's JSON: a proxy's or a
    login page's HTML, bytes that are not UTF-8, or JSON past the bounded reader's limits."""

    def __init__(self, service: str, server: str, what: str) -> None:
        super().__init__(
            f"the {service} at {server} answered with {what}, not the API's JSON; check that "
            f"the address names the {service} itself and not a proxy or a login page"
        )


def check_answer(
    service: str, url: str, status: int, content_type: str | None, body: bytes | str
) -> None:
    """Refuse a 2xx answer whose body no API client could read (``AnswerUnreadable``): one
    that says it is JSON is read by the bounded reader (kubetrain.bounded_json); an HTML page
    (a proxy's or a login page) is no API's answer. Anything else passes (a pod's log, which
    the API server sends as text/plain; an empty body). Checked here, where every answer
    passes, because the generated clients fall back to the raw text when JSON fails and then
    break on it far from the request (a ``str`` where a dict was meant, a model field None)."""
    from kubetrain import bounded_json

    media = (content_type or "").split(";")[0].strip().lower()
    if not 200 <= status <= 299 or not body:
        return
    if media in HTML_TYPES:
        raise AnswerUnreadable(service, origin(url), f"a {media} page")
    if not (media == "application/json" or media.endswith("+json")):
        return
    try:
        bounded_json.loads(body)
    except ValueError as exc:  # BoundedJSONError, JSONDecodeError
        raise AnswerUnreadable(service, origin(url), f"unreadable JSON ({exc})") from None


def http_timeout() -> float:
    """Seconds a server may keep a request waiting: $KUBETRAIN_HTTP_TIMEOUT_SECONDS, else 60."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_TIMEOUT_SECONDS:
        raise InvalidInput(
            TIMEOUT_ENV,
            f"{text!r} is not a number of seconds above 0 and at most {MAX_TIMEOUT_SECONDS:g}",
            f"set it to e.g. {DEFAULT_TIMEOUT_SECONDS:g}, or unset it",
        )
    return seconds


def origin(url: str) -> str:
    """``scheme://host:port`` of ``url``, without credentials, path or query."""
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return url
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def within(
    seconds: float,
    exchange: Callable[[], T],
    silent: Callable[[], Exception],
    timed_out: Callable[[BaseException], bool],
) -> T:
    """``exchange()``, if it ends within ``seconds``; else ``silent()`` is raised, as it is
    when ``exchange`` raises an error ``timed_out`` calls a timeout. The exchange runs in a
    daemon thread, left behind past the deadline: its socket timeouts end it (a silent
    server), or the process's exit does (a server that drips bytes)."""
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = exchange()
        except BaseException as error:  # re-raised in the caller's thread
            outcome["error"] = error
        finally:
            done.set()

    threading.Thread(target=run, name="http-exchange", daemon=True).start()
    if not done.wait(seconds):
        raise silent()
    error = outcome.get("error")
    if error is not None:
        if timed_out(error):
            raise silent() from None
        raise error
    return outcome["value"]


def urllib3_timed_out(error: BaseException) -> bool:
    """Whether urllib3 gave up waiting (connecting or reading), directly or after retries; a
    refused connection or an unknown host is not a timeout (urllib3 makes its
    ``NewConnectionError`` a ``ConnectTimeoutError``)."""
    import urllib3.exceptions

    if isinstance(error, urllib3.exceptions.MaxRetryError) and error.reason is not None:
        error = error.reason
    return isinstance(error, urllib3.exceptions.TimeoutError) and not isinstance(
        error, urllib3.exceptions.NewConnectionError
    )


def long_lived(query_params: Iterable[tuple[str, Any]] | None) -> bool:
    """Whether a Kubernetes request's query makes it a stream (a watch, a followed log)."""
    return any(
        key in STREAM_PARAMETERS and str(value).lower() == "true"
        for key, value in query_params or ()
    )


@functools.cache
def _timed_rest_client(base: type) -> type:
    """``base``, a generated client's ``rest.RESTClientObject`` (kubernetes, kfp_server_api),
    with timeouts on every request. The hook is ``RESTClientObject.request``: its GET, POST,
    ... methods all call it, with ``_request_timeout`` (None when the caller gives none, and
    then urllib3 waits forever). A single number there means urllib3's ``total``, not a float
    (the generated code drops a float), so timeouts are given as a (connect, read) pair."""

    class TimedRESTClient(base):
        def __init__(self, configuration: Any, service: str, seconds: float) -> None:
            super().__init__(configuration)
            self.service, self.seconds = service, seconds

        def request(
            self,
            method: str,
            url: str,
            query_params: Any = None,
            headers: Any = None,
            body: Any = None,
            post_params: Any = None,
            _preload_content: bool = True,
            _request_timeout: Any = None,
        ) -> Any:
            send = functools.partial(
                super().request,
                method,
                url,
                query_params=query_params,
                headers=headers,
                body=body,
                post_params=post_params,
                _preload_content=_preload_content,
            )
            if long_lived(query_params):
                return send(_request_timeout=_request_timeout or (self.seconds, None))

            def exchange() -> Any:
                try:
                    response = send(
                        _request_timeout=_request_timeout or (self.seconds, self.seconds)
                    )
                except UnicodeDecodeError:  # the generated client decodes every body as UTF-8
                    raise AnswerUnreadable(
                        self.service, origin(url), "bytes that are not UTF-8"
                    ) from None
                if not _preload_content:  # read the body now, within the deadline
                    response.read(cache_content=True)
                raw = getattr(response, "urllib3_response", response)  # RESTResponse's own
                check_answer(
                    self.service, url, response.status, raw.headers.get("Content-Type"),
                    response.data,
                )  # fmt: skip
                return response

            return within(
                self.seconds,
                exchange,
                lambda: ServerSilent(self.service, origin(url), self.seconds),
                urllib3_timed_out,
            )

    return TimedRESTClient


def kubernetes_api_client(
    configuration: kubernetes.client.Configuration,
) -> kubernetes.client.ApiClient:
    """A Kubernetes ``ApiClient`` for ``configuration`` whose requests have timeouts: its
    ``rest_client`` (the attribute ``ApiClient.request`` sends through) is replaced by a
    timed one built from the same configuration."""
    import kubernetes.client

    seconds = http_timeout()
    client = kubernetes.client.ApiClient(configuration)
    rest = _timed_rest_client(kubernetes.client.rest.RESTClientObject)
    client.rest_client = rest(configuration, "Kubernetes API", seconds)
    return client


#: Attempts the KFP client makes at the server's health check, and its pause between them
#: (kfp 2.17.3 kfp/client/client.py ``Client.get_kfp_healthz``, ~line 401: ``max_attempts =
#: 5``, ``sleep_duration = 5``), which retries only an HTTP error answer (``ApiException``).
KFP_HEALTHZ_ATTEMPTS = 5


def _time_kfp_requests(api_client: Any, seconds: float) -> None:
    """Put a timed ``rest_client`` (the attribute ``kfp_server_api.ApiClient.call_api`` sends
    through) in ``api_client``, the one the service APIs of a ``kfp.Client`` share; once."""
    import kfp_server_api.rest

    rest = _timed_rest_client(kfp_server_api.rest.RESTClientObject)
    if not isinstance(api_client.rest_client, rest):
        api_client.rest_client = rest(api_client.configuration, "KFP API", seconds)


@functools.cache
def _timed_kfp_client() -> type:
    """``kfp.Client`` whose every request is timed and read by ``check_answer``, the health
    check its constructor makes included. ``Client.__init__`` builds its ``ApiClient`` itself
    (no argument takes one) and, when no namespace is known, calls ``get_kfp_healthz`` before
    it returns (kfp 2.17.3 kfp/client/client.py ``Client.__init__``, ~line 204): that method,
    public and called on ``self``, is the first point after the ``ApiClient`` exists, so the
    timed client goes in there. Its retries keep upstream's count but pause so that they all
    fit in half the deadline: a server answering 500 at once is reported as its answer, not
    as silent after upstream's 20 s of pauses."""
    from kfp import Client

    class TimedKfpClient(Client):
        def __init__(self, host: str, namespace: str | None, seconds: float) -> None:
            self.deadline_seconds = seconds
            super().__init__(host=host, namespace=namespace)
            _time_kfp_requests(self.runs.api_client, seconds)

        def get_kfp_healthz(self, sleep_duration: int = 5) -> Any:
            # through client.healthzs, the generated API group kfp.Client publishes
            # (kfp/client/client.py _add_generated_apis), which shares the ApiClient
            _time_kfp_requests(self.healthzs.api_client, self.deadline_seconds)
            pause = min(sleep_duration, self.deadline_seconds / 2 / (KFP_HEALTHZ_ATTEMPTS - 1))
            return super().get_kfp_healthz(sleep_duration=pause)

    return TimedKfpClient


def kfp_client(host: str, namespace: str | None) -> kfp.Client:
    """A ``kfp.Client`` for ``host`` whose requests have timeouts and whose answers pass
    ``check_answer`` (``_timed_kfp_client``). The constructor runs within the deadline too:
    past its health check it may reach other servers (Google's, for a
    ``*.googleusercontent.com`` host)."""
    seconds = http_timeout()
    make = _timed_kfp_client()
    return within(
        seconds,
        lambda: make(host, namespace, seconds),
        lambda: ServerSilent("KFP API", origin(host), seconds),
        urllib3_timed_out,
    )


@functools.cache
def _timed_session() -> type:
    """A requests ``Session`` with timeouts. requests has no session-wide timeout; the hook
    is ``Session.request``, which ``get``/``post``/... and Hera's ``WorkflowsService._request``
    all call: a request without ``timeout`` gets (connect, read) = the limit, and the whole
    exchange (redirects and body included, as ``stream`` is not set) must end within it."""
    import requests

    class TimedSession(requests.Session):
        def __init__(self, service: str, seconds: float) -> None:
            super().__init__()
            self.service, self.seconds = service, seconds

        def request(self, method: str, url: str, **options: Any) -> requests.Response:
            if options.get("timeout") is None:
                options["timeout"] = (self.seconds, self.seconds)
            response = within(
                self.seconds,
                lambda: super(TimedSession, self).request(method, url, **options),
                lambda: ServerSilent(self.service, origin(url), self.seconds),
                lambda error: isinstance(error, requests.Timeout),
            )
            check_answer(
                self.service, url, response.status_code, response.headers.get("Content-Type"),
                response.content,
            )  # fmt: skip
            return response

    return TimedSession


def argo_workflows_service(
    host: str, token: str | None, verify: bool, namespace: str
) -> WorkflowsService:
    """Hera's ``WorkflowsService`` for the Argo Server at ``host``, on a timed session."""
    from hera.workflows.service import WorkflowsService

    session = _timed_session()("Argo Server", http_timeout())
    return WorkflowsService(
        host=host, token=token, verify_ssl=verify, namespace=namespace, session=session
    )
