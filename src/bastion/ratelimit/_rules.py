"""Route rules: ``[rate_limit.routes."<pattern>"]`` compiled once into dict lookups and a segment trie.

Pattern syntax (spec, limits / rate limiting 4-6)::

    [METHOD ]/path/with/segments      e.g. "POST /api/v1/uploads", "/api/*/documents", "/static/**"

- a literal segment matches itself (case-sensitive, like the router);
- ``*`` matches exactly one segment, ``**`` any number of segments (zero included; at most one per pattern);
- numeric and UUID segments become ``{id}`` before matching, in requests and in patterns alike, so
  ``/api/v1/users/{id}`` (or ``/api/v1/users/42``) matches ``/api/v1/users/7`` and ``/api/v1/users/<uuid>``;
  version segments such as ``v1`` are ordinary literals and are kept;
- the route template syntax works too: any other ``{name}`` (and ``{name:str}``, ``{name:float}``) is ``*``,
  ``{name:path}`` is ``**``, ``{name:int}`` and ``{name:uuid}`` are ``{id}``, so a route's own template names
  the requests the route matches;
- empty segments are ignored, so a trailing slash or ``//`` never leads a request out of its rule.

Priority: method-prefixed exact, then exact, then wildcard patterns, most specific first, then no rule (the
global per user / client / IP limits). Among wildcard patterns that match, the most specific has the most
literal segments; then one without ``**`` beats one with; then more ``*`` segments; then a method prefix;
last, at the first segment where they differ, a literal beats ``*`` and ``*`` beats ``**``. A ``HEAD``
request also matches ``GET`` rules, because the router serves it with the ``GET`` handler.

Pure logic: no I/O, no event loop.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bastion.errors import ConfigError
from bastion.routing._segments import ID_SEGMENT, normalize_segment

MATCH_CACHE_SIZE = 4096

if TYPE_CHECKING:
    from bastion.config import RouteRule as RouteRuleSettings

ONE_SEGMENT = "*"
ANY_SEGMENTS = "**"

_METHOD = re.compile(r"^[A-Z]+$")
_PLACEHOLDER = re.compile(r"^\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::(?P<convertor>[A-Za-z_]+))?\}$")
_CONVERTED = {None: ONE_SEGMENT, "str": ONE_SEGMENT, "float": ONE_SEGMENT, "path": ANY_SEGMENTS}
_CONVERTED |= {"int": ID_SEGMENT, "uuid": ID_SEGMENT}


@dataclass(frozen=True, slots=True, kw_only=True)
class Quota:
    """``limit`` requests per ``period_secs``, at most ``burst`` at once (default: ``limit``).

    Spent evenly (GCRA): one request every ``period_secs / limit`` seconds once the burst is used, so
    there is no double burst at the edge of a window.
    """

    limit: int
    period_secs: float
    burst: int = 0
    interval_secs: float = field(init=False)
    """Seconds between two requests once the burst is spent (the GCRA emission interval)."""

    def __post_init__(self) -> None:
        if self.limit <= 0 or not self.period_secs > 0 or not math.isfinite(self.period_secs):
            raise ConfigError(f"a quota needs a positive limit and period, got {self.limit}/{self.period_secs}s")
        if self.burst < 0:
            raise ConfigError(f"burst must be positive, got {self.burst}")
        if self.burst == 0:
            object.__setattr__(self, "burst", self.limit)
        object.__setattr__(self, "interval_secs", self.period_secs / self.limit)

    @classmethod
    def per_second(cls, limit: int, *, burst: int | None = None) -> Quota:
        return cls(limit=limit, period_secs=1.0, burst=burst or 0)

    @classmethod
    def per_minute(cls, limit: int, *, burst: int | None = None) -> Quota:
        return cls(limit=limit, period_secs=60.0, burst=burst or 0)

    @classmethod
    def per_hour(cls, limit: int, *, burst: int | None = None) -> Quota:
        return cls(limit=limit, period_secs=3600.0, burst=burst or 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteRule:
    """A compiled route rule. ``name`` (``"POST /api/*/documents"``) is its canonical pattern and key part."""

    name: str
    method: str | None
    segments: tuple[str, ...]
    quota: Quota
    per_user: bool = True
    more: tuple[Quota, ...] = ()
    """Further windows of the rule (a rule with several rates), charged in the same check as ``quota``."""
    local_fallback: bool = False
    """``on_store_error = "local"``: counted in this process while the cache store is down."""
    rank: tuple[object, ...] = field(init=False, repr=False, compare=False)
    """Sort key among matching wildcard rules: lower is more specific (see the module docstring)."""

    def __post_init__(self) -> None:
        kinds = tuple(2 if s == ANY_SEGMENTS else 1 if s == ONE_SEGMENT else 0 for s in self.segments)
        rank = (-kinds.count(0), ANY_SEGMENTS in self.segments, -kinds.count(1), self.method is None, kinds)
        object.__setattr__(self, "rank", rank)

    @property
    def exact(self) -> bool:
        return ONE_SEGMENT not in self.segments and ANY_SEGMENTS not in self.segments


def path_segments(path: str) -> tuple[str, ...]:
    """The normalized, non-empty segments of a (canonical) request path."""
    return tuple(normalize_segment(part) for part in path.split("/") if part)


def parse_pattern(pattern: str) -> tuple[str | None, tuple[str, ...]]:
    """``(method or None, normalized segments)`` of a rule pattern; ConfigError naming the pattern if invalid."""
    text = pattern.strip()
    method: str | None = None
    if " " in text:
        head, _, text = text.partition(" ")
        method, text = head.upper(), text.strip()
        if not _METHOD.match(method):
            raise ConfigError(f"route pattern {pattern!r}: {head!r} is not an HTTP method")
    if not text.startswith("/") or any(c.isspace() or c in "?#" for c in text):
        raise ConfigError(f"route pattern {pattern!r}: expected '[METHOD ]/path', e.g. 'POST /api/v1/uploads'")
    segments = []
    for part in text.split("/"):
        if not part:
            continue
        if part in (".", ".."):
            raise ConfigError(f"route pattern {pattern!r}: '.' and '..' segments are not allowed")
        if part not in (ONE_SEGMENT, ANY_SEGMENTS) and "*" in part:
            raise ConfigError(
                f"route pattern {pattern!r}: {part!r} mixes '*' with text; a wildcard is a whole segment "
                "('*' = one segment, '**' = any number)"
            )
        if part != ID_SEGMENT and ("{" in part or "}" in part):
            part = _placeholder(pattern, part)
        segments.append(normalize_segment(part))
    if segments.count(ANY_SEGMENTS) > 1:
        raise ConfigError(f"route pattern {pattern!r}: at most one '**' per pattern")
    return method, tuple(segments)


def _placeholder(pattern: str, part: str) -> str:
    """The wildcard a route template's ``{name[:convertor]}`` segment stands for (see the module docstring)."""
    match = _PLACEHOLDER.match(part)
    if match is None:
        raise ConfigError(
            f"route pattern {pattern!r}: {part!r}: a placeholder is a whole segment, '{{name}}' or "
            "'{name:convertor}' as in the route's path ('*' for any one segment)"
        )
    convertor = match.group("convertor")
    if convertor not in _CONVERTED:
        raise ConfigError(
            f"route pattern {pattern!r}: {part!r}: unknown convertor {convertor!r} (str, int, float, uuid, path)"
        )
    return _CONVERTED[convertor]


