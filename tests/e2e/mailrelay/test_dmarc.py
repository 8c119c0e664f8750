"""DMARC through the real `mailrelay` process, against a real DNS server and DKIM signatures made here."""

from __future__ import annotations

import json
import smtplib
from collections.abc import Callable
from typing import Any

import dkim
import pytest

from mailrelay.smtp import _replies as r
from mailrelay.testing import WebhookReceiver
from tests.e2e.mailrelay.support import TARGET, RelayProcess
from tests.mailrelay.servers import DnsZone, rsa_key_pair

SPF_LOOPBACK = "v=spf1 ip4:127.0.0.1 -all"  # the relay sees the test client as 127.0.0.1
SPF_ELSEWHERE = "v=spf1 ip4:192.0.2.1 -all"
BASE_FIELDS = {"sender", "sender_name", "recipient", "subject", "body"}


@pytest.fixture(scope="module")
def key() -> tuple[bytes, str]:
    return rsa_key_pair(1024)


def dmarc_relay(start: Callable[..., RelayProcess], url: str, zone: DnsZone, mode: str) -> RelayProcess:
    return start(WEBHOOK_URL=url, DMARC_MODE=mode, DNS_SERVERS=f"127.0.0.1:{zone.port}", DNS_TIMEOUT="0.5")


@pytest.fixture(scope="module")
def monitor(start_relay: Callable[..., RelayProcess], receiver: WebhookReceiver, dns_zone: DnsZone) -> RelayProcess:
    return dmarc_relay(start_relay, receiver.url, dns_zone, "monitor")


@pytest.fixture(scope="module")
def enforce(start_relay: Callable[..., RelayProcess], receiver: WebhookReceiver, dns_zone: DnsZone) -> RelayProcess:
    return dmarc_relay(start_relay, receiver.url, dns_zone, "enforce")


def message(author: str, key: tuple[bytes, str] | None = None, *, signer: str | None = None) -> bytes:
    raw = f"From: Al <{author}>\r\nTo: {TARGET}\r\nSubject: dmarc\r\n\r\nbody\r\n".encode()
    if key is None:
        return raw
    domain = signer or author.split("@")[1]
    header: bytes = dkim.sign(raw, b"sel", domain.encode(), key[0], include_headers=[b"from", b"subject", b"to"])
    return header + raw


def send(relay: RelayProcess, raw: bytes, *, mail_from: str) -> None:
    with relay.smtp() as smtp:
        assert smtp.sendmail(mail_from, [TARGET], raw) == {}


def refused(relay: RelayProcess, raw: bytes, *, mail_from: str) -> tuple[int, str]:
    with relay.smtp() as smtp, pytest.raises(smtplib.SMTPDataError) as caught:
        smtp.sendmail(mail_from, [TARGET], raw)
    return caught.value.smtp_code, caught.value.smtp_error.decode()


def posted(webhook: WebhookReceiver) -> dict[str, Any]:
    (request,) = webhook.wait_for(1)
    payload: dict[str, Any] = json.loads(request.body)
    return payload


# ---- monitor mode: every result is reported, nothing is refused


def test_pass_reports_the_authenticated_from(
    monitor: RelayProcess, webhook: WebhookReceiver, dns_zone: DnsZone, key: tuple[bytes, str]
) -> None:
    dns_zone.txt("_dmarc.m-pass.test", "v=DMARC1; p=reject")
    dns_zone.txt("sel._domainkey.m-pass.test", key[1])
    send(monitor, message("al@m-pass.test", key), mail_from="bounce@unrelated.test")
    payload = posted(webhook)
    assert set(payload) == BASE_FIELDS | {"dmarc_result", "authenticated_from"}
    assert (payload["dmarc_result"], payload["authenticated_from"]) == ("pass", "al@m-pass.test")


def test_spf_pass_alone_is_enough(monitor: RelayProcess, webhook: WebhookReceiver, dns_zone: DnsZone) -> None:
    dns_zone.txt("_dmarc.m-spf.test", "v=DMARC1; p=reject")
    dns_zone.txt("m-spf.test", SPF_LOOPBACK)
    send(monitor, message("al@m-spf.test"), mail_from="al@m-spf.test")
    payload = posted(webhook)
    assert (payload["dmarc_result"], payload["authenticated_from"]) == ("pass", "al@m-spf.test")


def test_fail_has_no_authenticated_from(monitor: RelayProcess, webhook: WebhookReceiver, dns_zone: DnsZone) -> None:
    dns_zone.txt("_dmarc.m-fail.test", "v=DMARC1; p=reject")
    dns_zone.txt("m-fail.test", SPF_ELSEWHERE)
    send(monitor, message("al@m-fail.test"), mail_from="al@m-fail.test")
    payload = posted(webhook)
    assert set(payload) == BASE_FIELDS | {"dmarc_result"}
    assert payload["dmarc_result"] == "fail"


def test_no_record_is_none(monitor: RelayProcess, webhook: WebhookReceiver, dns_zone: DnsZone) -> None:
    dns_zone.txt("m-none.test", SPF_LOOPBACK)
    send(monitor, message("al@m-none.test"), mail_from="al@m-none.test")
    payload = posted(webhook)
    assert set(payload) == BASE_FIELDS | {"dmarc_result"}
    assert payload["dmarc_result"] == "none"


def test_dns_timeout_is_temperror_and_still_posted(
    monitor: RelayProcess, webhook: WebhookReceiver, dns_zone: DnsZone
) -> None:
    dns_zone.slow.add("_dmarc.m-slow.test")
    send(monitor, message("al@m-slow.test"), mail_from="al@m-slow.test")
    payload = posted(webhook)
    assert set(payload) == BASE_FIELDS | {"dmarc_result"}
    assert payload["dmarc_result"] == "temperror"


