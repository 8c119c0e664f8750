"""Revocation: key shape, TTL, missing jti, against the memory store and a real Valkey server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis
from structlog.testing import capture_logs

from bastion._cache_store import CacheStore, MemoryCacheStore, RedisCacheStore
from bastion._claims import claims_from_payload
from bastion.auth._revocation import Revocations, revocation_key
from bastion.errors import CacheStoreError, InvalidToken, TokenRevoked

NOW = 1_800_000_000.0


@pytest.fixture(params=["memory", "valkey"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[CacheStore]:
    if request.param == "memory":
        yield MemoryCacheStore()
        return
    store = RedisCacheStore(request.getfixturevalue("valkey_url"))
    yield store
    await store.close()


async def test_revoked_token_is_rejected(store: CacheStore) -> None:
    revocations = Revocations(store)
    claims = claims_from_payload({"sub": "a", "exp": 9_999_999_999, "jti": "rev-1"})
    await revocations.check(claims)
    import time

    await revocations.revoke("rev-1", "stolen", time.time() + 60)
    with pytest.raises(TokenRevoked):
        await revocations.check(claims)


async def test_token_without_jti_is_invalid_while_revocation_is_on(store: CacheStore) -> None:
    with pytest.raises(InvalidToken, match="no jti"):
        await Revocations(store).check(claims_from_payload({"sub": "a", "exp": 9_999_999_999}))


async def test_already_expired_token_gets_no_entry(store: CacheStore) -> None:
    revocations = Revocations(store, clock=lambda: NOW)
    await revocations.revoke("old-1", "late", NOW - 1)
    assert not await revocations.is_revoked("old-1")


async def test_key_value_and_ttl_in_valkey(valkey_url: str) -> None:
    import time

    store = RedisCacheStore(valkey_url)
    try:
        await Revocations(store).revoke("ttl-1", "compromised", time.time() + 120)
    finally:
        await store.close()
    client = redis.from_url(valkey_url)
    try:
        assert revocation_key("ttl-1") == "jwt:revoked:ttl-1"
        assert await client.get("jwt:revoked:ttl-1") == b"compromised"
        assert 110_000 <= await client.pttl("jwt:revoked:ttl-1") <= 120_000
    finally:
        await client.aclose()


async def test_memory_entry_expires_with_the_token() -> None:
    clock = {"now": NOW}
    store = MemoryCacheStore(clock=lambda: clock["now"])
    revocations = Revocations(store, clock=lambda: clock["now"])
    await revocations.revoke("m-1", "r", NOW + 10)
    assert await revocations.is_revoked("m-1")
    clock["now"] = NOW + 11
    assert not await revocations.is_revoked("m-1")


@pytest.mark.parametrize("jti", ["", "x" * 257])
async def test_bad_jti_is_refused(jti: str) -> None:
    with pytest.raises(ValueError, match="jti"):
        await Revocations(MemoryCacheStore()).revoke(jti, "r", NOW)


async def test_outage_is_a_cache_store_error_logged_once(dead_redis_url: str) -> None:
    store = RedisCacheStore(dead_redis_url, timeout_secs=0.5)
    revocations = Revocations(store)
    claims = claims_from_payload({"sub": "a", "exp": 9_999_999_999, "jti": "j"})
    try:
        with capture_logs() as logs:
            for _ in range(3):
                with pytest.raises(CacheStoreError):
                    await revocations.check(claims)
    finally:
        await store.close()
    assert [entry["event"] for entry in logs].count("cache_store_unavailable") == 1
