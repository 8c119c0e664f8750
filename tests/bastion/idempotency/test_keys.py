"""Idempotency keys, fingerprints, records and route patterns: pure logic."""

from __future__ import annotations

import hashlib

import pytest

from bastion import ConfigError
from bastion.errors import IdempotencyKeyInvalid
from bastion.idempotency import IdempotentRoutes
from bastion.idempotency._keys import (
    FINGERPRINT_LENGTH,
    LOCAL_EXACT_MAX,
    LOCAL_KEY_MAX_LENGTH,
    Stored,
    done_record,
    fingerprint,
    local_fingerprint,
    local_key,
    local_record,
    parse_key,
    read_local_record,
    read_record,
    record_key,
    response_head,
    running_record,
)


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        pytest.param(b'"8e03978e-40d5-43e8"', "8e03978e-40d5-43e8", id="structured-string"),
        pytest.param(b"8e03978e-40d5-43e8", "8e03978e-40d5-43e8", id="bare-token"),
        pytest.param(b"order 42", "order 42", id="space-inside"),
    ],
)
def test_a_key_is_read_quoted_or_bare(raw: bytes, key: str) -> None:
    assert parse_key(raw, max_length=255) == key


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b'""', id="empty-string"),
        pytest.param(b"x" * 256, id="over-the-cap"),
        pytest.param(b"caf\xc3\xa9", id="not-ascii"),
        pytest.param(b"a\x01b", id="control-character"),
        pytest.param(b'"a"b"', id="quote-inside"),
    ],
)
def test_a_bad_key_is_idempotency_key_invalid(raw: bytes) -> None:
    with pytest.raises(IdempotencyKeyInvalid, match="1 to 255 printable ASCII"):
        parse_key(raw, max_length=255)


def test_the_key_cap_is_the_configured_length() -> None:
    assert parse_key(b"x" * 8, max_length=8) == "x" * 8
    with pytest.raises(IdempotencyKeyInvalid, match="1 to 8 "):
        parse_key(b"x" * 9, max_length=8)


def test_one_key_of_two_callers_is_two_records() -> None:
    assert record_key("user:alice", "k1") != record_key("user:bob", "k1")


def test_caller_and_key_cannot_collide_by_moving_a_colon() -> None:
    assert record_key("user:a:b", "c") != record_key("user:a", "b:c")


def test_the_fingerprint_covers_method_path_query_and_body() -> None:
    base = fingerprint("POST", "/api/v1/documents", b"", b'{"title":"a"}')
    assert fingerprint("POST", "/api/v1/documents", b"", b'{"title":"a"}') == base
    assert fingerprint("PUT", "/api/v1/documents", b"", b'{"title":"a"}') != base
    assert fingerprint("POST", "/api/v1/notes", b"", b'{"title":"a"}') != base
    assert fingerprint("POST", "/api/v1/documents", b"draft=1", b'{"title":"a"}') != base
    assert fingerprint("POST", "/api/v1/documents", b"", b'{"title":"b"}') != base


def test_a_done_record_reads_back_with_its_response() -> None:
    print_ = fingerprint("POST", "/x", b"", b"")
    raw = done_record(print_, 201, [(b"content-type", b"application/json")], b'{"id":"d-1"}\n')
    stored = read_record(raw)
    assert stored is not None and not stored.running
    assert (stored.fingerprint, stored.status, stored.headers, stored.body) == (
        print_,
        201,
        ((b"content-type", b"application/json"),),
        b'{"id":"d-1"}\n',
    )


def test_a_running_record_reads_back_as_running() -> None:
    print_ = fingerprint("POST", "/x", b"", b"")
    stored = read_record(running_record(print_))
    assert stored is not None and stored.running and stored.fingerprint == print_


@pytest.mark.parametrize("raw", [b"", b"X" + b"0" * 64, b"D" + b"0" * 64 + b"2x0\r\n\r\n", b"R" + b"0" * 10])
def test_an_unreadable_record_is_none(raw: bytes) -> None:
    assert read_record(raw) is None


