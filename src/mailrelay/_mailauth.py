"""The DMARC evaluator: policy discovery in DNS, SPF (pyspf) and DKIM (dkimpy), all through one bounded resolver.

pyspf and dkimpy are synchronous, so one message's whole evaluation runs on a worker thread of a small pool
(`_threads.BoundedExecutor`), inside a deadline shared by every query; the event loop never waits on DNS. Both
libraries ask our resolver: dkimpy takes it as its `dnsfunc`; pyspf looks names up through its module-level
`spf.DNSLookup`, which is replaced once by a function that uses the resolver of the evaluation running on the
calling thread (and pyspf's own lookup elsewhere).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import threading
from collections.abc import Callable
from typing import Any

import dkim  # type: ignore[import-untyped]  # dkimpy ships no type information
import spf  # type: ignore[import-untyped]  # nor does pyspf
import structlog

from mailrelay._dmarc import (
    DMARC_LABEL,
    Author,
    DmarcRecord,
    DmarcResult,
    DmarcVerdict,
    OrganizationalDomains,
    ascii_domain_of,
    author_of,
    choose_record,
)
from mailrelay._dns import Deadline, DnsClient, DnsFailure
from mailrelay._threads import BoundedExecutor

DMARC_WORKERS = 8  # messages evaluated at once; more wait for a free thread
# One message's checks (DMARC record, SPF with its up to 10 lookups, one key per DKIM signature) share this many
# DNS timeouts: with the default 5 s that is RFC 7208 4.6.4's 20 s for SPF.
EVALUATION_TIMEOUTS = 4
MAX_DKIM_SIGNATURES = 5  # signatures verified per message; the rest are ignored
# A DKIM key record longer than this is not used: it would carry an RSA key over ~8192 bits, and dkimpy's pure-Python
# RSA with an attacker's huge modulus and exponent costs seconds of CPU per signature.
MAX_DKIM_KEY_RECORD_BYTES = 2048
MIN_DKIM_KEY_BITS = 1024  # RFC 8301 3.2

log = structlog.get_logger("mailrelay.dmarc")
_quiet = logging.getLogger("mailrelay.dmarc.dkimpy")  # dkimpy logs every bad signature at ERROR
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False
_quiet.disabled = True


class _DkimDnsFailure(Exception):
    """A key lookup failed temporarily. Not a DKIMException: dkimpy must let it through to us."""


class _Lookups:
    """The DNS of one evaluation: every query within the shared deadline."""

    def __init__(self, client: DnsClient, deadline: Deadline) -> None:
        self.client = client
        self.deadline = deadline
        self.dkim_failed = False

    def txt(self, name: str) -> list[str]:
        return [text.decode("ascii", "replace") for text in self.client.txt(name, deadline=self.deadline)]

    def dkim_key(self, name: bytes, timeout: float = 0.0) -> bytes | None:
        """dkimpy's `dnsfunc`: the first TXT record at `<selector>._domainkey.<domain>.`, None when there is none."""
        try:
            records = self.client.txt(name.decode("ascii"), deadline=self.deadline)
        except UnicodeDecodeError:
            return None
        except DnsFailure as exc:
            self.dkim_failed = True
            raise _DkimDnsFailure(str(exc)) from None
        if not records:
            return None
        if len(records[0]) > MAX_DKIM_KEY_RECORD_BYTES:
            raise dkim.KeyFormatError(f"key record of {len(records[0])} bytes")
        return records[0]

    def spf(self, name: str, qtype: str, strict: object, timeout: float) -> list[tuple[tuple[str, str], Any]]:
        """pyspf's `DNSLookup`, answering in the shape its dnspython lookup does."""
        try:
            records = self.client.query(name, qtype, deadline=self.deadline)
        except DnsFailure as exc:
            raise spf.TempError(f"DNS {exc}") from None
        key = (name, qtype)
        if qtype in ("A", "AAAA"):
            return [(key, record.address) for record in records]  # type: ignore[attr-defined]
        if qtype == "MX":
            return [(key, (record.preference, record.exchange)) for record in records]  # type: ignore[attr-defined]
        if qtype == "PTR":
            return [(key, record.target.to_text(True)) for record in records]  # type: ignore[attr-defined]
        return [(key, record.strings) for record in records]  # type: ignore[attr-defined]


