"""An emulated Kubernetes API server on 127.0.0.1:<free port>, for tests and benchmarks.

``KubeEmulator`` runs ``kube_api.ClusterAPI`` (kmock's ``KubernetesEmulator``, extended) with
kmock's aiohttp ``Server`` in a background thread with its own event loop, so synchronous code
(the official ``kubernetes`` client, a ``kubetrain`` subprocess given the kubeconfig) talks to
it over real HTTP. Its methods are thread-safe: each runs on the emulator's loop.

Extension points for scripting a cluster's behaviour:

* state: ``create``/``get``/``list``/``patch``/``patch_status``/``delete`` (server semantics,
  watch events included), ``set_conditions``, ``add_event``;
* pods: ``create_pod``, ``set_pod_status`` (with ``objects.waiting/running/terminated``,
  ``objects.unschedulable``), ``append_log`` (served by ``pods/log``, ``follow`` included);
* watches: ``close_watches`` (clean end or dropped), ``expire_watches`` (410 Gone on resume),
  ``interrupt_logs`` (end log follow streams);
* faults: ``fail`` (403/404/409/500/... for the next N matching requests), ``drop`` (close
  the connection without an answer);
* traffic: ``requests``/``count`` (the request log in RBAC verbs and resources);
* controllers: ``on_event`` (called on every stored change, e.g. by ``FakeTrainer``), and
  ``api.admission`` (validating webhooks, e.g. the Trainer's, registered by ``FakeTrainer``);
* schemas: a custom resource is pruned, defaulted and validated against its CRD (schema and
  CEL rules; ``crd_schema``) on create, replace and patch; ``install_trainer`` installs the
  real Trainer v2.3 CRDs from ../shared, ``install_training_operator`` the Training Operator
  1.9 PyTorchJob CRD (vendored in ``crds``; ``FakeTrainingOperator`` installs it too),
  ``install_kuberay`` KubeRay v1.7.0's RayJob and RayCluster CRDs (``FakeKubeRay``'s);
* clients: ``configuration``, ``api_client``, ``write_kubeconfig``;
* anything else through kmock's DSL on ``emulator.api`` (``api[...] << payload``).
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import kmock
import kubernetes.client
import yaml

from kubetrain.jobspec import DEFAULT_RUNTIME
from tests.support import objects
from tests.support.faults import Fault, RequestRecord
from tests.support.kube_api import ClusterAPI

T = TypeVar("T")

# Short names tests use for the resources we touch.
RESOURCES = {
    "pods": kmock.resource("", "v1", "pods"),
    "events": kmock.resource("", "v1", "events"),
    "configmaps": kmock.resource("", "v1", "configmaps"),
    "services": kmock.resource("", "v1", "services"),
    "jobs": kmock.resource("batch", "v1", "jobs"),
    "customresourcedefinitions": kmock.resource(
        "apiextensions.k8s.io", "v1", "customresourcedefinitions"
    ),
    "trainjobs": kmock.resource("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
    "clustertrainingruntimes": kmock.resource(
        "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes"
    ),
    "trainingruntimes": kmock.resource("trainer.kubeflow.org", "v1alpha1", "trainingruntimes"),
    "pytorchjobs": kmock.resource("kubeflow.org", "v1", "pytorchjobs"),
    "rayjobs": kmock.resource("ray.io", "v1", "rayjobs"),
    "rayclusters": kmock.resource("ray.io", "v1", "rayclusters"),
    "workflows": kmock.resource("argoproj.io", "v1alpha1", "workflows"),
}


def resource_of(name: str | kmock.resource) -> kmock.resource:
    if isinstance(name, kmock.resource):
        return name
    return RESOURCES.get(name) or kmock.resource(name)


class KubeEmulator:
    """A running emulated API server; use as a context manager or call start()/stop()."""

    def __init__(self, namespace: str = "default", user: str = "") -> None:
        self.namespace = namespace
        self.api = ClusterAPI(user=user or f"system:serviceaccount:{namespace}:default")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._port: int | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> KubeEmulator:
        started: Future[int] = Future()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name="kube-emulator", daemon=True
        )
        self._thread.start()
        self._port = started.result(timeout=30)
        return self

    def _run(self, started: Future[int]) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve(started))
        except BaseException as exc:  # surfaced to start() instead of dying silently
            if not started.done():
                started.set_exception(exc)
        finally:
            self._loop.close()

    async def _serve(self, started: Future[int]) -> None:
        self._stopping = asyncio.Event()
        async with self.api, kmock.Server(self.api) as server:
            started.set_result(server.port)
            await self._stopping.wait()
            # End every stream still open, and any that still comes, so the server's shutdown
            # need not wait for them.
            self.api.shut_down()
            self.api.logs.interrupt()
            await asyncio.sleep(0)

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        if self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout=30)
        self._loop = self._thread = None

    def __enter__(self) -> KubeEmulator:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on the emulator's loop (where all its state lives) and return its result."""
        if self._loop is None:
            raise RuntimeError("the emulator is not running; call start() first")

        async def run() -> T:
            return fn(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    # -------------------------------------------------------------------- clients
    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the emulator is not running")
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def configuration(self) -> kubernetes.client.Configuration:
        config = kubernetes.client.Configuration()
        config.host = self.url
        # As kubetrain.backends.kubernetes.client.load_api_client: our code retries, not urllib3.
        config.retries = False
        return config

    def api_client(self) -> kubernetes.client.ApiClient:
        return kubernetes.client.ApiClient(self.configuration())

    def kubeconfig(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "emulator", "user": {"token": "emulator-token"}}],
            "contexts": [
                {
                    "name": "emulator",
                    "context": {
                        "cluster": "emulator",
                        "user": "emulator",
                        "namespace": self.namespace,
                    },
                }
            ],
            "current-context": "emulator",
        }

    def write_kubeconfig(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(yaml.safe_dump(self.kubeconfig()))
        return path

    # ---------------------------------------------------------------------- state
    def _key(self, resource: str | kmock.resource, name: str, namespace: str | None):
        res = resource_of(resource)
        return self.api.key(res, namespace if namespace is not None else self.namespace, name)

    def create(
        self, resource: str | kmock.resource, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """Create through the server's own logic (metadata, events); ``status`` in ``body`` is
        kept for resources without a status subresource and for pods, else dropped."""
        ns = namespace if namespace is not None else self.namespace
        return self.call(self.api.create_object, resource_of(resource), ns, body)

    def get(
        self, resource: str | kmock.resource, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        return self.call(lambda: _copy(self.api.live(self._key(resource, name, namespace))))

    def list(
        self, resource: str | kmock.resource, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        res = resource_of(resource)
        return self.call(lambda: [_copy(obj) for _, obj in self.api.live_items(res, namespace)])

    def object_keys(self) -> set[tuple[str, str | None, str]]:
        """(plural, namespace, name) of every object stored now, for "nothing was created"."""

        def keys() -> set[tuple[str, str | None, str]]:
            return {
                (resource.plural or "", namespace, name)
                for (resource, namespace, name), obj in self.api.objects.items()
                if not obj.deleted
            }

        return self.call(keys)

    def names(self, resource: str | kmock.resource, namespace: str | None = None) -> set[str]:
        return {obj["metadata"]["name"] for obj in self.list(resource, namespace)}

    def patch(
        self,
        resource: str | kmock.resource,
        name: str,
        changes: dict[str, Any],
        namespace: str | None = None,
    ) -> dict[str, Any]:
        key = self._key(resource, name, namespace)
        return self.call(self.api.patch_object, key, changes)

    def patch_status(
        self,
        resource: str | kmock.resource,
        name: str,
        status: dict[str, Any],
        namespace: str | None = None,
    ) -> dict[str, Any]:
        key = self._key(resource, name, namespace)
        return self.call(self.api.patch_object, key, {"status": status}, "", "status")

    def delete(
        self,
        resource: str | kmock.resource,
        name: str,
        namespace: str | None = None,
        policy: str = "Background",
    ) -> dict[str, Any]:
        key = self._key(resource, name, namespace)
        return self.call(self.api.delete_object, key, policy)

    def set_conditions(
        self,
        resource: str | kmock.resource,
        name: str,
        conditions: list[dict[str, Any]],
        namespace: str | None = None,
    ) -> dict[str, Any]:
        """Replace the object's ``status.conditions`` (build them with ``objects.condition``)."""
        return self.patch_status(resource, name, {"conditions": conditions}, namespace)

    def add_event(
        self, involved: dict[str, Any], reason: str, message: str, type_: str = "Warning"
    ) -> dict[str, Any]:
        return self.create("events", objects.event(involved, reason, message, type_))

    # ----------------------------------------------------------------------- pods
    def create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        return self.create("pods", pod, pod["metadata"].get("namespace"))

    def set_pod_status(
        self, name: str, status: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """Replace the pod's status wholesale (container statuses drive its log instances)."""
        key = self._key("pods", name, namespace)

        def replace() -> dict[str, Any]:
            current = _copy(self.api.require(key))
            current["status"] = status
            return self.api.write_object(key, current, "status")

        return self.call(replace)

    def append_log(
        self,
        pod: str,
        lines: list[str] | str,
        namespace: str | None = None,
        container: str = objects.NODE_CONTAINER,
    ) -> None:
        lines = [lines] if isinstance(lines, str) else list(lines)
        ns = namespace if namespace is not None else self.namespace
        self.call(self.api.logs.append, (ns, pod, container), lines)

    # -------------------------------------------------------------- the Trainer
    def install_crd(self, crd: dict[str, Any]) -> dict[str, Any]:
        return self.create("customresourcedefinitions", crd)

    def install_trainer(self, version: str = "2.3", runtime: str = DEFAULT_RUNTIME) -> None:
        """The Trainer's CRDs (TrainJob of ``version``, both runtime kinds) and one runtime:
        ours as the README installs it if the package ships it, else one shaped like the
        Trainer's ``torch-distributed``."""
        self.install_crd(objects.trainjob_crd(version))
        for runtime_crd in objects.runtime_crds():
            self.install_crd(runtime_crd)
        if runtime:
            body = objects.shipped_runtime(runtime) or objects.torch_runtime(runtime)
            self.create("clustertrainingruntimes", body)

    def install_training_operator(self) -> None:
        """The Training Operator's PyTorchJob CRD (release-1.9, ``crds/SOURCE.txt``)."""
        from tests.support.fake_training_operator import pytorchjob_crd

        self.install_crd(pytorchjob_crd())

    def install_kuberay(self) -> None:
        """KubeRay v1.7.0's RayJob and RayCluster CRDs (``crds/SOURCE.txt``; the fake operator
        is ``fake_kuberay.FakeKubeRay``)."""
        from tests.support.fake_kuberay import raycluster_crd, rayjob_crd

        self.install_crd(rayjob_crd())
        self.install_crd(raycluster_crd())

    # --------------------------------------------------------------------- faults
    def fail(
        self,
        status: int,
        *,
        verb: str | None = None,
        resource: str | None = None,
        name: str | None = None,
        times: int = 1,
        message: str = "",
    ) -> Fault:
        """Answer the next ``times`` requests matching verb/resource (RBAC terms, e.g.
        ``"create"``, ``"trainjobs"`` or ``"pods/log"``) with ``status``."""
        fault = Fault(status, verb, resource, name, times, message)
        return self.call(self.api.faults.add, fault)

    def drop(
        self,
        *,
        verb: str | None = None,
        resource: str | None = None,
        name: str | None = None,
        times: int = 1,
    ) -> Fault:
        """Close the connection of the next ``times`` matching requests without answering."""
        return self.call(self.api.faults.add, Fault(None, verb, resource, name, times))

    def fail_with_retry_after(
        self,
        status: int,
        seconds: int,
        *,
        verb: str | None = None,
        resource: str | None = None,
        times: int = 1,
    ) -> Fault:
        """Answer with ``status`` (429 or 503) and ``Retry-After: seconds``."""
        fault = Fault(status, verb, resource, None, times, retry_after=seconds)
        return self.call(self.api.faults.add, fault)

    def drop_after_processing(
        self,
        *,
        verb: str | None = None,
        resource: str | None = None,
        name: str | None = None,
        times: int = 1,
    ) -> Fault:
        """Carry out the next matching requests, then close their connection unanswered."""
        fault = Fault(None, verb, resource, name, times, after_processing=True)
        return self.call(self.api.faults.add, fault)

    def end_watches_at_once(self, *, resource: str | None = None, times: int = 1) -> Fault:
        """Answer the next ``times`` watches with an empty stream that ends at once."""
        fault = Fault(200, "watch", resource, None, times, empty_watch=True)
        return self.call(self.api.faults.add, fault)

    def close_watches(self, abort: bool = False) -> None:
        self.call(self.api.close_watches, abort)

    def expire_watches(self) -> None:
        self.call(self.api.expire_watches)

    def rotate_log(
        self, pod: str, namespace: str | None = None, container: str = objects.NODE_CONTAINER
    ) -> None:
        """The kubelet rotates the container's log file (see ``PodLogStore.rotate``)."""
        ns = namespace if namespace is not None else self.namespace
        self.call(self.api.logs.rotate, (ns, pod, container))

    def interrupt_logs(self) -> None:
        """End every ``pods/log?follow=true`` stream (the client should reconnect)."""
        self.call(self.api.logs.interrupt)

    # -------------------------------------------------------------------- traffic
    def requests(
        self,
        verb: str | None = None,
        resource: str | None = None,
        name: str | None = None,
        since: float | None = None,
    ) -> list[RequestRecord]:
        """Recorded requests, filtered; ``since`` is a ``time.monotonic()`` value."""
        records = self.call(lambda: list(self.api.records))
        return [
            record
            for record in records
            if (verb is None or record.verb == verb)
            and (resource is None or resource in (record.resource, record.plural))
            and (name is None or record.name == name)
            and (since is None or record.at >= since)
        ]

    def count(self, verb: str | None = None, resource: str | None = None, **filters: Any) -> int:
        return len(self.requests(verb, resource, **filters))

    def on_event(self, callback: Callable[[str, dict[str, Any]], None]) -> Callable[[], None]:
        """Call ``callback(plural, {"type": ..., "object": ...})`` on every stored change (on the
        emulator's loop: it must not block). Returns a function that unsubscribes."""

        def hook(resource: kmock.resource, event: dict[str, Any]) -> None:
            callback(resource.plural or "", event)

        self.call(self.api.hooks.append, hook)
        return lambda: self.call(self.api.hooks.remove, hook)


def _copy(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    return copy.deepcopy(obj) if obj is not None else None
