"""Idempotency keys, request fingerprints, stored records and the routes that take a key: pure logic, no I/O.

draft-ietf-httpapi-idempotency-key-header: the key is a Structured Field String (``Idempotency-Key: "abc"``); a
bare token (``Idempotency-Key: abc``, as many clients send it) is read the same. It is 1 to ``max_key_length``
printable ASCII characters (0x20-0x7E), else IdempotencyKeyInvalid (400).

A record lives in the cache store under ``idempotency:<sha256 of caller and key>``: the caller (``user:<sub>`` or
``client:<client_id>``) is part of the hash, so one caller's key never finds another caller's response, whatever
the clocks of the instances say. The record is ``R<fingerprint>`` while the first request runs and
``D<fingerprint><status and headers as in an HTTP head>\\r\\n\\r\\n<body>`` once its response is stored.

Without ``cache_store.url`` the step's own in-process store names it :func:`local_key` (caller and key themselves
when no longer than the hashed name), fingerprints requests with :func:`local_fingerprint` (a short request is its
own fingerprint) and writes :func:`local_record` s, whose fingerprint's length is their second byte. Its records
never leave the process, so they need not match other instances'.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable
from typing import NamedTuple

from bastion.errors import IdempotencyKeyInvalid
from bastion.ratelimit._rules import ANY_SEGMENTS, ONE_SEGMENT, check_patterns, parse_pattern, path_segments

KEY_PREFIX = "idempotency:"
RUNNING = b"R"
DONE = b"D"
FINGERPRINT_LENGTH = 64
LOCAL_KEY_MAX_LENGTH = len(KEY_PREFIX) + 64  # a hashed name's length: local_key's names are never longer
LOCAL_EXACT_MAX = 255
"""The longest request (method, path, query and body, newline-separated) that is its own fingerprint in memory."""
MATCH_CACHE_SIZE = 4096
_PRINTABLE = re.compile(rb"[\x20-\x7e]+")
_HEADER_JOIN = b": ".join  # (name, value) -> one line of a record's head
_LOCAL_DONE = tuple(DONE + bytes((length,)) for length in range(LOCAL_EXACT_MAX + 1))
"""The first two bytes of an in-memory done record, by the length of its fingerprint."""


def parse_key(raw: bytes, *, max_length: int) -> str:
    """The key of an ``Idempotency-Key`` header value; IdempotencyKeyInvalid when it is empty, longer than
    ``max_length`` or not printable ASCII."""
    if len(raw) <= max_length and raw.replace(b"-", b"").isalnum():
        return raw.decode("ascii")  # the usual key (a UUID, a token): ASCII letters, digits and dashes, unquoted
    text = raw.strip()
    if len(text) >= 2 and text[:1] == b'"' and text[-1:] == b'"':
        text = text[1:-1]
        if b'"' in text or b"\\" in text:
            raise IdempotencyKeyInvalid()
    if not text or len(text) > max_length or _PRINTABLE.fullmatch(text) is None:
        raise IdempotencyKeyInvalid(f"Idempotency-Key must be 1 to {max_length} printable ASCII characters")
    return text.decode("ascii")


def record_key(caller: str, key: str) -> str:
    """The cache-store key of ``caller``'s ``key`` (the two hashed together, so neither can collide)."""
    digest = hashlib.sha256(f"{len(caller)}:{caller}:{key}".encode()).hexdigest()
    return KEY_PREFIX + digest


def local_key(caller: str, key: str) -> str:
    """The in-process store's name for ``caller``'s ``key``: ``<len(caller)>:<caller>:<key>`` itself when it is ASCII
    and no longer than a hashed name (:data:`LOCAL_KEY_MAX_LENGTH`: a UUID key of a caller with a short ``sub``), else
    :func:`record_key`. The length prefix keeps it unambiguous and it starts with a digit, so it never equals a
    hashed name; held in this process only, it needs no hash (one SHA-256 fewer per request), and no name is longer
    than a hashed one, so the store's keys take no more memory than before."""
    name = f"{len(caller)}:{caller}:{key}"
    if len(name) <= LOCAL_KEY_MAX_LENGTH and name.isascii():
        return name
    return KEY_PREFIX + hashlib.sha256(name.encode()).hexdigest()


def fingerprint(method: str, path: str, query: bytes, body: bytes) -> bytes:
    """The request's fingerprint: SHA-256 (hex) of its method, canonical path, query string and body, joined by
    newlines (none of the first three can hold one: the path normalization refuses control characters). The body
    is hashed where it lies, not copied."""
    digest = hashlib.sha256(b"%s\n%s\n%s\n" % (method.encode(), path.encode("utf-8", "surrogateescape"), query))
    digest.update(body)
    return digest.hexdigest().encode()