_current = threading.local()
_pyspf_lookup: Callable[..., Any] = spf.DNSLookup
_hook_lock = threading.Lock()


def _spf_lookup(name: str, qtype: str, strict: object = True, timeout: float = 20.0) -> list[Any]:
    lookups: _Lookups | None = getattr(_current, "lookups", None)
    if lookups is None:  # pyspf used by someone else in this process: its own lookup
        return list(_pyspf_lookup(name, qtype, strict, timeout))
    return lookups.spf(name, qtype, strict, timeout)


def _install_spf_hook() -> None:
    with _hook_lock:
        if spf.DNSLookup is not _spf_lookup:
            spf.DNSLookup = _spf_lookup


class DmarcChecker:
    """Implements DmarcEvaluator with real DNS: `pass` when an SPF or DKIM pass is aligned with the From domain,
    `fail` when a policy exists and neither is, `none` without a policy record, `temperror` when DNS failed or the
    evaluation ran out of time (`EVALUATION_TIMEOUTS` x the DNS timeout). Never raises for DNS or message trouble.
    """

    def __init__(
        self,
        *,
        dns: DnsClient,
        organizational: OrganizationalDomains | None = None,
        workers: int = DMARC_WORKERS,
        report: bool = False,
    ) -> None:
        self.dns = dns
        self.report = report
        self.organizational = organizational or OrganizationalDomains()
        self.budget = dns.timeout * EVALUATION_TIMEOUTS
        self._executor = BoundedExecutor(workers=workers, name="mailrelay-dmarc")
        _install_spf_hook()

    async def evaluate(self, *, raw: bytes, peer_ip: str, helo: str, mail_from: str) -> DmarcVerdict:
        try:
            # the thread keeps to the deadline by itself; the extra second only catches a check that does not
            return await self._executor.run(self.budget + 1.0, self.check, raw, peer_ip, helo, mail_from)
        except TimeoutError:
            log.warning("dmarc_timeout", budget=self.budget)
            return DmarcVerdict(result=DmarcResult.TEMPERROR)

    def close(self) -> None:
        self._executor.close()

    def check(self, raw: bytes, peer_ip: str, helo: str, mail_from: str) -> DmarcVerdict:
        """The whole evaluation, blocking (a worker thread calls this). With `report` (payload v2), SPF and DKIM
        are evaluated and reported even where DMARC does not need them (no author, no policy, an aligned DKIM
        pass)."""
        author = author_of(raw)
        lookups = _Lookups(self.dns, Deadline(self.budget))
        if author is None:
            return self._reported(DmarcVerdict(result=DmarcResult.FAIL), raw, peer_ip, helo, mail_from, lookups)
        try:
            found = self._discover(author.domain, lookups)
        except DnsFailure as exc:
            log.info("dmarc_temperror", domain=author.domain, step="policy", error=str(exc))
            return DmarcVerdict(result=DmarcResult.TEMPERROR, domain=author.domain)
        if found is None:
            verdict = DmarcVerdict(result=DmarcResult.NONE, domain=author.domain)
            return self._reported(verdict, raw, peer_ip, helo, mail_from, lookups)
        record, at_organizational = found
        policy = (record.subdomain_policy or record.policy) if at_organizational else record.policy
        result, spf_result, dkim_result = self._authenticate(author, record, raw, peer_ip, helo, mail_from, lookups)
        return DmarcVerdict(
            result=result,
            authenticated_from=author.address if result is DmarcResult.PASS else None,
            domain=author.domain,
            policy=policy,
            pct=record.pct,
            spf=spf_result if self.report else None,
            dkim=dkim_result if self.report else None,
        )

    def _reported(
        self, verdict: DmarcVerdict, raw: bytes, peer_ip: str, helo: str, mail_from: str, lookups: _Lookups
    ) -> DmarcVerdict:
        if not self.report:
            return verdict
        domains, signatures = self._dkim_domains(raw, lookups)
        spf_result, _ = self._spf(peer_ip, helo, mail_from, lookups)
        return dataclasses.replace(verdict, spf=spf_result, dkim=_dkim_result(domains, signatures, lookups))

    def _discover(self, domain: str, lookups: _Lookups) -> tuple[DmarcRecord, bool] | None:
        """RFC 7489 6.6.3: the record at _dmarc.<From domain>, else at _dmarc.<organizational domain>."""
        record = choose_record(lookups.txt(f"{DMARC_LABEL}.{domain}"))
        if record is not None:
            return record, False
        organizational = self.organizational(domain)
        if organizational == domain:
            return None
        record = choose_record(lookups.txt(f"{DMARC_LABEL}.{organizational}"))
        return (record, True) if record is not None else None

    def _authenticate(
        self,
        author: Author,
        record: DmarcRecord,
        raw: bytes,
        peer_ip: str,
        helo: str,
        mail_from: str,
        lookups: _Lookups,
    ) -> tuple[DmarcResult, str | None, str | None]:
        """The DMARC result, and the SPF and DKIM verdicts (SPF is skipped after an aligned DKIM pass unless
        `report`)."""
        domains, signatures = self._dkim_domains(raw, lookups)
        dkim_result = _dkim_result(domains, signatures, lookups)
        if any(self.organizational.aligned(d, author.domain, record.adkim) for d in domains):
            spf_result = self._spf(peer_ip, helo, mail_from, lookups)[0] if self.report else None
            return DmarcResult.PASS, spf_result, dkim_result
        spf_result, spf_domain = self._spf(peer_ip, helo, mail_from, lookups)
        if spf_result == "pass" and spf_domain and self.organizational.aligned(spf_domain, author.domain, record.aspf):
            return DmarcResult.PASS, spf_result, dkim_result
        if lookups.dkim_failed or spf_result == "temperror":
            log.info("dmarc_temperror", domain=author.domain, step="dkim" if lookups.dkim_failed else "spf")
            return DmarcResult.TEMPERROR, spf_result, dkim_result
        return DmarcResult.FAIL, spf_result, dkim_result

    @staticmethod
    def _dkim_domains(raw: bytes, lookups: _Lookups) -> tuple[list[str], int]:
        """The d= domains of the signatures that verify (at most MAX_DKIM_SIGNATURES tried), and how many
        signatures there are."""
        try:
            verifier = dkim.DKIM(raw, logger=_quiet, minkey=MIN_DKIM_KEY_BITS)
            count = sum(1 for name, _ in verifier.headers if name.lower() == b"dkim-signature")
        except Exception:  # dkimpy's parser on hostile input: nothing verifies
            return [], 0
        domains: list[str] = []
        for index in range(min(count, MAX_DKIM_SIGNATURES)):
            try:
                verified = verifier.verify(idx=index, dnsfunc=lookups.dkim_key)
            except Exception as exc:  # a DNS failure (noted in lookups), DKIMException, bad base64, broken tags
                log.debug("dkim_signature_failed", index=index, error=type(exc).__name__)
                continue
            domain = ascii_domain_of(verifier.domain.decode("ascii", "replace")) if verified else None
            if domain is not None:
                domains.append(domain)
        return domains, count

    @staticmethod
    def _spf(peer_ip: str, helo: str, mail_from: str, lookups: _Lookups) -> tuple[str, str | None]:
        """pyspf's result for MAIL FROM (or the HELO name for the null sender) and the domain it checked."""
        try:
            address = ipaddress.ip_address(peer_ip)
        except ValueError:
            return "none", None
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        identity = mail_from.rpartition("@")[2] if mail_from else helo
        domain = ascii_domain_of(identity)
        if domain is None:
            return "none", None
        sender = f"{mail_from.rpartition('@')[0] or 'postmaster'}@{domain}" if mail_from else ""
        _current.lookups = lookups
        try:
            query = spf.query(
                i=str(address),
                s=sender,
                h=domain if not mail_from else (helo or domain),
                timeout=lookups.client.timeout,
                querytime=max(lookups.deadline.remaining(), 0.001),
            )
            result, _, _ = query.check()
        except Exception:  # pyspf on a record it cannot handle: no SPF pass
            return "permerror", domain
        finally:
            _current.lookups = None
        return str(result), domain


def _dkim_result(domains: list[str], signatures: int, lookups: _Lookups) -> str:
    """pass (a signature verified), temperror (a key lookup failed), fail (signatures, none verified), none."""
    if domains:
        return "pass"
    if lookups.dkim_failed:
        return "temperror"
    return "fail" if signatures else "none"
