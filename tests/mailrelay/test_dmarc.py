"""DMARC without I/O: records (garbage included), the From author, organizational domains, alignment, enforcement."""

from __future__ import annotations

import pytest

from mailrelay._dmarc import (
    Alignment,
    Author,
    DmarcPolicy,
    DmarcRecord,
    DmarcResult,
    DmarcVerdict,
    Enforcement,
    OrganizationalDomains,
    ascii_domain_of,
    author_of,
    choose_record,
    enforcement,
    parse_record,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("v=DMARC1; p=reject", DmarcRecord(policy=DmarcPolicy.REJECT)),
        (
            "v=DMARC1;p=Quarantine;sp=none;adkim=s;aspf=S;pct=25;rua=mailto:d@example.org",
            DmarcRecord(
                policy=DmarcPolicy.QUARANTINE,
                subdomain_policy=DmarcPolicy.NONE,
                adkim=Alignment.STRICT,
                aspf=Alignment.STRICT,
                pct=25,
            ),
        ),
        pytest.param(
            "v=DMARC1; p=reject; adkim=banana; aspf=; pct=abc; sp=maybe; foo=bar; ==; ;x",
            DmarcRecord(policy=DmarcPolicy.REJECT),
            id="garbage-tags-take-defaults",
        ),
        pytest.param("v=DMARC1; p=reject; pct=250", DmarcRecord(policy=DmarcPolicy.REJECT), id="pct-out-of-range"),
        pytest.param("v=DMARC1; p=none; p=reject", DmarcRecord(policy=DmarcPolicy.NONE), id="first-tag-wins"),
        pytest.param(
            "v=DMARC1; p=bogus; rua=mailto:r@example.org", DmarcRecord(policy=DmarcPolicy.NONE), id="bad-p-rua"
        ),
        pytest.param("v=DMARC1; p=bogus", None, id="bad-p-no-rua"),
        pytest.param("v=DMARC1; adkim=s", None, id="no-p"),
        pytest.param("v=DMARC2; p=reject", None, id="wrong-version"),
        pytest.param("p=reject; v=DMARC1", None, id="version-not-first"),
        pytest.param("v=spf1 -all", None, id="spf-record"),
        pytest.param("", None, id="empty"),
        pytest.param("\x00\xff garbage", None, id="binary"),
    ],
)
def test_parse_record(text: str, expected: DmarcRecord | None) -> None:
    assert parse_record(text) == expected


def test_exactly_one_dmarc_record_counts() -> None:
    assert choose_record(["v=spf1 -all", "v=DMARC1; p=reject"]) == DmarcRecord(policy=DmarcPolicy.REJECT)
    assert choose_record(["v=DMARC1; p=reject", "v=DMARC1; p=none"]) is None
    assert choose_record([]) is None


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (b"From: Al <al@Example.ORG>\r\n", Author(address="al@example.org", domain="example.org")),
        (b"From: al@mail.example.org.\r\n", Author(address="al@mail.example.org", domain="mail.example.org")),
        (
            b"From: =?utf-8?q?J=C3=B6rg?= <j@b\xc3\xbccher.example>\r\n",
            Author(address="j@bücher.example", domain="xn--bcher-kva.example"),
        ),
        (b"Subject: no from\r\n", None),
        (b"From: a@example.org\r\nFrom: b@example.net\r\n", None),
        (b"From: a@example.org, b@example.net\r\n", None),
        (b"From: undisclosed\r\n", None),
        (b"From: a@b@example.org\r\n", None),
        (b"From: a@localhost\r\n", None),
    ],
)
def test_author_of(headers: bytes, expected: Author | None) -> None:
    assert author_of(headers + b"\r\nbody\r\n") == expected


def test_ascii_domain_of() -> None:
    assert ascii_domain_of("Example.ORG.") == "example.org"
    assert ascii_domain_of("münchen.example") == "xn--mnchen-3ya.example"
    assert ascii_domain_of("-bad-.example") is None
    assert ascii_domain_of("a" * 64 + ".example") is None


@pytest.fixture(scope="module")
def organizational() -> OrganizationalDomains:
    return OrganizationalDomains()


@pytest.mark.parametrize(
    ("domain", "expected"),
    [
        ("example.org", "example.org"),
        ("a.b.mail.example.org", "example.org"),
        ("mail.example.co.uk", "example.co.uk"),
        ("project.github.io", "project.github.io"),
        ("x.y.unknowntld", "y.unknowntld"),
    ],
)
def test_organizational_domain_from_the_bundled_list(
    organizational: OrganizationalDomains, domain: str, expected: str
) -> None:
    assert organizational(domain) == expected


def test_alignment(organizational: OrganizationalDomains) -> None:
    assert organizational.aligned("mail.example.org", "example.org", Alignment.RELAXED)
    assert organizational.aligned("Example.org.", "example.org", Alignment.STRICT)
    assert not organizational.aligned("mail.example.org", "example.org", Alignment.STRICT)
    assert not organizational.aligned("example.net", "example.org", Alignment.RELAXED)
    assert not organizational.aligned("a.co.uk", "b.co.uk", Alignment.RELAXED)
    assert not organizational.aligned("evil.github.io", "project.github.io", Alignment.RELAXED)


FAILING = DmarcVerdict(result=DmarcResult.FAIL, domain="example.org", policy=DmarcPolicy.REJECT)


@pytest.mark.parametrize(
    ("verdict", "expected"),
    [
        (FAILING, Enforcement.REJECT),
        (
            DmarcVerdict(result=DmarcResult.FAIL, domain="example.org", policy=DmarcPolicy.QUARANTINE),
            Enforcement.ACCEPT,
        ),
        (DmarcVerdict(result=DmarcResult.FAIL, domain="example.org", policy=DmarcPolicy.NONE), Enforcement.ACCEPT),
        (DmarcVerdict(result=DmarcResult.FAIL), Enforcement.REJECT),
        (DmarcVerdict(result=DmarcResult.TEMPERROR, domain="example.org"), Enforcement.DEFER),
        (DmarcVerdict(result=DmarcResult.NONE, domain="example.org"), Enforcement.ACCEPT),
        (DmarcVerdict(result=DmarcResult.PASS, domain="example.org", policy=DmarcPolicy.REJECT), Enforcement.ACCEPT),
    ],
)
def test_enforcement(verdict: DmarcVerdict, expected: Enforcement) -> None:
    assert enforcement(verdict, sample=0.5) is expected


def test_pct_applies_reject_to_that_share_of_failing_messages() -> None:
    sampled = DmarcVerdict(result=DmarcResult.FAIL, domain="example.org", policy=DmarcPolicy.REJECT, pct=30)
    assert enforcement(sampled, sample=0.29) is Enforcement.REJECT
    assert enforcement(sampled, sample=0.30) is Enforcement.ACCEPT
    never = DmarcVerdict(result=DmarcResult.FAIL, domain="example.org", policy=DmarcPolicy.REJECT, pct=0)
    assert enforcement(never, sample=0.0) is Enforcement.ACCEPT
