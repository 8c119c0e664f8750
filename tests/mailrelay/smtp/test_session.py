"""The state table: transitions read like the spec's rows."""

from __future__ import annotations

import pytest

from mailrelay.smtp._session import ALLOWED_STATES, Event, Session, SmtpState, next_state

S = SmtpState


@pytest.mark.parametrize(
    ("state", "event", "expected"),
    [
        pytest.param(S.CONNECTED, Event.HELLO, S.GREETED, id="ehlo-helo"),
        pytest.param(S.GREETED, Event.TLS_STARTED, S.CONNECTED, id="starttls-needs-new-ehlo"),
        pytest.param(S.GREETED, Event.SENDER_ACCEPTED, S.MAIL_FROM, id="mail-from"),
        pytest.param(S.MAIL_FROM, Event.RECIPIENT_ACCEPTED, S.RCPT_TO, id="rcpt-known"),
        pytest.param(S.RCPT_TO, Event.RECIPIENT_ACCEPTED, S.RCPT_TO, id="rcpt-another"),
        pytest.param(S.RCPT_TO, Event.RECIPIENT_UNKNOWN, S.MAIL_FROM, id="rcpt-unknown-clears"),
        pytest.param(S.RCPT_TO, Event.DATA_STARTED, S.DATA, id="data"),
        pytest.param(S.DATA, Event.DATA_FINISHED, S.GREETED, id="dot"),
        pytest.param(S.RCPT_TO, Event.RESET, S.GREETED, id="rset"),
        pytest.param(S.CONNECTED, Event.RESET, S.CONNECTED, id="rset-before-ehlo"),
        pytest.param(S.MAIL_FROM, Event.HELLO, S.GREETED, id="ehlo-mid-transaction"),
    ],
)
def test_transitions(state: SmtpState, event: Event, expected: SmtpState) -> None:
    assert next_state(state, event) is expected


@pytest.mark.parametrize(
    ("state", "event"),
    [(S.CONNECTED, Event.SENDER_ACCEPTED), (S.GREETED, Event.DATA_STARTED), (S.DATA, Event.HELLO)],
)
def test_missing_pairs_are_errors(state: SmtpState, event: Event) -> None:
    with pytest.raises(KeyError):
        next_state(state, event)


def test_verbs_are_limited_to_their_states() -> None:
    assert ALLOWED_STATES["MAIL"] == {S.GREETED}
    assert ALLOWED_STATES["RCPT"] == {S.MAIL_FROM, S.RCPT_TO}
    assert ALLOWED_STATES["DATA"] == {S.RCPT_TO}
    assert ALLOWED_STATES["STARTTLS"] == {S.GREETED}


def test_session_apply_and_new_envelope() -> None:
    session = Session(peer_ip="127.0.0.1")
    session.apply(Event.HELLO)
    session.envelope.mail_from = "a@x"
    session.new_envelope()
    assert session.state is S.GREETED
    assert session.envelope.mail_from is None
