"""The SMTP side of the relay: session state machine, reply texts and the asyncio/aiosmtpd-based server."""

from __future__ import annotations

from mailrelay.smtp._protocol import RelaySMTP
from mailrelay.smtp._replies import Reply
from mailrelay.smtp._server import SmtpServer
from mailrelay.smtp._session import (
    Envelope,
    EnvelopeHandler,
    SenderPolicy,
    Session,
    SmtpOptions,
    SmtpState,
)

__all__ = [
    "Envelope",
    "EnvelopeHandler",
    "RelaySMTP",
    "Reply",
    "SenderPolicy",
    "Session",
    "SmtpOptions",
    "SmtpServer",
    "SmtpState",
]
