"""Misbehaving clients against the real process: oversize data, long lines, garbage, hang-ups."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

import pytest

from mailrelay.smtp import _replies as r
from mailrelay.testing import WebhookReceiver
from tests.e2e.mailrelay.support import MAX_MESSAGE_SIZE, TARGET, RawSmtp, RelayProcess, wait_until


def start_data(relay: RelayProcess) -> RawSmtp:
    client = relay.raw()
    client.reply()
    client.command("EHLO tester")
    client.command("MAIL FROM:<alice@example.org>")
    client.command(f"RCPT TO:<{TARGET}>")
    assert client.command("DATA") == [str(r.START_MAIL_INPUT).encode()]
    return client


def test_oversized_message_is_552_and_not_delivered(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    line = b"x" * 998 + b"\r\n"
    with start_data(relay) as client:
        client.send(b"Subject: huge\r\n\r\n" + line * (MAX_MESSAGE_SIZE // len(line) + 10) + b".\r\n")
        assert client.reply() == [b"552 5.3.4 Message size exceeds fixed limit"]
        assert client.command("NOOP") == [b"250 OK"]  # the session goes on
    assert webhook.requests == []


def test_over_long_data_line_is_rejected(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    with start_data(relay) as client:
        client.send(b"Subject: long\r\n\r\n" + b"y" * 5000 + b"\r\n.\r\n")
        assert client.reply() == [str(r.DATA_LINE_TOO_LONG).encode()]
        assert client.command("NOOP") == [b"250 OK"]
    assert webhook.requests == []


@pytest.mark.parametrize(
    ("wire", "delivered"),
    [
        pytest.param(b"x" * 998, "x" * 998, id="998-octets-accepted"),
        pytest.param(b"x" * 999, None, id="999-octets-refused"),
        pytest.param(b"." + b"x" * 998, "x" * 998, id="dot-and-998-accepted"),
        pytest.param(b"." + b"x" * 999, None, id="dot-and-999-refused"),
    ],
)
def test_a_data_line_holds_998_octets_plus_a_transparency_dot(
    relay: RelayProcess, webhook: WebhookReceiver, wire: bytes, delivered: str | None
) -> None:
    """RFC 5321 4.5.3.1.6: 1000 octets with the CRLF; a dot-stuffed line has one more, removed on receipt."""
    with start_data(relay) as client:
        client.send(b"Subject: edge\r\n\r\n" + wire + b"\r\n.\r\n")
        if delivered is None:
            assert client.reply() == [b"500 5.5.2 Line too long (RFC 5321 4.5.3.1.6)"]
        else:
            assert client.reply() == [str(r.MESSAGE_ACCEPTED).encode()]
        assert client.command("NOOP") == [b"250 OK"]  # the session goes on
    if delivered is None:
        assert webhook.requests == []
    else:
        assert wait_until(lambda: len(webhook.requests) == 1, timeout=10)
        assert json.loads(webhook.requests[0].body)["body"] == delivered + "\n"


def test_smtplib_dot_stuffs_a_998_octet_line_starting_with_a_dot_and_it_arrives_whole(
    relay: RelayProcess, webhook: WebhookReceiver
) -> None:
    """The client's side of the rule: smtplib sends the line as 999 octets, the relay removes the dot."""
    line = "." + "y" * 997
    with relay.smtp() as smtp:
        smtp.ehlo()
        smtp.mail("alice@example.org")
        smtp.rcpt(TARGET)
        assert smtp.data(f"From: alice@example.org\r\nSubject: dot\r\n\r\n{line}\r\n".encode())[0] == 250
    assert wait_until(lambda: len(webhook.requests) == 1, timeout=10)
    assert json.loads(webhook.requests[0].body)["body"] == line + "\n"


