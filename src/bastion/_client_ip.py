"""The client's IP address: the direct peer, or forwarded headers when the operator trusts a proxy."""

from __future__ import annotations

import functools
import ipaddress

from bastion.types import Scope

UNKNOWN = "unknown"


@functools.lru_cache(maxsize=4096)
def parse_ip(value: str) -> str | None:
    """A normalized IP string (IPv4-mapped IPv6 as IPv4, brackets and ports removed), or ``None``."""
    text = value.strip()
    if text.startswith("[") and "]" in text:
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def peer_ip(scope: Scope) -> str:
    client = scope.get("client")
    if not client:
        return UNKNOWN
    return parse_ip(str(client[0])) or UNKNOWN


def forwarded_ip(scope: Scope) -> str | None:
    """The first ``X-Forwarded-For`` entry, else ``X-Real-IP``, when it is a valid address."""
    forwarded = real = None
    for name, value in scope["headers"]:
        if name == b"x-forwarded-for" and forwarded is None:
            # Only the first entry matters; never split a header of hundreds of entries.
            forwarded = value.split(b",", 1)[0][:64].decode("latin-1")
        elif name == b"x-real-ip" and real is None:
            real = value[:64].decode("latin-1")
    for candidate in (forwarded, real):
        if candidate is not None:
            parsed = parse_ip(candidate)
            if parsed is not None:
                return parsed
    return None


def client_ip(scope: Scope, *, trust_forwarded: bool) -> str:
    """The client IP (spec: limits / rate limiting 3). Malformed headers fall back to the peer address."""
    if trust_forwarded:
        return forwarded_ip(scope) or peer_ip(scope)
    return peer_ip(scope)