def local_fingerprint(method: str, path: str, query: bytes, body: bytes) -> bytes:
    """The in-process store's fingerprint: the request itself (method, canonical path, query string and body, joined by
    newlines) when that is at most :data:`LOCAL_EXACT_MAX` bytes: exact, two requests share it only when they are the
    same request, and there is nothing to hash. A longer one: BLAKE2b-256 of the same bytes in 64 hex digits (never
    equal to a request, which holds a newline; Python's own BLAKE2 costs about half of OpenSSL's SHA-256 inside a
    request). Both cost less than :func:`fingerprint`, which every instance sharing a store must agree on
    (bench/README.md, issue 32)."""
    if len(body) <= LOCAL_EXACT_MAX:
        exact = b"\n".join((method.encode(), path.encode("utf-8", "surrogateescape"), query, body))
        if len(exact) <= LOCAL_EXACT_MAX:
            return exact
    digest = hashlib.blake2b(
        b"%s\n%s\n%s\n" % (method.encode(), path.encode("utf-8", "surrogateescape"), query), digest_size=32
    )
    digest.update(body)
    return digest.hexdigest().encode()


class Stored(NamedTuple):
    """A record read back: its fingerprint and, once the first request finished, its response."""

    fingerprint: bytes
    status: int | None = None
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes = b""

    @property
    def running(self) -> bool:
        return self.status is None


def running_record(print_: bytes) -> bytes:
    return RUNNING + print_


def done_record(print_: bytes, status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes) -> bytes:
    """``D<fingerprint><status>\\r\\n<name>: <value>\\r\\n...\\r\\n\\r\\n<body>``: the shape of an HTTP response head
    (a header name or value never holds CR or LF), written and read without a JSON round."""
    return record_of(print_, response_head(status, headers), body)


def response_head(status: int, headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The part of a done record between the fingerprint and the body: status and headers, blank line included."""
    return b"\r\n".join([b"%d" % status, *map(_HEADER_JOIN, headers), b"", b""])


def record_of(print_: bytes, head: bytes, body: bytes) -> bytes:
    """A done record from a :func:`response_head` rendered earlier."""
    return b"".join((DONE, print_, head, body))


def read_record(raw: bytes) -> Stored | None:
    """A record as stored by :func:`running_record` or :func:`done_record`; ``None`` for anything else."""
    kind, print_ = raw[:1], raw[1 : 1 + FINGERPRINT_LENGTH]
    if kind == RUNNING and len(raw) == 1 + FINGERPRINT_LENGTH:
        return Stored(print_)
    if kind != DONE:
        return None
    return _done(print_, raw[1 + FINGERPRINT_LENGTH :])


def local_record(print_: bytes, head: bytes, body: bytes) -> bytes:
    """A done record of the in-process store, from a :func:`response_head` rendered earlier: ``D``, the length of the
    fingerprint in one byte (at most :data:`LOCAL_EXACT_MAX`), the fingerprint, the head, the body. Its running record
    is :func:`running_record`'s."""
    return b"".join((_LOCAL_DONE[len(print_)], print_, head, body))


def read_local_record(raw: bytes) -> Stored | None:
    """A record as stored by :func:`running_record` or :func:`local_record`; ``None`` for anything else."""
    kind = raw[:1]
    if kind == RUNNING:
        return Stored(raw[1:]) if len(raw) > 1 else None
    if kind != DONE or len(raw) < 2:
        return None
    end = 2 + raw[1]
    return _done(raw[2:end], raw[end:]) if len(raw) >= end else None


def _done(print_: bytes, response: bytes) -> Stored | None:
    """A done record's fingerprint and the rest (head and body) read back; ``None`` when the head is malformed."""
    head, blank, body = response.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    if not blank or not status.isdigit() or any(b": " not in line for line in lines):
        return None
    headers = tuple((name, value) for name, _, value in (line.partition(b": ") for line in lines))
    return Stored(print_, int(status), headers, body)


class IdempotentRoutes:
    """The route patterns that take an ``Idempotency-Key`` (``[idempotency] routes`` and the routes registered
    with ``idempotency=True``), in the syntax of ``[rate_limit.routes]``; ConfigError for a bad one."""

    def __init__(self, patterns: Iterable[str]) -> None:
        patterns = list(dict.fromkeys(patterns))
        check_patterns(patterns)
        self.patterns = tuple(parse_pattern(pattern) for pattern in patterns)
        self.match = functools.lru_cache(maxsize=MATCH_CACHE_SIZE)(self._match)

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def _match(self, method: str, path: str) -> bool:
        segments = path_segments(path)
        return any(
            (wanted is None or wanted == method) and _segments_match(pattern, segments)
            for wanted, pattern in self.patterns
        )


def _segments_match(pattern: tuple[str, ...], segments: tuple[str, ...]) -> bool:
    if ANY_SEGMENTS in pattern:
        at = pattern.index(ANY_SEGMENTS)
        head, tail = pattern[:at], pattern[at + 1 :]
        if len(segments) < len(head) + len(tail):
            return False
        return _segments_match(head, segments[: len(head)]) and _segments_match(
            tail, segments[len(segments) - len(tail) :] if tail else ()
        )
    return len(pattern) == len(segments) and all(p in (ONE_SEGMENT, s) for p, s in zip(pattern, segments, strict=True))
