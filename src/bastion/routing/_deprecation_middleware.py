"""Versioned requests: the ``api.version.requests`` metric; for deprecated versions the headers, the
``deprecated_api_version_accessed`` log and, past an enforced sunset or in a brownout slot, ``410 Gone``."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

import structlog

from bastion._claims import Claims
from bastion._metrics import Metrics
from bastion.errors import ConfigError, Gone
from bastion.routing._deprecation import HeaderForm
from bastion.routing._versioned import VersionedApi
from bastion.types import SCOPE_API_VERSION, SCOPE_CLAIMS, SCOPE_RESPONSE_HEADERS, ASGIApp, Receive, Scope, Send

log = structlog.get_logger("bastion.deprecation")

ANONYMOUS_CALLER = "anonymous"
SUB_HASH_CHARS = 16
"""Hex digits of SHA-256 kept for a ``sub:`` caller: enough to tell callers apart, not to store who they are."""


def caller_of(scope: Scope) -> str:
    """The ``caller`` label of a request: ``client:<client_id>``, else ``sub:<SHA-256 of sub, 16 hex>``, else
    ``anonymous`` (no token, or one rejected before the handler)."""
    claims = scope.get(SCOPE_CLAIMS)
    if not isinstance(claims, Claims):
        return ANONYMOUS_CALLER
    if claims.client_id:
        return f"client:{claims.client_id}"
    if claims.sub:
        return "sub:" + hashlib.sha256(claims.sub.encode()).hexdigest()[:SUB_HASH_CHARS]
    return ANONYMOUS_CALLER


def version_labels(api: VersionedApi) -> dict[str, int]:
    """``{"2": 2}`` for each registered version: a path's label is looked up, not parsed, per request. Only the
    canonical form is a key: ``v02`` or ``v\u0661`` (another script's digit) is no version (versions are >= 1)."""
    return {str(number): number for number in api.versions}


class DeprecationMiddleware:
    """Tag versioned requests: record the version, count it, and mark deprecated versions.

    Writes scope[SCOPE_API_VERSION]. For a deprecated version it logs ``deprecated_api_version_accessed``
    (warning) and puts the deprecation headers on every response of that version, errors included (via
    scope[SCOPE_RESPONSE_HEADERS], which the error renderer reads); past an enforced sunset or in a brownout
    slot it raises Gone (410) before anything else runs. Reads the live deprecation state of ``api``, so a
    version deprecated at run time is marked from its next request on. With ``metrics.version_callers`` the
    request is counted when it ends, by its caller (token auth, further in, has put the claims in the scope).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        api: VersionedApi,
        base_path: str,
        metrics: Metrics,
        form: HeaderForm = "version",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.app = app
        self.api = api
        self.prefix = base_path + "/v"
        self.metrics = metrics
        self.form = form
        self.clock = clock
        self._labels = version_labels(api)
        now = clock()
        for number, deprecation in sorted(api.deprecations.items()):
            if form == "rfc9745" and deprecation.since_at is None:
                raise ConfigError(
                    f'service.deprecation_header = "rfc9745" needs the date v{number} was deprecated: '
                    f'deprecate({number}, ..., since="2026-01-01T00:00:00Z")'
                )
            sunset = deprecation.sunset_at
            if deprecation.enforce_sunset and sunset is not None and sunset.timestamp() <= now:
                log.warning(
                    "api_version_sunset_passed",
                    version=f"v{number}",
                    sunset_date=deprecation.sunset_rfc3339,
                    message=f"v{number} is past its sunset: every request to it answers 410 Gone",
                )

    def _version_of(self, path: str) -> int | None:
        if not path.startswith(self.prefix):
            return None
        start = len(self.prefix)
        end = path.find("/", start)
        label = path[start:] if end < 0 else path[start:end]
        number = self._labels.get(label)
        if number is None and len(self._labels) != len(self.api.versions):  # one registered since: learn it
            self._labels = version_labels(self.api)
            number = self._labels.get(label)
        return number

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        version = self._version_of(scope["path"]) if scope["type"] == "http" else None
        if version is None:
            await self.app(scope, receive, send)
            return
        if not self.metrics.version_callers:
            self._tag(scope, version)
            await self.app(scope, receive, send)
            return
        deprecation = self.api.versions[version].deprecation
        replacement = deprecation.replacement if deprecation is not None else None
        try:
            self._tag(scope, version)
            await self.app(scope, receive, send)
        finally:
            self.metrics.version_request(version, replacement, caller_of(scope))

    def enter(self, scope: Scope, receive: Receive) -> Receive | None:
        """The step for an HTTP request, as a plain call (``bastion._fused``); ``None`` when it counts the request
        by its caller once it is over (``metrics.version_callers``: then this layer runs)."""
        if self.metrics.version_callers:
            return None
        version = self._version_of(scope["path"])
        if version is not None:
            self._tag(scope, version)
        return receive

    def _tag(self, scope: Scope, version: int) -> None:
        scope[SCOPE_API_VERSION] = version
        deprecation = self.api.versions[version].deprecation
        if not self.metrics.version_callers:
            self.metrics.version_request(version, deprecation.replacement if deprecation is not None else None)
        if deprecation is None:
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
        headers = self.api.deprecation_headers(version, self.form)
        scope[SCOPE_RESPONSE_HEADERS] = [*scope.get(SCOPE_RESPONSE_HEADERS, ()), *headers]
        gone = deprecation.gone(version, self.clock())
        if gone is not None:
            raise Gone(gone)
