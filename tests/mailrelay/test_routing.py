"""Recipient patterns and the router: pure logic, no event loop."""

from __future__ import annotations

import re

import pytest

from mailrelay._routing import Route, Router, find_conflict, overlap, parse_pattern


def route(name: str, *patterns: str, strip_tag: bool = False) -> Route:
    return Route(
        name=name,
        patterns=tuple(parse_pattern(p, strip_tag=strip_tag) for p in patterns),
        webhook_url=f"http://127.0.0.1/{name}",
    )


class TestPatterns:
    @pytest.mark.parametrize(
        ("address", "taken"),
        [
            pytest.param("Inbox@Example.TEST", "exact", id="exact-any-case"),
            pytest.param("anyone@corp.test", "domain", id="whole-domain"),
            pytest.param("help@example.test", "plus", id="plus-family-untagged"),
            pytest.param("help+billing@example.test", "plus", id="plus-family-tagged"),
            pytest.param("someone@sub.corp.test", None, id="subdomain-not-matched"),
            pytest.param("helpdesk@example.test", None, id="plus-stem-is-whole"),
            pytest.param("inbox+x@example.test", None, id="exact-does-not-take-tags"),
        ],
    )
    def test_each_form_matches_its_addresses(self, address: str, taken: str | None) -> None:
        router = Router(
            [
                route("exact", "inbox@example.test"),
                route("domain", "*@corp.test"),
                route("plus", "help+*@example.test"),
            ]
        )
        found = router.route_for(address)
        assert (found.name if found else None) == taken

    def test_strip_tag_matches_the_untagged_address(self) -> None:
        router = Router([route("exact", "inbox@example.test", strip_tag=True)], strip_tag=True)
        found = router.route_for("inbox+news@example.test")
        assert found is not None and found.name == "exact"

    @pytest.mark.parametrize(
        ("text", "problem"),
        [
            pytest.param("inbox", "one @ expected", id="no-at"),
            pytest.param("a@b@c", "one @ expected", id="two-at"),
            pytest.param("*@*.example.test", "* is not allowed in the domain", id="wildcard-domain"),
            pytest.param("in*box@example.test", "* stands only for", id="wildcard-inside"),
            pytest.param("@example.test", "no valid local part", id="empty-local"),
            pytest.param("inbox@", "no valid domain", id="empty-domain"),
            pytest.param("inbox@exa mple.test", "no valid domain", id="space-in-domain"),
            pytest.param("a+b+*@example.test", "can never match", id="tag-in-plus-stem"),
            pytest.param("x" * 65 + "@example.test", "can never match", id="local-over-64"),
        ],
    )
    def test_malformed_or_never_matching_pattern_is_refused(self, text: str, problem: str) -> None:
        with pytest.raises(ValueError, match=re.escape(problem)):
            parse_pattern(text)

    def test_tagged_exact_pattern_never_matches_when_tags_are_stripped(self) -> None:
        with pytest.raises(ValueError, match="can never match: MAIL_RELAY_STRIP_RECIPIENT_TAG"):
            parse_pattern("inbox+news@example.test", strip_tag=True)


class TestConflicts:
    @pytest.mark.parametrize(
        ("a", "b", "overlapping"),
        [
            pytest.param("*@x.test", "sales@x.test", True, id="domain-and-exact"),
            pytest.param("help+*@x.test", "help+vip@x.test", True, id="plus-and-tagged-exact"),
            pytest.param("help+*@x.test", "help@x.test", True, id="plus-and-untagged-exact"),
            pytest.param("help+*@x.test", "helpdesk@x.test", False, id="plus-and-longer-stem"),
            pytest.param("*@x.test", "*@y.test", False, id="two-domains"),
        ],
    )
    def test_overlap(self, a: str, b: str, overlapping: bool) -> None:
        assert overlap(parse_pattern(a), parse_pattern(b)) is overlapping

    def test_conflict_names_both_patterns_and_routes(self) -> None:
        conflict = find_conflict([route("support", "*@x.test"), route("sales", "sales@x.test")])
        assert conflict == (
            "overlapping patterns: '*@x.test' (route 'support') and 'sales@x.test' (route 'sales') "
            "match the same addresses"
        )

    def test_duplicate_is_named_as_such(self) -> None:
        conflict = find_conflict([route("a", "in@x.test"), route("b", "IN@x.test")])
        assert conflict is not None and conflict.startswith("duplicate patterns: 'in@x.test' (route 'a')")
