"""MAIL_RELAY_* parsing and validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from mailrelay.config import load_settings, parse_settings, unknown_variables
from mailrelay.errors import ConfigError

REQUIRED = {
    "MAIL_RELAY_TARGET_EMAILS": "Inbox@Example.com, ops@example.com ,",
    "MAIL_RELAY_WEBHOOK_URL": "https://hooks.example.com/mail",
}


def settings_with(**values: str) -> dict[str, str]:
    return {**REQUIRED, **{f"MAIL_RELAY_{k}": v for k, v in values.items()}}


def test_defaults() -> None:
    settings = parse_settings(REQUIRED)
    assert settings.target_emails == frozenset({"inbox@example.com", "ops@example.com"})
    assert settings.bind_address == "0.0.0.0"
    assert settings.port == 2525
    assert settings.health_bind_address == "0.0.0.0"
    assert settings.health_port == 8080
    assert settings.header_prefixes == ()
    assert settings.webhook_signing_secret is None
    assert settings.webhook_timeout == 30
    assert settings.webhook_max_retries == 3
    assert settings.webhook_backoff_base == 1.0
    assert settings.circuit_breaker_threshold == 5
    assert settings.circuit_breaker_reset == 60
    assert settings.max_message_size == 26_214_400
    assert settings.max_attachment_size == 10_485_760
    assert settings.tls_cert is None and settings.tls_key is None
    assert settings.log_level == "INFO"
    assert settings.max_concurrent_per_ip == 10
    assert settings.max_unknown_rcpts_per_session == 3


def test_header_prefixes_are_trimmed_lowercased_and_deduplicated() -> None:
    settings = parse_settings(settings_with(HEADER_PREFIX=" X-Custom-, x-custom-,X-Tracking "))
    assert settings.header_prefixes == ("x-custom-", "x-tracking")


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9000/hook",
        "http://127.8.9.10/hook",
        "http://localhost/hook",
        "http://LOCALHOST./hook",
        "http://[::1]:8000/hook",
        "https://example.com/hook",
    ],
)
def test_allowed_webhook_urls(url: str) -> None:
    assert parse_settings(settings_with(WEBHOOK_URL=url)).webhook_url == url


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/hook",
        "http://127.0.0.1.nip.io/hook",
        "http://localhost.example.com/hook",
        "http://10.0.0.1/hook",
        "ftp://127.0.0.1/hook",
        "127.0.0.1/hook",
        "https:///nohost",
        pytest.param("https://example.com:99999/hook", id="port-above-65535"),
        pytest.param("https://example.com:0/hook", id="port-0"),
    ],
)
def test_rejected_webhook_urls(url: str) -> None:
    with pytest.raises(ConfigError, match="MAIL_RELAY_WEBHOOK_URL"):
        parse_settings(settings_with(WEBHOOK_URL=url))


def test_allow_insecure_permits_plain_http_anywhere() -> None:
    values = settings_with(WEBHOOK_URL="http://example.com/hook", WEBHOOK_ALLOW_INSECURE="true")
    assert parse_settings(values).webhook_allow_insecure is True


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PORT", "-1"),
        ("HEALTH_PORT", "http"),
        ("WEBHOOK_TIMEOUT", "0"),
        ("WEBHOOK_TIMEOUT", "nan"),
        ("WEBHOOK_MAX_RETRIES", "-1"),
        ("WEBHOOK_MAX_RETRIES", "21"),
        ("WEBHOOK_BACKOFF_BASE", "-0.5"),
        ("CIRCUIT_BREAKER_THRESHOLD", "0"),
        ("CIRCUIT_BREAKER_RESET", "soon"),
        ("MAX_MESSAGE_SIZE", "0"),
        ("MAX_ATTACHMENT_SIZE", "10MB"),
        ("MAX_CONCURRENT_PER_IP", "0"),
        ("MAX_UNKNOWN_RCPTS_PER_SESSION", "-3"),
        ("LOG_LEVEL", "verbose"),
        ("BIND_ADDRESS", "not an address!"),
        ("HEADER_PREFIX", "X-Bad Prefix"),
        ("WEBHOOK_ALLOW_INSECURE", "sure"),
    ],
)
def test_bad_values_name_variable_and_value(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings(settings_with(**{name: value}))
    assert caught.value.variable == f"MAIL_RELAY_{name}"
    assert f"MAIL_RELAY_{name}" in str(caught.value)
    assert repr(value) in str(caught.value)


@pytest.mark.parametrize("missing", ["MAIL_RELAY_TARGET_EMAILS", "MAIL_RELAY_WEBHOOK_URL"])
def test_required_variables(missing: str) -> None:
    values = dict(REQUIRED)
    del values[missing]
    with pytest.raises(ConfigError, match=missing):
        parse_settings(values)


def test_empty_secret_is_an_error_that_hides_the_value() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings(settings_with(WEBHOOK_SIGNING_SECRET=""))
    assert "MAIL_RELAY_WEBHOOK_SIGNING_SECRET" in str(caught.value)


def test_secret_is_kept_verbatim_and_out_of_repr() -> None:
    settings = parse_settings(settings_with(WEBHOOK_SIGNING_SECRET=" s3cret "))
    assert settings.webhook_signing_secret == " s3cret "
    assert "s3cret" not in repr(settings)


def test_tls_cert_and_key_go_together(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError, match="MAIL_RELAY_TLS_KEY"):
        parse_settings(settings_with(TLS_CERT=str(cert)))
    both = parse_settings(settings_with(TLS_CERT=str(cert), TLS_KEY=str(cert)))
    assert both.tls_cert == cert


def test_dotenv_is_read_and_environment_wins(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(
        "MAIL_RELAY_TARGET_EMAILS=file@example.com\nMAIL_RELAY_WEBHOOK_URL=https://file.example.com\n"
        "MAIL_RELAY_PORT=2600\n"
    )
    settings = load_settings(tmp_path, {"MAIL_RELAY_PORT": "2700"})
    assert settings.target_emails == frozenset({"file@example.com"})
    assert settings.port == 2700


def test_unknown_variables_are_reported() -> None:
    env = {**REQUIRED, "MAIL_RELAY_PROT": "25", "OTHER": "x"}
    assert unknown_variables(env) == ["MAIL_RELAY_PROT"]


def test_url_password_is_not_echoed() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings(settings_with(WEBHOOK_URL="http://user:hunter2@example.com/hook"))
    assert "hunter2" not in str(caught.value)
    assert "http://user:***@example.com/hook" in str(caught.value)


def test_webhook_url_query_is_not_shown_in_errors() -> None:
    from mailrelay.config import _without_password

    assert _without_password("https://u:pw@hook.example/x?token=s3cret") == "https://u:***@hook.example/x?***"
    assert _without_password("https://hook.example/x") == "https://hook.example/x"
