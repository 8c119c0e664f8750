"""STARTTLS with smtplib against the real process: the upgrade, the second STARTTLS, the default cert."""

from __future__ import annotations

import json
import os
import signal
import ssl
import time
from collections.abc import Callable
from pathlib import Path

from bastion_core.testing import DevCA, Issued
from mailrelay.testing import WebhookReceiver
from tests.e2e.mailrelay.support import TARGET, RelayProcess


def test_starttls_upgrades_and_requires_a_new_ehlo(
    relay: RelayProcess, client_tls_context: ssl.SSLContext, webhook: WebhookReceiver
) -> None:
    with relay.smtp() as smtp:
        smtp.ehlo()
        assert smtp.has_extn("starttls")
        assert smtp.starttls(context=client_tls_context) == (220, b"Go ahead")
        # after the handshake the session is back in Connected: MAIL needs a new EHLO
        assert smtp.docmd("MAIL FROM:<alice@example.org>") == (503, b"Bad sequence of commands")
        assert smtp.ehlo() == (250, b"MailRelay greets tester.example\nSIZE 200000\n8BITMIME\nPIPELINING\nSMTPUTF8")
        assert not smtp.has_extn("starttls")  # no longer offered once TLS is active
        smtp.sendmail("alice@example.org", [TARGET], b"Subject: secret\r\n\r\nover TLS\r\n")
    assert json.loads(webhook.wait_for(1)[0].body)["subject"] == "secret"


def test_second_starttls_gets_a_single_503_and_the_session_survives(
    relay: RelayProcess, client_tls_context: ssl.SSLContext
) -> None:
    with relay.smtp() as smtp:
        smtp.ehlo()
        smtp.starttls(context=client_tls_context)
        assert smtp.docmd("STARTTLS") == (503, b"STARTTLS already active")
        smtp.ehlo()
        assert smtp.docmd("STARTTLS") == (503, b"STARTTLS already active")
        assert smtp.noop() == (250, b"OK")  # the connection is intact


def test_self_signed_certificate_is_generated_when_none_is_configured(
    start_relay: Callable[..., RelayProcess], receiver: WebhookReceiver
) -> None:
    relay = start_relay(WEBHOOK_URL=receiver.url)
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE
    with relay.smtp() as smtp:
        smtp.ehlo()
        assert smtp.starttls(context=unverified) == (220, b"Go ahead")
        assert smtp.ehlo() == (250, b"MailRelay greets tester.example\nSIZE 200000\n8BITMIME\nPIPELINING\nSMTPUTF8")
    (event,) = relay.events("self_signed_certificate_generated")
    assert (event["level"], event["hint"]) == (
        "warning",
        "set MAIL_RELAY_TLS_CERT and MAIL_RELAY_TLS_KEY to serve a trusted certificate",
    )


def starttls_name(relay: RelayProcess, context: ssl.SSLContext) -> str:
    """The CN of the certificate a new STARTTLS handshake gets."""
    with relay.smtp() as smtp:
        smtp.ehlo()
        smtp.starttls(context=context)
        peer = smtp.sock.getpeercert()  # type: ignore[union-attr]
    return next(value for rdn in peer["subject"] for key, value in rdn if key == "commonName")


def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_renewed_certificate_is_served_without_a_restart_and_a_broken_one_is_not(
    start_relay: Callable[..., RelayProcess], receiver: WebhookReceiver, tmp_path: Path
) -> None:
    """SIGHUP re-reads the files at once (the interval is an hour here); the poll runs the same reload."""
    ca = DevCA()
    ca.write(tmp_path)
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))

    def rotate(version: str, issued: Issued) -> None:
        issued.write(tmp_path / version, "relay")
        (tmp_path / "next").symlink_to(version)
        os.replace(tmp_path / "next", tmp_path / "current")  # one atomic swap of both files

    def relay_cert(name: str) -> Issued:
        return ca.issue(name, dns=("localhost",), ips=("127.0.0.1",), server=True, client=False)

    rotate("v1", relay_cert("relay-v1"))
    relay = start_relay(
        WEBHOOK_URL=receiver.url,
        TLS_CERT=str(tmp_path / "current/relay.pem"),
        TLS_KEY=str(tmp_path / "current/relay-key.pem"),
        TLS_RELOAD_INTERVAL="3600",
    )
    rotate("v2", relay_cert("relay-v2"))
    assert starttls_name(relay, context) == "relay-v1"
    relay.proc.send_signal(signal.SIGHUP)
    eventually(lambda: starttls_name(relay, context) == "relay-v2")
    broken = relay_cert("relay-broken")
    rotate("broken", Issued(broken.cert_pem, relay_cert("other").key_pem, broken.serial))
    relay.proc.send_signal(signal.SIGHUP)
    eventually(lambda: bool(relay.events("tls_reload_failed")))
    assert starttls_name(relay, context) == "relay-v2"
    (failed,) = relay.events("tls_reload_failed")
    assert (failed["level"], failed["kept"]) == ("error", "previous")
