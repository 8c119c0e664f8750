"""Route rules: pattern syntax, normalization, every wildcard form, priority, and lookups over 200 rules."""

from __future__ import annotations

import random
import re

import pytest

from bastion.config import RouteRule as RouteRuleSettings
from bastion.errors import ConfigError
from bastion.ratelimit._rules import Quota, RouteRule, RouteRules, parse_pattern, path_segments

UUID = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"


def _regex(segments: tuple[str, ...]) -> str:
    parts = {"*": "/[^/]+", "**": "(?:/[^/]+)*"}
    return "".join(parts.get(segment, "/" + re.escape(segment)) for segment in segments) or "/?"


def _priority(rule: RouteRule) -> tuple[object, ...]:
    """The documented order: method-prefixed exact, exact, then wildcards by specificity."""
    if rule.exact:
        return (0 if rule.method else 1,)
    return (2, *rule.rank)


def rules(*patterns: str) -> RouteRules:
    return RouteRules.from_settings({p: RouteRuleSettings(requests_per_minute=10) for p in patterns})


def matched(table: RouteRules, method: str, path: str) -> str | None:
    rule = table.match(method, path)
    return rule.name if rule is not None else None


class TestNormalization:
    @pytest.mark.parametrize(
        ("path", "segments"),
        [
            pytest.param("/api/v1/users/42", ("api", "v1", "users", "{id}"), id="numeric"),
            pytest.param(f"/api/v1/users/{UUID}", ("api", "v1", "users", "{id}"), id="uuid"),
            pytest.param(f"/api/v1/users/{UUID.upper()}", ("api", "v1", "users", "{id}"), id="uuid-upper"),
            pytest.param("/api/v2/docs", ("api", "v2", "docs"), id="version-kept"),
            pytest.param("/api/v1/users/42abc", ("api", "v1", "users", "42abc"), id="alphanumeric-kept"),
            pytest.param("/api/v1/users/\u00b2", ("api", "v1", "users", "\u00b2"), id="non-ascii-digit-kept"),
            pytest.param("/api/v1/users/", ("api", "v1", "users"), id="trailing-slash"),
            pytest.param("//api//v1/users", ("api", "v1", "users"), id="double-slashes"),
            pytest.param("/", (), id="root"),
        ],
    )
    def test_request_segments(self, path: str, segments: tuple[str, ...]) -> None:
        assert path_segments(path) == segments

    def test_numeric_segment_in_a_pattern_means_id(self) -> None:
        assert parse_pattern("/api/v1/users/7") == (None, ("api", "v1", "users", "{id}"))

    def test_method_is_upper_cased(self) -> None:
        assert parse_pattern("post /api/v1/uploads") == ("POST", ("api", "v1", "uploads"))

    def test_numeric_and_uuid_requests_match_an_id_rule(self) -> None:
        table = rules("/api/v1/users/{id}")
        assert matched(table, "GET", "/api/v1/users/42") == "/api/v1/users/{id}"
        assert matched(table, "GET", f"/api/v1/users/{UUID}") == "/api/v1/users/{id}"
        assert matched(table, "GET", "/api/v1/users/me") is None

    def test_version_segments_are_not_ids(self) -> None:
        table = rules("/api/v1/users")
        assert matched(table, "GET", "/api/v1/users") == "/api/v1/users"
        assert matched(table, "GET", "/api/v2/users") is None


