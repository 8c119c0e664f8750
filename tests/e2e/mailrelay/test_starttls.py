"""STARTTLS with smtplib against the real process: the upgrade, the second STARTTLS, the default cert."""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable

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
