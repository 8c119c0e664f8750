"""DMARC (RFC 7489) without I/O: policy records, the From author, organizational domains, alignment, enforcement.

The evaluator that looks things up in DNS and runs SPF and DKIM is in `_mailauth.py`; everything here is pure and
tested without a network or an event loop.
"""

from __future__ import annotations

import email.utils
import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass
from email import policy
from email.parser import BytesHeaderParser
from typing import TYPE_CHECKING, Protocol

from mailrelay._parsing import scrub

if TYPE_CHECKING:
    from publicsuffixlist import PublicSuffixList

DMARC_VERSION = "DMARC1"
DMARC_LABEL = "_dmarc"  # RFC 7489 6.1
_TAG = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$", re.DOTALL)
_DOMAIN = re.compile(r"^(?=.{1,253}$)([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?\.)*[a-z0-9_]([a-z0-9-]{0,61}[a-z0-9])?$")


class DmarcResult(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    NONE = "none"  # no DMARC record for the From domain or its organizational domain
    TEMPERROR = "temperror"  # a DNS failure or timeout: the sender should try again


class DmarcPolicy(enum.Enum):
    NONE = "none"
    QUARANTINE = "quarantine"
    REJECT = "reject"


class Alignment(enum.Enum):
    RELAXED = "r"  # same organizational domain
    STRICT = "s"  # same domain


class Enforcement(enum.Enum):
    """What enforce mode does with a verdict."""

    ACCEPT = "accept"
    REJECT = "reject"  # 550 5.7.1
    DEFER = "defer"  # 451 4.7.0: the sender retries later


@dataclass(frozen=True, slots=True, kw_only=True)
class DmarcRecord:
    """One published policy. Tags this relay does not use (rua, ruf, fo, rf, ri) are accepted and ignored."""

    policy: DmarcPolicy
    subdomain_policy: DmarcPolicy | None = None
    adkim: Alignment = Alignment.RELAXED
    aspf: Alignment = Alignment.RELAXED
    pct: int = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class Author:
    """The one RFC5322.From address of a message; `domain` is lower-case ASCII (IDNA)."""

    address: str
    domain: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DmarcVerdict:
    """What the payload reports (`result`, and `authenticated_from` only on pass) and what enforce mode needs:
    the policy that applies to the From domain (None when no record was found or there is no single author)."""

    result: DmarcResult
    authenticated_from: str | None = None
    domain: str | None = None
    policy: DmarcPolicy | None = None
    pct: int = 100
    spf: str | None = None  # pyspf's result for the envelope sender (payload v2's `spf`); None: not evaluated
    dkim: str | None = None  # pass, fail, none or temperror over the DKIM signatures (payload v2's `dkim`)


class DmarcEvaluator(Protocol):
    """Evaluates one accepted message; `peer_ip` is the SMTP client, `mail_from` the envelope sender."""

    async def evaluate(self, *, raw: bytes, peer_ip: str, helo: str, mail_from: str) -> DmarcVerdict: ...


def parse_record(text: str) -> DmarcRecord | None:
    """A DMARC TXT record, or None when it is not a usable one (RFC 7489 6.3, 6.6.3).

    The record must start with `v=DMARC1`. Unknown tags and bad values of optional tags are ignored (their default
    applies). A missing or invalid `p` makes the record unusable unless it names a report address (`rua`), in which
    case it counts as `p=none`, as RFC 7489 6.6.3 says.
    """
    parts = text.split(";")
    first = _TAG.match(parts[0])
    if first is None or first.group(1).lower() != "v" or first.group(2) != DMARC_VERSION:
        return None
    tags: dict[str, str] = {}
    for part in parts[1:]:
        match = _TAG.match(part)
        if match is not None:
            tags.setdefault(match.group(1).lower(), match.group(2))
    policy = _policy(tags.get("p"))
    if policy is None:
        if not any(uri.strip().lower().startswith("mailto:") for uri in tags.get("rua", "").split(",")):
            return None
        policy = DmarcPolicy.NONE
    pct_text = tags.get("pct", "100")
    pct = int(pct_text) if pct_text.isdigit() and int(pct_text) <= 100 else 100
    return DmarcRecord(
        policy=policy,
        subdomain_policy=_policy(tags.get("sp")),
        adkim=_alignment(tags.get("adkim")),
        aspf=_alignment(tags.get("aspf")),
        pct=pct,
    )


def choose_record(texts: Iterable[str]) -> DmarcRecord | None:
    """The policy among the TXT records at `_dmarc.<domain>`: exactly one must be a DMARC record (RFC 7489 6.6.3)."""
    records = [record for record in (parse_record(text) for text in texts) if record is not None]
    return records[0] if len(records) == 1 else None


def _policy(value: str | None) -> DmarcPolicy | None:
    try:
        return DmarcPolicy((value or "").lower())
    except ValueError:
        return None


def _alignment(value: str | None) -> Alignment:
    return Alignment.STRICT if (value or "").lower() == "s" else Alignment.RELAXED


def author_of(raw: bytes) -> Author | None:
    """The From address DMARC authenticates, or None unless there is exactly one From header holding exactly one
    address with a valid domain (RFC 7489 6.6.1: several authors or none leave nothing to authenticate)."""
    try:
        headers = BytesHeaderParser(policy=policy.compat32).parsebytes(raw)
        values = [scrub(str(value)) for name, value in headers.raw_items() if str(name).lower() == "from"]
    except Exception:  # the parser is forgiving, but this decides authentication: no author on any surprise
        return None
    if len(values) != 1:
        return None
    try:
        addresses = [address for _, address in email.utils.getaddresses(values) if address]
    except Exception:
        return None
    if len(addresses) != 1 or addresses[0].count("@") != 1:
        return None
    local, _, domain = addresses[0].partition("@")
    ascii_domain = ascii_domain_of(domain)
    if not local or ascii_domain is None:
        return None
    return Author(address=f"{local}@{domain.lower().rstrip('.')}", domain=ascii_domain)


def ascii_domain_of(domain: str) -> str | None:
    """`domain` as lower-case ASCII for DNS (IDNA for internationalized names), or None when it is not a domain."""
    domain = domain.strip().rstrip(".").lower()
    try:
        ascii_name = domain.encode("idna").decode("ascii") if not domain.isascii() else domain
    except (UnicodeError, ValueError):
        return None
    return ascii_name if _DOMAIN.match(ascii_name) and "." in ascii_name else None


class OrganizationalDomains:
    """RFC 7489 3.2 with the public suffix list bundled in the `publicsuffixlist` wheel (never fetched at run time).

    Private suffixes count (``github.io``): two sites under one hosting suffix belong to different owners.
    """

    def __init__(self, psl: PublicSuffixList | None = None) -> None:
        if psl is None:
            from publicsuffixlist import PublicSuffixList  # the dmarc extra (mailrelay._extras)

            psl = PublicSuffixList()
        self._psl = psl

    def __call__(self, domain: str) -> str:
        return self._psl.privatesuffix(domain) or domain

    def aligned(self, identifier: str, author_domain: str, mode: Alignment) -> bool:
        """Whether an authenticated domain (DKIM d=, SPF identity) is aligned with the From domain."""
        identifier, author_domain = identifier.lower().rstrip("."), author_domain.lower().rstrip(".")
        if mode is Alignment.STRICT:
            return identifier == author_domain
        return self(identifier) == self(author_domain)


def enforcement(verdict: DmarcVerdict, *, sample: float) -> Enforcement:
    """Enforce mode's decision. `sample` is uniform in [0, 1): with `pct` below 100 only that share of failing
    messages gets the policy, the rest the next milder one (RFC 7489 6.6.4: reject -> quarantine -> none).

    `quarantine` is accepted: the relay has no quarantine of its own, and the webhook sees `dmarc_result: fail`.
    A message without a single From author fails with no policy to consult and is rejected: nothing could be
    authenticated.
    """
    if verdict.result is DmarcResult.TEMPERROR:
        return Enforcement.DEFER
    if verdict.result is not DmarcResult.FAIL:
        return Enforcement.ACCEPT
    if verdict.domain is None:
        return Enforcement.REJECT
    if verdict.policy is DmarcPolicy.REJECT and sample * 100 < verdict.pct:
        return Enforcement.REJECT
    return Enforcement.ACCEPT