class TestWildcards:
    def test_star_matches_exactly_one_segment(self) -> None:
        table = rules("/api/*/documents")
        assert matched(table, "POST", "/api/v1/documents") == "/api/*/documents"
        assert matched(table, "POST", "/api/v2/documents") == "/api/*/documents"
        assert matched(table, "POST", "/api/documents") is None
        assert matched(table, "POST", "/api/v1/x/documents") is None

    def test_trailing_star_matches_one_segment(self) -> None:
        table = rules("/files/*")
        assert matched(table, "GET", "/files/a") == "/files/*"
        assert matched(table, "GET", "/files") is None
        assert matched(table, "GET", "/files/a/b") is None

    def test_double_star_matches_any_number_of_segments(self) -> None:
        table = rules("/static/**")
        for path in ("/static", "/static/a", "/static/a/b/c/d"):
            assert matched(table, "GET", path) == "/static/**", path
        assert matched(table, "GET", "/other/a") is None

    def test_double_star_in_the_middle(self) -> None:
        table = rules("/api/**/uploads")
        assert matched(table, "GET", "/api/uploads") == "/api/**/uploads"
        assert matched(table, "GET", "/api/v1/uploads") == "/api/**/uploads"
        assert matched(table, "GET", "/api/v1/a/b/uploads") == "/api/**/uploads"
        assert matched(table, "GET", "/api/v1/uploads/x") is None

    def test_leading_double_star(self) -> None:
        table = rules("/**/avatar")
        assert matched(table, "GET", "/avatar") == "/**/avatar"
        assert matched(table, "GET", "/api/v1/users/7/avatar") == "/**/avatar"

    def test_star_after_double_star(self) -> None:
        table = rules("/api/**/items/*")
        assert matched(table, "GET", "/api/v1/items/9") == "/api/**/items/*"
        assert matched(table, "GET", "/api/v1/items") is None

    def test_long_paths_do_not_blow_up(self) -> None:
        table = rules("/**/x", "/a/**/b/*", "/*/*/**")
        path = "/a" * 20_000 + "/b/c"
        assert matched(table, "GET", path) == "/a/**/b/*"
        assert matched(table, "GET", "/a" * 20_000) == "/*/*/**"


class TestPriority:
    def test_method_prefixed_route_beats_exact_path(self) -> None:
        table = rules("/api/v1/uploads", "POST /api/v1/uploads")
        assert matched(table, "POST", "/api/v1/uploads") == "POST /api/v1/uploads"
        assert matched(table, "GET", "/api/v1/uploads") == "/api/v1/uploads"

    def test_exact_path_beats_wildcards(self) -> None:
        table = rules("POST /api/*/uploads", "/api/v1/uploads", "/api/**")
        assert matched(table, "POST", "/api/v1/uploads") == "/api/v1/uploads"
        assert matched(table, "POST", "/api/v2/uploads") == "POST /api/*/uploads"
        assert matched(table, "GET", "/api/v2/uploads") == "/api/**"

    def test_literal_beats_star_beats_double_star(self) -> None:
        table = rules("/api/v1/*", "/api/*/uploads", "/api/**")
        assert matched(table, "GET", "/api/v1/uploads") == "/api/v1/*"
        assert matched(table, "GET", "/api/v2/uploads") == "/api/*/uploads"
        assert matched(table, "GET", "/api/v2/other") == "/api/**"

    def test_more_fixed_segments_after_double_star_win(self) -> None:
        table = rules("/api/**", "/api/**/uploads")
        assert matched(table, "GET", "/api/v1/uploads") == "/api/**/uploads"

    def test_method_prefix_breaks_a_tie_between_wildcards(self) -> None:
        table = rules("/api/*/uploads", "PUT /api/*/uploads")
        assert matched(table, "PUT", "/api/v1/uploads") == "PUT /api/*/uploads"
        assert matched(table, "GET", "/api/v1/uploads") == "/api/*/uploads"

    def test_the_documented_example(self) -> None:
        """docs/ratelimit.md, priority example."""
        table = rules("/api/v1/*", "/api/*/uploads", "/api/**", "/api/v1/r1/**")
        assert matched(table, "GET", "/api/v1/uploads") == "/api/v1/*"
        assert matched(table, "GET", "/api/v2/uploads") == "/api/*/uploads"
        assert matched(table, "GET", "/api/v1/r1/x") == "/api/v1/r1/**"
        assert matched(table, "GET", "/api/v2/other") == "/api/**"

    def test_no_rule_means_global_limits(self) -> None:
        assert matched(rules("/api/v1/uploads"), "GET", "/api/v1/other") is None
        assert RouteRules().match("GET", "/anything") is None

    def test_head_is_held_to_get_rules(self) -> None:
        """The router serves HEAD with the GET handler, so a HEAD must not escape a GET rule."""
        table = rules("GET /api/v1/export", "GET /api/*/reports")
        assert matched(table, "HEAD", "/api/v1/export") == "GET /api/v1/export"
        assert matched(table, "HEAD", "/api/v9/reports") == "GET /api/*/reports"


