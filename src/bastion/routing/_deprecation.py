"""A deprecated API version: its replacement, sunset date, message and sunset enforcement, and its headers
(RFC 8594, with the spec's or RFC 9745's form of ``Deprecation``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from email.utils import format_datetime
from typing import Literal

from bastion.errors import ConfigError
from bastion.routing._sunset import Brownout, gone_reason, parse_sunset
from bastion.types import Headers

HeaderForm = Literal["version", "rfc9745"]
"""``service.deprecation_header``: ``Deprecation: version="v1"`` (the spec's) or ``Deprecation: @<unix time>``
(RFC 9745, the date ``since`` names)."""


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

    ``sunset`` and ``since`` take an RFC 3339 string (``"2027-06-30T00:00:00Z"``) or an aware datetime and are
    kept as UTC datetimes. ``enforce_sunset``: from the sunset on, the version's routes answer ``410 Gone``
    (opt-in: the spec only announces a sunset). ``brownout``: 410 for a share of the time before the sunset.
    ``since`` (when the version was deprecated) is what RFC 9745's ``Deprecation`` header carries. Raises
    ConfigError for a bad replacement, date or message, or enforcement or a brownout without a sunset.
    """

    replacement: int
    sunset: datetime | str | None = None
    message: str | None = None
    enforce_sunset: bool = False
    brownout: Brownout | None = None
    since: datetime | str | None = None

    def __post_init__(self) -> None:
        replacement = self.replacement
        if isinstance(replacement, bool) or not isinstance(replacement, int) or replacement < 1:
            raise ConfigError(f"replacement version {replacement!r} must be a positive integer")
        object.__setattr__(self, "sunset", parse_sunset(self.sunset))
        object.__setattr__(self, "since", parse_sunset(self.since, "deprecation since"))
        if (self.enforce_sunset or self.brownout is not None) and self.sunset is None:
            raise ConfigError("enforce_sunset and brownout need a sunset date")
        if self.brownout is not None and self.sunset_at is not None and self.brownout.start_at >= self.sunset_at:
            raise ConfigError(f"brownout start {self.brownout.start_at.isoformat()} is not before the sunset")
        if self.message is not None:
            object.__setattr__(self, "message", _header_text(self.message, "deprecation message") or None)

    @property
    def sunset_at(self) -> datetime | None:
        assert not isinstance(self.sunset, str)
        return self.sunset

    @property
    def since_at(self) -> datetime | None:
        assert not isinstance(self.since, str)
        return self.since

    def gone(self, version: int, now: float) -> str | None:
        """The ``410 Gone`` message for a request to ``version`` at ``now`` (Unix seconds), else ``None``."""
        return gone_reason(
            version=version,
            replacement=self.replacement,
            sunset=self.sunset_at,
            enforce=self.enforce_sunset,
            brownout=self.brownout,
            now=now,
        )

    @property
    def sunset_rfc3339(self) -> str | None:
        return self.sunset_at.strftime("%Y-%m-%dT%H:%M:%SZ") if self.sunset_at else None

    def headers(self, version: int, form: HeaderForm = "version") -> Headers:
        """``Deprecation``, ``Sunset`` (IMF-fixdate; omitted without a date), ``Link`` and ``Warning``.

        ``form = "rfc9745"``: ``Deprecation: @<since as Unix seconds>`` (an RFC 9651 date); the spec's form when
        ``since`` is not set (the service refuses that combination at start-up)."""
        label, successor = f"v{version}", f"v{self.replacement}"
        warning = f"API version {label} is deprecated. Please migrate to version {successor}."
        if self.message:
            warning += f" {self.message}"
        since = self.since_at
        value = f"@{int(since.timestamp())}" if form == "rfc9745" and since is not None else f'version="{label}"'
        headers: Headers = [(b"deprecation", value.encode())]
        if self.sunset_at is not None:
            headers.append((b"sunset", format_datetime(self.sunset_at, usegmt=True).encode()))
        headers.append((b"link", f'</{successor}/>; rel="successor-version"'.encode()))
        escaped = warning.replace("\\", "\\\\").replace('"', '\\"')
        headers.append((b"warning", f'299 - "{escaped}"'.encode("latin-1")))
        return headers
