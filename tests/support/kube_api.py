"""kmock's ``KubernetesEmulator`` grown into an API server a real client can be tested against.

kmock stores objects and serves list/watch/get/create/patch/delete over real HTTP, but without
what a backend that follows jobs relies on. ``ClusterAPI`` adds it, keeping kmock's request
parsing, object store, discovery, HTTP server and reaction DSL (``api[...] << ...``):

* metadata the server owns (uid, resourceVersion, generation, creationTimestamp), the
  ``status`` subresource, merge/strategic/JSON patches, ``PUT``, finalizers and
  garbage collection of dependents (``propagationPolicy``; batch Jobs orphan by default);
* label and field selectors; watches that resume from a ``resourceVersion``, answer
  ``410 Gone`` once it is compacted, end after ``timeoutSeconds`` (with a bookmark) and can be
  closed or expired by the test;
* ``pods/log`` with ``follow``, ``previous``, ``tailLines``, ``sinceSeconds``, ``sinceTime``,
  ``timestamps``, and log rotation (``pod_logs``);
* CRDs: creating one serves its resource, deleting it stops serving it; custom resources are
  pruned, defaulted and validated against the CRD's schema and CEL rules (``crd_schema``), with
  ``?fieldValidation=Strict|Warn|Ignore`` as the real server;
* admission webhooks (``admission``): callables that see a custom resource before it is stored
  and may refuse it, as the Trainer's and JobSet's validating webhooks do;
* a request log in RBAC terms and scripted faults (error statuses, with ``Retry-After`` if
  asked; dropped connections, before or after the request was carried out; watches that end
  at once);
* error bodies shaped like the real server's ``Status`` objects.

Everything here runs on the emulator's event loop; ``emulator.KubeEmulator`` is the
thread-safe facade tests use.
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import datetime
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock

from tests.support.crd_schema import SchemaAdmission, admissions_of
from tests.support.faults import METHOD_VERBS, VERBS, Fault, FaultList, RequestRecord
from tests.support.pod_logs import LogQuery, PodLogStore
from tests.support.selectors import selector_matcher

Key = tuple[kmock.resource, str | None, str]
Hook = Callable[[kmock.resource, dict[str, Any]], None]
#: (resource, new object, old object or None) -> raises ``api_error`` to refuse the request.
Webhook = Callable[[kmock.resource, dict[str, Any], dict[str, Any] | None], None]

CRD_RESOURCE = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
POD_RESOURCE = kmock.resource("", "v1", "pods")
JOB_RESOURCE = kmock.resource("batch", "v1", "jobs")
DEFAULT_WATCH_SECONDS = 1800.0
WATCH_WAKEUP_SECONDS = 0.5

BUILTIN_RESOURCES: dict[str, kmock.ResourceInfo] = {
    "v1/pods": kmock.ResourceInfo(
        kind="Pod", namespaced=True, subresources={"status", "log"}, verbs={"get", "list"}
    ),
    "v1/events": kmock.ResourceInfo(kind="Event", namespaced=True),
    "v1/configmaps": kmock.ResourceInfo(kind="ConfigMap", namespaced=True),
    # The Trainer's MPI plugin makes an ssh-auth Secret per TrainJob (fake_trainer).
    "v1/secrets": kmock.ResourceInfo(kind="Secret", namespaced=True),
    "v1/services": kmock.ResourceInfo(kind="Service", namespaced=True, subresources={"status"}),
    "batch/v1/jobs": kmock.ResourceInfo(kind="Job", namespaced=True, subresources={"status"}),
    "apps/v1/deployments": kmock.ResourceInfo(
        kind="Deployment", namespaced=True, subresources={"status"}
    ),
    "apiextensions.k8s.io/v1/customresourcedefinitions": kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False, subresources={"status"}
    ),
}
REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    409: "AlreadyExists",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def qualified(resource: kmock.resource) -> str:
    """How the server names a resource in messages: ``pods``, ``trainjobs.trainer.kubeflow.org``."""
    return resource.plural if not resource.group else f"{resource.plural}.{resource.group}"


def api_error(code: int, message: str, reason: str = "", **details: Any) -> kmock.KubernetesError:
    return kmock.KubernetesError(
        status=code, reason=reason or REASONS.get(code, "Unknown"), message=message, details=details
    )


def webhook_denial(webhook: str, message: str) -> kmock.KubernetesError:
    """How the API server answers a request a validating webhook denied: a controller-runtime
    validator's plain error is ``Denied(err.Error())``, code 403 and reason Forbidden
    (controller-runtime v0.24.1 ``pkg/webhook/admission/validator_custom.go`` ``Handle``,
    ``response.go`` ``ValidationResponse``), and the server prefixes the webhook's name to its
    message, with no details (kubernetes ``staging/src/k8s.io/apiserver/pkg/admission/plugin/
    webhook/errors/statuserror.go`` ``ToStatusErr``)."""
    return api_error(403, f'admission webhook "{webhook}" denied the request: {message}')


def status_body(error: kmock.KubernetesError) -> dict[str, Any]:
    """A ``metav1.Status``; ``details`` is omitted when empty (``omitempty``)."""
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": error.message,
        "reason": error.reason,
        "code": error.status,
    }
    if error.details:
        body["details"] = error.details
    return body


def _containers_by_name(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return {status.get("name"): status for status in statuses}


@attrs.define(kw_only=True)
class ClusterAPI(kmock.KubernetesEmulator):
    """The emulated API server; see the module docstring for what it adds to kmock."""

    #: Who the requests come from, as named in 403 messages.
    user: str = "system:serviceaccount:default:default"
    #: Watch events kept for resuming; older resourceVersions answer 410 Gone.
    history_limit: int = 20_000
    records: list[RequestRecord] = attrs.field(factory=list, init=False)
    faults: FaultList = attrs.field(factory=FaultList, init=False)
    logs: PodLogStore = attrs.field(factory=PodLogStore, init=False)
    hooks: list[Hook] = attrs.field(factory=list, init=False)
    admission: list[Webhook] = attrs.field(factory=list, init=False)
    schemas: dict[kmock.resource, SchemaAdmission] = attrs.field(factory=dict, init=False)
    _rv: int = attrs.field(default=1, init=False)
    _compacted_rv: int = attrs.field(default=0, init=False)
    _history: list[tuple[int, kmock.resource, dict[str, Any]]] = attrs.field(
        factory=list, init=False
    )
    _tick: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _watch_epoch: int = attrs.field(default=0, init=False)
    _abort_watches: bool = attrs.field(default=False, init=False)
    #: Set when the server shuts down: a watch that arrives afterwards (a client thread racing
    #: its own stop) is dropped at once, or the server's shutdown would wait out its timeout.
    _shutting_down: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback[kmock.method.PUT] << self._serve_replace
        for key, info in BUILTIN_RESOURCES.items():
            self.resources[key] = copy.deepcopy(info)

    # ----------------------------------------------------------------- request plumbing
    @staticmethod
    def record_of(request: kmock.Request) -> RequestRecord:
        resource = request.resource
        if request.action is not None:
            verb = VERBS.get(request.action.value.lower(), request.action.value.lower())
        else:
            verb = METHOD_VERBS.get(str(request.method.value).upper(), "get")
        plural = resource.plural if resource is not None and resource.plural else ""
        if request.subresource:
            plural = f"{plural}/{request.subresource}"
        return RequestRecord(
            verb=verb,
            resource=plural,
            group=resource.group or "" if resource is not None else "",
            namespace=request.namespace,
            name=request.name,
            params=dict(request.params),
        )

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # The official client sends ``watch=True``; the server parses booleans like Go's
        # strconv.ParseBool, kmock only knows "true".
        if request.method == kmock.method.GET and flag(request.params, "watch"):
            object.__setattr__(request, "action", kmock.action.WATCH)
        record = self.record_of(request)
        self.records.append(record)
        fault = self.faults.take(record)
        if fault is not None:
            return await self._apply_fault(fault, record, request)
        # Skip KubernetesEmulator._handle: it stores objects before any reaction runs and
        # without server-owned metadata; our fallbacks below do the storing instead.
        return await kmock.RawHandler._handle(self, request)

    async def _apply_fault(
        self, fault: Fault, record: RequestRecord, request: kmock.Request
    ) -> aiohttp.web.StreamResponse:
        if fault.empty_watch:
            return aiohttp.web.Response(status=200, content_type="application/json", body=b"")
        if fault.status is None:
            response = aiohttp.web.Response(status=500)
            if fault.after_processing:
                response = await kmock.RawHandler._handle(self, request)
            raw = request._raw_request
            if raw is not None and raw.transport is not None:
                raw.transport.abort()
            return response
        error = self.fault_error(fault, record)
        if fault.retry_after is not None:
            return aiohttp.web.json_response(
                status_body(error),
                status=error.status,
                headers={"Retry-After": str(fault.retry_after)},
            )
        raise error

    def fault_error(self, fault: Fault, record: RequestRecord) -> kmock.KubernetesError:
        what = record.resource if not record.group else f"{record.plural}.{record.group}"
        named = f'{what} "{record.name}"' if record.name else what
        if fault.status == 403:
            scope = (
                f'in the namespace "{record.namespace}"'
                if record.namespace
                else "at the cluster scope"
            )
            message = fault.message or (
                f'{named} is forbidden: User "{self.user}" cannot {record.verb} resource '
                f'"{record.resource}" in API group "{record.group}" {scope}'
            )
            return api_error(403, message, kind=record.plural, name=record.name or "")
        if fault.status == 409:
            return api_error(409, fault.message or f"{named} already exists")
        if fault.status == 404:
            return api_error(404, fault.message or f"{named} not found")
        return api_error(
            fault.status or 500, fault.message or "Internal error occurred: injected by the test"
        )

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, kmock.KubernetesError):
            return aiohttp.web.json_response(status_body(exc), status=exc.status)
        return await super()._render_error(exc)

    def _get_resources(self) -> list[kmock.resource]:
        # Only what is served now: a deleted CRD's objects must not keep it discoverable.
        return list(self.resources)

    def info(self, resource: kmock.resource | None) -> kmock.ResourceInfo:
        if resource is None or not resource.plural or resource not in self.resources:
            raise api_error(404, "the server could not find the requested resource")
        return self.resources[resource]

    def key(self, resource: kmock.resource, namespace: str | None, name: str) -> Key:
        return (resource, namespace if self.info(resource).namespaced else None, name)

    # --------------------------------------------------------------------- the store
    def live(self, key: Key) -> dict[str, Any] | None:
        if key not in self.objects or self.objects[key].deleted:
            return None
        return self.objects[key].raw

    def live_items(self, resource: kmock.resource, namespace: str | None = None):
        for (res, ns, name), obj in list(self.objects.items()):
            if res == resource and not obj.deleted and (namespace is None or ns == namespace):
                yield (res, ns, name), obj.raw

    def require(self, key: Key) -> dict[str, Any]:
        obj = self.live(key)
        if obj is None:
            resource, _, name = key
            raise api_error(
                404,
                f'{qualified(resource)} "{name}" not found',
                name=name,
                group=resource.group,
                kind=resource.plural,
            )
        return obj

    def _emit(self, resource: kmock.resource, event_type: str, obj: dict[str, Any]) -> None:
        event = {"type": event_type, "object": copy.deepcopy(obj)}
        self._history.append((self._rv, resource, event))
        if len(self._history) > self.history_limit + self.history_limit // 10:
            self._compacted_rv = self._history[-self.history_limit - 1][0]
            del self._history[: -self.history_limit]
        self._tick.set()
        self._tick = asyncio.Event()
        for hook in list(self.hooks):
            hook(resource, copy.deepcopy(event))

    def _store(self, key: Key, obj: dict[str, Any], event_type: str) -> dict[str, Any]:
        resource, namespace, name = key
        previous = self.live(key)
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if key in self.objects:
            self.objects[key].create(obj)
        else:
            self.objects[key] = obj
        if resource == POD_RESOURCE and namespace is not None:
            self._follow_containers(namespace, name, previous, obj)
        self._emit(resource, event_type, obj)
        return copy.deepcopy(obj)

    def _follow_containers(
        self, namespace: str, pod: str, old: dict[str, Any] | None, new: dict[str, Any]
    ) -> None:
        """Keep container log instances in step with the pod's container statuses."""
        before = _containers_by_name(old or {})
        for container, status in _containers_by_name(new).items():
            key = (namespace, pod, container)
            state = status.get("state") or {}
            old_status = before.get(container) or {}
            restarted = status.get("restartCount", 0) > old_status.get("restartCount", 0)
            if restarted or (
                "running" in state and "running" not in (old_status.get("state") or {})
            ):
                if restarted or not self.logs.instances(key):
                    self.logs.start(key)
            if "terminated" in state:
                instances = self.logs.instances(key)
                if not instances or not instances[-1].terminated:
                    self.logs.terminate(key)

    def create_object(
        self,
        resource: kmock.resource,
        namespace: str | None,
        body: dict[str, Any],
        field_validation: str = "",
        warnings: list[str] | None = None,
    ) -> dict[str, Any]:
        info = self.info(resource)
        if not isinstance(body, dict):
            raise api_error(400, "the body of the request was in an unknown format")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        name = meta.get("name") or (
            f"{meta['generateName']}{secrets.token_hex(3)[:5]}" if meta.get("generateName") else ""
        )
        if not name:
            raise api_error(422, f"{info.kind} is invalid: metadata.name: Required value")
        key = self.key(resource, namespace or meta.get("namespace"), name)
        if self.live(key) is not None:
            raise api_error(
                409,
                f'{qualified(resource)} "{name}" already exists',
                name=name,
                group=resource.group,
                kind=resource.plural,
            )
        meta["name"] = name
        if key[1] is not None:
            meta["namespace"] = key[1]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_iso(), generation=1)
        obj.setdefault("apiVersion", self.group_version(resource))
        obj.setdefault("kind", info.kind)
        if "status" in info.subresources and resource != POD_RESOURCE:
            obj.pop("status", None)
        obj = self.admit(resource, obj, None, field_validation, warnings)
        stored = self._store(key, obj, "ADDED")
        if resource == CRD_RESOURCE:
            self._serve_crd(stored)
        return stored

    def admit(
        self,
        resource: kmock.resource,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        field_validation: str = "",
        warnings: list[str] | None = None,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """A custom resource as the server stores it: pruned, defaulted, valid (else 400 for
        unknown fields under Strict, 422 Invalid), then passed by the admission webhooks."""
        admission = self.schemas.get(resource)
        if admission is None:
            return obj
        result = admission.admit(obj, old)
        name = obj["metadata"].get("name", "")
        if result.unknown and field_validation == "Strict":
            unknown = ", ".join(f'unknown field "{path}"' for path in result.unknown)
            raise api_error(
                400,
                f'{admission.kind} in version "{admission.version}" cannot be handled as a '
                f"{admission.kind}: strict decoding error: {unknown}",
            )
        if result.unknown and field_validation != "Ignore" and warnings is not None:
            warnings.extend(f'unknown field "{path}"' for path in result.unknown)
        if result.causes:
            messages = [cause.message for cause in result.causes]
            shown = messages[0] if len(messages) == 1 else f"[{', '.join(messages)}]"
            raise api_error(
                422,
                f'{admission.kind}.{resource.group} "{name}" is invalid: {shown}',
                name=name,
                group=resource.group,
                kind=admission.kind,
                causes=[cause.as_dict() for cause in result.causes],
            )
        if subresource is None:  # webhooks are registered for the resource, not its status
            for webhook in list(self.admission):
                webhook(resource, obj, old)
        return obj

    @staticmethod
    def group_version(resource: kmock.resource) -> str:
        return f"{resource.group}/{resource.version}" if resource.group else resource.version

    def write_object(
        self,
        key: Key,
        new: dict[str, Any],
        subresource: str | None = None,
        field_validation: str = "",
        warnings: list[str] | None = None,
    ) -> dict[str, Any]:
        """Store a new version of an existing object, keeping what the server owns."""
        resource = key[0]
        info = self.info(resource)
        current = self.require(key)
        sent_rv = (new.get("metadata") or {}).get("resourceVersion")
        if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
            raise api_error(
                409,
                f'Operation cannot be fulfilled on {qualified(resource)} "{key[2]}": the object '
                "has been modified; please apply your changes to the latest version and try again",
                reason="Conflict",
            )
        if subresource == "status":
            new = {**copy.deepcopy(current), "status": new.get("status")}
        elif "status" in info.subresources:
            new = {**new, "status": copy.deepcopy(current.get("status"))}
        if new.get("status") is None:
            new.pop("status", None)
        meta = new.setdefault("metadata", {})
        for owned in ("uid", "creationTimestamp", "name", "namespace", "deletionTimestamp"):
            if owned in current["metadata"]:
                meta[owned] = current["metadata"][owned]
        generation = current["metadata"].get("generation", 1)
        new = self.admit(resource, new, current, field_validation, warnings, subresource)
        changed_spec = new.get("spec") != current.get("spec")
        meta["generation"] = generation + 1 if changed_spec else generation
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            # the last finalizer gone: the object goes, and the garbage collector takes its
            # dependents (a Background deletion's, the default)
            self._drop(key, new)
            self._collect_dependents(meta.get("uid"))
            return copy.deepcopy(new)
        return self._store(key, new, "MODIFIED")

    def patch_object(
        self,
        key: Key,
        patch: Any,
        content_type: str = "",
        subresource: str | None = None,
        field_validation: str = "",
        warnings: list[str] | None = None,
    ) -> dict[str, Any]:
        current = self.require(key)
        if "json-patch" in content_type or isinstance(patch, list):
            if not isinstance(patch, list):
                raise api_error(
                    400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
                )
            new = jsonpatch.apply_patch(copy.deepcopy(current), patch)
        else:
            if "strategic-merge" in content_type and key[0].group not in ("", "batch"):
                raise api_error(415, "strategic merge patch is not supported for custom resources")
            if not isinstance(patch, dict):
                raise api_error(400, "the body of the request was in an unknown format")
            new = merge_patch(copy.deepcopy(current), patch)
        # The merged object keeps the current resourceVersion unless the patch names one,
        # which then is a precondition checked by write_object.
        return self.write_object(key, new, subresource, field_validation, warnings)

    def delete_object(self, key: Key, policy: str = "") -> dict[str, Any]:
        current = self.require(key)
        resource = key[0]
        policy = policy or ("Orphan" if resource == JOB_RESOURCE else "Background")
        if current["metadata"].get("finalizers"):
            if not current["metadata"].get("deletionTimestamp"):
                marked = copy.deepcopy(current)
                marked["metadata"]["deletionTimestamp"] = now_iso()
                return self._store(key, marked, "MODIFIED")
            return copy.deepcopy(current)
        if policy == "Foreground":
            self._collect_dependents(current["metadata"].get("uid"))
        self._drop(key, copy.deepcopy(current))
        if policy == "Background":
            self._collect_dependents(current["metadata"].get("uid"))
        return current

    def _drop(self, key: Key, last: dict[str, Any]) -> None:
        resource, namespace, name = key
        self._rv += 1
        last["metadata"]["resourceVersion"] = str(self._rv)
        self.objects[key].delete()
        if resource == POD_RESOURCE and namespace is not None:
            self.logs.forget_pod(namespace, name)
        if resource == CRD_RESOURCE:
            self._stop_serving_crd(last)
        self._emit(resource, "DELETED", last)

    def _collect_dependents(self, uid: str | None) -> None:
        """Garbage collection: delete every object owned by ``uid`` (and theirs)."""
        if not uid:
            return
        for (resource, namespace, name), obj in list(self.objects.items()):
            if obj.deleted:
                continue
            owners = obj.raw.get("metadata", {}).get("ownerReferences") or []
            if any(owner.get("uid") == uid for owner in owners):
                self.delete_object((resource, namespace, name), "Background")

    # ---------------------------------------------------------------------------- CRDs
    def _crd_resources(self, crd: dict[str, Any]):
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        for version in spec.get("versions") or []:
            if version.get("served", True):
                subresources = set((version.get("subresources") or {}).keys())
                resource = kmock.resource(spec.get("group"), version["name"], names.get("plural"))
                info = kmock.ResourceInfo(
                    kind=names.get("kind"),
                    singular=names.get("singular"),
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    subresources=subresources,
                )
                yield resource, info

    def _serve_crd(self, crd: dict[str, Any]) -> None:
        admissions = admissions_of(crd)
        for resource, info in self._crd_resources(crd):
            self.resources[resource] = info
            if resource.version in admissions:
                self.schemas[resource] = admissions[resource.version]

    def _stop_serving_crd(self, crd: dict[str, Any]) -> None:
        for resource, _ in self._crd_resources(crd):
            for key, _obj in list(self.live_items(resource)):
                self._drop(key, copy.deepcopy(self.objects[key].raw))
            if resource in self.resources:
                del self.resources[resource]
            self.schemas.pop(resource, None)

    # ----------------------------------------------------------------- HTTP fallbacks
    async def _serve_list(self, request: kmock.Request) -> dict[str, Any]:
        info = self.info(request.resource)
        matches = selector_matcher(request.params)
        items = [
            copy.deepcopy(obj)
            for _, obj in self.live_items(request.resource, request.namespace)
            if matches(obj)
        ]
        return {
            "apiVersion": self.group_version(request.resource),
            "kind": f"{info.kind}List",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }

    async def _serve_fetch(self, request: kmock.Request) -> Any:
        self.info(request.resource)
        if request.subresource == "log" and request.resource == POD_RESOURCE:
            return self._serve_log(request)
        key = self.key(request.resource, request.namespace, request.name)
        return copy.deepcopy(self.require(key))

    async def _serve_create(self, request: kmock.Request) -> kmock.Response:
        warnings: list[str] = []
        created = self.create_object(
            request.resource,
            request.namespace,
            request.data,
            request.params.get("fieldValidation", ""),
            warnings,
        )
        return kmock.Response(status=201, payload=created, headers=warning_header(warnings))

    async def _serve_update(self, request: kmock.Request) -> kmock.Response:
        key = self.key(request.resource, request.namespace, request.name)
        content_type = request.headers.get("Content-Type", "")
        warnings: list[str] = []
        patched = self.patch_object(
            key,
            request.data,
            content_type,
            request.subresource,
            request.params.get("fieldValidation", ""),
            warnings,
        )
        return kmock.Response(status=200, payload=patched, headers=warning_header(warnings))

    async def _serve_replace(self, request: kmock.Request) -> kmock.Response:
        if request.resource is None or not request.name:
            raise api_error(405, "the server does not allow this method on the requested resource")
        key = self.key(request.resource, request.namespace, request.name)
        if not isinstance(request.data, dict):
            raise api_error(400, "the body of the request was in an unknown format")
        warnings: list[str] = []
        replaced = self.write_object(
            key,
            copy.deepcopy(request.data),
            request.subresource,
            request.params.get("fieldValidation", ""),
            warnings,
        )
        return kmock.Response(status=200, payload=replaced, headers=warning_header(warnings))

    async def _serve_delete(self, request: kmock.Request) -> dict[str, Any]:
        key = self.key(request.resource, request.namespace, request.name)
        options = request.data if isinstance(request.data, dict) else {}
        policy = options.get("propagationPolicy") or request.params.get("propagationPolicy", "")
        if options.get("orphanDependents") is True:
            policy = "Orphan"
        return self.delete_object(key, policy)

    def _serve_log(self, request: kmock.Request) -> Any:
        key = self.key(POD_RESOURCE, request.namespace, request.name)
        pod = self.require(key)
        names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        container = request.params.get("container") or (names[0] if len(names) == 1 else "")
        if not container:
            raise api_error(
                400,
                f"a container name must be specified for pod {request.name}, "
                f"choose one of: {names}",
            )
        log_key = (request.namespace or "", request.name or "", container)
        previous = flag(request.params, "previous")
        instances = self.logs.instances(log_key)
        if previous and len(instances) < 2:
            raise api_error(
                400,
                f'previous terminated container "{container}" in pod "{request.name}" not found',
            )
        state = (_containers_by_name(pod).get(container) or {}).get("state") or {}
        if not instances and not ({"running", "terminated"} & set(state)):
            reason = (state.get("waiting") or {}).get("reason", "ContainerCreating")
            raise api_error(
                400,
                f'container "{container}" in pod "{request.name}" is waiting to start: {reason}',
            )
        try:
            query = LogQuery.from_params(request.params)
        except ValueError as error:  # the API server refuses unparsable options with 400
            raise api_error(400, str(error)) from None
        if flag(request.params, "follow") and not previous:
            return self.logs.follow(log_key, query, lambda: _gone(request))
        return self.logs.read(log_key, query, previous=previous)

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        info = self.info(request.resource)
        matches = selector_matcher(request.params)
        resource, namespace = request.resource, request.namespace
        timeout = float(request.params.get("timeoutSeconds") or DEFAULT_WATCH_SECONDS)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        epoch = -1 if self._shutting_down else self._watch_epoch
        yield b""  # send the headers at once
        since = request.params.get("resourceVersion") or "0"
        if since == "0":
            for _, obj in self.live_items(resource, namespace):
                if matches(obj):
                    yield {"type": "ADDED", "object": copy.deepcopy(obj)}
            cursor = self._rv
        elif int(since) < self._compacted_rv:
            yield {"type": "ERROR", "object": status_body(self.expired(int(since)))}
            return
        else:
            cursor = int(since)
        while True:
            tick = self._tick
            # A closed watch delivers nothing more: the client resumes from what it saw.
            if epoch != self._watch_epoch:
                if self._abort_watches and request._raw_request is not None:
                    transport = request._raw_request.transport
                    if transport is not None:
                        transport.abort()
                return
            start = bisect.bisect_right(self._history, cursor, key=lambda entry: entry[0])
            for rv, event_resource, event in self._history[start:]:
                if epoch != self._watch_epoch:
                    break
                cursor = rv
                obj = event["object"]
                in_namespace = namespace is None or obj["metadata"].get("namespace") == namespace
                if event_resource == resource and in_namespace and matches(obj):
                    yield event
            else:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    if flag(request.params, "allowWatchBookmarks"):
                        yield self.bookmark(info, resource)
                    return
                if _gone(request):
                    return
                try:
                    await asyncio.wait_for(
                        tick.wait(), timeout=min(remaining, WATCH_WAKEUP_SECONDS)
                    )
                except asyncio.TimeoutError:
                    pass

    def expired(self, since: int) -> kmock.KubernetesError:
        return api_error(410, f"too old resource version: {since} ({self._compacted_rv})")

    def bookmark(self, info: kmock.ResourceInfo, resource: kmock.resource) -> dict[str, Any]:
        return {
            "type": "BOOKMARK",
            "object": {
                "kind": info.kind,
                "apiVersion": self.group_version(resource),
                "metadata": {"resourceVersion": str(self._rv)},
            },
        }

    # ------------------------------------------------------------------ test controls
    def shut_down(self) -> None:
        """Drop every open watch, and every watch that still comes (``_shutting_down``)."""
        self._shutting_down = True
        self.close_watches(abort=True)

    def close_watches(self, abort: bool = False) -> None:
        """End every open watch now: cleanly (the client resumes) or by dropping it."""
        self._watch_epoch += 1
        self._abort_watches = abort
        self._tick.set()
        self._tick = asyncio.Event()

    def expire_watches(self) -> None:
        """Compact all history: resuming from any resourceVersion seen so far answers 410."""
        self._rv += 1
        self._compacted_rv = self._rv
        self._history.clear()
        self.close_watches()

    @property
    def resource_version(self) -> int:
        return self._rv


def warning_header(warnings: list[str]) -> dict[str, str]:
    """The ``Warning`` header the server answers with (RFC 7234 code 299, one per warning)."""
    if not warnings:
        return {}
    return {"Warning": ", ".join(f"299 - {json.dumps(text)}" for text in warnings)}


def flag(params: dict[str, str], name: str) -> bool:
    """A boolean query parameter, parsed the way the API server parses it."""
    return params.get(name, "").lower() in ("1", "t", "true")


def _gone(request: kmock.Request) -> bool:
    raw = request._raw_request
    return raw is None or raw.transport is None or raw.transport.is_closing()


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (strategic merge is treated the same: lists are replaced)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result
