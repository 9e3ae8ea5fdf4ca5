"""The emulator's request log and scripted faults.

Every request is recorded with the Kubernetes verb and resource it means (``get pods/log``,
``watch trainjobs``), so tests and benchmarks can count API traffic; a fault answers the next
N matching requests with an error status or drops their connection.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

# What the verbs of kmock's parsed actions (and plain methods) are called in RBAC terms.
VERBS = {
    "fetch": "get",
    "list": "list",
    "watch": "watch",
    "create": "create",
    "update": "patch",
    "delete": "delete",
}
METHOD_VERBS = {"PUT": "update", "PATCH": "patch", "DELETE": "delete", "POST": "create"}


@dataclass(frozen=True)
class RequestRecord:
    """One request as the API server understood it."""

    verb: str
    resource: str  # plural, with "/subresource" when there is one, e.g. "pods/log"
    group: str
    namespace: str | None
    name: str | None
    params: dict[str, str] = field(default_factory=dict)
    at: float = field(default_factory=time.monotonic)

    @property
    def plural(self) -> str:
        return self.resource.split("/", 1)[0]


@dataclass
class Fault:
    """Answer the next ``times`` requests matching verb/resource/name with ``status`` (or drop
    the connection when ``status`` is None).

    ``retry_after`` adds that header (seconds) to the error, as an API server under load does
    with 429 and 503; ``after_processing`` drops the connection only once the request was
    carried out (the change is made, the client never hears of it); ``empty_watch`` answers a
    watch with 200 and ends it at once, without an event."""

    status: int | None
    verb: str | None = None
    resource: str | None = None
    name: str | None = None
    times: int = 1
    message: str = ""
    hits: int = 0
    retry_after: int | None = None
    after_processing: bool = False
    empty_watch: bool = False

    def matches(self, record: RequestRecord) -> bool:
        return (
            self.hits < self.times
            and (self.verb is None or self.verb == record.verb)
            and (self.resource is None or self.resource in (record.resource, record.plural))
            and (self.name is None or self.name == record.name)
        )


class FaultList:
    def __init__(self) -> None:
        self._faults: list[Fault] = []

    def add(self, fault: Fault) -> Fault:
        self._faults.append(fault)
        return fault

    def take(self, record: RequestRecord) -> Fault | None:
        """The first armed fault for this request, spending one of its hits."""
        for fault in self._faults:
            if fault.matches(record):
                fault.hits += 1
                return fault
        return None

    def clear(self) -> None:
        self._faults.clear()
