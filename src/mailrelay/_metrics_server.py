"""The metrics endpoint on MAIL_RELAY_METRICS_PORT: GET or HEAD /metrics -> 200 with the Prometheus text format,
another method there -> 405, any other path -> 404 `Not Found` (as on the health port)."""

from __future__ import annotations

import structlog

from mailrelay._health import NOT_FOUND
from mailrelay._http import READ_TIMEOUT_SECS, HttpServer, response
from mailrelay._metrics import CONTENT_TYPE, RelayMetrics

METRICS_PATH = "/metrics"
READ_METHODS = ("GET", "HEAD")
METHOD_NOT_ALLOWED = ("405 Method Not Allowed", b"Method Not Allowed")
INTERNAL_ERROR = ("500 Internal Server Error", b"Internal Server Error")

log = structlog.get_logger("mailrelay.metrics")


class MetricsServer(HttpServer):
    """Serves `metrics` on its own port; each scrape first reads what comes from elsewhere (`metrics.refresh()`)."""

    def __init__(self, metrics: RelayMetrics, *, read_timeout: float = READ_TIMEOUT_SECS) -> None:
        super().__init__(self._respond_to, read_timeout=read_timeout)
        self.metrics = metrics

    async def _respond_to(self, method: str, path: str) -> bytes:
        head_only = method == "HEAD"
        if path != METRICS_PATH:
            return response(*NOT_FOUND, head_only=head_only)
        if method not in READ_METHODS:
            return response(*METHOD_NOT_ALLOWED, headers=[("Allow", ", ".join(READ_METHODS))])
        try:
            await self.metrics.refresh()
            body = self.metrics.exposition()
        except Exception:  # a bug costs the scrape, never the relay
            log.exception("metrics_scrape_failed")
            return response(*INTERNAL_ERROR, head_only=head_only)
        return response("200 OK", body, content_type=CONTENT_TYPE, head_only=head_only)