@pytest.mark.parametrize(("adkim", "result"), [("r", "pass"), ("s", "fail")])
def test_relaxed_and_strict_alignment(
    monitor: RelayProcess,
    webhook: WebhookReceiver,
    dns_zone: DnsZone,
    key: tuple[bytes, str],
    adkim: str,
    result: str,
) -> None:
    """DKIM signed by the organizational domain, From a subdomain."""
    domain = f"m-align-{adkim}.test"
    dns_zone.txt(f"_dmarc.news.{domain}", f"v=DMARC1; p=reject; adkim={adkim}")
    dns_zone.txt(f"sel._domainkey.{domain}", key[1])
    send(monitor, message(f"al@news.{domain}", key, signer=domain), mail_from="b@unrelated.test")
    payload = posted(webhook)
    assert payload["dmarc_result"] == result
    assert payload.get("authenticated_from") == (f"al@news.{domain}" if result == "pass" else None)


def test_organizational_domain_fallback(monitor: RelayProcess, webhook: WebhookReceiver, dns_zone: DnsZone) -> None:
    """No record at the subdomain: the organizational domain's (below the public suffix co.uk) applies."""
    dns_zone.txt("_dmarc.m-org.co.uk", "v=DMARC1; p=none; sp=reject")
    dns_zone.txt("mail.m-org.co.uk", SPF_LOOPBACK)
    send(monitor, message("al@shop.m-org.co.uk"), mail_from="x@mail.m-org.co.uk")
    payload = posted(webhook)
    assert (payload["dmarc_result"], payload["authenticated_from"]) == ("pass", "al@shop.m-org.co.uk")


def test_off_mode_sends_neither_field(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    send(relay, message("al@example.org"), mail_from="al@example.org")
    assert set(posted(webhook)) == BASE_FIELDS


# ---- enforce mode: the domain's policy decides


def test_reject_policy_gives_550_and_nothing_is_posted(
    enforce: RelayProcess, webhook: WebhookReceiver, dns_zone: DnsZone
) -> None:
    dns_zone.txt("_dmarc.e-reject.test", "v=DMARC1; p=reject")
    dns_zone.txt("e-reject.test", SPF_ELSEWHERE)
    reply = refused(enforce, message("ceo@e-reject.test"), mail_from="ceo@e-reject.test")
    assert reply == (550, "5.7.1 Message rejected: unauthenticated mail from e-reject.test (DMARC policy)")
    assert reply == (r.dmarc_rejected("e-reject.test").code, r.dmarc_rejected("e-reject.test").text)
    assert webhook.requests == []
    assert enforce.events("message_refused")[-1]["dmarc_result"] == "fail"


def test_temperror_gives_451_so_the_sender_retries(
    enforce: RelayProcess, webhook: WebhookReceiver, dns_zone: DnsZone
) -> None:
    dns_zone.servfail.add("_dmarc.e-temp.test")
    reply = refused(enforce, message("al@e-temp.test"), mail_from="al@e-temp.test")
    assert reply == (451, "4.7.0 DMARC check failed temporarily (DNS), try again later")
    assert webhook.requests == []


def test_quarantine_policy_is_posted_with_the_failure(
    enforce: RelayProcess, webhook: WebhookReceiver, dns_zone: DnsZone
) -> None:
    dns_zone.txt("_dmarc.e-quarantine.test", "v=DMARC1; p=quarantine")
    send(enforce, message("al@e-quarantine.test"), mail_from="al@e-quarantine.test")
    payload = posted(webhook)
    assert (payload["dmarc_result"], "authenticated_from" in payload) == ("fail", False)


def test_none_policy_is_posted(enforce: RelayProcess, webhook: WebhookReceiver, dns_zone: DnsZone) -> None:
    dns_zone.txt("_dmarc.e-nopolicy.test", "v=DMARC1; p=none")
    send(enforce, message("al@e-nopolicy.test"), mail_from="al@e-nopolicy.test")
    assert posted(webhook)["dmarc_result"] == "fail"


def test_pct_zero_downgrades_reject_to_quarantine(
    enforce: RelayProcess, webhook: WebhookReceiver, dns_zone: DnsZone
) -> None:
    dns_zone.txt("_dmarc.e-pct.test", "v=DMARC1; p=reject; pct=0")
    send(enforce, message("al@e-pct.test"), mail_from="al@e-pct.test")
    assert posted(webhook)["dmarc_result"] == "fail"


def test_pass_is_posted(
    enforce: RelayProcess, webhook: WebhookReceiver, dns_zone: DnsZone, key: tuple[bytes, str]
) -> None:
    dns_zone.txt("_dmarc.e-pass.test", "v=DMARC1; p=reject; adkim=s; aspf=s")
    dns_zone.txt("sel._domainkey.e-pass.test", key[1])
    send(enforce, message("al@e-pass.test", key), mail_from="al@e-pass.test")
    payload = posted(webhook)
    assert (payload["dmarc_result"], payload["authenticated_from"]) == ("pass", "al@e-pass.test")


def test_no_record_is_posted_as_none(enforce: RelayProcess, webhook: WebhookReceiver) -> None:
    send(enforce, message("al@e-none.test"), mail_from="al@e-none.test")
    assert posted(webhook)["dmarc_result"] == "none"


def test_message_without_a_from_address_gets_550(enforce: RelayProcess, webhook: WebhookReceiver) -> None:
    raw = f"To: {TARGET}\r\nSubject: anonymous\r\n\r\nbody\r\n".encode()
    assert refused(enforce, raw, mail_from="al@example.org") == (
        550,
        "5.7.1 Message rejected: DMARC needs exactly one From address",
    )
    assert webhook.requests == []
