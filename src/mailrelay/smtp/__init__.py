"""The SMTP side of the relay: session state machine, reply texts and the aiosmtpd-based server."""

from __future__ import annotations

from mailrelay.smtp.protocol import RelaySMTP
from mailrelay.smtp.replies import Reply
from mailrelay.smtp.server import SmtpServer
from mailrelay.smtp.session import Envelope, EnvelopeHandler, Session, SmtpOptions, SmtpState

__all__ = [
    "Envelope",
    "EnvelopeHandler",
    "RelaySMTP",
    "Reply",
    "Session",
    "SmtpOptions",
    "SmtpServer",
    "SmtpState",
]
