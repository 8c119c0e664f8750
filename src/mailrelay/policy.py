"""Sender-policy seam: a hook asked at MAIL FROM that may refuse the sender with its own reply.

The policy itself comes in a later issue; with no policy configured every sender is accepted.
"""

from __future__ import annotations

from typing import Protocol

from mailrelay.smtp.replies import Reply


class SenderPolicy(Protocol):
    """Returns None to accept the sender, or the reply that refuses it (e.g. 550 5.7.1 ...)."""

    async def check_sender(self, *, peer_ip: str, helo: str, mail_from: str, tls: bool) -> Reply | None: ...
