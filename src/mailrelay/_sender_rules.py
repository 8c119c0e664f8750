"""Sender rules: an optional Cedar policy (MAIL_RELAY_SENDER_POLICY_FILE) that decides per accepted message whether
its route receives it. The request (docs/mailrelay.md "Sender rules"):

- principal `Sender::"<envelope sender>"` with `address`, `domain` and `aligned_domain` (the DMARC-aligned From
  domain on a DMARC pass, else "");
- action `Action::"Receive"`;
- resource `Route::"<route name>"` with `name`;
- context `dmarc`, `spf`, `dkim` (verdicts; "none" when not evaluated), `client_ip` (an ipaddr value), `helo`,
  `size` (bytes), `attachment_types` (set of MIME types, lower case).

Cedar comes from the shared core (`bastion_core._cedar`, the `mailrelay[policy]` extra). A Deny, or an evaluation
error (fail closed), answers `550 5.7.1 <MAIL_RELAY_SENDER_POLICY_DENY_TEXT>`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mailrelay._dmarc import DmarcResult, DmarcVerdict

if TYPE_CHECKING:  # cedarpy (the policy extra) is imported only when a policy is configured
    from bastion_core._cedar import CedarDecision, CedarPolicies

ACTION = "Receive"
PRINCIPAL_TYPE = "Sender"
RESOURCE_TYPE = "Route"
NOT_EVALUATED = "none"
MAX_ATTACHMENT_TYPES = 100  # distinct types put into the context (the attachment policy bounds the count too)


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageFacts:
    """What the policy sees of one message."""

    sender: str
    route: str
    client_ip: str
    helo: str
    size: int
    attachment_types: Iterable[str]
    verdict: DmarcVerdict | None


class SenderRules:
    """The parsed policy and its decisions; `decide(facts)` never raises."""

    def __init__(self, policies: CedarPolicies) -> None:
        self.policies = policies

    @classmethod
    def load(cls, path: Path, *, variable: str) -> SenderRules:
        """ConfigError naming `variable` and the file when it cannot be read or parsed."""
        from bastion_core._cedar import load_cedar_policies

        return cls(load_cedar_policies(path, origin=f"{variable} ({path})"))

    def decide(self, facts: MessageFacts) -> CedarDecision:
        from bastion_core._cedar import cedar_decide

        sender = facts.sender.lower()
        domain = sender.rpartition("@")[2]
        verdict = facts.verdict
        aligned = ""
        if verdict is not None and verdict.result is DmarcResult.PASS and verdict.authenticated_from:
            aligned = verdict.authenticated_from.rpartition("@")[2].lower()
        return cedar_decide(
            self.policies,
            principal=(PRINCIPAL_TYPE, sender, {"address": sender, "domain": domain, "aligned_domain": aligned}),
            action=ACTION,
            resource=(RESOURCE_TYPE, facts.route, {"name": facts.route}),
            context={
                **verdicts(verdict),
                "client_ip": _ip(facts.client_ip),
                "helo": facts.helo,
                "size": facts.size,
                "attachment_types": sorted({t.lower() for t in facts.attachment_types})[:MAX_ATTACHMENT_TYPES],
            },
        )


def verdicts(verdict: DmarcVerdict | None) -> dict[str, str]:
    """`dmarc`, `spf` and `dkim` as text. SPF and DKIM come from the verdict when it carries them (`spf`, `dkim`
    attributes, added by payload v2); until then they read "none"."""
    if verdict is None:
        return {"dmarc": NOT_EVALUATED, "spf": NOT_EVALUATED, "dkim": NOT_EVALUATED}
    return {
        "dmarc": verdict.result.value,
        "spf": _text(getattr(verdict, "spf", None)),
        "dkim": _text(getattr(verdict, "dkim", None)),
    }


def _text(value: object) -> str:
    if value is None:
        return NOT_EVALUATED
    return str(getattr(value, "value", value))


def _ip(text: str) -> dict[str, Any]:
    """Cedar's ipaddr extension value; 0.0.0.0 for a peer that is not an IP (a Unix socket in tests)."""
    try:
        address = str(ipaddress.ip_address(text))
    except ValueError:
        address = "0.0.0.0"
    return {"__extn": {"fn": "ip", "arg": address}}
