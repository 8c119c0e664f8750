"""DmarcChecker against a real DNS server: every result, alignment modes, the organizational-domain fallback, and
hostile input (broken DKIM signatures and keys, SPF loops, garbage DMARC records, DNS timeouts)."""

from __future__ import annotations

import base64
import os
import re

import dkim
import pytest

from mailrelay._dmarc import DmarcPolicy, DmarcResult, DmarcVerdict
from mailrelay._dns import DnsClient
from mailrelay._mailauth import MAX_DKIM_KEY_RECORD_BYTES, DmarcChecker
from mailrelay.testing import free_port
from tests.mailrelay.servers import DnsZone, rsa_key_pair

DNS_TIMEOUT = 0.5
CLIENT_IP = "192.0.2.10"
SPF_PASS = f"v=spf1 ip4:{CLIENT_IP} -all"


@pytest.fixture(scope="module")
def key() -> tuple[bytes, str]:
    return rsa_key_pair(1024)


@pytest.fixture(scope="module")
def checker(dns_zone: DnsZone) -> DmarcChecker:
    return DmarcChecker(dns=DnsClient(servers=[("127.0.0.1", dns_zone.port)], timeout=DNS_TIMEOUT))


def message(author: str, subject: str = "hello") -> bytes:
    return f"From: Al <{author}>\r\nTo: inbox@example.test\r\nSubject: {subject}\r\n\r\nbody\r\n".encode()


def signed(raw: bytes, key: tuple[bytes, str], *, domain: str, selector: str = "sel") -> bytes:
    header: bytes = dkim.sign(raw, selector.encode(), domain.encode(), key[0], include_headers=[b"from", b"subject"])
    return header + raw


async def check(
    checker: DmarcChecker, raw: bytes, *, mail_from: str = "", ip: str = CLIENT_IP, helo: str = "h.test"
) -> DmarcVerdict:
    return await checker.evaluate(raw=raw, peer_ip=ip, helo=helo, mail_from=mail_from)


async def test_aligned_dkim_passes_and_names_the_author(
    checker: DmarcChecker, dns_zone: DnsZone, key: tuple[bytes, str]
) -> None:
    dns_zone.txt("_dmarc.dkim-pass.test", "v=DMARC1; p=reject")
    dns_zone.txt("sel._domainkey.dkim-pass.test", key[1])
    raw = signed(message("al@dkim-pass.test"), key, domain="dkim-pass.test")
    assert await check(checker, raw, mail_from="bounce@elsewhere.test") == DmarcVerdict(
        result=DmarcResult.PASS,
        authenticated_from="al@dkim-pass.test",
        domain="dkim-pass.test",
        policy=DmarcPolicy.REJECT,
    )


async def test_aligned_spf_passes(checker: DmarcChecker, dns_zone: DnsZone) -> None:
    dns_zone.txt("_dmarc.spf-pass.test", "v=DMARC1; p=quarantine")
    dns_zone.txt("spf-pass.test", SPF_PASS)
    verdict = await check(checker, message("al@spf-pass.test"), mail_from="al@spf-pass.test")
    assert (verdict.result, verdict.authenticated_from) == (DmarcResult.PASS, "al@spf-pass.test")


async def test_authentication_of_another_domain_fails(
    checker: DmarcChecker, dns_zone: DnsZone, key: tuple[bytes, str]
) -> None:
    """SPF and DKIM both pass, but for a domain that is not the From domain: DMARC fails."""
    dns_zone.txt("_dmarc.victim.test", "v=DMARC1; p=reject")
    dns_zone.txt("attacker.test", SPF_PASS)
    dns_zone.txt("sel._domainkey.attacker.test", key[1])
    raw = signed(message("ceo@victim.test"), key, domain="attacker.test")
    assert await check(checker, raw, mail_from="x@attacker.test") == DmarcVerdict(
        result=DmarcResult.FAIL, domain="victim.test", policy=DmarcPolicy.REJECT
    )


async def test_spf_fail_without_dkim_fails(checker: DmarcChecker, dns_zone: DnsZone) -> None:
    dns_zone.txt("_dmarc.spf-fail.test", "v=DMARC1; p=none")
    dns_zone.txt("spf-fail.test", "v=spf1 ip4:198.51.100.1 -all")
    verdict = await check(checker, message("al@spf-fail.test"), mail_from="al@spf-fail.test")
    assert verdict == DmarcVerdict(result=DmarcResult.FAIL, domain="spf-fail.test", policy=DmarcPolicy.NONE)


