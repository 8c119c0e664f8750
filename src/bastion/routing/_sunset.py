"""Sunset enforcement: whether a deprecated version answers ``410 Gone`` at an instant (after its sunset, or in
a brownout slot before it). Pure: the clock is the caller's."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from bastion.errors import ConfigError


def parse_sunset(value: str | datetime | None, what: str = "sunset") -> datetime | None:
    """A timezone-aware UTC datetime from an RFC 3339 string (or a datetime); ConfigError otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip().replace("z", "Z"))
        except ValueError:
            raise ConfigError(f"{what} {value!r} is not an RFC 3339 date-time such as 2027-06-30T00:00:00Z") from None
    if value.tzinfo is None:
        raise ConfigError(f"{what} {value.isoformat()!r} has no UTC offset; RFC 3339 requires one")
    return value.astimezone(UTC)


MIN_BROWNOUT_PERIOD_SECS = 60
"""A shorter period would make a brownout indistinguishable from random failures."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Brownout:
    """Answer 410 for ``share`` of the time from ``start`` until the version's sunset.

    Time is cut into periods of ``period_secs`` counted from the Unix epoch, so every instance browns out in
    the same slots: the first ``share * period_secs`` seconds of each period answer 410. ``start`` is an RFC
    3339 string or an aware datetime. Raises ConfigError for a share outside (0, 1], a period under
    :data:`MIN_BROWNOUT_PERIOD_SECS` or a bad date.
    """

    start: datetime | str
    share: float
    period_secs: int = 3600

    def __post_init__(self) -> None:
        start = parse_sunset(self.start, "brownout start")
        if start is None:
            raise ConfigError("brownout start is required (an RFC 3339 date-time)")
        object.__setattr__(self, "start", start)
        share = self.share
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
            raise ConfigError(f"brownout share {share!r} must be a fraction in (0, 1], e.g. 0.1 for 10 % of the time")
        period = self.period_secs
        if isinstance(period, bool) or not isinstance(period, int) or period < MIN_BROWNOUT_PERIOD_SECS:
            raise ConfigError(f"brownout period_secs {period!r} must be an integer >= {MIN_BROWNOUT_PERIOD_SECS}")

    @property
    def start_at(self) -> datetime:
        assert isinstance(self.start, datetime)
        return self.start

    def active(self, now: float) -> bool:
        """Whether ``now`` (Unix seconds) falls in a brownout slot (the caller checks it is before the sunset)."""
        if now < self.start_at.timestamp():
            return False
        return now % self.period_secs < self.share * self.period_secs


def gone_reason(
    *, version: int, replacement: int, sunset: datetime | None, enforce: bool, brownout: Brownout | None, now: float
) -> str | None:
    """The 410 message for a request at ``now`` (Unix seconds), or ``None`` when the version still answers."""
    if sunset is None:
        return None
    stamp = sunset.strftime("%Y-%m-%dT%H:%M:%SZ")
    if now >= sunset.timestamp():
        if enforce:
            return f"API version v{version} was sunset on {stamp}. Please migrate to version v{replacement}."
        return None
    if brownout is not None and brownout.active(now):
        return (
            f"API version v{version} is browned out ahead of its sunset on {stamp}. "
            f"Please migrate to version v{replacement}."
        )
    return None
