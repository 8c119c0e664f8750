"""DMARC seam: the evaluator interface the relay calls when a DMARC mode is configured.

DMARC evaluation itself (dkimpy, pyspf, dnspython) arrives in a later issue; until then no
evaluator is configured and the payload never carries dmarc_result.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class DmarcResult(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    NONE = "none"
    TEMPERROR = "temperror"


@dataclass(frozen=True, slots=True, kw_only=True)
class DmarcVerdict:
    """What the payload reports: the result and, only on pass, the aligned From address."""

    result: DmarcResult
    authenticated_from: str | None = None


class DmarcEvaluator(Protocol):
    """Evaluates one accepted message; `peer_ip` is the SMTP client, `mail_from` the envelope sender."""

    async def evaluate(self, *, raw: bytes, peer_ip: str, helo: str, mail_from: str) -> DmarcVerdict: ...
