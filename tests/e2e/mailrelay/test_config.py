"""Configuration of the real process: invalid values exit 2 before listening, naming the variable; `.env`;
unknown variables; listen failures."""

from __future__ import annotations

import errno
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from bastion_core import UNKNOWN_VARIABLE_EVENT
from mailrelay.testing import WebhookReceiver, free_port
from tests.e2e.mailrelay.support import (
    TARGET,
    RelayProcess,
    log_events,
    relay_command,
    relay_env,
    wait_until_listening,
)

VALID = {
    "TARGET_EMAILS": TARGET,
    "WEBHOOK_URL": "http://127.0.0.1:9/webhook",
    "BIND_ADDRESS": "127.0.0.1",
    "HEALTH_BIND_ADDRESS": "127.0.0.1",
}


def run_relay(tmp_path: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    env = relay_env(**{"PORT": str(free_port()), "HEALTH_PORT": str(free_port()), **settings})
    return subprocess.run(relay_command(), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=20)


INSECURE = "an https URL (plain http is allowed only to loopback hosts unless MAIL_RELAY_WEBHOOK_ALLOW_INSECURE=true)"


def configuration_error(variable: str, expected: str, shown: str) -> str:
    return f"mailrelay: configuration error: MAIL_RELAY_{variable}: expected {expected}, got {shown}\n"


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        pytest.param("TARGET_EMAILS", "", "a value (this variable is required)", id="targets-empty"),
        pytest.param(
            "TARGET_EMAILS",
            "not-an-address",
            "a comma-separated list of addresses like inbox@example.com",
            id="targets-bad",
        ),
        pytest.param("WEBHOOK_URL", "ftp://example.com/hook", "an absolute http(s) URL", id="url-scheme"),
        pytest.param("WEBHOOK_URL", "http://example.com/hook", INSECURE, id="url-insecure"),
        pytest.param("WEBHOOK_URL", "http://127.0.0.1.example.com/hook", INSECURE, id="url-loopback-lookalike"),
        pytest.param("PORT", "smtp", "a TCP port 0-65535", id="port-text"),
        pytest.param("PORT", "70000", "a TCP port 0-65535", id="port-range"),
        pytest.param("WEBHOOK_TIMEOUT", "-1", "a number of seconds > 0", id="timeout-negative"),
        pytest.param("WEBHOOK_MAX_RETRIES", "many", "an integer 0-20", id="retries-text"),
        pytest.param("CIRCUIT_BREAKER_MIN_REQUESTS", "0", "a positive integer", id="breaker-window-zero"),
        pytest.param("MAX_MESSAGE_SIZE", "1e6", "a positive integer", id="size-float"),
        pytest.param("LOG_LEVEL", "LOUD", "one of DEBUG, INFO, WARNING, ERROR, CRITICAL", id="log-level"),
        pytest.param("LOG_FORMAT", "xml", "one of auto, json, console", id="log-format"),
        pytest.param("TLS_CERT", "/nonexistent/cert.pem", "the path of a readable PEM file", id="tls-cert-missing"),
        pytest.param("WEBHOOK_ALLOW_INSECURE", "maybe", "a boolean (true/false, 1/0, yes/no, on/off)", id="bool"),
    ],
)
def test_invalid_value_exits_2_naming_variable_and_value(
    tmp_path: Path, variable: str, value: str, expected: str
) -> None:
    result = run_relay(tmp_path, **{**VALID, variable: value})
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == configuration_error(variable, expected, repr(value))


def test_missing_required_variable_is_named(tmp_path: Path) -> None:
    result = run_relay(tmp_path, TARGET_EMAILS=TARGET)
    assert result.returncode == 2
    assert result.stderr == configuration_error("WEBHOOK_URL", "a value (this variable is required)", "<unset>")


def test_signing_secret_is_never_printed(tmp_path: Path) -> None:
    result = run_relay(tmp_path, **VALID, WEBHOOK_SIGNING_SECRET="hunter2-secret", PORT="bad")
    assert result.returncode == 2
    assert result.stderr == configuration_error("PORT", "a TCP port 0-65535", "'bad'")
    assert "hunter2-secret" not in result.stderr + result.stdout