def canonical_name(method: str | None, segments: tuple[str, ...]) -> str:
    path = "/" + "/".join(segments)
    return f"{method} {path}" if method else path


def quotas_of(settings: RouteRuleSettings) -> tuple[Quota, ...]:
    """The quotas of a ``[rate_limit.routes]`` entry, one per rate it sets, shortest window first; the burst
    applies to the shortest window (the longer ones allow their whole rate at once)."""
    rates = [
        (1.0, settings.requests_per_second),
        (60.0, settings.requests_per_minute),
        (3600.0, settings.requests_per_hour),
        (86_400.0, settings.requests_per_day),
    ]
    quotas = [Quota(limit=limit, period_secs=period) for period, limit in rates if limit is not None]
    assert quotas  # the settings model requires a rate
    first = quotas[0]
    if settings.burst_size is not None:
        quotas[0] = Quota(limit=first.limit, period_secs=first.period_secs, burst=settings.burst_size)
    return tuple(quotas)


def quota_of(settings: RouteRuleSettings) -> Quota:
    """The quota of the shortest window of a ``[rate_limit.routes]`` entry."""
    return quotas_of(settings)[0]


def check_patterns(patterns: Iterable[str]) -> None:
    """Raise ConfigError for an invalid pattern, or two that are the same rule once normalized."""
    seen: dict[str, str] = {}
    for pattern in patterns:
        name = canonical_name(*parse_pattern(pattern))
        if name in seen:
            raise ConfigError(f"route patterns {seen[name]!r} and {pattern!r} are the same rule ({name!r})")
        seen[name] = pattern


def merge_route_options(
    routes: Mapping[str, RouteRuleSettings], options: Mapping[str, RouteRuleSettings]
) -> tuple[dict[str, RouteRuleSettings], list[tuple[str, str]]]:
    """The ``[rate_limit.routes]`` table with the routes' own limits (``rate_limit=`` on a route) added.

    The table wins: an option is dropped when a table key is the same pattern once normalized (``{note_id}``,
    ``{id:str}`` and ``*`` alike), for the option's method or for every method. Returns the merged table and
    the ``(option, table key)`` pairs dropped. ConfigError for an invalid pattern on either side.
    """
    table = {}
    for key in routes:
        method, segments = parse_pattern(key)
        table[(method, segments)] = key
    merged = dict(routes)
    dropped = []
    for pattern, rule in options.items():
        method, segments = parse_pattern(pattern)
        winner = table.get((method, segments)) or table.get((None, segments))
        if winner is not None:
            dropped.append((pattern, winner))
        else:
            merged[pattern] = rule
    return merged, dropped


