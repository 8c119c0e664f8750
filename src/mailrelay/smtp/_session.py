"""SMTP session state: the spec's state table as an enum plus a transition table, the per-connection `Session`
and per-message `Envelope` the server fills in, and the hooks it calls out to (`EnvelopeHandler`, `SenderPolicy`,
`SmtpObserver`)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from mailrelay._routing import DEFAULT_ROUTE, Route, Router, parse_pattern
from mailrelay.smtp._replies import Reply


class SmtpState(enum.Enum):
    CONNECTED = "connected"  # before EHLO/HELO, and again right after a STARTTLS handshake
    GREETED = "greeted"
    MAIL_FROM = "mail_from"
    RCPT_TO = "rcpt_to"
    DATA = "data"


class Event(enum.Enum):
    HELLO = "hello"  # EHLO or HELO
    TLS_STARTED = "tls_started"
    SENDER_ACCEPTED = "sender_accepted"
    RECIPIENT_ACCEPTED = "recipient_accepted"
    RECIPIENT_UNKNOWN = "recipient_unknown"  # the accepted recipients are cleared
    DATA_STARTED = "data_started"
    DATA_FINISHED = "data_finished"  # accepted, refused or failed: the envelope is replaced
    RESET = "reset"


_S = SmtpState
_E = Event

TRANSITIONS: Mapping[tuple[SmtpState, Event], SmtpState] = {
    **{(state, _E.HELLO): _S.GREETED for state in _S if state is not _S.DATA},
    (_S.GREETED, _E.TLS_STARTED): _S.CONNECTED,
    (_S.GREETED, _E.SENDER_ACCEPTED): _S.MAIL_FROM,
    (_S.MAIL_FROM, _E.RECIPIENT_ACCEPTED): _S.RCPT_TO,
    (_S.RCPT_TO, _E.RECIPIENT_ACCEPTED): _S.RCPT_TO,
    (_S.MAIL_FROM, _E.RECIPIENT_UNKNOWN): _S.MAIL_FROM,
    (_S.RCPT_TO, _E.RECIPIENT_UNKNOWN): _S.MAIL_FROM,
    (_S.RCPT_TO, _E.DATA_STARTED): _S.DATA,
    (_S.DATA, _E.DATA_FINISHED): _S.GREETED,
    (_S.CONNECTED, _E.RESET): _S.CONNECTED,
    **{(state, _E.RESET): _S.GREETED for state in (_S.GREETED, _S.MAIL_FROM, _S.RCPT_TO)},
}
"""(state, event) -> next state. A pair that is missing is a bug in the server, not a client error."""

ALLOWED_STATES: Mapping[str, frozenset[SmtpState]] = {
    "STARTTLS": frozenset({_S.GREETED}),
    "MAIL": frozenset({_S.GREETED}),
    "RCPT": frozenset({_S.MAIL_FROM, _S.RCPT_TO}),
    "DATA": frozenset({_S.RCPT_TO}),
}
"""Verbs valid only in some states; elsewhere they get 503 Bad sequence of commands."""


def next_state(state: SmtpState, event: Event) -> SmtpState:
    """Look up a transition; KeyError for a pair the state table does not have."""
    return TRANSITIONS[(state, event)]


@dataclass(slots=True, kw_only=True)
class Envelope:
    """Per-message data, replaced after each DATA (and on RSET, EHLO, HELO and STARTTLS)."""

    mail_from: str | None = None
    mail_options: list[str] = field(default_factory=list)
    recipients: list[str] = field(default_factory=list)
    route: Route | None = None
    """The route of the accepted recipients (one per transaction: RCPTs of another route get 452)."""
    smtp_utf8: bool = False
    content: bytes | None = None


@dataclass(slots=True, kw_only=True)
class Session:
    """Per-connection data; kept across messages and across STARTTLS."""

    peer_ip: str
    peer_port: int = 0
    state: SmtpState = SmtpState.CONNECTED
    helo: str | None = None
    extended: bool = False
    tls: bool = False
    unknown_recipients: int = 0
    bad_commands: int = 0
    messages: int = 0
    envelope: Envelope = field(default_factory=Envelope)

    def apply(self, event: Event) -> SmtpState:
        self.state = next_state(self.state, event)
        return self.state

    def new_envelope(self) -> None:
        self.envelope = Envelope()


@dataclass(frozen=True, slots=True, kw_only=True)
class SmtpOptions:
    """Limits and targets every connection of one listener shares.

    `router` says which route each recipient takes (None: not accepted); without one, `targets` (exact addresses
    and patterns) make a single route.
    """

    max_message_size: int
    targets: frozenset[str] = frozenset()
    router: Router | None = None
    idle_timeout: float = 300.0
    max_concurrent_per_ip: int = 10
    max_sessions: int = 100
    max_unknown_recipients: int = 3

    def __post_init__(self) -> None:
        if self.router is None:
            patterns = tuple(parse_pattern(target) for target in sorted(self.targets))
            route = Route(name=DEFAULT_ROUTE, patterns=patterns, webhook_url="")
            object.__setattr__(self, "router", Router([route]))  # frozen: set once while it is made


class EnvelopeHandler(Protocol):
    """Where the SMTP layer hands off each complete message; the reply it returns ends DATA."""

    async def handle_envelope(self, envelope: Envelope, session: Session) -> Reply: ...


class SenderPolicy(Protocol):
    """Asked at MAIL FROM: None accepts the sender, a reply (e.g. 550 5.7.1 ...) refuses it.

    A seam for a later issue; with no policy configured every sender is accepted.
    """

    async def check_sender(self, *, peer_ip: str, helo: str, mail_from: str, tls: bool) -> Reply | None: ...


class SmtpObserver(Protocol):
    """Told of the replies the relay's metrics count (`mailrelay._metrics.RelayMetrics`); each call must be cheap and
    never raise.

    `session_refused`: the 421 a connection got for a session limit. `recipient_answered`: the reply to a RCPT TO
    naming an address (250 accepted, 550 unknown, 421 too many unknown). `message_answered`: the final reply to a
    message's data (after the final dot), whatever it is, told once decided (also when the client hung up before
    it could be sent).
    """

    def session_refused(self, reply: Reply) -> None: ...

    def recipient_answered(self, reply: Reply) -> None: ...

    def message_answered(self, reply: Reply) -> None: ...
