"""Every row of the spec's SMTP state table, with its exact reply text, against the real process."""

from __future__ import annotations

import json

from mailrelay.smtp import _replies as r
from mailrelay.testing import WebhookReceiver
from tests.e2e.mailrelay.support import SECOND_TARGET, TARGET, RelayProcess


def test_greeting_text(relay: RelayProcess) -> None:
    with relay.raw() as client:
        assert client.reply() == [b"220 MailRelay SMTP Server Ready"]


def test_ehlo_with_domain_greets_it_and_ends_with_starttls(relay: RelayProcess) -> None:
    with relay.raw() as client:
        client.reply()
        lines = client.command("EHLO mx.example.org")
    assert lines == [
        b"250-MailRelay greets mx.example.org",
        b"250-SIZE 200000",
        b"250-8BITMIME",
        b"250-PIPELINING",
        b"250-SMTPUTF8",
        b"250 STARTTLS",
    ]


def test_ehlo_without_domain_greets_client(relay: RelayProcess) -> None:
    with relay.raw() as client:
        client.reply()
        lines = client.command("EHLO")
    assert lines == [
        b"250-MailRelay greets client",
        b"250-SIZE 200000",
        b"250-8BITMIME",
        b"250-PIPELINING",
        b"250-SMTPUTF8",
        b"250 STARTTLS",
    ]


def test_helo_replies_mailrelay(relay: RelayProcess) -> None:
    with relay.raw() as client:
        client.reply()
        assert client.command("HELO mx.example.org") == [b"250 MailRelay"]


def test_mail_from_with_address_is_ok(relay: RelayProcess) -> None:
    with relay.smtp() as smtp:
        smtp.ehlo()
        assert smtp.docmd("MAIL FROM:<alice@example.org>") == (250, b"OK")


def test_mail_from_empty_is_syntax_error(relay: RelayProcess) -> None:
    with relay.smtp() as smtp:
        smtp.ehlo()
        assert smtp.docmd("MAIL FROM:") == (501, b"Syntax error in MAIL FROM parameters")
        # no state change: a proper MAIL FROM is still accepted afterwards
        assert smtp.docmd("MAIL FROM:<alice@example.org>") == (250, b"OK")


def test_rcpt_known_target_is_ok_case_insensitively(relay: RelayProcess) -> None:
    with relay.smtp() as smtp:
        smtp.ehlo()
        smtp.docmd("MAIL FROM:<alice@example.org>")
        assert smtp.docmd(f"RCPT TO:<{TARGET.upper()}>") == (250, b"OK")
        assert smtp.docmd(f"RCPT TO:<{SECOND_TARGET}>") == (250, b"OK")


def test_rcpt_unknown_is_550_and_clears_the_accepted_recipient(relay: RelayProcess) -> None:
    with relay.smtp() as smtp:
        smtp.ehlo()
        smtp.docmd("MAIL FROM:<alice@example.org>")
        assert smtp.docmd(f"RCPT TO:<{TARGET}>") == (250, b"OK")
        assert smtp.docmd("RCPT TO:<nobody@example.test>") == (550, b"No such user here")
        # the accepted recipient is gone, so DATA is out of sequence
        assert smtp.docmd("DATA") == (503, b"Bad sequence of commands")


def test_data_without_mail_or_rcpt_is_bad_sequence(relay: RelayProcess) -> None:
    with relay.smtp() as smtp:
        smtp.ehlo()
        assert smtp.docmd("DATA") == (503, b"Bad sequence of commands")
        smtp.docmd("MAIL FROM:<alice@example.org>")
        assert smtp.docmd("DATA") == (503, b"Bad sequence of commands")