@dataclass(slots=True)
class _Node:
    children: dict[str, _Node] = field(default_factory=dict)
    star: _Node | None = None
    rest: _Node | None = None  # the "**" child
    rules: dict[str | None, RouteRule] = field(default_factory=dict)
    # Below a '**' node: how many segments the rest of each pattern needs (none has a second '**').
    tails: tuple[int, ...] = ()


class RouteRules:
    """Find the rule for ``(method, path)`` with dict lookups and one walk down a segment trie.

    Exact rules sit in dicts keyed by the normalized path; wildcard rules in a trie whose walk follows only
    the branches the path can take (the literal child, ``*``, ``**``) and collects the rules it reaches;
    the most specific wins. A ``**`` knows the segment counts of the pattern tails below it, so a walk never
    tries every split of a long path: the cost is bounded by the trie, not by the number of rules or the path.
    """

    def __init__(self, rules: Iterable[RouteRule] = ()) -> None:
        self.rules = list(rules)
        self._exact_method: dict[tuple[str, str], RouteRule] = {}
        self._exact_any: dict[str, RouteRule] = {}
        self._root = _Node()
        self._has_wildcards = False
        for rule in self.rules:
            path = "/" + "/".join(rule.segments)
            if rule.exact:
                if rule.method is not None:
                    self._exact_method[(rule.method, path)] = rule
                else:
                    self._exact_any[path] = rule
            else:
                self._insert(rule)
        self._set_tails(self._root)
        self._match_cached = functools.lru_cache(maxsize=MATCH_CACHE_SIZE)(self._match_uncached)

    @classmethod
    def from_settings(
        cls, routes: Mapping[str, RouteRuleSettings], *, on_store_error: str = "fail_closed"
    ) -> RouteRules:
        """Compile ``rate_limit.routes`` once; ConfigError for invalid or duplicate patterns. ``on_store_error`` is
        ``rate_limit.on_store_error``, for the rules that do not set their own."""
        check_patterns(routes)
        compiled = []
        for pattern, settings in routes.items():
            method, segments = parse_pattern(pattern)
            first, *more = quotas_of(settings)
            compiled.append(
                RouteRule(
                    name=canonical_name(method, segments),
                    method=method,
                    segments=segments,
                    quota=first,
                    per_user=settings.per_user,
                    more=tuple(more),
                    local_fallback=(settings.on_store_error or on_store_error) == "local",
                )
            )
        return cls(compiled)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def _insert(self, rule: RouteRule) -> None:
        self._has_wildcards = True
        node = self._root
        for segment in rule.segments:
            if segment == ONE_SEGMENT:
                node.star = node.star or _Node()
                node = node.star
            elif segment == ANY_SEGMENTS:
                node.rest = node.rest or _Node()
                node = node.rest
            else:
                node = node.children.setdefault(segment, _Node())
        node.rules[rule.method] = rule

    def _set_tails(self, node: _Node) -> None:
        for child in (*node.children.values(), node.star, node.rest):
            if child is not None:
                self._set_tails(child)
        if node.rest is not None:
            node.rest.tails = tuple(sorted(_tail_lengths(node.rest)))

    def match(self, method: str, path: str) -> RouteRule | None:
        """The highest-priority rule for a request, or ``None`` (the global limits apply).

        Answers for recent ``(method, path)`` pairs are remembered (a bounded LRU): most traffic repeats paths.
        """
        if not self.rules:
            return None
        return self._match_cached(method, path)

    def _match_uncached(self, method: str, path: str) -> RouteRule | None:
        method = method.upper()
        segments = path_segments(path)
        normalized = "/" + "/".join(segments)
        rule = self._exact_method.get((method, normalized))
        if rule is None and method == "HEAD":
            rule = self._exact_method.get(("GET", normalized))
        if rule is None:
            rule = self._exact_any.get(normalized)
        if rule is None and self._has_wildcards:
            found: list[RouteRule] = []
            _walk(self._root, segments, 0, method, found)
            if found:
                rule = min(found, key=_rank)
        return rule


def _rank(rule: RouteRule) -> tuple[object, ...]:
    return rule.rank


def _tail_lengths(node: _Node, depth: int = 0) -> set[int]:
    lengths = {depth} if node.rules else set()
    for child in (*node.children.values(), node.star):
        if child is not None:
            lengths |= _tail_lengths(child, depth + 1)
    return lengths


def _terminal(node: _Node, method: str, found: list[RouteRule]) -> None:
    rules = node.rules
    if not rules:
        return
    rule = rules.get(method)
    if rule is None and method == "HEAD":
        rule = rules.get("GET")
    if rule is not None:
        found.append(rule)
    rule = rules.get(None)
    if rule is not None:
        found.append(rule)


def _walk(node: _Node, segments: tuple[str, ...], index: int, method: str, found: list[RouteRule]) -> None:
    if index == len(segments):
        _terminal(node, method, found)
    else:
        child = node.children.get(segments[index])
        if child is not None:
            _walk(child, segments, index + 1, method, found)
        if node.star is not None:
            _walk(node.star, segments, index + 1, method, found)
    if node.rest is not None:
        remaining = len(segments) - index
        for tail in node.rest.tails:
            if tail <= remaining:
                _walk(node.rest, segments, len(segments) - tail, method, found)
