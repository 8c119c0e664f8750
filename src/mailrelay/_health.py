"""The health endpoint: any method on /health -> 200 with an empty body, any other path -> 404 `Not Found`."""

from __future__ import annotations

from mailrelay._http import BAD_REQUEST, HttpServer, request_path, response

HEALTH_PATH = "/health"
NOT_FOUND = ("404 Not Found", b"Not Found")
"""The spec's answer for any other path (status and body), on the metrics port too."""


def response_for(method: str, target: str) -> bytes:
    """The full HTTP response for a request line's method and target (pure); HEAD gets no body, a target that does
    not parse gets 400."""
    path = request_path(target)
    return BAD_REQUEST if path is None else _health_response(method, path)


def _health_response(method: str, path: str) -> bytes:
    status, body = ("200 OK", b"") if path == HEALTH_PATH else NOT_FOUND
    return response(status, body, head_only=method == "HEAD")


async def _respond(method: str, path: str) -> bytes:
    return _health_response(method, path)


class HealthServer(HttpServer):
    """Serves the health endpoint on its own port."""

    def __init__(self) -> None:
        super().__init__(_respond)