class TestRoutes:
    def test_a_method_and_wildcard_pattern_matches_every_version(self) -> None:
        routes = IdempotentRoutes(["POST /api/*/documents"])
        assert routes.match("POST", "/api/v1/documents")
        assert routes.match("POST", "/api/v2/documents")
        assert not routes.match("GET", "/api/v1/documents")
        assert not routes.match("POST", "/api/v1/documents/d-1")

    def test_a_double_star_matches_any_depth(self) -> None:
        routes = IdempotentRoutes(["POST /**"])
        assert routes.match("POST", "/api/v1/documents/1/comments")
        assert not routes.match("PUT", "/api/v1/documents")

    def test_a_template_placeholder_is_one_segment(self) -> None:
        routes = IdempotentRoutes(["PUT /api/v1/documents/{doc_id}"])
        assert routes.match("PUT", "/api/v1/documents/d-1")
        assert not routes.match("PUT", "/api/v1/documents/d-1/x")

    def test_a_bad_pattern_is_a_config_error(self) -> None:
        with pytest.raises(ConfigError, match="'POST api/x'"):
            IdempotentRoutes(["POST api/x"])


def test_in_memory_a_short_name_is_caller_and_key_themselves_and_a_long_one_the_hash() -> None:
    assert local_key("user:alice", "k1") == "10:user:alice:k1"
    assert local_key("user:a:b", "c") != local_key("user:a", "b:c")
    long_key = "k" * 80
    assert local_key("user:alice", long_key) == record_key("user:alice", long_key)
    assert len(local_key("user:alice", "k" * 62)) == LOCAL_KEY_MAX_LENGTH  # the longest kept as it is
    assert local_key("user:jürgen", "k1") == record_key("user:jürgen", "k1")  # no name takes more memory than a hash


def test_the_fingerprint_is_64_hex_digits() -> None:
    print_ = fingerprint("POST", "/api/v1/documents", b"", b'{"title":"a"}')
    assert len(print_) == FINGERPRINT_LENGTH and int(print_, 16) >= 0


@pytest.mark.parametrize("body", [b'{"title":"a"}', b"x" * 300], ids=["short request", "long request"])
def test_the_in_memory_fingerprint_covers_method_path_query_and_body(body: bytes) -> None:
    base = local_fingerprint("POST", "/api/v1/documents", b"", body)
    assert local_fingerprint("POST", "/api/v1/documents", b"", body) == base
    others = [
        local_fingerprint("PUT", "/api/v1/documents", b"", body),
        local_fingerprint("POST", "/api/v1/notes", b"", body),
        local_fingerprint("POST", "/api/v1/documents", b"draft=1", body),
        local_fingerprint("POST", "/api/v1/documents", b"", body + b" "),
    ]
    assert base not in others and len(set(others)) == 4


def test_in_memory_a_short_request_is_its_own_fingerprint_and_a_long_one_its_blake2b() -> None:
    assert (
        local_fingerprint("POST", "/api/v1/documents", b"a=1", b'{"t":1}') == b'POST\n/api/v1/documents\na=1\n{"t":1}'
    )
    longest = local_fingerprint("POST", "/d", b"", b"x" * (LOCAL_EXACT_MAX - len("POST\n/d\n\n")))
    assert len(longest) == LOCAL_EXACT_MAX and longest.endswith(b"x")
    over = local_fingerprint("POST", "/d", b"", b"x" * (LOCAL_EXACT_MAX + 1 - len("POST\n/d\n\n")))
    digest = hashlib.blake2b(b"POST\n/d\n\n" + b"x" * (LOCAL_EXACT_MAX + 1 - 9), digest_size=32).hexdigest()
    assert over == digest.encode()


@pytest.mark.parametrize(
    "print_",
    [b'POST\n/d\n\n{"t":1}', b"\x00\r\n\r\n" * 40, b"f" * 64],
    ids=["a request", "a request of CR, LF and NUL", "a BLAKE2b"],
)
def test_an_in_memory_record_reads_back_whatever_its_fingerprint_holds(print_: bytes) -> None:
    running = read_local_record(running_record(print_))
    assert running is not None and running.running and running.fingerprint == print_
    head = response_head(201, [(b"content-type", b"application/json")])
    stored = read_local_record(local_record(print_, head, b'{"id":"d-1"}\r\n\r\n'))
    assert stored == Stored(print_, 201, ((b"content-type", b"application/json"),), b'{"id":"d-1"}\r\n\r\n')
    assert not stored.running


@pytest.mark.parametrize("raw", [b"", b"R", b"D", b"D\x05abc", b"X" + b"0" * 64, b"D\x01a2x0\r\n\r\n"])
def test_an_unreadable_in_memory_record_is_none(raw: bytes) -> None:
    assert read_local_record(raw) is None