async def test_no_record_is_none(checker: DmarcChecker, dns_zone: DnsZone) -> None:
    dns_zone.txt("no-dmarc.test", SPF_PASS)
    verdict = await check(checker, message("al@no-dmarc.test"), mail_from="al@no-dmarc.test")
    assert verdict == DmarcVerdict(result=DmarcResult.NONE, domain="no-dmarc.test")


async def test_policy_lookup_timeout_is_temperror(checker: DmarcChecker, dns_zone: DnsZone) -> None:
    dns_zone.slow.add("_dmarc.slow-dns.test")
    verdict = await check(checker, message("al@slow-dns.test"))
    assert verdict == DmarcVerdict(result=DmarcResult.TEMPERROR, domain="slow-dns.test")


async def test_policy_lookup_servfail_is_temperror(checker: DmarcChecker, dns_zone: DnsZone) -> None:
    dns_zone.servfail.add("_dmarc.servfail.test")
    assert (await check(checker, message("al@servfail.test"))).result is DmarcResult.TEMPERROR


async def test_unreachable_dns_server_is_temperror() -> None:
    lonely = DmarcChecker(dns=DnsClient(servers=[("127.0.0.1", free_port())], timeout=DNS_TIMEOUT))
    assert (await check(lonely, message("al@example.org"))).result is DmarcResult.TEMPERROR


@pytest.mark.parametrize(("adkim", "expected"), [("r", DmarcResult.PASS), ("s", DmarcResult.FAIL)])
async def test_dkim_alignment_relaxed_and_strict(
    checker: DmarcChecker, dns_zone: DnsZone, key: tuple[bytes, str], adkim: str, expected: DmarcResult
) -> None:
    """Signed by the parent domain, From a subdomain: aligned only under relaxed alignment."""
    domain = f"adkim-{adkim}.test"
    dns_zone.txt(f"_dmarc.mail.{domain}", f"v=DMARC1; p=reject; adkim={adkim}")
    dns_zone.txt(f"sel._domainkey.{domain}", key[1])
    raw = signed(message(f"al@mail.{domain}"), key, domain=domain)
    assert (await check(checker, raw)).result is expected


@pytest.mark.parametrize(("aspf", "expected"), [("r", DmarcResult.PASS), ("s", DmarcResult.FAIL)])
async def test_spf_alignment_relaxed_and_strict(
    checker: DmarcChecker, dns_zone: DnsZone, aspf: str, expected: DmarcResult
) -> None:
    """MAIL FROM a bounce subdomain that SPF authorizes, From the parent domain."""
    domain = f"aspf-{aspf}.test"
    dns_zone.txt(f"_dmarc.{domain}", f"v=DMARC1; p=reject; aspf={aspf}")
    dns_zone.txt(f"bounce.{domain}", SPF_PASS)
    verdict = await check(checker, message(f"al@{domain}"), mail_from=f"b@bounce.{domain}")
    assert verdict.result is expected
    assert verdict.authenticated_from == (f"al@{domain}" if expected is DmarcResult.PASS else None)


async def test_organizational_domain_fallback_applies_the_subdomain_policy(
    checker: DmarcChecker, dns_zone: DnsZone
) -> None:
    """No record at _dmarc.news.shop.co.uk: the one at the organizational domain (public suffix co.uk) applies."""
    dns_zone.txt("_dmarc.shop.co.uk", "v=DMARC1; p=none; sp=reject")
    sub = await check(checker, message("al@news.shop.co.uk"))
    assert sub == DmarcVerdict(result=DmarcResult.FAIL, domain="news.shop.co.uk", policy=DmarcPolicy.REJECT)
    top = await check(checker, message("al@shop.co.uk"))
    assert top == DmarcVerdict(result=DmarcResult.FAIL, domain="shop.co.uk", policy=DmarcPolicy.NONE)
    assert ("_dmarc.news.shop.co.uk", "TXT") in dns_zone.queries