def test_tls_key_without_cert_is_named(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("not a key")
    result = run_relay(tmp_path, **VALID, TLS_KEY=str(key))
    assert result.returncode == 2
    assert result.stderr == configuration_error(
        "TLS_CERT", "a PEM path (TLS_CERT and TLS_KEY are set together)", "<unset>"
    )


def test_dotenv_file_is_read_and_environment_wins(tmp_path: Path, receiver: WebhookReceiver) -> None:
    smtp_port, health_port = free_port(), free_port()
    (tmp_path / ".env").write_text(
        f"MAIL_RELAY_TARGET_EMAILS={TARGET}\n"
        f"MAIL_RELAY_WEBHOOK_URL={receiver.url}\n"
        "MAIL_RELAY_BIND_ADDRESS=127.0.0.1\n"
        "MAIL_RELAY_HEALTH_BIND_ADDRESS=127.0.0.1\n"
        "MAIL_RELAY_PORT=1\n"  # overridden by the environment below
        f"MAIL_RELAY_HEALTH_PORT={health_port}\n"
    )
    log_path = tmp_path / "relay.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            relay_command(), cwd=tmp_path, env=relay_env(PORT=str(smtp_port)), stdout=log_file, stderr=log_file
        )
    relay = RelayProcess(proc=proc, smtp_port=smtp_port, health_port=health_port, log_path=log_path)
    try:
        wait_until_listening(relay)
    finally:
        assert relay.stop() == 0


def test_port_in_use_exits_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_relay(tmp_path, **VALID, PORT=str(port))
    assert result.returncode == 1
    (event,) = log_events(result.stderr, "listen_failed")
    assert (event["level"], event["variables"], event["address"]) == (
        "error",
        "MAIL_RELAY_BIND_ADDRESS/MAIL_RELAY_PORT",
        f"127.0.0.1:{port}",
    )
    assert event["error"] == (
        f"[Errno {errno.EADDRINUSE}] error while attempting to bind on address ('127.0.0.1', {port}): "
        "address already in use"
    )


def test_health_port_in_use_exits_1_naming_the_health_variables(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_relay(tmp_path, **VALID, HEALTH_PORT=str(port))
    assert result.returncode == 1
    (event,) = log_events(result.stderr, "listen_failed")
    assert (event["variables"], event["address"]) == (
        "MAIL_RELAY_HEALTH_BIND_ADDRESS/MAIL_RELAY_HEALTH_PORT",
        f"127.0.0.1:{port}",
    )


def test_unknown_variable_stops_the_relay_before_it_listens(tmp_path: Path) -> None:
    result = run_relay(tmp_path, **VALID, PROT="25")
    assert result.returncode == 2
    assert result.stderr == (
        "mailrelay: configuration error: MAIL_RELAY_PROT: not a MailRelay variable (did you mean MAIL_RELAY_PORT?); "
        "fix the name, or set MAIL_RELAY_IGNORE_UNKNOWN_VARIABLES=true to start anyway\n"
    )


def test_unknown_variable_is_a_warning_when_told_to_ignore_them(
    start_relay: Callable[..., RelayProcess], receiver: WebhookReceiver
) -> None:
    relay = start_relay(WEBHOOK_URL=receiver.url, PROT="25", LOG_LEVEL="warning", IGNORE_UNKNOWN_VARIABLES="true")
    (event,) = relay.events(UNKNOWN_VARIABLE_EVENT)
    assert (event["level"], event["variable"]) == ("warning", "MAIL_RELAY_PROT")
    assert relay.events("mailrelay_started") == []  # LOG_LEVEL=warning keeps info events out


def test_log_format_console_writes_readable_lines(
    start_relay: Callable[..., RelayProcess], receiver: WebhookReceiver
) -> None:
    relay = start_relay(WEBHOOK_URL=receiver.url, LOG_FORMAT="console", LOG_LEVEL="info")
    relay.stop()
    lines = relay.logs().splitlines()
    assert not any(line.startswith("{") for line in lines)
    assert any("[info     ] mailrelay_started" in line and "[mailrelay]" in line for line in lines)