class TestPathTricks:
    """A request must not land in a looser rule than the route it reaches (paths arrive canonical)."""

    def test_trailing_slash_stays_in_the_rule(self) -> None:
        assert matched(rules("POST /api/v1/uploads"), "POST", "/api/v1/uploads/") == "POST /api/v1/uploads"

    def test_double_slash_stays_in_the_rule(self) -> None:
        assert matched(rules("POST /api/v1/uploads"), "POST", "//api//v1/uploads") == "POST /api/v1/uploads"

    def test_lower_case_method_stays_in_the_rule(self) -> None:
        assert matched(rules("POST /api/v1/uploads"), "post", "/api/v1/uploads") == "POST /api/v1/uploads"

    def test_case_variant_path_is_another_path(self) -> None:
        """Paths are case-sensitive here as in the router: /API/V1/UPLOADS reaches no uploads route either."""
        assert matched(rules("POST /api/v1/uploads"), "POST", "/API/V1/UPLOADS") is None


class TestRouteTemplates:
    """Keys written in the route template syntax match the requests the route matches."""

    @pytest.mark.parametrize(
        ("pattern", "name"),
        [
            pytest.param("POST /api/v2/notes/{note_id}", "POST /api/v2/notes/*", id="name"),
            pytest.param("/api/v2/notes/{note_id:str}", "/api/v2/notes/*", id="str"),
            pytest.param("/api/v2/notes/{ratio:float}", "/api/v2/notes/*", id="float"),
            pytest.param("/api/v2/notes/{n:int}", "/api/v2/notes/{id}", id="int"),
            pytest.param("/api/v2/notes/{n:uuid}", "/api/v2/notes/{id}", id="uuid"),
            pytest.param("/files/{rest:path}", "/files/**", id="path"),
        ],
    )
    def test_a_placeholder_is_the_wildcard_of_its_convertor(self, pattern: str, name: str) -> None:
        assert [rule.name for rule in rules(pattern).rules] == [name]

    @pytest.mark.parametrize("path", ["/api/v2/notes/abc", "/api/v2/notes/42", f"/api/v2/notes/{UUID}"])
    def test_a_named_placeholder_matches_any_one_segment(self, path: str) -> None:
        assert matched(rules("POST /api/v2/notes/{note_id}"), "POST", path) == "POST /api/v2/notes/*"

    def test_a_named_placeholder_matches_no_deeper_path(self) -> None:
        assert matched(rules("POST /api/v2/notes/{note_id}"), "POST", "/api/v2/notes/abc/tags") is None

    def test_a_path_placeholder_matches_deeper_paths(self) -> None:
        assert matched(rules("GET /files/{rest:path}"), "GET", "/files/a/b/c.txt") == "GET /files/**"

    def test_a_template_key_and_its_wildcard_form_are_the_same_rule(self) -> None:
        with pytest.raises(ConfigError, match="same rule"):
            rules("/api/v2/notes/{note_id}", "/api/v2/notes/*")


class TestPatternErrors:
    @pytest.mark.parametrize(
        ("pattern", "message"),
        [
            pytest.param("POST /api/v*/documents", "wildcard is a whole segment", id="partial-wildcard"),
            pytest.param("/api/**/x/**", "at most one", id="two-double-stars"),
            pytest.param("/api/v{n}", "a placeholder is a whole segment", id="partial-placeholder"),
            pytest.param("/api/{user_id:slug}", "unknown convertor 'slug'", id="unknown-convertor"),
            pytest.param("api/v1", "expected", id="relative"),
            pytest.param("P0ST /api", "not an HTTP method", id="bad-method"),
            pytest.param("/api/../admin", "'..'", id="dot-dot"),
            pytest.param("/api?x=1", "expected", id="query"),
        ],
    )
    def test_invalid_pattern_fails_start_up(self, pattern: str, message: str) -> None:
        with pytest.raises(ConfigError, match=message):
            rules(pattern)

    def test_patterns_equal_after_normalization_are_rejected(self) -> None:
        with pytest.raises(ConfigError, match="same rule"):
            rules("/api/v1/users/7", "/api/v1/users/{id}/")


