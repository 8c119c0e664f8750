"""Deprecated API versions: RFC 8594 headers, the ``deprecated_api_version_accessed`` log and the version metric."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import TYPE_CHECKING

import structlog
from opentelemetry.metrics import Counter

from bastion.errors import ConfigError
from bastion.types import (
    SCOPE_API_VERSION,
    SCOPE_RESPONSE_HEADERS,
    ASGIApp,
    Headers,
    Message,
    Receive,
    Scope,
    Send,
)

if TYPE_CHECKING:
    from bastion.routing.versioned import VersionedApi

log = structlog.get_logger("bastion.deprecation")


def parse_sunset(value: str | datetime | None) -> datetime | None:
    """A timezone-aware UTC datetime from an RFC 3339 string (or a datetime); ConfigError otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip().replace("z", "Z"))
        except ValueError:
            raise ConfigError(f"sunset {value!r} is not an RFC 3339 date-time such as 2027-06-30T00:00:00Z") from None
    if value.tzinfo is None:
        raise ConfigError(f"sunset {value.isoformat()!r} has no UTC offset; RFC 3339 requires one")
    return value.astimezone(UTC)


def _header_text(value: str, what: str) -> str:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ConfigError(f"{what} {value!r} contains control characters")
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        raise ConfigError(f"{what} {value!r} must be latin-1 text to fit an HTTP header") from None
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class Deprecation:
    """Deprecation of one API version: its replacement, optional sunset and message.

    ``sunset`` takes an RFC 3339 string (``"2027-06-30T00:00:00Z"``) or an aware datetime and is kept as a
    UTC datetime. Raises ConfigError for a bad replacement, date or message.
    """

    replacement: int
    sunset: datetime | str | None = None
    message: str | None = None

    def __post_init__(self) -> None:
        replacement = self.replacement
        if isinstance(replacement, bool) or not isinstance(replacement, int) or replacement < 1:
            raise ConfigError(f"replacement version {replacement!r} must be a positive integer")
        object.__setattr__(self, "sunset", parse_sunset(self.sunset))
        if self.message is not None:
            object.__setattr__(self, "message", _header_text(self.message, "deprecation message") or None)

    @property
    def sunset_at(self) -> datetime | None:
        assert not isinstance(self.sunset, str)
        return self.sunset

    @property
    def sunset_rfc3339(self) -> str | None:
        return self.sunset_at.strftime("%Y-%m-%dT%H:%M:%SZ") if self.sunset_at else None

    def headers(self, version: int) -> Headers:
        """``Deprecation``, ``Sunset`` (IMF-fixdate; omitted without a date), ``Link`` and ``Warning``."""
        label, successor = f"v{version}", f"v{self.replacement}"
        warning = f"API version {label} is deprecated. Please migrate to version {successor}."
        if self.message:
            warning += f" {self.message}"
        headers: Headers = [(b"deprecation", f'version="{label}"'.encode())]
        if self.sunset_at is not None:
            headers.append((b"sunset", format_datetime(self.sunset_at, usegmt=True).encode()))
        headers.append((b"link", f'</{successor}/>; rel="successor-version"'.encode()))
        escaped = warning.replace("\\", "\\\\").replace('"', '\\"')
        headers.append((b"warning", f'299 - "{escaped}"'.encode("latin-1")))
        return headers


class DeprecationMiddleware:
    """Tag versioned requests: record the version, count it, and mark deprecated versions.

    Writes scope[SCOPE_API_VERSION]. For a deprecated version it logs ``deprecated_api_version_accessed``
    (warning) and puts the deprecation headers on every response of that version, errors included (via
    scope[SCOPE_RESPONSE_HEADERS], which the error renderer reads). Reads the live deprecation state of
    ``api``, so a version deprecated at run time is marked from its next request on.
    """

    def __init__(self, app: ASGIApp, *, api: VersionedApi, base_path: str, counter: Counter | None) -> None:
        self.app = app
        self.api = api
        self.prefix = base_path + "/v"
        self.counter = counter

    def _version_of(self, path: str) -> int | None:
        if not path.startswith(self.prefix):
            return None
        label = path[len(self.prefix) :].split("/", 1)[0]
        if not label.isdigit() or label.startswith("0"):
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
        if self.counter is not None:
            attributes = {"version": f"v{version}", "deprecated": "true" if deprecation else "false"}
            if deprecation is not None:
                attributes["replacement_version"] = f"v{deprecation.replacement}"
            self.counter.add(1, attributes)
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
        extra = self.api.deprecation_headers(version)
        scope[SCOPE_RESPONSE_HEADERS] = [*scope.get(SCOPE_RESPONSE_HEADERS, ()), *extra]

        async def send_with_deprecation(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *extra]
            await send(message)

        await self.app(scope, receive, send_with_deprecation)