def test_data_then_dot_delivers_and_returns_to_greeted(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    with relay.smtp() as smtp:
        smtp.ehlo()
        smtp.docmd("MAIL FROM:<alice@example.org>")
        smtp.docmd(f"RCPT TO:<{TARGET}>")
        assert smtp.docmd("DATA") == (354, b"Start mail input; end with <CRLF>.<CRLF>")
        smtp.send(b"Subject: one\r\n\r\nfirst\r\n.\r\n")
        assert smtp.getreply() == (250, b"OK: Message accepted for delivery")
        # Greeted again: a second transaction on the same connection works
        assert smtp.docmd("MAIL FROM:<alice@example.org>") == (250, b"OK")
    assert len(webhook.wait_for(1)) == 1


def test_quit_says_bye_and_closes(relay: RelayProcess) -> None:
    with relay.raw() as client:
        client.reply()
        assert client.command("QUIT") == [b"221 Bye"]
        assert client.closed_by_server()


def test_quit_inside_data_is_a_body_line(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    with relay.raw() as client:
        client.reply()
        client.command("EHLO tester")
        client.command("MAIL FROM:<alice@example.org>")
        client.command(f"RCPT TO:<{TARGET}>")
        assert client.command("DATA") == [b"354 Start mail input; end with <CRLF>.<CRLF>"]
        client.send(b"Subject: quit\r\n\r\nQUIT\r\nafter quit\r\n.\r\n")
        assert client.reply() == [b"250 OK: Message accepted for delivery"]
    payload = json.loads(webhook.wait_for(1)[0].body)
    assert payload["body"] == "QUIT\nafter quit\n"


def test_starttls_in_connected_state_is_bad_sequence(relay: RelayProcess) -> None:
    with relay.raw() as client:
        client.reply()
        assert client.command("STARTTLS") == [b"503 Bad sequence of commands"]


def test_starttls_during_a_transaction_is_bad_sequence(relay: RelayProcess) -> None:
    with relay.smtp() as smtp:
        smtp.ehlo()
        smtp.docmd("MAIL FROM:<alice@example.org>")
        assert smtp.docmd("STARTTLS") == (503, b"Bad sequence of commands")


class TestWhereTheSpecIsSilent:
    def test_rset_and_noop_are_ok(self, relay: RelayProcess) -> None:
        with relay.smtp() as smtp:
            smtp.ehlo()
            assert smtp.docmd("NOOP") == (250, b"OK")
            smtp.docmd("MAIL FROM:<alice@example.org>")
            assert smtp.docmd("RSET") == (250, b"OK")
            assert smtp.docmd("RCPT TO:<inbox@example.test>") == (503, b"Bad sequence of commands")

    def test_unknown_verb_is_500(self, relay: RelayProcess) -> None:
        with relay.smtp() as smtp:
            code, _ = smtp.docmd("FROBNICATE now")
        assert code == 500

    def test_mail_before_greeting_is_bad_sequence(self, relay: RelayProcess) -> None:
        with relay.raw() as client:
            client.reply()
            assert client.command("MAIL FROM:<alice@example.org>") == [b"503 Bad sequence of commands"]

    def test_nested_mail_is_bad_sequence(self, relay: RelayProcess) -> None:
        with relay.smtp() as smtp:
            smtp.ehlo()
            smtp.docmd("MAIL FROM:<alice@example.org>")
            assert smtp.docmd("MAIL FROM:<bob@example.org>") == (503, b"Bad sequence of commands")

    def test_esmtp_parameters_are_accepted(self, relay: RelayProcess) -> None:
        with relay.smtp() as smtp:
            smtp.ehlo()
            assert smtp.docmd("MAIL FROM:<alice@example.org> SIZE=1000 BODY=8BITMIME SMTPUTF8") == (
                250,
                b"OK",
            )

    def test_declared_size_above_limit_is_552(self, relay: RelayProcess) -> None:
        with relay.smtp() as smtp:
            smtp.ehlo()
            code, text = smtp.docmd("MAIL FROM:<alice@example.org> SIZE=999999999")
        assert (code, text) == (r.SIZE_DECLARED_TOO_LARGE.code, r.SIZE_DECLARED_TOO_LARGE.text.encode())

    def test_null_reverse_path_is_accepted(self, relay: RelayProcess, webhook: WebhookReceiver) -> None:
        with relay.smtp() as smtp:
            smtp.ehlo()
            assert smtp.docmd("MAIL FROM:<>") == (250, b"OK")
            smtp.docmd(f"RCPT TO:<{TARGET}>")
            assert smtp.data(b"Subject: bounce\r\n\r\nDelivery Status Notification\r\n") == (
                250,
                b"OK: Message accepted for delivery",
            )
        assert json.loads(webhook.wait_for(1)[0].body)["sender"] == ""

    def test_unknown_recipient_cap_closes_with_421(self, relay: RelayProcess) -> None:
        with relay.raw() as client:
            client.reply()
            client.command("EHLO tester")
            client.command("MAIL FROM:<alice@example.org>")
            for n in range(3):
                assert client.command(f"RCPT TO:<nobody{n}@example.test>") == [b"550 No such user here"]
            assert client.command("RCPT TO:<nobody9@example.test>") == [r.TOO_MANY_UNKNOWN_RCPTS.line().rstrip()]
            assert client.closed_by_server()

    def test_pipelined_commands_get_replies_in_order(self, relay: RelayProcess, webhook: WebhookReceiver) -> None:
        with relay.raw() as client:
            client.reply()
            client.command("EHLO tester")
            client.send(f"MAIL FROM:<alice@example.org>\r\nRCPT TO:<{TARGET}>\r\nDATA\r\n".encode())
            assert client.reply() == [b"250 OK"]
            assert client.reply() == [b"250 OK"]
            assert client.reply() == [b"354 Start mail input; end with <CRLF>.<CRLF>"]
            client.send(b"Subject: piped\r\n\r\nbody\r\n.\r\nQUIT\r\n")
            assert client.reply() == [b"250 OK: Message accepted for delivery"]
            assert client.reply() == [b"221 Bye"]
        assert json.loads(webhook.wait_for(1)[0].body)["subject"] == "piped"