async def test_null_sender_is_checked_with_the_helo_name(checker: DmarcChecker, dns_zone: DnsZone) -> None:
    dns_zone.txt("_dmarc.helo.test", "v=DMARC1; p=reject")
    dns_zone.txt("mx.helo.test", SPF_PASS)
    verdict = await check(checker, message("al@helo.test"), mail_from="", helo="mx.helo.test")
    assert verdict.result is DmarcResult.PASS


async def test_ipv4_mapped_client_address_is_checked_as_ipv4(checker: DmarcChecker, dns_zone: DnsZone) -> None:
    dns_zone.txt("_dmarc.mapped.test", "v=DMARC1; p=reject")
    dns_zone.txt("mapped.test", SPF_PASS)
    verdict = await check(checker, message("al@mapped.test"), mail_from="al@mapped.test", ip=f"::ffff:{CLIENT_IP}")
    assert verdict.result is DmarcResult.PASS


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(b"To: x@example.test\r\n", id="no-from"),
        pytest.param(b"From: a@single-from.test\r\nFrom: b@single-from.test\r\n", id="two-from-headers"),
        pytest.param(b"From: a@single-from.test, b@other.test\r\n", id="two-addresses"),
    ],
)
async def test_message_without_a_single_author_fails(checker: DmarcChecker, headers: bytes) -> None:
    assert await check(checker, headers + b"\r\nbody\r\n") == DmarcVerdict(result=DmarcResult.FAIL)


# ---- hostile DKIM signatures and keys


def tamper(signature: bytes, tag: str, value: bytes | None) -> bytes:
    """The DKIM-Signature header with one tag replaced (or removed when `value` is None)."""
    unfolded = re.sub(rb"\r\n[ \t]+", b" ", signature).rstrip(b"\r\n")
    name, _, tags = unfolded.partition(b":")
    parts = [p.strip() for p in tags.split(b";")]
    kept = [p for p in parts if p.split(b"=", 1)[0].strip() != tag.encode()]
    if value is not None:
        kept.append(tag.encode() + b"=" + value)
    return name + b": " + b"; ".join(kept) + b"\r\n"


@pytest.mark.parametrize(
    ("tag", "value"),
    [
        pytest.param("b", b"!!!not*base64!!!", id="bad-base64-signature"),
        pytest.param("bh", b"@@@", id="bad-base64-body-hash"),
        pytest.param("b", b"AAAA", id="short-signature"),
        pytest.param("d", None, id="missing-d"),
        pytest.param("s", None, id="missing-s"),
        pytest.param("bh", None, id="missing-bh"),
        pytest.param("b", None, id="missing-b"),
        pytest.param("h", None, id="missing-h"),
        pytest.param("a", b"rsa-md5", id="unknown-algorithm"),
        pytest.param("c", b"weird/odd", id="bad-canonicalization"),
        pytest.param("l", b"-5", id="negative-length"),
    ],
)
async def test_broken_dkim_signature_fails_and_a_good_one_beside_it_passes(
    checker: DmarcChecker, dns_zone: DnsZone, key: tuple[bytes, str], tag: str, value: bytes | None
) -> None:
    dns_zone.txt("_dmarc.broken-sig.test", "v=DMARC1; p=reject")
    dns_zone.txt("sel._domainkey.broken-sig.test", key[1])
    raw = message("al@broken-sig.test")
    good = dkim.sign(raw, b"sel", b"broken-sig.test", key[0], include_headers=[b"from", b"subject"])
    broken = tamper(good, tag, value)
    assert (await check(checker, broken + raw)).result is DmarcResult.FAIL
    assert (await check(checker, broken + good + raw)).result is DmarcResult.PASS


