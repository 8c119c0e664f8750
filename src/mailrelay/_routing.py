"""Recipient routing: which RCPT TO addresses the relay accepts and which route (webhook) each one goes to.

Pure logic, no I/O. Three pattern forms (docs/mailrelay.md "Recipient routing"), compared case-insensitively:
an exact address `inbox@example.com`; a whole domain `*@example.com`; a plus-address family `user+*@example.com`
(`user@example.com` and `user+<anything>@example.com`). With `strip_tag` the `+detail` of every recipient is
removed before matching, so `user@example.com` also takes `user+news@example.com`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MAX_LOCAL_PART = 64  # RFC 5321 4.5.3.1.1: a longer local part never arrives
MAX_DOMAIN = 255  # RFC 5321 4.5.3.1.2
DEFAULT_ROUTE = "default"
TAG_SEPARATOR = "+"

# Characters an address may hold here: no spaces, controls, quotes, brackets or separators (RFC 5322 atext plus
# the dot, and any non-ASCII letter for SMTPUTF8 addresses).
_LOCAL = re.compile(r"[^\s\x00-\x1f\x7f\"(),:;<>@\[\\\]*]+")
_LABEL = re.compile(r"(?!-)[^\s\x00-\x1f\x7f\"(),:;<>@\[\\\]*.+_!#$%&'/=?^`{|}~]{1,63}(?<!-)")


class PatternKind(enum.Enum):
    EXACT = "exact"
    DOMAIN = "domain"  # *@domain
    PLUS = "plus"  # user+*@domain


@dataclass(frozen=True, slots=True, kw_only=True)
class Pattern:
    """One parsed target pattern; `text` is how the operator wrote it (lower-cased)."""

    text: str
    kind: PatternKind
    local: str  # the local part (without `+*` for PLUS; empty for DOMAIN)
    domain: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """Where the messages of some recipients go: a webhook with its own signing secret and payload version.

    `payload_version` None means the relay's MAIL_RELAY_PAYLOAD_VERSION (the delivery code reads the route's value
    first). `name` labels the route's breaker and metrics.
    """

    name: str
    patterns: tuple[Pattern, ...]
    webhook_url: str
    signing_secret: str | None = None
    payload_version: int | None = None


def parse_pattern(text: str, *, strip_tag: bool = False) -> Pattern:
    """Parse one target pattern; ValueError saying what is wrong for a malformed one or one that can never match."""
    raw = text.strip().lower()
    if raw.count("@") != 1:
        raise ValueError(f"{text!r} is not an address pattern (one @ expected)")
    local, domain = raw.split("@")
    _check_domain(text, domain)
    if local == "*":
        return Pattern(text=raw, kind=PatternKind.DOMAIN, local="", domain=domain)
    if local.endswith(TAG_SEPARATOR + "*"):
        stem = local[:-2]
        _check_local(text, stem)
        if TAG_SEPARATOR in stem:
            raise ValueError(f"{text!r} can never match (a tag holds no further +tag before the *)")
        return Pattern(text=raw, kind=PatternKind.PLUS, local=stem, domain=domain)
    _check_local(text, local)
    if strip_tag and TAG_SEPARATOR in local:
        raise ValueError(
            f"{text!r} can never match: MAIL_RELAY_STRIP_RECIPIENT_TAG removes the +tag before matching "
            f"(write {local.split(TAG_SEPARATOR)[0]}@{domain})"
        )
    return Pattern(text=raw, kind=PatternKind.EXACT, local=local, domain=domain)


def _check_local(text: str, local: str) -> None:
    if "*" in local:
        raise ValueError(f"{text!r}: * stands only for a whole local part (*@domain) or a tag (user+*@domain)")
    if not local or not _LOCAL.fullmatch(local) or local.startswith(".") or local.endswith(".") or ".." in local:
        raise ValueError(f"{text!r} has no valid local part before the @")
    if len(local.encode()) > MAX_LOCAL_PART:
        raise ValueError(f"{text!r} can never match: the local part is over {MAX_LOCAL_PART} bytes (RFC 5321)")


def _check_domain(text: str, domain: str) -> None:
    if "*" in domain:
        raise ValueError(f"{text!r}: * is not allowed in the domain (one pattern per domain)")
    labels = domain.split(".")
    if not domain or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"{text!r} has no valid domain after the @")
    if len(domain.encode()) > MAX_DOMAIN:
        raise ValueError(f"{text!r} can never match: the domain is over {MAX_DOMAIN} bytes (RFC 5321)")


def matches(pattern: Pattern, local: str, domain: str) -> bool:
    """Whether a lower-cased recipient (`local`, already without its tag when tags are stripped) matches."""
    if domain != pattern.domain:
        return False
    if pattern.kind is PatternKind.DOMAIN:
        return True
    if pattern.kind is PatternKind.EXACT:
        return local == pattern.local
    return local == pattern.local or local.startswith(pattern.local + TAG_SEPARATOR)


def overlap(a: Pattern, b: Pattern) -> bool:
    """Whether some address matches both patterns."""
    if a.domain != b.domain:
        return False
    if PatternKind.DOMAIN in (a.kind, b.kind):
        return True
    if a.kind is PatternKind.EXACT and b.kind is PatternKind.EXACT:
        return a.local == b.local
    if a.kind is PatternKind.PLUS and b.kind is PatternKind.PLUS:
        return a.local == b.local
    plus, exact = (a, b) if a.kind is PatternKind.PLUS else (b, a)
    return matches(plus, exact.local, exact.domain)


def find_conflict(routes: Sequence[Route]) -> str | None:
    """The first pair of patterns (of any routes, or twice in one) that some address matches, described; None when
    every address has at most one route."""
    seen: list[tuple[str, Pattern]] = []
    for route in routes:
        for pattern in route.patterns:
            for other_route, other in seen:
                if overlap(pattern, other):
                    how = "duplicate" if pattern.text == other.text else "overlapping"
                    return (
                        f"{how} patterns: {other.text!r} (route {other_route!r}) and {pattern.text!r} "
                        f"(route {route.name!r}) match the same addresses"
                    )
            seen.append((route.name, pattern))
    return None


class Router:
    """The route of each recipient: `route_for(address)` or None (550 No such user here).

    Exact addresses are a dict lookup, the `*@domain` and `user+*@domain` patterns per domain; `strip_tag` removes
    the `+detail` of the recipient first. The routes must not overlap (`find_conflict`), except within one route.
    """

    def __init__(self, routes: Iterable[Route], *, strip_tag: bool = False) -> None:
        self.routes = tuple(routes)
        self.strip_tag = strip_tag
        self._exact: dict[str, Route] = {}
        self._domains: dict[str, Route] = {}
        self._plus: dict[str, list[tuple[Pattern, Route]]] = {}
        for route in self.routes:
            for pattern in route.patterns:
                if pattern.kind is PatternKind.EXACT:
                    self._exact.setdefault(f"{pattern.local}@{pattern.domain}", route)
                elif pattern.kind is PatternKind.DOMAIN:
                    self._domains.setdefault(pattern.domain, route)
                else:
                    self._plus.setdefault(pattern.domain, []).append((pattern, route))

    def route_for(self, address: str) -> Route | None:
        local, at, domain = address.lower().rpartition("@")
        if not at or not local:
            return None
        if self.strip_tag:
            local = local.split(TAG_SEPARATOR, 1)[0]
        route = self._exact.get(f"{local}@{domain}")
        if route is not None:
            return route
        for pattern, plus_route in self._plus.get(domain, ()):
            if matches(pattern, local, domain):
                return plus_route
        return self._domains.get(domain)

    @property
    def pattern_count(self) -> int:
        return sum(len(route.patterns) for route in self.routes)


def target_label(route: str | None) -> str:
    """A route's breaker name and metrics `target` label: `webhook` for the default route (and none), `route:<name>`
    for a routes-file route."""
    return "webhook" if route is None or route == DEFAULT_ROUTE else f"route:{route}"
