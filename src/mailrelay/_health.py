"""The health port: any method on /health -> 200 with an empty body; GET or HEAD /ready -> the readiness JSON (in
queue mode with the NATS connection and the dead-letter count); any other path -> 404 `Not Found`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

from mailrelay._errors import QueueUnavailable
from mailrelay._http import BAD_REQUEST, HttpServer, request_path, response

if TYPE_CHECKING:  # nats-py (the queue extra)
    from mailrelay._queue import QueueDepth

HEALTH_PATH = "/health"
READY_PATH = "/ready"
SERVICE = "mailrelay"
NOT_FOUND = ("404 Not Found", b"Not Found")
"""The spec's answer for any other path (status and body), on the metrics port too."""
JSON = "application/json"


class ReadinessProbe(Protocol):
    """What /ready asks the queue (`_queue.JetStreamQueue`): the connection, and the stream's depths (one JetStream
    request, at most 2 s; QueueUnavailable when they cannot be read)."""

    @property
    def connected(self) -> bool: ...

    async def depth(self) -> QueueDepth: ...


def response_for(method: str, target: str) -> bytes:
    """The full HTTP response for a request line's method and target (pure); HEAD gets no body, a target that does
    not parse gets 400."""
    path = request_path(target)
    return BAD_REQUEST if path is None else _health_response(method, path)


def _health_response(method: str, path: str) -> bytes:
    status, body = ("200 OK", b"") if path == HEALTH_PATH else NOT_FOUND
    return response(status, body, head_only=method == "HEAD")


async def readiness(queue: ReadinessProbe | None) -> tuple[bool, dict[str, Any]]:
    """Whether the relay can take mail, and the `/ready` body: `{"ready", "service", "dependencies"}` as Bastion's
    /ready. In queue mode the `queue` dependency is healthy while NATS is connected and the depths read, and
    carries `dead_letters` (letters on `<stream>.dead` nobody consumed) and `messages` (not yet acknowledged)."""
    dependencies: dict[str, dict[str, Any]] = {}
    if queue is not None:
        try:
            depth = await queue.depth()
        except QueueUnavailable as exc:
            dependencies["queue"] = {"healthy": False, "message": exc.reason}
        else:
            dependencies["queue"] = {"healthy": True, "messages": depth.messages, "dead_letters": depth.dead_letters}
    ready = all(dependency["healthy"] for dependency in dependencies.values())
    return ready, {"ready": ready, "service": SERVICE, "dependencies": dependencies}


class HealthServer(HttpServer):
    """Serves /health and /ready on their own port; `queue` (queue mode) is what /ready reports on."""

    def __init__(self, queue: ReadinessProbe | None = None) -> None:
        super().__init__(self._respond_to)
        self.queue = queue

    async def _respond_to(self, method: str, path: str) -> bytes:
        if path != READY_PATH or method not in ("GET", "HEAD"):
            return _health_response(method, path)
        ready, body = await readiness(self.queue)
        status = "200 OK" if ready else "503 Service Unavailable"
        return response(status, json.dumps(body).encode(), content_type=JSON, head_only=method == "HEAD")