async def test_garbage_dkim_signature_header_fails(checker: DmarcChecker, dns_zone: DnsZone) -> None:
    dns_zone.txt("_dmarc.garbage-sig.test", "v=DMARC1; p=reject")
    for header in (
        b"DKIM-Signature: \x00\xff;;;==\r\n",
        b"DKIM-Signature:\r\n",
        b"DKIM-Signature: " + b"a=" * 5000 + b"\r\n",
    ):
        assert (await check(checker, header + message("al@garbage-sig.test"))).result is DmarcResult.FAIL


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(
            "v=DKIM1; k=rsa; p=" + base64.b64encode(os.urandom(MAX_DKIM_KEY_RECORD_BYTES)).decode(), id="huge"
        ),
        pytest.param("v=DKIM1; k=rsa; p=!!!notbase64", id="bad-base64"),
        pytest.param("v=DKIM1; k=rsa; p=" + base64.b64encode(b"not a key").decode(), id="not-a-key"),
        pytest.param("v=DKIM1; k=rsa; p=", id="revoked"),
        pytest.param("v=DKIM9; k=rsa; p=AAAA", id="bad-version"),
        pytest.param("v=DKIM1; k=dsa; p=AAAA", id="unknown-key-type"),
    ],
)
async def test_unusable_dkim_key_fails(
    checker: DmarcChecker, dns_zone: DnsZone, key: tuple[bytes, str], record: str
) -> None:
    dns_zone.txt("_dmarc.bad-key.test", "v=DMARC1; p=reject")
    dns_zone.txt("bad._domainkey.bad-key.test", record)
    raw = signed(message("al@bad-key.test"), key, domain="bad-key.test", selector="bad")
    assert (await check(checker, raw)).result is DmarcResult.FAIL


async def test_dkim_key_lookup_timeout_is_temperror(
    checker: DmarcChecker, dns_zone: DnsZone, key: tuple[bytes, str]
) -> None:
    dns_zone.txt("_dmarc.slow-key.test", "v=DMARC1; p=reject")
    dns_zone.slow.add("sel._domainkey.slow-key.test")
    raw = signed(message("al@slow-key.test"), key, domain="slow-key.test")
    assert (await check(checker, raw)).result is DmarcResult.TEMPERROR


# ---- hostile SPF records


async def test_spf_include_loop_fails(checker: DmarcChecker, dns_zone: DnsZone) -> None:
    dns_zone.txt("_dmarc.spf-loop.test", "v=DMARC1; p=reject")
    dns_zone.txt("spf-loop.test", "v=spf1 include:loop-b.spf-loop.test -all")
    dns_zone.txt("loop-b.spf-loop.test", "v=spf1 include:spf-loop.test -all")
    verdict = await check(checker, message("al@spf-loop.test"), mail_from="al@spf-loop.test")
    assert verdict.result is DmarcResult.FAIL


async def test_spf_with_more_than_ten_lookups_fails(checker: DmarcChecker, dns_zone: DnsZone) -> None:
    """The client is authorized by the 12th include: past RFC 7208's limit of 10 lookups, so a permerror."""
    dns_zone.txt("_dmarc.spf-many.test", "v=DMARC1; p=reject")
    dns_zone.txt("spf-many.test", "v=spf1 include:i0.spf-many.test -all")
    for n in range(12):
        dns_zone.txt(f"i{n}.spf-many.test", f"v=spf1 a:nothing{n}.spf-many.test include:i{n + 1}.spf-many.test -all")
    dns_zone.txt("i12.spf-many.test", SPF_PASS)
    for n in range(12):
        dns_zone.a(f"nothing{n}.spf-many.test", "198.51.100.1")
    verdict = await check(checker, message("al@spf-many.test"), mail_from="al@spf-many.test")
    assert verdict.result is DmarcResult.FAIL


async def test_spf_lookup_timeout_is_temperror(checker: DmarcChecker, dns_zone: DnsZone) -> None:
    dns_zone.txt("_dmarc.spf-slow.test", "v=DMARC1; p=reject")
    dns_zone.slow.add("spf-slow.test")
    verdict = await check(checker, message("al@spf-slow.test"), mail_from="al@spf-slow.test")
    assert verdict.result is DmarcResult.TEMPERROR


async def test_garbage_spf_record_fails(checker: DmarcChecker, dns_zone: DnsZone) -> None:
    dns_zone.txt("_dmarc.spf-garbage.test", "v=DMARC1; p=reject")
    dns_zone.txt("spf-garbage.test", "v=spf1 ip4:999.1.1.1 %{zzz} include: -all", "v=spf1 +all")
    verdict = await check(checker, message("al@spf-garbage.test"), mail_from="al@spf-garbage.test")
    assert verdict.result is DmarcResult.FAIL


# ---- hostile DMARC records


