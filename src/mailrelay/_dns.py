"""DNS for DMARC, SPF and DKIM: one dnspython resolver (configured servers or the system's), every query bounded.

Blocking by design: the checks that use it (pyspf, dkimpy) are synchronous and run in worker threads
(`_mailauth.py`). A timeout, SERVFAIL or unreachable server is a `DnsFailure` (DMARC's temperror); a name that
does not exist or has no records of the type is an empty answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import dns.exception
import dns.message
import dns.name
import dns.nameserver
import dns.rdata
import dns.rdtypes.txtbase
import dns.resolver

DNS_CACHE_ENTRIES = 4096  # answers are cached for their TTL; a busy relay asks for the same policies often


class DnsFailure(Exception):
    """A lookup failed for a reason that may go away (timeout, SERVFAIL, no server answered): DMARC temperror."""


class NoResolver(Exception):
    """No DNS server configured and none in the system configuration (/etc/resolv.conf)."""


class Deadline:
    """The time left for one message's checks; every query gets at most the remainder."""

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until = clock() + seconds

    def remaining(self) -> float:
        return self._until - self._clock()


class DnsClient:
    """Thread-safe lookups through one resolver: `servers` as (ip, port) pairs, or the system resolver when empty.

    `timeout` bounds each query (all servers and retries included). Raises NoResolver at construction when there
    is nothing to ask.
    """

    def __init__(self, *, servers: Sequence[tuple[str, int]] = (), timeout: float = 5.0) -> None:
        try:
            resolver = dns.resolver.Resolver(configure=not servers)
        except dns.resolver.NoResolverConfiguration as exc:
            raise NoResolver(str(exc)) from None
        if servers:
            resolver.nameservers = [dns.nameserver.Do53Nameserver(host, port) for host, port in servers]
        if not resolver.nameservers:
            raise NoResolver("no nameservers")
        resolver.timeout = timeout
        resolver.lifetime = timeout
        resolver.retry_servfail = False
        resolver.cache = dns.resolver.LRUCache(DNS_CACHE_ENTRIES)
        self.timeout = timeout
        self._resolver = resolver

    def query(self, name: str, rdtype: str, *, deadline: Deadline | None = None) -> list[dns.rdata.Rdata]:
        """The records of `rdtype` at `name` (CNAMEs followed); [] for NXDOMAIN or no such records.

        Raises DnsFailure on a timeout, SERVFAIL, an unreachable server, or when the deadline has passed.
        """
        lifetime = self.timeout if deadline is None else min(self.timeout, deadline.remaining())
        if lifetime <= 0:
            raise DnsFailure(f"{rdtype} {name}: time for DNS checks used up")
        try:
            answer = self._resolver.resolve(
                dns.name.from_text(name),
                rdtype,
                lifetime=lifetime,
                search=False,
                raise_on_no_answer=False,
            )
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        except dns.exception.Timeout:
            raise DnsFailure(f"{rdtype} {name}: timeout") from None
        except dns.resolver.NoNameservers:
            raise DnsFailure(f"{rdtype} {name}: no server answered (SERVFAIL or unreachable)") from None
        except (dns.name.EmptyLabel, dns.name.LabelTooLong, dns.name.NameTooLong):
            return []  # not a name that can exist
        except dns.exception.DNSException as exc:
            raise DnsFailure(f"{rdtype} {name}: {type(exc).__name__}") from None
        return list(answer.rrset) if answer.rrset is not None else []

    def txt(self, name: str, *, deadline: Deadline | None = None) -> list[bytes]:
        """Each TXT record at `name` with its strings joined (RFC 7208 3.3, RFC 6376 3.6.2.2)."""
        records = self.query(name, "TXT", deadline=deadline)
        return [b"".join(r.strings) for r in records if isinstance(r, dns.rdtypes.txtbase.TXTBase)]
