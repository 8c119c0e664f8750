"""Reply constants and the EHLO reply layout."""

from __future__ import annotations

from mailrelay.smtp import _replies as r


def test_spec_texts() -> None:
    assert str(r.GREETING) == "220 MailRelay SMTP Server Ready"
    assert str(r.HELO_OK) == "250 MailRelay"
    assert str(r.STARTTLS_GO_AHEAD) == "220 Go ahead"
    assert str(r.BAD_SEQUENCE) == "503 Bad sequence of commands"
    assert str(r.STARTTLS_ALREADY_ACTIVE) == "503 STARTTLS already active"
    assert str(r.MAIL_FROM_SYNTAX) == "501 Syntax error in MAIL FROM parameters"
    assert str(r.OK) == "250 OK"
    assert str(r.NO_SUCH_USER) == "550 No such user here"
    assert str(r.START_MAIL_INPUT) == "354 Start mail input; end with <CRLF>.<CRLF>"
    assert str(r.MESSAGE_ACCEPTED) == "250 OK: Message accepted for delivery"
    assert str(r.BYE) == "221 Bye"
    assert str(r.MESSAGE_TOO_LARGE) == "552 5.3.4 Message size exceeds fixed limit"


def test_failure_helpers() -> None:
    assert str(r.temporary_failure("down")) == "451 4.3.0 down"
    assert str(r.permanent_failure("no")) == "554 5.6.0 no"
    assert r.OK.line() == b"250 OK\r\n"


def test_ehlo_lines_with_starttls_last() -> None:
    assert r.ehlo_lines(domain="mx", size_limit=100, offer_starttls=True) == [
        "250-MailRelay greets mx",
        "250-SIZE 100",
        "250-8BITMIME",
        "250-PIPELINING",
        "250-SMTPUTF8",
        "250 STARTTLS",
    ]


def test_ehlo_lines_without_starttls() -> None:
    assert r.ehlo_lines(domain="mx", size_limit=100, offer_starttls=False)[-1] == "250 SMTPUTF8"
