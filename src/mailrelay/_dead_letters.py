"""Dead letters as `mailrelay dead-letters` shows and selects them: the record, the filters (route, error, age) and
the durations they take. Pure: the JetStream side is `_dead_letter_store.py`, the command `_dead_letter_cli.py`."""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass, field
from typing import Any

DEFAULT_ROUTE = "default"
"""The route of a dead letter whose message carried no route name (a relay without named routes)."""
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNIT_SECS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MAX_DURATION_SECS = 10 * 365 * 86400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    """One dead letter: its place in the stream, what the relay recorded with it, and the payload as queued."""

    sequence: int
    delivery_id: str
    route: str
    error: str
    attempts: int | None
    accepted_at: float | None
    """Unix seconds of the 250 (MailRelay-Accepted-At)."""
    dead_lettered_at: float
    """Unix seconds the stream stored the dead letter."""
    body: bytes = field(repr=False)

    def summary(self) -> dict[str, Any]:
        """The record without the payload (`list --json`), times in RFC 3339 UTC."""
        out: dict[str, Any] = {
            "sequence": self.sequence,
            "delivery_id": self.delivery_id,
            "route": self.route,
            "error": self.error,
        }
        if self.attempts is not None:
            out["attempts"] = self.attempts
        if self.accepted_at is not None:
            out["accepted_at"] = rfc3339(self.accepted_at)
        out["dead_lettered_at"] = rfc3339(self.dead_lettered_at)
        out["size_bytes"] = len(self.body)
        return out

    def detail(self) -> dict[str, Any]:
        """The record with its payload (`show`): the JSON object as queued, or the text when it is not JSON."""
        out = self.summary()
        try:
            out["payload"] = json.loads(self.body)
        except ValueError:
            out["payload_text"] = self.body.decode("utf-8", errors="replace")
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class LetterFilter:
    """Which dead letters a command acts on; every given criterion must hold.

    `route`: equal (case-insensitive); `error`: contained in the recorded error (case-insensitive); `older_than` /
    `newer_than`: seconds since the letter was dead-lettered.
    """

    route: str | None = None
    error: str | None = None
    older_than: float | None = None
    newer_than: float | None = None

    def matches(self, letter: DeadLetter, *, now: float) -> bool:
        age = now - letter.dead_lettered_at
        return (
            (self.route is None or letter.route.casefold() == self.route.casefold())
            and (self.error is None or self.error.casefold() in letter.error.casefold())
            and (self.older_than is None or age >= self.older_than)
            and (self.newer_than is None or age < self.newer_than)
        )


def parse_duration(raw: str) -> float:
    """`90`, `90s`, `15m`, `2h`, `7d` -> seconds; ValueError saying what is expected."""
    match = _DURATION.match(raw.strip().lower())
    if match is None:
        raise ValueError(f"expected a duration like 90s, 15m, 2h or 7d, got {raw!r}")
    seconds = float(match.group(1)) * _UNIT_SECS[match.group(2)]
    if seconds > MAX_DURATION_SECS:
        raise ValueError(f"expected a duration of at most 10 years, got {raw!r}")
    return seconds


def rfc3339(timestamp: float) -> str:
    return (
        datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    )


def shown_age(seconds: float) -> str:
    """An age for the table: `42s`, `17m`, `5h`, `3d`."""
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"
