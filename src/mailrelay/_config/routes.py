"""The routes of a relay: MAIL_RELAY_TARGET_EMAILS + MAIL_RELAY_WEBHOOK_URL (the route `default`) and the routes of
MAIL_RELAY_ROUTES_FILE (TOML), checked once at start-up: every error a ConfigError naming the file and the route."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path

from bastion_core import ConfigError
from mailrelay._config.converters import PREFIX, parse_webhook_url
from mailrelay._config.model import Settings
from mailrelay._routing import DEFAULT_ROUTE, Route, find_conflict, parse_pattern

ROUTES_FILE_VARIABLE = PREFIX + "ROUTES_FILE"
MAX_ROUTES_FILE_BYTES = 1024 * 1024
MAX_ROUTES = 256  # each route holds an HTTP session and a breaker
PAYLOAD_VERSIONS = (1, 2)
ROUTE_KEYS = frozenset({"name", "patterns", "webhook_url", "signing_secret", "payload_version"})
_ROUTE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")  # also a metrics label and a NATS header value


def relay_routes(settings: Settings) -> tuple[Route, ...]:
    """The default route (when MAIL_RELAY_TARGET_EMAILS is set) then the file's routes, in the file's order.

    Raises ConfigError for a malformed or never-matching pattern, a bad route, or two patterns some address matches
    both (named). The patterns of MAIL_RELAY_TARGET_EMAILS may overlap each other: they share one webhook.
    """
    routes: list[Route] = []
    if settings.target_emails and settings.webhook_url:
        patterns = tuple(
            parse_pattern(text, strip_tag=settings.strip_recipient_tag) for text in sorted(settings.target_emails)
        )
        routes.append(
            Route(
                name=DEFAULT_ROUTE,
                patterns=patterns,
                webhook_url=settings.webhook_url,
                signing_secret=settings.webhook_signing_secret,
            )
        )
    if settings.routes_file is not None:
        routes.extend(_file_routes(settings.routes_file, settings, taken={route.name for route in routes}))
    conflict = find_conflict(_without_default_overlaps(routes))
    if conflict is not None:
        raise ConfigError(f"{ROUTES_FILE_VARIABLE}: {conflict}")
    return tuple(routes)


def _without_default_overlaps(routes: list[Route]) -> list[Route]:
    """The default route's patterns once each, so overlaps among them (one webhook) are not conflicts."""
    if not routes or routes[0].name != DEFAULT_ROUTE:
        return routes
    kept: list[Route] = []
    for pattern in routes[0].patterns:
        probe = Route(name=DEFAULT_ROUTE, patterns=(pattern,), webhook_url="")
        if find_conflict([*kept, probe]) is None:
            kept.append(probe)
    return [*kept, *routes[1:]]


def _file_routes(path: Path, settings: Settings, *, taken: set[str]) -> list[Route]:
    origin = f"{ROUTES_FILE_VARIABLE} ({path})"
    try:
        with path.open("rb") as file:
            text = file.read(MAX_ROUTES_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{origin}: cannot read the file ({exc.strerror or exc})") from None
    if len(text) > MAX_ROUTES_FILE_BYTES:
        raise ConfigError(f"{origin}: over {MAX_ROUTES_FILE_BYTES} bytes")
    try:
        document = tomllib.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{origin}: not valid TOML ({exc})") from None
    unknown = sorted(set(document) - {"route"})
    if unknown:
        raise ConfigError(f"{origin}: unknown key {unknown[0]!r} (expected [[route]] tables)")
    tables = document.get("route")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{origin}: expected at least one [[route]] table")
    if len(tables) > MAX_ROUTES:
        raise ConfigError(f"{origin}: {len(tables)} routes, at most {MAX_ROUTES}")
    routes = []
    for number, table in enumerate(tables, start=1):
        route = _route(table, settings, where=f"{origin}: route {number}")
        if route.name in taken:
            raise ConfigError(f"{origin}: route {number}: the name {route.name!r} is already used")
        taken.add(route.name)
        routes.append(route)
    return routes


def _route(table: Mapping[str, object], settings: Settings, *, where: str) -> Route:
    unknown = sorted(set(table) - ROUTE_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (expected {', '.join(sorted(ROUTE_KEYS))})")
    name = table.get("name")
    if not isinstance(name, str) or not _ROUTE_NAME.match(name):
        raise ConfigError(f"{where}: name: expected lower-case letters, digits, _ and - (1-63), got {name!r}")
    where = f"{where} ({name!r})"
    patterns = table.get("patterns")
    if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) for p in patterns):
        raise ConfigError(f"{where}: patterns: expected a non-empty list of address patterns")
    try:
        parsed = tuple(parse_pattern(text, strip_tag=settings.strip_recipient_tag) for text in patterns)
    except ValueError as exc:
        raise ConfigError(f"{where}: patterns: {exc}") from None
    url = table.get("webhook_url")
    try:
        webhook_url = parse_webhook_url(
            url if isinstance(url, str) else "", allow_insecure=settings.webhook_allow_insecure
        )
    except ValueError as exc:
        raise ConfigError(f"{where}: webhook_url: expected {exc}") from None
    secret = table.get("signing_secret")
    if secret is not None and (not isinstance(secret, str) or not secret):
        raise ConfigError(f"{where}: signing_secret: expected a non-empty string")
    version = table.get("payload_version")
    if version is not None and (isinstance(version, bool) or version not in PAYLOAD_VERSIONS):
        raise ConfigError(f"{where}: payload_version: expected one of {PAYLOAD_VERSIONS}, got {version!r}")
    return Route(
        name=name,
        patterns=parsed,
        webhook_url=webhook_url,
        signing_secret=secret,
        payload_version=version if isinstance(version, int) else None,
    )
