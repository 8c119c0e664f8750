"""Invalid configuration: the real process exits non-zero before listening, naming the variable."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from mailrelay.testing import WebhookReceiver, free_port
from tests.e2e.mailrelay.support import TARGET, RelayProcess, relay_command, relay_env, wait_until_listening

VALID = {
    "TARGET_EMAILS": TARGET,
    "WEBHOOK_URL": "http://127.0.0.1:9/webhook",
    "BIND_ADDRESS": "127.0.0.1",
    "HEALTH_BIND_ADDRESS": "127.0.0.1",
}


def run_relay(tmp_path: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    env = relay_env(**{"PORT": str(free_port()), "HEALTH_PORT": str(free_port()), **settings})
    return subprocess.run(relay_command(), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=20)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        pytest.param("TARGET_EMAILS", "", id="targets-empty"),
        pytest.param("TARGET_EMAILS", "not-an-address", id="targets-bad"),
        pytest.param("WEBHOOK_URL", "ftp://example.com/hook", id="url-scheme"),
        pytest.param("WEBHOOK_URL", "http://example.com/hook", id="url-insecure"),
        pytest.param("WEBHOOK_URL", "http://127.0.0.1.example.com/hook", id="url-loopback-lookalike"),
        pytest.param("PORT", "smtp", id="port-text"),
        pytest.param("PORT", "70000", id="port-range"),
        pytest.param("WEBHOOK_TIMEOUT", "-1", id="timeout-negative"),
        pytest.param("WEBHOOK_MAX_RETRIES", "many", id="retries-text"),
        pytest.param("CIRCUIT_BREAKER_THRESHOLD", "0", id="threshold-zero"),
        pytest.param("MAX_MESSAGE_SIZE", "1e6", id="size-float"),
        pytest.param("LOG_LEVEL", "LOUD", id="log-level"),
        pytest.param("TLS_CERT", "/nonexistent/cert.pem", id="tls-cert-missing"),
        pytest.param("WEBHOOK_ALLOW_INSECURE", "maybe", id="bool"),
    ],
)
def test_invalid_value_exits_non_zero_naming_variable(tmp_path: Path, variable: str, value: str) -> None:
    result = run_relay(tmp_path, **{**VALID, variable: value})
    assert result.returncode != 0
    assert f"MAIL_RELAY_{variable}" in result.stderr
    if value:
        assert repr(value) in result.stderr


def test_missing_required_variable_is_named(tmp_path: Path) -> None:
    result = run_relay(tmp_path, TARGET_EMAILS=TARGET)
    assert result.returncode != 0
    assert "MAIL_RELAY_WEBHOOK_URL" in result.stderr


def test_signing_secret_is_never_printed(tmp_path: Path) -> None:
    result = run_relay(tmp_path, **VALID, WEBHOOK_SIGNING_SECRET="hunter2-secret", PORT="bad")
    assert result.returncode != 0
    assert "hunter2-secret" not in result.stderr + result.stdout


def test_tls_key_without_cert_is_named(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("not a key")
    result = run_relay(tmp_path, **VALID, TLS_KEY=str(key))
    assert result.returncode != 0
    assert "MAIL_RELAY_TLS_CERT" in result.stderr


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
    assert "listen_failed" in result.stderr
    assert "MAIL_RELAY_BIND_ADDRESS/MAIL_RELAY_PORT" in result.stderr
    assert f"127.0.0.1:{port}" in result.stderr


def test_health_port_in_use_exits_1_naming_the_health_variables(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_relay(tmp_path, **VALID, HEALTH_PORT=str(port))
    assert result.returncode == 1
    assert "MAIL_RELAY_HEALTH_BIND_ADDRESS/MAIL_RELAY_HEALTH_PORT" in result.stderr
    assert f"127.0.0.1:{port}" in result.stderr
