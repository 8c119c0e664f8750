"""HMAC-SHA256 signatures over `<timestamp>.<body>`."""

from __future__ import annotations

import hashlib
import hmac

from mailrelay._signing import compute_signature, signature_headers, verify_signature

BODY = b'{"sender":"a@example.org"}'


def test_signature_is_hmac_sha256_over_timestamp_dot_body() -> None:
    expected = hmac.new(b"secret", b"1700000000." + BODY, hashlib.sha256).hexdigest()
    assert compute_signature("secret", 1_700_000_000, BODY) == "sha256=" + expected


def test_headers() -> None:
    headers = signature_headers("secret", 1_700_000_000, BODY)
    assert headers["X-MailRelay-Timestamp"] == "1700000000"
    assert headers["X-MailRelay-Signature-256"] == compute_signature("secret", 1_700_000_000, BODY)


def test_verify_accepts_fresh_valid_signatures() -> None:
    signature = compute_signature("secret", 1_700_000_000, BODY)
    assert verify_signature("secret", timestamp="1700000000", signature=signature, body=BODY, now=1_700_000_100)


def test_verify_rejects_tampering_wrong_secret_and_stale_timestamps() -> None:
    signature = compute_signature("secret", 1_700_000_000, BODY)
    stamp, now = "1700000000", 1_700_000_000.0
    assert not verify_signature("secret", timestamp=stamp, signature=signature, body=BODY + b" ", now=now)
    assert not verify_signature("other", timestamp=stamp, signature=signature, body=BODY, now=now)
    assert not verify_signature("secret", timestamp="1700000000", signature=signature, body=BODY, now=1_700_001_000)
    assert not verify_signature("secret", timestamp="abc", signature=signature, body=BODY, now=1_700_000_000)
