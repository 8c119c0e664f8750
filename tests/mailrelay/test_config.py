"""MAIL_RELAY_* parsing and validation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import bastion_core
from mailrelay import ConfigError, Settings, load_settings, parse_settings
from mailrelay._config import VARIABLES, shown_value, unknown_variables

REQUIRED = {
    "MAIL_RELAY_TARGET_EMAILS": "Inbox@Example.com, ops@example.com ,",
    "MAIL_RELAY_WEBHOOK_URL": "https://hooks.example.com/mail",
}
DOCS = Path(__file__).parents[2] / "docs" / "mailrelay.md"
DNS_EXPECTED = "a comma-separated list of DNS server addresses like 192.0.2.53, 192.0.2.54:5353 or [2001:db8::53]:53"
INSECURE = "an https URL (plain http is allowed only to loopback hosts unless MAIL_RELAY_WEBHOOK_ALLOW_INSECURE=true)"

REMOVED_BREAKER_THRESHOLD = (
    "nothing: this variable was removed; the breaker now opens on a failure rate over webhook attempts, "
    "set MAIL_RELAY_CIRCUIT_BREAKER_FAILURE_RATE (0.0-1.0) and MAIL_RELAY_CIRCUIT_BREAKER_MIN_REQUESTS instead"
)


def settings_with(**values: str) -> dict[str, str]:
    return {**REQUIRED, **{f"MAIL_RELAY_{k}": v for k, v in values.items()}}


def error_for(values: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_settings(values)
    return str(caught.value)


def test_defaults() -> None:
    settings = parse_settings(REQUIRED)
    assert type(settings) is Settings
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
    assert settings.circuit_breaker_failure_rate == 0.5
    assert settings.circuit_breaker_min_requests == 10
    assert settings.circuit_breaker_half_open_requests == 1
    assert settings.circuit_breaker_reset == 60
    assert settings.max_message_size == 26_214_400
    assert settings.max_attachment_size == 10_485_760
    assert settings.tls_cert is None and settings.tls_key is None
    assert settings.log_level == "INFO"
    assert settings.log_format == "auto"
    assert settings.max_concurrent_per_ip == 10
    assert settings.max_sessions == 100
    assert settings.max_unknown_rcpts_per_session == 3
    assert settings.idle_timeout == 300
    assert settings.shutdown_grace == 30


def test_settings_are_frozen() -> None:
    settings = parse_settings(REQUIRED)
    with pytest.raises(ValueError, match="frozen"):
        settings.port = 25  # type: ignore[misc]


def test_blank_value_means_the_default() -> None:
    settings = parse_settings(settings_with(PORT="  ", LOG_LEVEL=""))
    assert (settings.port, settings.log_level) == (2525, "INFO")


def test_values_are_trimmed() -> None:
    assert parse_settings(settings_with(PORT=" 2600 ")).port == 2600


def test_header_prefixes_are_trimmed_lowercased_and_deduplicated() -> None:
    settings = parse_settings(settings_with(HEADER_PREFIX=" X-Custom-, x-custom-,X-Tracking "))
    assert settings.header_prefixes == ("x-custom-", "x-tracking")


@pytest.mark.parametrize(("value", "expected"), [("json", "json"), ("Console", "console"), ("AUTO", "auto")])
def test_log_format(value: str, expected: str) -> None:
    assert parse_settings(settings_with(LOG_FORMAT=value)).log_format == expected


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
    ("url", "expected"),
    [
        ("http://example.com/hook", INSECURE),
        ("http://127.0.0.1.nip.io/hook", INSECURE),
        ("http://localhost.example.com/hook", INSECURE),
        ("http://10.0.0.1/hook", INSECURE),
        ("ftp://127.0.0.1/hook", "an absolute http(s) URL"),
        ("127.0.0.1/hook", "an absolute http(s) URL"),
        ("https:///nohost", "an absolute http(s) URL"),
        pytest.param("https://example.com:99999/hook", "an absolute http(s) URL with a port 1-65535", id="port-99999"),
        pytest.param("https://example.com:0/hook", "an absolute http(s) URL with a port 1-65535", id="port-0"),
    ],
)
def test_rejected_webhook_urls(url: str, expected: str) -> None:
    assert error_for(settings_with(WEBHOOK_URL=url)) == f"MAIL_RELAY_WEBHOOK_URL: expected {expected}, got {url!r}"


def test_allow_insecure_permits_plain_http_anywhere() -> None:
    values = settings_with(WEBHOOK_URL="http://example.com/hook", WEBHOOK_ALLOW_INSECURE="true")
    assert parse_settings(values).webhook_allow_insecure is True


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("PORT", "-1", "a TCP port 0-65535"),
        ("HEALTH_PORT", "http", "a TCP port 0-65535"),
        ("WEBHOOK_TIMEOUT", "0", "a number of seconds > 0"),
        ("WEBHOOK_TIMEOUT", "nan", "a number of seconds > 0"),
        ("PAYLOAD_VERSION", "3", "1 (the specification's payload) or 2"),
        ("PAYLOAD_VERSION", "v2", "1 (the specification's payload) or 2"),
        ("WEBHOOK_MAX_RETRIES", "-1", "an integer 0-20"),
        ("WEBHOOK_MAX_RETRIES", "21", "an integer 0-20"),
        ("WEBHOOK_BACKOFF_BASE", "-0.5", "a number of seconds >= 0"),
        ("CIRCUIT_BREAKER_FAILURE_RATE", "1.5", "a failure rate between 0.0 and 1.0"),
        ("CIRCUIT_BREAKER_FAILURE_RATE", "half", "a failure rate between 0.0 and 1.0"),
        ("CIRCUIT_BREAKER_MIN_REQUESTS", "0", "a positive integer"),
        ("CIRCUIT_BREAKER_HALF_OPEN_REQUESTS", "0", "a positive integer"),
        ("CIRCUIT_BREAKER_THRESHOLD", "5", REMOVED_BREAKER_THRESHOLD),
        ("CIRCUIT_BREAKER_RESET", "soon", "a number of seconds > 0"),
        ("MAX_MESSAGE_SIZE", "0", "a positive integer"),
        ("MAX_ATTACHMENT_SIZE", "10MB", "a positive integer"),
        ("MAX_CONCURRENT_PER_IP", "0", "a positive integer"),
        ("MAX_UNKNOWN_RCPTS_PER_SESSION", "-3", "an integer >= 0"),
        ("LOG_LEVEL", "verbose", "one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ("LOG_FORMAT", "xml", "one of auto, json, console"),
        ("BIND_ADDRESS", "not an address!", "an IP address or host name to listen on"),
        ("HEADER_PREFIX", "X-Bad Prefix", "a comma-separated list of header-name prefixes like X-Custom-"),
        ("WEBHOOK_ALLOW_INSECURE", "sure", "a boolean (true/false, 1/0, yes/no, on/off)"),
        ("TARGET_EMAILS", "inbox", "a comma-separated list of addresses like inbox@example.com"),
        ("TLS_CERT", "/nonexistent/cert.pem", "the path of a readable PEM file"),
    ],
)
def test_bad_values_name_variable_and_value(name: str, value: str, expected: str) -> None:
    assert error_for(settings_with(**{name: value})) == f"MAIL_RELAY_{name}: expected {expected}, got {value!r}"


def test_payload_version_is_1_unless_set_to_2() -> None:
    assert (
        parse_settings(REQUIRED).payload_version,
        parse_settings(settings_with(PAYLOAD_VERSION="2")).payload_version,
    ) == (1, 2)


def test_value_is_shown_as_it_arrived() -> None:
    assert error_for(settings_with(PORT=" smtp ")) == "MAIL_RELAY_PORT: expected a TCP port 0-65535, got ' smtp '"


def test_first_bad_variable_in_check_order_is_named() -> None:
    assert error_for(settings_with(PORT="x", WEBHOOK_ALLOW_INSECURE="x")) == (
        "MAIL_RELAY_WEBHOOK_ALLOW_INSECURE: expected a boolean (true/false, 1/0, yes/no, on/off), got 'x'"
    )


def test_configuration_error_is_the_shared_core_class() -> None:
    assert ConfigError is bastion_core.ConfigError
    with pytest.raises(ValueError, match="MAIL_RELAY_PORT"):
        parse_settings(settings_with(PORT="x"))


@pytest.mark.parametrize("missing", ["MAIL_RELAY_TARGET_EMAILS", "MAIL_RELAY_WEBHOOK_URL"])
def test_required_variables(missing: str) -> None:
    values = dict(REQUIRED)
    del values[missing]
    assert error_for(values) == f"{missing}: expected a value (this variable is required), got <unset>"


def test_blank_required_variable_shows_the_blank() -> None:
    assert error_for(settings_with(TARGET_EMAILS=" ")) == (
        "MAIL_RELAY_TARGET_EMAILS: expected a value (this variable is required), got ' '"
    )


def test_empty_secret_is_an_error_that_hides_the_value() -> None:
    assert error_for(settings_with(WEBHOOK_SIGNING_SECRET="")) == (
        "MAIL_RELAY_WEBHOOK_SIGNING_SECRET: expected a non-empty secret (unset the variable to turn signing off),"
        " got '<redacted>'"
    )


def test_secret_is_kept_verbatim_and_out_of_repr() -> None:
    settings = parse_settings(settings_with(WEBHOOK_SIGNING_SECRET=" s3cret "))
    assert settings.webhook_signing_secret == " s3cret "
    assert "s3cret" not in repr(settings)


def test_tls_cert_and_key_go_together(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    expected = "expected a PEM path (TLS_CERT and TLS_KEY are set together), got <unset>"
    assert error_for(settings_with(TLS_CERT=str(cert))) == f"MAIL_RELAY_TLS_KEY: {expected}"
    assert error_for(settings_with(TLS_CERT=str(cert), TLS_KEY=" ")) == f"MAIL_RELAY_TLS_KEY: {expected}"
    assert error_for(settings_with(TLS_KEY=str(cert))) == f"MAIL_RELAY_TLS_CERT: {expected}"
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


def test_process_environment_wins_over_dotenv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """load_settings() without `environ` reads through pydantic-settings, with the same precedence."""
    for name in [n for n in __import__("os").environ if n.upper().startswith("MAIL_RELAY_")]:
        monkeypatch.delenv(name)
    (tmp_path / ".env").write_text(
        "MAIL_RELAY_TARGET_EMAILS=file@example.com\nMAIL_RELAY_WEBHOOK_URL=https://file.example.com\n"
        "MAIL_RELAY_PORT=2600\nMAIL_RELAY_HEALTH_PORT=8600\n"
    )
    monkeypatch.setenv("MAIL_RELAY_PORT", "2700")
    monkeypatch.setenv("MAIL_RELAY_HEALTH_PORT", " ")  # set but blank: the default, not the file's value
    monkeypatch.setenv("mail_relay_max_sessions", "7")  # names are case-sensitive
    settings = load_settings(tmp_path)
    assert type(settings) is Settings
    assert (settings.target_emails, settings.port, settings.health_port) == (
        frozenset({"file@example.com"}),
        2700,
        8080,
    )
    assert settings.max_sessions == 100


def test_process_environment_errors_are_config_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in __import__("os").environ if n.upper().startswith("MAIL_RELAY_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MAIL_RELAY_TARGET_EMAILS", "a@example.com")
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path)
    assert str(caught.value) == "MAIL_RELAY_WEBHOOK_URL: expected a value (this variable is required), got <unset>"


def test_unknown_variables_are_reported() -> None:
    env = {**REQUIRED, "MAIL_RELAY_PROT": "25", "OTHER": "x", "MAIL_RELAY_LOG_FORMAT": "json"}
    assert unknown_variables(env) == ["MAIL_RELAY_PROT"]


def test_every_variable_is_documented() -> None:
    rows = [line for line in DOCS.read_text().splitlines() if line.startswith("| `MAIL_RELAY_")]
    documented = {name for row in rows for name in re.findall(r"`(MAIL_RELAY_[A-Z0-9_]+)`", row.split("|")[1])}
    assert documented == VARIABLES


def test_url_password_is_not_echoed() -> None:
    assert error_for(settings_with(WEBHOOK_URL="http://user:hunter2@example.com/hook")) == (
        f"MAIL_RELAY_WEBHOOK_URL: expected {INSECURE}, got 'http://user:***@example.com/hook'"
    )


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("https://u:pw@hook.example/x?token=s3cret", "https://u:***@hook.example/x?***"),
        ("https://hook.example/x", "https://hook.example/x"),
        pytest.param("https://hook.example/x?a=1,2&token=s3cret", "https://hook.example/x?***", id="comma-in-query"),
        pytest.param("https://u:p,w@hook.example/x", "https://u:***@hook.example/x", id="comma-in-password"),
        pytest.param("a@example.com, b?c", "a@example.com, b?***", id="list"),
    ],
)
def test_url_password_and_query_are_not_shown_in_errors(raw: str, shown: str) -> None:
    assert shown_value(raw) == shown


def test_defaults_of_dmarc_attachment_policy_and_s3() -> None:
    settings = parse_settings(REQUIRED)
    assert (settings.dmarc_mode, settings.dns_servers, settings.dns_timeout) == ("off", (), 5.0)
    assert settings.attachment_max_bytes == settings.max_attachment_size == 10_485_760
    assert (settings.attachment_max_total_bytes, settings.attachment_max_count) == (None, None)
    assert (settings.attachment_allowed_types, settings.attachment_denied_types) == ((), ())
    assert settings.attachment_denied_extensions == frozenset()
    assert (settings.attachment_policy_action, settings.attachment_delivery) == ("drop", "inline")
    assert (settings.s3_bucket, settings.s3_prefix, settings.s3_endpoint_url, settings.s3_region) == (
        None,
        "",
        None,
        None,
    )
    assert (settings.s3_presign_secs, settings.s3_inline_max_bytes, settings.s3_timeout) == (None, None, 30.0)


def test_dmarc_attachment_policy_and_s3_values() -> None:
    settings = parse_settings(
        settings_with(
            DMARC_MODE="Enforce",
            DNS_SERVERS="192.0.2.53, 192.0.2.54:5353,2001:db8::53,[2001:db8::54]:5300, 192.0.2.53",
            DNS_TIMEOUT="1.5",
            ATTACHMENT_MAX_TOTAL_BYTES="5000",
            ATTACHMENT_MAX_COUNT="0",
            ATTACHMENT_ALLOWED_TYPES="Image/*, application/PDF,*/*",
            ATTACHMENT_DENIED_TYPES="image/svg+xml",
            ATTACHMENT_DENIED_EXTENSIONS=".EXE, js,bat",
            ATTACHMENT_POLICY_ACTION="REJECT",
            ATTACHMENT_DELIVERY="s3",
            S3_BUCKET="mail.attachments-1",
            S3_PREFIX="relay/in/",
            S3_ENDPOINT_URL="http://minio:9000",
            S3_REGION="eu-central-1",
            S3_PRESIGN_SECS="604800",
            S3_INLINE_MAX_BYTES="0",
            S3_TIMEOUT="2",
        )
    )
    assert settings.dmarc_mode == "enforce"
    assert settings.dns_servers == (
        ("192.0.2.53", 53),
        ("192.0.2.54", 5353),
        ("2001:db8::53", 53),
        ("2001:db8::54", 5300),
    )
    assert settings.dns_timeout == 1.5
    assert (settings.attachment_max_total_bytes, settings.attachment_max_count) == (5000, 0)
    assert settings.attachment_allowed_types == ("image/*", "application/pdf", "*/*")
    assert settings.attachment_denied_types == ("image/svg+xml",)
    assert settings.attachment_denied_extensions == frozenset({"exe", "js", "bat"})
    assert (settings.attachment_policy_action, settings.attachment_delivery) == ("reject", "s3")
    assert (settings.s3_bucket, settings.s3_prefix, settings.s3_endpoint_url) == (
        "mail.attachments-1",
        "relay/in/",
        "http://minio:9000",
    )
    assert (settings.s3_region, settings.s3_presign_secs, settings.s3_inline_max_bytes) == ("eu-central-1", 604800, 0)
    assert settings.s3_timeout == 2


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("DMARC_MODE", "strict", "one of off, monitor, enforce"),
        ("DNS_SERVERS", "dns.example", DNS_EXPECTED),
        ("DNS_SERVERS", "192.0.2.1:0", DNS_EXPECTED),
        ("DNS_SERVERS", "192.0.2.1:53:53", DNS_EXPECTED),
        ("DNS_SERVERS", "[2001:db8::1]x", DNS_EXPECTED),
        ("DNS_SERVERS", ",", DNS_EXPECTED),
        ("DNS_TIMEOUT", "0", "a number of seconds > 0"),
        ("ATTACHMENT_MAX_BYTES", "0", "a positive integer"),
        ("ATTACHMENT_MAX_TOTAL_BYTES", "1e6", "a positive integer"),
        ("ATTACHMENT_MAX_COUNT", "-1", "an integer >= 0"),
        ("ATTACHMENT_ALLOWED_TYPES", "pdf", "a comma-separated list of MIME types like application/pdf, image/*"),
        ("ATTACHMENT_DENIED_TYPES", "*/pdf", "a comma-separated list of MIME types like application/pdf, image/*"),
        ("ATTACHMENT_DENIED_EXTENSIONS", "tar.gz", "a comma-separated list of file extensions like exe, js, bat"),
        ("ATTACHMENT_POLICY_ACTION", "bounce", "one of drop, reject"),
        ("ATTACHMENT_DELIVERY", "ftp", "one of inline, s3"),
        ("S3_BUCKET", "My_Bucket", "an S3 bucket name (3-63 characters: lower-case letters, digits, dots, hyphens)"),
        ("S3_PREFIX", "/abs/", "an S3 key prefix like attachments/ (letters, digits and !_.*'()/-, no leading /)"),
        ("S3_PREFIX", "a/../b/", "an S3 key prefix like attachments/ (letters, digits and !_.*'()/-, no leading /)"),
        ("S3_ENDPOINT_URL", "minio:9000", "an absolute http(s) URL like http://127.0.0.1:9000"),
        ("S3_REGION", "EU Central", "an AWS region name like eu-central-1"),
        ("S3_PRESIGN_SECS", "604801", "a number of seconds 1-604800"),
        ("S3_INLINE_MAX_BYTES", "-1", "an integer >= 0"),
        ("S3_TIMEOUT", "never", "a number of seconds > 0"),
    ],
)
def test_bad_dmarc_attachment_and_s3_values(name: str, value: str, expected: str) -> None:
    assert error_for(settings_with(**{name: value})) == f"MAIL_RELAY_{name}: expected {expected}, got {value!r}"


@pytest.mark.parametrize("name", ["ATTACHMENT_MAX_BYTES", "MAX_ATTACHMENT_SIZE"])
def test_either_name_sets_the_per_attachment_limit(name: str) -> None:
    settings = parse_settings(settings_with(**{name: "4096"}))
    assert settings.attachment_max_bytes == settings.max_attachment_size == 4096


def test_both_names_of_the_per_attachment_limit_is_an_error() -> None:
    assert error_for(settings_with(ATTACHMENT_MAX_BYTES="1", MAX_ATTACHMENT_SIZE="1")) == (
        "MAIL_RELAY_MAX_ATTACHMENT_SIZE: expected no value when MAIL_RELAY_ATTACHMENT_MAX_BYTES is set"
        " (it is the old name of the same limit), got '1'"
    )


def test_old_limit_name_in_the_environment_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in __import__("os").environ if n.upper().startswith("MAIL_RELAY_")]:
        monkeypatch.delenv(name)
    for name, value in {**REQUIRED, "MAIL_RELAY_MAX_ATTACHMENT_SIZE": "77"}.items():
        monkeypatch.setenv(name, value)
    assert load_settings(tmp_path).attachment_max_bytes == 77
    monkeypatch.setenv("MAIL_RELAY_ATTACHMENT_MAX_BYTES", "78")
    with pytest.raises(ConfigError, match="MAIL_RELAY_MAX_ATTACHMENT_SIZE: expected no value"):
        load_settings(tmp_path)


def test_s3_delivery_needs_a_bucket() -> None:
    assert error_for(settings_with(ATTACHMENT_DELIVERY="s3")) == (
        "MAIL_RELAY_S3_BUCKET: expected an S3 bucket name (required with MAIL_RELAY_ATTACHMENT_DELIVERY=s3),"
        " got <unset>"
    )


def test_s3_endpoint_password_and_query_are_not_echoed() -> None:
    assert error_for(settings_with(S3_ENDPOINT_URL="http://key:secret@minio:9000/?token=x")) == (
        "MAIL_RELAY_S3_ENDPOINT_URL: expected an absolute http(s) URL like http://127.0.0.1:9000,"
        " got 'http://key:***@minio:9000/?***'"
    )


def test_dmarc_variables_are_known_now() -> None:
    env = {
        **REQUIRED,
        "MAIL_RELAY_DMARC_MODE": "monitor",
        "MAIL_RELAY_S3_BUCKET": "b",
        "MAIL_RELAY_MAX_ATTACHMENT_SIZE": "1",
    }
    assert unknown_variables(env) == []


NATS_EXPECTED = "a NATS URL like nats://127.0.0.1:4222 (several: comma-separated)"
QUEUE = {"QUEUE": "jetstream", "NATS_URL": "nats://127.0.0.1:4222"}


def test_queue_defaults_to_direct_mode() -> None:
    settings = parse_settings(REQUIRED)
    assert (settings.queue, settings.nats_url, settings.queue_stream) == ("direct", None, "MAILRELAY")
    assert (settings.queue_workers, settings.queue_max_attempts) == (16, 25)
    assert (settings.queue_max_age, settings.queue_ack_wait) == (86_400, 60)


def test_queue_mode_values() -> None:
    settings = parse_settings(
        settings_with(
            QUEUE="JetStream",
            NATS_URL=" nats://a:4222 , tls://b:4222",
            QUEUE_STREAM="mail_in-1",
            QUEUE_WORKERS="0",
            QUEUE_MAX_ATTEMPTS="3",
            QUEUE_MAX_AGE="600",
            QUEUE_ACK_WAIT="45",
        )
    )
    assert (settings.queue, settings.nats_url, settings.queue_stream) == (
        "jetstream",
        "nats://a:4222,tls://b:4222",
        "mail_in-1",
    )
    assert (settings.queue_workers, settings.queue_max_attempts, settings.queue_max_age, settings.queue_ack_wait) == (
        0,
        3,
        600,
        45,
    )


def test_queue_mode_needs_a_nats_url() -> None:
    assert error_for(settings_with(QUEUE="jetstream")) == (
        "MAIL_RELAY_NATS_URL: expected a NATS URL like nats://127.0.0.1:4222 (required with "
        "MAIL_RELAY_QUEUE=jetstream), got <unset>"
    )


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("QUEUE", "kafka", "one of direct, jetstream"),
        ("NATS_URL", "http://127.0.0.1:4222", NATS_EXPECTED),
        ("NATS_URL", "nats://a:4222,,nats://b:4222", NATS_EXPECTED),
        ("NATS_URL", "nats://:4222", NATS_EXPECTED),
        ("QUEUE_STREAM", "mail.in", "a JetStream stream name (1-64 letters, digits, _ and -)"),
        ("QUEUE_STREAM", "mail>", "a JetStream stream name (1-64 letters, digits, _ and -)"),
        ("QUEUE_WORKERS", "-1", "an integer >= 0"),
        ("QUEUE_MAX_ATTEMPTS", "0", "an integer 1-1000"),
        ("QUEUE_MAX_AGE", "0", "a number of seconds > 0"),
    ],
)
def test_bad_queue_values(name: str, value: str, expected: str) -> None:
    assert error_for({**settings_with(**QUEUE), f"MAIL_RELAY_{name}": value}) == (
        f"MAIL_RELAY_{name}: expected {expected}, got {value!r}"
    )


def test_ack_wait_must_outlast_the_webhook_timeout_in_queue_mode() -> None:
    assert error_for(settings_with(**QUEUE, WEBHOOK_TIMEOUT="30", QUEUE_ACK_WAIT="30")) == (
        "MAIL_RELAY_QUEUE_ACK_WAIT: expected a number of seconds greater than MAIL_RELAY_WEBHOOK_TIMEOUT (30), got '30'"
    )
    assert parse_settings(settings_with(WEBHOOK_TIMEOUT="90")).queue_ack_wait == 60  # direct mode: not used


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        pytest.param("http://alice:s3cret@nats:4222", "'http://alice:***@nats:4222'", id="password"),
        pytest.param("http://t0ken@nats:4222", "'http://***@nats:4222'", id="token"),
        pytest.param("nats://a:4222,http://t0ken@b:4222", "'nats://a:4222,http://***@b:4222'", id="cluster"),
    ],
)
def test_nats_credentials_are_never_shown(raw: str, shown: str) -> None:
    message = error_for(settings_with(QUEUE="jetstream", NATS_URL=raw))
    assert message == f"MAIL_RELAY_NATS_URL: expected {NATS_EXPECTED}, got {shown}"


def test_metrics_are_off_unless_the_port_is_set() -> None:
    assert parse_settings(REQUIRED).metrics_port is None
    assert parse_settings(settings_with(METRICS_PORT="")).metrics_port is None
    assert parse_settings(settings_with(METRICS_PORT=" 9100 ")).metrics_port == 9100


def test_metrics_port_0_is_a_random_free_port_even_with_smtp_on_0() -> None:
    assert parse_settings(settings_with(METRICS_PORT="0", PORT="0")).metrics_port == 0


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({"METRICS_PORT": "2525"}, "a TCP port other than MAIL_RELAY_PORT (2525)", id="default-smtp"),
        pytest.param({"METRICS_PORT": "8080"}, "a TCP port other than MAIL_RELAY_HEALTH_PORT (8080)", id="health"),
        pytest.param(
            {"METRICS_PORT": "2600", "PORT": "2600"}, "a TCP port other than MAIL_RELAY_PORT (2600)", id="smtp"
        ),
        pytest.param(
            {"METRICS_PORT": "9100", "HEALTH_PORT": "9100"},
            "a TCP port other than MAIL_RELAY_HEALTH_PORT (9100)",
            id="set-health",
        ),
    ],
)
def test_metrics_port_must_be_its_own(values: dict[str, str], expected: str) -> None:
    shown = repr(values["METRICS_PORT"])
    assert error_for(settings_with(**values)) == f"MAIL_RELAY_METRICS_PORT: expected {expected}, got {shown}"


@pytest.mark.parametrize("value", ["metrics", "9100.0", "-1", "65536", "0x2384"])
def test_metrics_port_must_be_a_port_number(value: str) -> None:
    assert error_for(settings_with(METRICS_PORT=value)) == (
        f"MAIL_RELAY_METRICS_PORT: expected a TCP port 0-65535, got {value!r}"
    )


def test_a_bad_smtp_port_is_named_before_the_metrics_port_is_compared() -> None:
    assert error_for(settings_with(PORT="smtp", METRICS_PORT="2525")) == (
        "MAIL_RELAY_PORT: expected a TCP port 0-65535, got 'smtp'"
    )
