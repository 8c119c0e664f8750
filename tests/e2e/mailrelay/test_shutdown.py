"""Graceful shutdown of the real process on SIGTERM/SIGINT."""

from __future__ import annotations

import signal
import ssl
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from mailrelay.smtp import _replies as r
from mailrelay.testing import ScriptedResponse, WebhookReceiver
from tests.e2e.mailrelay.support import TARGET, RelayProcess


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_with_exit_0_and_421_to_idle_sessions(
    start_relay: Callable[..., RelayProcess], receiver: WebhookReceiver, sig: int
) -> None:
    relay = start_relay(WEBHOOK_URL=receiver.url)
    with relay.raw() as idle:
        idle.reply()
        idle.command("EHLO tester")
        assert relay.stop(sig) == 0
        assert idle.reply() == [str(r.SHUTTING_DOWN).encode()]
        assert idle.closed_by_server()
    assert [event["event"] for event in relay.events()][-2:] == ["mailrelay_stopping", "mailrelay_stopped"]


def test_idle_tls_session_does_not_hold_up_shutdown(
    start_relay: Callable[..., RelayProcess],
    receiver: WebhookReceiver,
    tls_files: tuple[Path, Path],
    client_tls_context: ssl.SSLContext,
) -> None:
    """An idle client never answers the TLS close_notify: the 421 must still end its session at
    once, or the relay waits out the whole grace period (set far beyond stop()'s patience here)."""
    cert, key = tls_files
    relay = start_relay(WEBHOOK_URL=receiver.url, TLS_CERT=str(cert), TLS_KEY=str(key), SHUTDOWN_GRACE="120")
    with relay.smtp() as smtp:
        smtp.ehlo()
        smtp.starttls(context=client_tls_context)
        smtp.ehlo()
        assert relay.stop() == 0  # exited by itself, not killed after STOP_TIMEOUT_SECS
        assert smtp.getreply() == (r.SHUTTING_DOWN.code, r.SHUTTING_DOWN.text.encode())
    assert [event["event"] for event in relay.events()][-2:] == ["mailrelay_stopping", "mailrelay_stopped"]


def test_message_in_delivery_finishes_before_exit(
    start_relay: Callable[..., RelayProcess], webhook: WebhookReceiver
) -> None:
    relay = start_relay(WEBHOOK_URL=webhook.url)
    webhook.script(ScriptedResponse(status=200, delay=0.5))
    client = relay.raw()
    client.reply()
    client.command("EHLO tester")
    client.command("MAIL FROM:<alice@example.org>")
    client.command(f"RCPT TO:<{TARGET}>")
    client.command("DATA")
    client.send(b"Subject: in flight\r\n\r\nbody\r\n.\r\n")
    webhook.wait_for(1)  # the POST is in progress now
    stopper = threading.Thread(target=relay.stop)
    stopper.start()
    try:
        assert client.reply() == [b"250 OK: Message accepted for delivery"]
        assert client.reply() == [str(r.SHUTTING_DOWN).encode()]
    finally:
        client.close()
        stopper.join(timeout=15)
    assert relay.proc.returncode == 0
