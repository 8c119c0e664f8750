"""Path rules: health always public, exclude/include with trailing wildcards, public prefixes."""

from __future__ import annotations

import pytest

from bastion.auth._paths import PathRules
from bastion.errors import ConfigError


def rules(
    *, include: list[str] | None = None, exclude: list[str] | None = None, public: list[str] | None = None
) -> PathRules:
    return PathRules.from_settings(include_paths=include or [], exclude_paths=exclude or [], public_paths=public or [])


def test_default_protects_everything_but_health_and_ready() -> None:
    default = rules()
    assert not default.requires_token("/health")
    assert not default.requires_token("/ready")
    for path in ("/", "/api/v1/documents", "/healthz", "/health/", "/ready/x"):
        assert default.requires_token(path), path


def test_health_is_public_even_in_include_mode() -> None:
    assert not rules(include=["/health", "/*"]).requires_token("/health")


class TestExclude:
    def test_exact_path(self) -> None:
        rule = rules(exclude=["/api/v1/status"])
        assert not rule.requires_token("/api/v1/status")
        assert rule.requires_token("/api/v1/status/x")
        assert rule.requires_token("/api/v1/statusx")

    def test_trailing_wildcard_matches_below_not_itself(self) -> None:
        rule = rules(exclude=["/api/v1/public/*"])
        assert not rule.requires_token("/api/v1/public/a")
        assert not rule.requires_token("/api/v1/public/a/b")
        assert rule.requires_token("/api/v1/public")
        assert rule.requires_token("/api/v1/publicity")


class TestInclude:
    def test_only_listed_paths_are_protected(self) -> None:
        rule = rules(include=["/api/v1/admin/*", "/api/v1/me"])
        assert rule.requires_token("/api/v1/admin/users")
        assert rule.requires_token("/api/v1/me")
        assert not rule.requires_token("/api/v1/documents")


class TestPublicPrefixes:
    def test_segment_boundary(self) -> None:
        rule = rules(public=["/api/v1/public/"])
        assert not rule.requires_token("/api/v1/public")
        assert not rule.requires_token("/api/v1/public/x/y")
        assert rule.requires_token("/api/v1/publicity")

    def test_public_prefix_beats_include(self) -> None:
        assert not rules(include=["/api/*"], public=["/api/open"]).requires_token("/api/open/x")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"include": ["/a"], "exclude": ["/b"]}, "both set"),
        ({"exclude": ["api/x"]}, "absolute path"),
        ({"exclude": ["/api/*/x"]}, "absolute path"),
        ({"exclude": ["/api*"]}, "absolute path"),
        ({"public": ["/api/*"]}, "absolute path prefix"),
    ],
)
def test_bad_patterns_fail_at_start_up(kwargs: dict[str, list[str]], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        rules(**kwargs)