class TestTwoHundredRules:
    """200 rules of every kind; each request finds the rule a linear scan by priority would find."""

    @staticmethod
    def table() -> RouteRules:
        patterns = []
        for n in range(50):
            patterns += [
                f"POST /api/v1/r{n}/items",
                f"/api/v1/r{n}/items",
                f"/api/*/r{n}/items/*",
                f"/api/v1/r{n}/**",
            ]
        return rules(*patterns)

    def test_table_has_200_rules(self) -> None:
        assert len(self.table().rules) == 200

    def test_trie_agrees_with_a_full_scan(self) -> None:
        """Random paths: the dict-and-trie lookup picks what scanning every rule by priority picks."""
        table = self.table()
        scan = [(re.compile(_regex(rule.segments)), rule) for rule in table.rules]
        rng = random.Random(5)
        parts = ["api", "v1", "v2", "r3", "r17", "r49", "items", "42", "x", "deep"]
        for _ in range(2000):
            method = rng.choice(["GET", "POST", "HEAD"])
            path = "/" + "/".join(rng.choice(parts) for _ in range(rng.randint(0, 7)))
            normalized = "/" + "/".join(path_segments(path))
            candidates = [
                rule
                for regex, rule in scan
                if regex.fullmatch(normalized) and rule.method in (None, method, "GET" if method == "HEAD" else None)
            ]
            expected = min(candidates, key=_priority, default=None)
            assert table.match(method, path) is expected, (method, path)

    @pytest.mark.parametrize(
        ("method", "path", "expected"),
        [
            ("POST", "/api/v1/r7/items", "POST /api/v1/r7/items"),
            ("GET", "/api/v1/r7/items", "/api/v1/r7/items"),
            ("GET", "/api/v1/r49/items/12", "/api/*/r49/items/*"),  # 3 literals, no '**': beats /api/v1/r49/**
            ("GET", "/api/v3/r0/items/x", "/api/*/r0/items/*"),
            ("GET", "/api/v1/r33/deep/down/here", "/api/v1/r33/**"),
            ("GET", "/api/v1/r33", "/api/v1/r33/**"),
            ("GET", "/api/v2/r33/items", None),
            ("GET", "/api/v1/r50/items", None),
        ],
    )
    def test_lookup(self, method: str, path: str, expected: str | None) -> None:
        assert matched(self.table(), method, path) == expected


def test_route_rule_dataclass_knows_exact_from_wildcard() -> None:
    quota = Quota.per_minute(1)
    assert RouteRule(name="/a", method=None, segments=("a",), quota=quota).exact
    assert not RouteRule(name="/a/*", method=None, segments=("a", "*"), quota=quota).exact


@pytest.mark.parametrize(
    ("settings", "limit", "period"),
    [
        pytest.param(RouteRuleSettings(requests_per_second=3), 3, 1.0, id="per-second"),
        pytest.param(RouteRuleSettings(requests_per_minute=30), 30, 60.0, id="per-minute"),
        pytest.param(RouteRuleSettings(requests_per_hour=300), 300, 3600.0, id="per-hour"),
    ],
)
def test_route_rule_presets(settings: RouteRuleSettings, limit: int, period: float) -> None:
    rule = RouteRules.from_settings({"/x": settings}).rules[0]
    assert (rule.quota.limit, rule.quota.period_secs, rule.quota.burst) == (limit, period, limit)


def test_route_rule_needs_a_rate() -> None:
    with pytest.raises(ValueError, match="at least one of requests_per_second"):
        RouteRuleSettings(burst_size=3)


def test_route_rule_with_two_rates_has_two_windows_shortest_first() -> None:
    rule = RouteRules.from_settings({"/x": RouteRuleSettings(requests_per_day=1000, requests_per_second=2)}).rules[0]
    assert [(q.limit, q.period_secs) for q in (rule.quota, *rule.more)] == [(2, 1.0), (1000, 86_400.0)]
