"""The metrics listener: ``/metrics`` on its own port (``metrics.port``), served from a thread by the standard
library's HTTP server, so a scrape is answered even while the event loop is busy (docs/observability.md)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4


class _Handler(BaseHTTPRequestHandler):
    """One request of the metrics listener (``self.server.listener`` says what to answer)."""

    server: _Server
    timeout = 10  # a client that sends nothing is dropped, its thread freed
    protocol_version = "HTTP/1.1"

    def version_string(self) -> str:
        return "bastion"  # no versions on the wire

    def do_GET(self) -> None:  # http.server's naming
        self._answer(head=False)

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("do_"):  # every other method: 405 on the path, 404 elsewhere (not http.server's 501)
            return lambda: self._answer(head=False, allowed=False)
        raise AttributeError(name)

    def _answer(self, *, head: bool, allowed: bool = True) -> None:
        listener = self.server.listener
        extra: list[tuple[str, str]] = []
        if self.path.split("?", 1)[0] != listener.path:
            status, content_type, body = 404, "text/plain; charset=utf-8", b"Not Found"
        elif not allowed:
            status, content_type, body = 405, "text/plain; charset=utf-8", b"Method Not Allowed"
            extra.append(("Allow", "GET, HEAD"))
        else:
            status, content_type, body = 200, CONTENT_TYPE_PLAIN_0_0_4, listener.expose()
        self.send_response(status)
        for name, value in [("Content-Type", content_type), ("Content-Length", str(len(body))), *extra]:
            self.send_header(name, value)
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        if not head:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # a scrape is not worth a log line
        pass


class _Server(ThreadingHTTPServer):
    listener: MetricsListener


class MetricsListener:
    """``metrics.port``: the exposition on a port of its own, answered by threads of a stdlib HTTP server (it runs
    in the supervisor of ``--workers N`` too, which has no event loop). ``GET``/``HEAD`` on ``path`` -> 200, another
    method there -> 405, any other path -> 404 ``Not Found``. ``expose()`` must be thread-safe (prometheus-client's
    collection is; breaker states are read without side effects)."""

    def __init__(self, expose: Callable[[], bytes], *, path: str) -> None:
        self.expose = expose
        self.path = path
        self._server: _Server | None = None

    def start(self, host: str, port: int) -> None:
        """Bind and serve; an OSError (port in use, unknown host) is the caller's to report."""
        server = self._server = _Server((host, port), _Handler)
        server.listener = self
        threading.Thread(target=server.serve_forever, name="bastion-metrics", daemon=True).start()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
