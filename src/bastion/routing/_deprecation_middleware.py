"""Versioned requests: the ``api.version.requests`` metric; for deprecated versions the RFC 8594 headers and the
``deprecated_api_version_accessed`` log."""

from __future__ import annotations

import structlog

from bastion._metrics import Metrics
from bastion.routing._versioned import VersionedApi
from bastion.types import SCOPE_API_VERSION, SCOPE_RESPONSE_HEADERS, ASGIApp, Receive, Scope, Send

log = structlog.get_logger("bastion.deprecation")


class DeprecationMiddleware:
    """Tag versioned requests: record the version, count it, and mark deprecated versions.

    Writes scope[SCOPE_API_VERSION]. For a deprecated version it logs ``deprecated_api_version_accessed``
    (warning) and puts the deprecation headers on every response of that version, errors included (via
    scope[SCOPE_RESPONSE_HEADERS], which the error renderer reads). Reads the live deprecation state of
    ``api``, so a version deprecated at run time is marked from its next request on.
    """

    def __init__(self, app: ASGIApp, *, api: VersionedApi, base_path: str, metrics: Metrics) -> None:
        self.app = app
        self.api = api
        self.prefix = base_path + "/v"
        self.metrics = metrics

    def _version_of(self, path: str) -> int | None:
        if not path.startswith(self.prefix):
            return None
        label = path[len(self.prefix) :].split("/", 1)[0]
        # ASCII digits only: str.isdigit (and int) take other scripts' digits too, "v\u0661" is not v1.
        if not (label.isascii() and label.isdigit()) or label.startswith("0"):
            return None
        number = int(label)
        return number if number in self.api.versions else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        version = self._version_of(scope["path"]) if scope["type"] == "http" else None
        if version is None:
            await self.app(scope, receive, send)
            return
        scope[SCOPE_API_VERSION] = version
        deprecation = self.api.versions[version].deprecation
        self.metrics.version_request(version, deprecation.replacement if deprecation is not None else None)
        if deprecation is None:
            await self.app(scope, receive, send)
            return
        log.warning(
            "deprecated_api_version_accessed",
            path=scope["path"],
            deprecated_version=f"v{version}",
            replacement_version=f"v{deprecation.replacement}",
            sunset_date=deprecation.sunset_rfc3339,
            message=deprecation.message,
        )
        # On every response of the request, errors included; the request-id step adds them.
        scope[SCOPE_RESPONSE_HEADERS] = [*scope.get(SCOPE_RESPONSE_HEADERS, ()), *self.api.deprecation_headers(version)]
        await self.app(scope, receive, send)
