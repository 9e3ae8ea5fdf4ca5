"""Every HTTP client is built by kubetrain.backends.http_clients, which gives it timeouts: a
test that reads the source (ast), like the import layers' (tests/test_import_layers.py). Any
use of a client's constructor (or of a function that sends with a client made on the spot:
``requests.get``, ``urlopen``) elsewhere in kubetrain/, components/ or pipelines/ fails it,
as does a generated ``...Api()`` made with no ``ApiClient`` (it makes a default one)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

import pytest

from tests.test_import_layers import package_sources

FACTORY = "kubetrain.backends.http_clients"
#: What builds an HTTP client, or sends with one made on the spot, by its dotted name.
CLIENT_MAKERS = frozenset(
    {
        # kubernetes
        "kubernetes.client.ApiClient",
        "kubernetes.client.api_client.ApiClient",
        "kubernetes.client.rest.RESTClientObject",
        "kubernetes.config.new_client_from_config",
        "kubernetes.config.new_client_from_config_dict",
        "kubernetes.config.kube_config.new_client_from_config",
        "kubernetes.config.kube_config.new_client_from_config_dict",
        "kubernetes.dynamic.DynamicClient",
        # KFP
        "kfp.Client",
        "kfp.client.Client",
        "kfp.client.client.Client",
        "kfp_server_api.ApiClient",
        "kfp_server_api.api_client.ApiClient",
        "kfp_server_api.rest.RESTClientObject",
        # Argo (Hera), whose default session has no timeout
        "hera.workflows.WorkflowsService",
        "hera.workflows.service.WorkflowsService",
        # requests
        *(
            f"requests.{name}"
            for name in ("Session", "session", "request", "get", "post", "put", "patch")
        ),
        *(f"requests.{name}" for name in ("delete", "head", "options")),
        "requests.sessions.Session",
        "requests.api.request",
        # urllib3
        *(
            f"urllib3.{name}"
            for name in (
                "PoolManager",
                "ProxyManager",
                "HTTPConnectionPool",
                "HTTPSConnectionPool",
                "connection_from_url",
                "proxy_from_url",
                "request",
            )
        ),
        "urllib3.poolmanager.PoolManager",
        # the standard library
        "urllib.request.urlopen",
        "urllib.request.urlretrieve",
        "urllib.request.build_opener",
        "urllib.request.OpenerDirector",
        "http.client.HTTPConnection",
        "http.client.HTTPSConnection",
    }
)
#: Generated clients of any other SDK (kubeflow.training, kfp_server_api.api_client...).
CLIENT_CLASS_NAMES = ("ApiClient", "RESTClientObject", "PoolManager")
#: Packages whose generated ``...Api(api_client=None)`` makes its own default ``ApiClient``.
GENERATED_API_PACKAGES = ("kubernetes.client", "kfp_server_api")
#: (module, client maker) allowed outside the factory, each with why.
ALLOWED = {
    ("kubetrain.render.pytorchjob", "kubeflow.training.api_client.ApiClient"): (
        "the Training Operator SDK's models are (de)serialized by its ApiClient, which never "
        "sends a request there (sanitize_for_serialization, deserialize)"
    ),
}


def imported_names(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted name it stands for, from every (absolute) import in the file:
    ``import a.b`` binds ``a``, ``import a.b as x`` binds ``x`` to ``a.b``, ``from a import
    b as c`` binds ``c`` to ``a.b``."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def dotted(node: ast.expr, names: dict[str, str]) -> str | None:
    """The dotted name an expression ``a.b.c`` stands for, its first part resolved through
    the imports; None for anything else (a call's result, a subscript)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([names.get(node.id, node.id), *reversed(parts)])


def annotation_nodes(tree: ast.AST) -> set[int]:
    """ids of every node inside a type annotation (naming a client's type is no use of it)."""
    roots: list[ast.expr | None] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            roots.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            roots.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(inner) for root in roots if root is not None for inner in ast.walk(root)}


def is_client_maker(name: str) -> bool:
    return name in CLIENT_MAKERS or ("." in name and name.rsplit(".", 1)[1] in CLIENT_CLASS_NAMES)


