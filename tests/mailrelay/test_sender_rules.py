"""The sender rules' Cedar request: what the principal, resource and context hold for one message."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion_core import ConfigError
from mailrelay._dmarc import DmarcResult, DmarcVerdict
from mailrelay._sender_rules import MessageFacts, SenderRules

PASS = DmarcVerdict(result=DmarcResult.PASS, authenticated_from="ap@Partner.test", domain="partner.test")


def rules(tmp_path: Path, when: str) -> SenderRules:
    path = tmp_path / "policy.cedar"
    path.write_text(f'permit (principal, action == Action::"Receive", resource == Route::"billing") when {{ {when} }};')
    return SenderRules.load(path, variable="MAIL_RELAY_SENDER_POLICY_FILE")


def facts(**changes: object) -> MessageFacts:
    values: dict[str, object] = {
        "sender": "Bounce@Lists.test",
        "route": "billing",
        "client_ip": "192.0.2.7",
        "helo": "mx.lists.test",
        "size": 1234,
        "attachment_types": ["Application/PDF", "image/png", "application/pdf"],
        "verdict": PASS,
    }
    values.update(changes)
    return MessageFacts(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "condition",
    [
        pytest.param('principal.address == "bounce@lists.test" && principal.domain == "lists.test"', id="sender"),
        pytest.param('principal.aligned_domain == "partner.test" && context.dmarc == "pass"', id="aligned-domain"),
        pytest.param('context.spf == "none" && context.dkim == "none"', id="verdicts-not-yet-carried"),
        pytest.param('context.client_ip.isInRange(ip("192.0.2.0/24"))', id="client-ip"),
        pytest.param('context.helo == "mx.lists.test" && context.size == 1234', id="helo-and-size"),
        pytest.param(
            'context.attachment_types == ["application/pdf", "image/png"]', id="attachment-types-lower-case-set"
        ),
        pytest.param('resource.name == "billing"', id="resource"),
    ],
)
def test_request_carries(tmp_path: Path, condition: str) -> None:
    assert rules(tmp_path, condition).decide(facts()).allowed


def test_aligned_domain_is_empty_without_a_dmarc_pass(tmp_path: Path) -> None:
    failed = DmarcVerdict(result=DmarcResult.FAIL, domain="partner.test")
    policy = rules(tmp_path, 'principal.aligned_domain == "" && context.dmarc == "fail"')
    assert policy.decide(facts(verdict=failed)).allowed


def test_without_dmarc_every_verdict_reads_none(tmp_path: Path) -> None:
    policy = rules(tmp_path, 'context.dmarc == "none" && principal.aligned_domain == ""')
    assert policy.decide(facts(verdict=None)).allowed


def test_other_route_is_not_permitted(tmp_path: Path) -> None:
    decision = rules(tmp_path, "true").decide(facts(route="support"))
    assert (decision.allowed, decision.errors) == (False, ())


def test_unreadable_policy_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        SenderRules.load(tmp_path / "absent.cedar", variable="MAIL_RELAY_SENDER_POLICY_FILE")
    assert str(caught.value) == (
        f"MAIL_RELAY_SENDER_POLICY_FILE ({tmp_path}/absent.cedar): cannot read the file (No such file or directory)"
    )