def test_over_long_line_ending_in_dot_does_not_end_data(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    with start_data(relay) as client:
        client.send(b"z" * 3000 + b".\r\n")  # the tail of this line is ".\r\n" but it is not a terminator
        client.send(b"more\r\n.\r\n")
        assert client.reply() == [str(r.DATA_LINE_TOO_LONG).encode()]
    assert webhook.requests == []


def test_over_long_command_line_is_500(relay: RelayProcess) -> None:
    with relay.raw() as client:
        client.reply()
        assert client.command("NOOP " + "a" * 2000) == [str(r.COMMAND_TOO_LONG).encode()]
        assert client.command("NOOP " + "a" * 600) == [str(r.COMMAND_TOO_LONG).encode()]
        assert client.command("NOOP") == [b"250 OK"]


def test_garbage_commands_get_500_then_421(relay: RelayProcess) -> None:
    with relay.raw() as client:
        client.reply()
        unrecognized = [str(r.UNRECOGNIZED_COMMAND).encode()]
        assert client.command("\x00\x01binary") == unrecognized
        client.send(b"\xff\xfe\xfd\r\n")
        assert client.reply() == unrecognized
        assert client.command("") == unrecognized
        # 10 bad commands are answered (the three above and seven more); the 11th closes the session
        assert [client.command(f"JUNK{n}") for n in range(7)] == [unrecognized] * 7
        assert client.command("JUNK7") == [str(r.TOO_MANY_BAD_COMMANDS).encode()]
        assert client.closed_by_server()


def test_disconnect_mid_data_delivers_nothing(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    client = start_data(relay)
    client.send(b"Subject: half\r\n\r\nthis message never ends\r\n")
    client.sock.shutdown(socket.SHUT_RDWR)
    client.close()
    # the relay must stay healthy and a following message must be the only one delivered
    with relay.smtp() as smtp:
        smtp.ehlo()
        smtp.sendmail("alice@example.org", [TARGET], b"Subject: whole\r\n\r\ncomplete\r\n")
    requests = webhook.wait_for(1)
    time.sleep(0.2)  # a stray delivery of the half message would have arrived by now
    assert [json.loads(r.body)["subject"] for r in webhook.requests] == ["whole"]
    assert len(requests) == 1


def test_client_that_half_closes_after_quit_gets_every_reply(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    """A client may send its whole transaction and QUIT, then shut down its sending side: the
    message is delivered, so the client must still get the 250 (and the 221), not a silent close."""
    with relay.raw() as client:
        client.reply()
        client.send(
            f"EHLO tester\r\nMAIL FROM:<alice@example.org>\r\nRCPT TO:<{TARGET}>\r\nDATA\r\n".encode()
            + b"Subject: half-closed\r\n\r\nbody\r\n.\r\nQUIT\r\n"
        )
        client.sock.shutdown(socket.SHUT_WR)
        assert client.reply() == [
            b"250-MailRelay greets tester",
            b"250-SIZE 200000",
            b"250-8BITMIME",
            b"250-PIPELINING",
            b"250-SMTPUTF8",
            b"250 STARTTLS",
        ]
        assert [client.reply(), client.reply(), client.reply()] == [
            [b"250 OK"],
            [b"250 OK"],
            [b"354 Start mail input; end with <CRLF>.<CRLF>"],
        ]
        assert client.reply() == [b"250 OK: Message accepted for delivery"]
        assert client.reply() == [b"221 Bye"]
        assert client.closed_by_server()
    assert [json.loads(r.body)["subject"] for r in webhook.wait_for(1)] == ["half-closed"]


def test_half_close_mid_data_delivers_nothing(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    with start_data(relay) as client:
        client.send(b"Subject: cut\r\n\r\nno final dot\r\n")
        client.sock.shutdown(socket.SHUT_WR)
        assert client.closed_by_server()
    with relay.smtp() as smtp:  # the next message is the only one that arrives
        smtp.ehlo()
        smtp.sendmail("alice@example.org", [TARGET], b"Subject: next\r\n\r\nbody\r\n")
    assert [json.loads(r.body)["subject"] for r in webhook.wait_for(1)] == ["next"]


def test_per_ip_session_cap_answers_421(
    start_relay: Callable[..., RelayProcess],
    receiver: WebhookReceiver,
) -> None:
    relay = start_relay(WEBHOOK_URL=receiver.url, MAX_CONCURRENT_PER_IP="2")
    first, second = relay.raw(), relay.raw()
    try:
        assert first.reply() == second.reply() == [str(r.GREETING).encode()]
        with relay.raw() as third:
            assert third.reply() == [str(r.TOO_MANY_CONNECTIONS).encode()]
            assert third.closed_by_server()
    finally:
        first.close()
        second.close()


def test_server_wide_session_cap_answers_421(
    start_relay: Callable[..., RelayProcess],
    receiver: WebhookReceiver,
) -> None:
    """MAX_SESSIONS bounds memory however many addresses the clients come from."""
    relay = start_relay(WEBHOOK_URL=receiver.url, MAX_SESSIONS="2", MAX_CONCURRENT_PER_IP="10")
    first, second = relay.raw(), relay.raw()
    try:
        assert first.reply() == second.reply() == [str(r.GREETING).encode()]
        with relay.raw() as third:
            assert third.reply() == [str(r.TOO_MANY_SESSIONS).encode()]
            assert third.closed_by_server()
    finally:
        first.close()
        second.close()
    for _ in range(100):  # the server frees the slots when it sees the two connections close
        with relay.raw() as fourth:
            if fourth.reply() == [str(r.GREETING).encode()]:
                break
        time.sleep(0.02)
    else:
        raise AssertionError("the freed sessions were never admitted again")