def uses(source: str) -> Iterator[tuple[int, str]]:
    """(line, what) for each use of an HTTP client maker in ``source``: a reference to one
    (called or passed on), and a generated ``...Api()`` called without an ApiClient."""
    tree = ast.parse(source)
    names = imported_names(tree)
    in_annotation = annotation_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in in_annotation:
            continue
        if isinstance(node, ast.Call):
            name = dotted(node.func, names)
            without_client = not node.args and not any(
                keyword.arg == "api_client" for keyword in node.keywords
            )
            if (
                name
                and name.startswith(tuple(f"{package}." for package in GENERATED_API_PACKAGES))
                and name.endswith("Api")
                and without_client
            ):
                yield node.lineno, f"{name}() without an ApiClient"
        # The outermost name of a chain: ``requests.get``, not also ``requests``.
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
            name = dotted(node, names)
            if name and is_client_maker(name):
                yield node.lineno, name


def violations(sources: dict[str, str]) -> list[str]:
    """Each use of an HTTP client maker outside the factory, as ``module:line: name``."""
    return [
        f"{module}:{line}: {name}"
        for module, source in sorted(sources.items())
        if module != FACTORY
        for line, name in sorted(set(uses(source)))
        if (module, name) not in ALLOWED
    ]


def test_every_http_client_is_built_by_the_factory() -> None:
    sources = package_sources()
    assert FACTORY in sources  # the walk found the factory
    assert violations(sources) == []


def test_the_factory_builds_each_kind_of_client() -> None:
    """What the guard's list names is what the factory does build (the list is not stale)."""
    built = {name for _, name in uses(package_sources()[FACTORY])}
    assert {
        "kubernetes.client.ApiClient",
        "kfp.Client",
        "hera.workflows.service.WorkflowsService",
        "requests.Session",
    } <= built


def test_each_allowance_is_still_needed() -> None:
    sources = package_sources()
    for module, name in ALLOWED:
        assert name in {found for _, found in uses(sources[module])}, (module, name)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import requests\n\nrequests.get('http://x')\n", "requests.get"),
        ("import requests\n\nrequests.Session()\n", "requests.Session"),
        ("from requests import Session as S\n\ndef f():\n    return S()\n", "requests.Session"),
        (
            "import functools\nimport requests\n\nfetch = functools.partial(requests.post, 'u')\n",
            "requests.post",
        ),
        (
            "import kubernetes.client\n\nkubernetes.client.ApiClient(c)\n",
            "kubernetes.client.ApiClient",
        ),
        (
            "from kubernetes import client as k\n\nk.api_client.ApiClient()\n",
            "kubernetes.client.api_client.ApiClient",
        ),
        (
            "from kubernetes import config\n\nconfig.new_client_from_config()\n",
            "kubernetes.config.new_client_from_config",
        ),
        (
            "from kubernetes import client\n\nclient.CoreV1Api()\n",
            "kubernetes.client.CoreV1Api() without an ApiClient",
        ),
        ("from kfp import Client\n\nClient(host='h')\n", "kfp.Client"),
        ("import kfp\n\nkfp.Client(host='h')\n", "kfp.Client"),
        ("import kfp_server_api\n\nkfp_server_api.ApiClient(c)\n", "kfp_server_api.ApiClient"),
        ("import urllib3\n\nurllib3.PoolManager()\n", "urllib3.PoolManager"),
        (
            "from urllib.request import urlopen\n\ndef f():\n    urlopen('http://x')\n",
            "urllib.request.urlopen",
        ),
        ("import urllib.request\n\nurllib.request.urlopen('u')\n", "urllib.request.urlopen"),
        ("import http.client\n\nhttp.client.HTTPSConnection('h')\n", "http.client.HTTPSConnection"),
        (
            "from hera.workflows.service import WorkflowsService\n\nWorkflowsService(host='h')\n",
            "hera.workflows.service.WorkflowsService",
        ),
        (
            "from some_sdk.api_client import ApiClient\n\nApiClient()\n",
            "some_sdk.api_client.ApiClient",
        ),
    ],
)
def test_a_client_built_outside_the_factory_is_caught(source: str, expected: str) -> None:
    module = "kubetrain.backends.kubernetes.backend"
    found = violations({**package_sources(), module: source})
    assert any(line.startswith(f"{module}:") and line.endswith(f": {expected}") for line in found)


def test_the_factorys_own_clients_and_harmless_uses_pass() -> None:
    sources = {
        FACTORY: "import requests\n\nrequests.Session()\n",
        "kubetrain.backends.kubernetes.objects": (
            "import kubernetes.client\n\nkubernetes.client.CoreV1Api(api_client)\n"
            "kubernetes.client.CustomObjectsApi(api_client=c)\n"
        ),
        "kubetrain.cli.submit_argo": (
            "import requests\n\ndef f(session: requests.Session) -> requests.Response:\n"
            "    x: requests.Session = session\n"
            "    try:\n        pass\n    except requests.RequestException:\n        pass\n"
        ),
    }
    assert violations(sources) == []
