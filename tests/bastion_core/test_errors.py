"""The configuration error both programs raise: one constructor, one message shape."""

from __future__ import annotations

from bastion_core import ConfigError


def test_invalid_names_key_expectation_and_value() -> None:
    error = ConfigError.invalid("MAIL_RELAY_SMTP_PORT", "http", "a port number 1-65535")
    assert str(error) == "MAIL_RELAY_SMTP_PORT: expected a port number 1-65535, got 'http'"


def test_invalid_without_a_value_says_unset() -> None:
    assert str(ConfigError.invalid("MAIL_RELAY_WEBHOOK_URL", None, "an http(s) URL")) == (
        "MAIL_RELAY_WEBHOOK_URL: expected an http(s) URL, got <unset>"
    )


def test_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)
