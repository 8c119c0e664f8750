"""MAIL_RELAY_ROUTES_FILE and the target patterns as start-up reads them: routes in order, every problem one
ConfigError naming the file, the route and the conflict."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion_core import ConfigError
from mailrelay._config import parse_settings
from mailrelay._config.routes import relay_routes

ROUTES = """
[[route]]
name = "support"
patterns = ["support@example.test", "help+*@example.test"]
webhook_url = "http://127.0.0.1:9/support"
signing_secret = "support-secret"
payload_version = 2

[[route]]
name = "billing"
patterns = ["*@billing.test"]
webhook_url = "http://127.0.0.1:9/billing"
"""


def routes_of(tmp_path: Path, text: str, **variables: str) -> list[tuple[str, tuple[str, ...], str | None]]:
    path = tmp_path / "routes.toml"
    path.write_text(text)
    settings = parse_settings(
        {"MAIL_RELAY_ROUTES_FILE": str(path), **{f"MAIL_RELAY_{k}": v for k, v in variables.items()}}
    )
    return [(r.name, tuple(p.text for p in r.patterns), r.signing_secret) for r in relay_routes(settings)]


def error_of(tmp_path: Path, text: str, **variables: str) -> str:
    with pytest.raises(ConfigError) as caught:
        routes_of(tmp_path, text, **variables)
    return str(caught.value).replace(str(tmp_path), "<tmp>")


def test_routes_file_alone_needs_no_single_webhook(tmp_path: Path) -> None:
    assert routes_of(tmp_path, ROUTES) == [
        ("support", ("support@example.test", "help+*@example.test"), "support-secret"),
        ("billing", ("*@billing.test",), None),
    ]


def test_single_webhook_variables_become_the_default_route(tmp_path: Path) -> None:
    routes = routes_of(tmp_path, ROUTES, TARGET_EMAILS="inbox@example.test", WEBHOOK_URL="http://127.0.0.1:9/x")
    assert [name for name, _, _ in routes] == ["default", "support", "billing"]


def test_overlap_with_the_default_route_is_named(tmp_path: Path) -> None:
    error = error_of(tmp_path, ROUTES, TARGET_EMAILS="*@example.test", WEBHOOK_URL="http://127.0.0.1:9/x")
    assert error == (
        "MAIL_RELAY_ROUTES_FILE: overlapping patterns: '*@example.test' (route 'default') and "
        "'support@example.test' (route 'support') match the same addresses"
    )


def test_default_route_patterns_may_overlap_each_other() -> None:
    settings = parse_settings(
        {
            "MAIL_RELAY_TARGET_EMAILS": "*@example.test,inbox@example.test",
            "MAIL_RELAY_WEBHOOK_URL": "http://127.0.0.1/x",
        }
    )
    assert [route.name for route in relay_routes(settings)] == ["default"]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        pytest.param(
            ROUTES
            + '\n[[route]]\nname = "dup"\npatterns = ["SUPPORT@example.test"]\nwebhook_url = "http://127.0.0.1/d"\n',
            "MAIL_RELAY_ROUTES_FILE: duplicate patterns: 'support@example.test' (route 'support') and "
            "'support@example.test' (route 'dup') match the same addresses",
            id="duplicate",
        ),
        pytest.param(
            '[[route]]\nname = "a"\npatterns = ["*@x@y"]\nwebhook_url = "http://127.0.0.1/a"\n',
            "MAIL_RELAY_ROUTES_FILE (<tmp>/routes.toml): route 1 ('a'): patterns: '*@x@y' is not an address "
            "pattern (one @ expected)",
            id="malformed-pattern",
        ),
        pytest.param(
            '[[route]]\nname = "a"\npatterns = ["a@x.test"]\nwebhook_url = "http://127.0.0.1/a"\nsecret = "s"\n',
            "MAIL_RELAY_ROUTES_FILE (<tmp>/routes.toml): route 1: unknown key 'secret' (expected name, "
            "patterns, payload_version, signing_secret, webhook_url)",
            id="unknown-key",
        ),
        pytest.param(
            '[[route]]\nname = "a"\npatterns = ["a@x.test"]\nwebhook_url = "http://hooks.example/a"\n',
            "MAIL_RELAY_ROUTES_FILE (<tmp>/routes.toml): route 1 ('a'): webhook_url: expected an https URL (plain "
            "http is allowed only to loopback hosts unless MAIL_RELAY_WEBHOOK_ALLOW_INSECURE=true)",
            id="insecure-url",
        ),
        pytest.param(
            '[[route]]\nname = "a"\npatterns = ["a@x.test"]\nwebhook_url = "http://127.0.0.1/a"\npayload_version = 3\n',
            "MAIL_RELAY_ROUTES_FILE (<tmp>/routes.toml): route 1 ('a'): payload_version: expected one of (1, 2), got 3",
            id="payload-version",
        ),
        pytest.param(
            '[[route]]\nname = "Bad Name"\npatterns = ["a@x.test"]\nwebhook_url = "http://127.0.0.1/a"\n',
            "MAIL_RELAY_ROUTES_FILE (<tmp>/routes.toml): route 1: name: expected lower-case letters, digits, _ "
            "and - (1-63), got 'Bad Name'",
            id="route-name",
        ),
        pytest.param(
            "route = 1",
            "MAIL_RELAY_ROUTES_FILE (<tmp>/routes.toml): expected at least one [[route]] table",
            id="no-tables",
        ),
        pytest.param("[[route]\n", "MAIL_RELAY_ROUTES_FILE (<tmp>/routes.toml): not valid TOML", id="not-toml"),
    ],
)
def test_bad_routes_file_is_one_line_naming_the_route(tmp_path: Path, text: str, error: str) -> None:
    assert error_of(tmp_path, text).startswith(error)


def test_never_matching_target_stops_start_up() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings(
            {
                "MAIL_RELAY_TARGET_EMAILS": "inbox+news@example.test",
                "MAIL_RELAY_STRIP_RECIPIENT_TAG": "true",
                "MAIL_RELAY_WEBHOOK_URL": "http://127.0.0.1/x",
            }
        )
    assert str(caught.value) == (
        "MAIL_RELAY_TARGET_EMAILS: 'inbox+news@example.test' can never match: MAIL_RELAY_STRIP_RECIPIENT_TAG removes "
        "the +tag before matching (write inbox@example.test)"
    )


def test_webhook_url_is_required_with_target_emails_even_with_a_routes_file(tmp_path: Path) -> None:
    assert error_of(tmp_path, ROUTES, TARGET_EMAILS="inbox@example.test") == (
        "MAIL_RELAY_WEBHOOK_URL: expected a value (this variable is required), got <unset>"
    )
