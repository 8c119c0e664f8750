"""HMAC-SHA256 webhook signatures: `sha256=<hex>` over `<timestamp>.<body>`."""

from __future__ import annotations

import hashlib
import hmac

TIMESTAMP_HEADER = "X-MailRelay-Timestamp"
SIGNATURE_HEADER = "X-MailRelay-Signature-256"
SIGNATURE_PREFIX = "sha256="


def compute_signature(secret: str, timestamp: int, body: bytes) -> str:
    """`sha256=` + hex HMAC-SHA256 keyed with the UTF-8 secret over b"<timestamp>." + body."""
    message = str(timestamp).encode("ascii") + b"." + body
    digest = hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()
    return SIGNATURE_PREFIX + digest


def signature_headers(secret: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The two headers a signed request carries."""
    return {
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: compute_signature(secret, timestamp, body),
    }


class Signer:
    """Signs request bodies with one secret; the keyed HMAC state is computed once and copied per body."""

    __slots__ = ("_keyed",)

    def __init__(self, secret: str) -> None:
        self._keyed = hmac.new(secret.encode("utf-8"), digestmod=hashlib.sha256)

    def headers(self, timestamp: int, body: bytes) -> dict[str, str]:
        """The same two headers as :func:`signature_headers`, without hashing the key again."""
        stamp = str(timestamp)
        mac = self._keyed.copy()
        mac.update(stamp.encode("ascii") + b".")
        mac.update(body)
        return {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: SIGNATURE_PREFIX + mac.hexdigest()}


def verify_signature(
    secret: str, *, timestamp: str, signature: str, body: bytes, now: float, tolerance: float = 300.0
) -> bool:
    """Receiver-side check: a well-formed timestamp within `tolerance` seconds and a matching digest.

    Compares in constant time. This is the recipe documented for webhook receivers.
    """
    if not timestamp.isdigit() or abs(now - int(timestamp)) > tolerance:
        return False
    expected = compute_signature(secret, int(timestamp), body)
    return hmac.compare_digest(expected, signature)