async def test_dmarc_record_with_garbage_tags_still_applies(checker: DmarcChecker, dns_zone: DnsZone) -> None:
    dns_zone.txt("_dmarc.garbage-tags.test", "v=DMARC1; p=reject; adkim=zz; pct=lots; foo=bar; ;;=")
    verdict = await check(checker, message("al@garbage-tags.test"))
    assert verdict == DmarcVerdict(result=DmarcResult.FAIL, domain="garbage-tags.test", policy=DmarcPolicy.REJECT)


@pytest.mark.parametrize(
    ("name", "records"),
    [
        ("bad-p", ("v=DMARC1; p=bogus",)),
        ("two-records", ("v=DMARC1; p=reject", "v=DMARC1; p=none")),
        ("bad-version", ("v=DMARC3; p=reject",)),
        ("binary-garbage", ("\x7f" * 600,)),
    ],
)
async def test_unusable_dmarc_records_mean_none(
    checker: DmarcChecker, dns_zone: DnsZone, name: str, records: tuple[str, ...]
) -> None:
    domain = f"{name}.unusable.test"
    dns_zone.txt(f"_dmarc.{domain}", *records)
    assert (await check(checker, message(f"al@{domain}"))).result is DmarcResult.NONE


# ---- SPF and DKIM verdicts for payload v2 (report=True)


@pytest.fixture(scope="module")
def reporter(dns_zone: DnsZone) -> DmarcChecker:
    return DmarcChecker(dns=DnsClient(servers=[("127.0.0.1", dns_zone.port)], timeout=DNS_TIMEOUT), report=True)


async def test_report_gives_spf_after_an_aligned_dkim_pass(
    reporter: DmarcChecker, dns_zone: DnsZone, key: tuple[bytes, str]
) -> None:
    dns_zone.txt("_dmarc.both.test", "v=DMARC1; p=reject")
    dns_zone.txt("sel._domainkey.both.test", key[1])
    dns_zone.txt("both.test", "v=spf1 -all")
    raw = signed(message("al@both.test"), key, domain="both.test")
    verdict = await check(reporter, raw, mail_from="al@both.test")
    assert (verdict.result, verdict.spf, verdict.dkim) == (DmarcResult.PASS, "fail", "pass")


async def test_report_without_a_dmarc_record(reporter: DmarcChecker, dns_zone: DnsZone) -> None:
    dns_zone.txt("no-policy-spf.test", SPF_PASS)
    verdict = await check(reporter, message("al@no-policy-spf.test"), mail_from="al@no-policy-spf.test")
    assert (verdict.result, verdict.spf, verdict.dkim) == (DmarcResult.NONE, "pass", "none")


async def test_report_of_a_broken_signature_is_dkim_fail(
    reporter: DmarcChecker, dns_zone: DnsZone, key: tuple[bytes, str]
) -> None:
    dns_zone.txt("_dmarc.broken-sig.test", "v=DMARC1; p=none")
    dns_zone.txt("sel._domainkey.broken-sig.test", key[1])
    raw = signed(message("al@broken-sig.test"), key, domain="broken-sig.test").replace(b"hello", b"hullo")
    verdict = await check(reporter, raw, mail_from="al@broken-sig.test")
    assert (verdict.result, verdict.spf, verdict.dkim) == (DmarcResult.FAIL, "none", "fail")


async def test_report_without_an_author(reporter: DmarcChecker, dns_zone: DnsZone) -> None:
    dns_zone.txt("anonymous.test", SPF_PASS)
    raw = b"Subject: no From\r\n\r\nbody\r\n"
    verdict = await check(reporter, raw, mail_from="x@anonymous.test")
    assert (verdict.result, verdict.spf, verdict.dkim) == (DmarcResult.FAIL, "pass", "none")


async def test_verdicts_are_not_reported_without_report(checker: DmarcChecker, dns_zone: DnsZone) -> None:
    dns_zone.txt("_dmarc.quiet.test", "v=DMARC1; p=none")
    dns_zone.txt("quiet.test", SPF_PASS)
    verdict = await check(checker, message("al@quiet.test"), mail_from="al@quiet.test")
    assert (verdict.result, verdict.spf, verdict.dkim) == (DmarcResult.PASS, None, None)
