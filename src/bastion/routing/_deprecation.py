"""A deprecated API version: its replacement, sunset date and message, and its RFC 8594 headers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import format_datetime

from bastion.errors import ConfigError
from bastion.types import Headers


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
