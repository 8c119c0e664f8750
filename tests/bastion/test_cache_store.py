"""The cache store: memory and a real Valkey behave alike; an outage is a CacheStoreError."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator

import pytest

from bastion._cache_store import CacheStore, MemoryCacheStore, RedisCacheStore, cache_store_from_settings
from bastion.config import CacheStoreSettings
from bastion.errors import CacheStoreError


@pytest.fixture(params=["memory", "valkey"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[CacheStore]:
    if request.param == "memory":
        yield MemoryCacheStore()
        return
    valkey = RedisCacheStore(request.getfixturevalue("valkey_url"))
    yield valkey
    await valkey.close()


async def test_set_get_exists(store: CacheStore) -> None:
    await store.set("cs:key", b"value", ttl_secs=30)
    assert await store.get("cs:key") == b"value"
    assert await store.exists("cs:key")
    assert await store.get("cs:absent") is None
    assert not await store.exists("cs:absent")
    await store.ping()


async def test_memory_expiry_uses_the_clock() -> None:
    now = {"t": 0.0}
    store = MemoryCacheStore(clock=lambda: now["t"])
    await store.set("k", b"v", ttl_secs=5)
    now["t"] = 4.9
    assert await store.exists("k")
    now["t"] = 5.0
    assert not await store.exists("k")
    assert len(store) == 0


async def test_memory_sweeps_expired_keys_on_writes() -> None:
    now = {"t": 0.0}
    store = MemoryCacheStore(clock=lambda: now["t"])
    for n in range(MemoryCacheStore.SWEEP_EVERY - 1):
        await store.set(f"old{n}", b"", ttl_secs=1)
    now["t"] = 2.0
    await store.set("fresh", b"", ttl_secs=1)
    assert len(store) == 1


async def test_outage_raises_cache_store_error(dead_redis_url: str) -> None:
    store = RedisCacheStore(dead_redis_url, timeout_secs=0.5)
    try:
        for call in (store.ping(), store.get("k"), store.exists("k"), store.set("k", b"v", ttl_secs=1)):
            with pytest.raises(CacheStoreError):
                await call
    finally:
        await store.close()


def test_memory_store_without_a_url() -> None:
    assert isinstance(cache_store_from_settings(CacheStoreSettings()), MemoryCacheStore)


async def test_more_concurrent_calls_than_connections_wait_instead_of_failing(valkey_url: str) -> None:
    import asyncio

    store = RedisCacheStore(valkey_url, max_connections=2, timeout_secs=5)
    try:
        results = await asyncio.gather(*(store.exists(f"cs:busy:{n}") for n in range(50)))
    finally:
        await store.close()
    assert results == [False] * 50


async def test_a_byte_capped_memory_store_forgets_the_oldest_writes_first() -> None:
    store = MemoryCacheStore(max_bytes=10)
    for key in ("a", "b", "c"):
        await store.set(key, b"1234", ttl_secs=60)
    await store.set("a", b"1234", ttl_secs=60)  # written again: now the newest
    assert [await store.get(key) for key in ("a", "b", "c")] == [b"1234", None, b"1234"]


async def test_past_its_cap_a_memory_store_forgets_down_to_fifteen_sixteenths_at_once() -> None:
    """One batch per overflow (not one key per write): the walk to the oldest keys is paid once per batch."""
    store = MemoryCacheStore(max_bytes=160)
    for n in range(17):
        await store.set(f"k{n}", b"0123456789", ttl_secs=60)
    assert [n for n in range(17) if await store.get(f"k{n}") is None] == [0, 1]
    assert len(store) == 15


async def test_claim_sets_only_an_absent_key_and_returns_what_is_there() -> None:
    store = MemoryCacheStore()
    assert await store.claim("k", b"first", ttl_secs=60) is None
    assert await store.claim("k", b"second", ttl_secs=60) == b"first"
    await store.delete("k")
    assert await store.claim("k", b"third", ttl_secs=60) is None


async def test_a_value_replaced_in_place_keeps_its_place_and_its_bytes_count() -> None:
    store = MemoryCacheStore(max_bytes=10)
    store.claim_now("a", b"12", ttl_secs=60)
    store.claim_now("b", b"12", ttl_secs=60)
    store.replace_now("a", b"123456", ttl_secs=60)  # 8 bytes held: a stays the oldest
    store.replace_now("c", b"12", ttl_secs=60)  # absent: set as usual, 10 bytes
    assert [await store.get(key) for key in ("a", "b", "c")] == [b"123456", b"12", b"12"]
    store.replace_now("b", b"1234", ttl_secs=60)  # 12 bytes: past the cap, the oldest (a) goes
    assert [await store.get(key) for key in ("a", "b", "c")] == [None, b"1234", b"12"]


def test_a_memory_store_gives_the_garbage_collector_no_new_object_per_write() -> None:
    # One tracked object per write (a record's tuple) brought the collector's full passes twice as often under the
    # idempotency step's load (bench/README.md, issue 32).
    store = MemoryCacheStore(max_bytes=1_000_000)
    gc.disable()
    try:
        before = len(gc.get_objects())
        for number in range(1000):
            store.claim_now(f"key-{number}", b"R" * 65, ttl_secs=60)
            store.replace_now(f"key-{number}", b"D" * 200, ttl_secs=60)
        added = len(gc.get_objects()) - before
    finally:
        gc.enable()
    assert added < 10
