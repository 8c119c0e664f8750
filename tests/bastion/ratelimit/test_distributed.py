"""The distributed limiter against a real Valkey server: key shapes, expiry, one round trip, shared limits, outages."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from bastion import Service, Slot
from bastion._cache_store import MemoryCacheStore, RedisCacheStore
from bastion.config import Settings
from bastion.errors import CacheStoreError
from bastion.ratelimit import Bucket, Quota
from bastion.ratelimit._distributed import DistributedLimiter
from bastion.testing import FakeClock
from tests.bastion.ratelimit.conftest import service

Client = Callable[..., httpx.AsyncClient]


@pytest.fixture
async def store(valkey_url: str) -> AsyncIterator[RedisCacheStore]:
    redis_store = RedisCacheStore(valkey_url)
    yield redis_store
    await redis_store.close()


def unique(prefix: str = "alice") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def distributed_settings(url: str, *, max_connections: int = 10, **rate_limit: Any) -> Settings:
    return Settings.model_validate(
        {
            "token": {"enabled": False},
            "cache_store": {"url": url, "max_connections": max_connections},
            "rate_limit": {"distributed": True, "auto_apply": False, **rate_limit},
        }
    )


class TestOnValkey:
    async def test_burst_then_refusal(self, store: RedisCacheStore) -> None:
        limiter = DistributedLimiter(store)
        bucket = Bucket(key=f"rate_limit:user:{unique()}:60", quota=Quota.per_minute(3))
        outcomes = [await limiter.charge(bucket) for _ in range(5)]
        assert [o.allowed for o in outcomes] == [True, True, True, False, False]
        assert [o.remaining for o in outcomes] == [2, 1, 0, 0, 0]
        assert 19 < outcomes[3].retry_after <= 20
        assert outcomes[3].retry_after_secs == 20
        assert outcomes[3].reset_at == pytest.approx(outcomes[2].reset_at)

    async def test_counter_key_holds_the_time_and_expires_with_the_bucket(self, store: RedisCacheStore) -> None:
        key = f"rate_limit:user:{unique()}:60"
        limiter = DistributedLimiter(store)
        outcome = await limiter.charge(Bucket(key=key, quota=Quota.per_minute(10)))
        stored = await store.client.get(key)
        assert int(stored) == pytest.approx(outcome.reset_at * 1_000_000, abs=1)
        assert 5_000 < await store.client.pttl(key) <= 6_000  # full again after one interval (60 s / 10)
        for _ in range(9):
            await limiter.charge(Bucket(key=key, quota=Quota.per_minute(10)))
        assert 59_000 < await store.client.pttl(key) <= 60_000  # never longer than the window

    async def test_counter_expires_after_the_window(self, store: RedisCacheStore) -> None:
        key = f"route:GET /api/v1/fast:user:{unique()}"
        limiter = DistributedLimiter(store)
        bucket = Bucket(key=key, quota=Quota(limit=5, period_secs=0.2))
        assert [(await limiter.charge(bucket)).allowed for _ in range(6)] == [True] * 5 + [False]
        await asyncio.sleep(0.25)
        assert await store.client.exists(key) == 0
        assert (await limiter.charge(bucket)).allowed

    async def test_one_round_trip_per_request(self, store: RedisCacheStore) -> None:
        limiter = DistributedLimiter(store)
        bucket = Bucket(key=f"rate_limit:ip:{unique('10.0.0')}:60", quota=Quota.per_minute(100))
        await limiter.charge(bucket)  # the first call may load the script
        await store.client.config_resetstat()
        for _ in range(7):
            await limiter.charge(bucket)
        stats = await store.client.info("commandstats")
        assert stats["cmdstat_evalsha"]["calls"] == 7
        # GET, SET and TIME run inside the script (the server counts them too); nothing else was sent.
        assert set(stats) <= {
            "cmdstat_evalsha",
            "cmdstat_get",
            "cmdstat_set",
            "cmdstat_time",
            "cmdstat_config|resetstat",
        }
        assert stats["cmdstat_get"]["calls"] == 7

    async def test_script_flush_is_survived(self, store: RedisCacheStore) -> None:
        limiter = DistributedLimiter(store)
        bucket = Bucket(key=f"rate_limit:user:{unique()}:60", quota=Quota.per_minute(2))
        await limiter.charge(bucket)
        await store.client.script_flush()
        assert (await limiter.charge(bucket)).allowed
        assert not (await limiter.charge(bucket)).allowed


class TestAutoPipelining:
    """Script calls made in one event-loop iteration share one pipeline; each still gets its own answer."""

    async def test_concurrent_charges_go_in_one_pipeline_and_exactly_the_burst_passes(
        self, store: RedisCacheStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        limiter = DistributedLimiter(store)
        bucket = Bucket(key=f"rate_limit:user:{unique()}:60", quota=Quota.per_minute(5))
        await limiter.charge(Bucket(key=f"rate_limit:user:{unique()}:60", quota=Quota.per_minute(5)))  # loads it
        pool = store.client.connection_pool
        checkouts = 0
        get_connection = pool.get_connection

        async def counting_checkout(*args: Any, **kwargs: Any) -> Any:
            nonlocal checkouts
            checkouts += 1
            return await get_connection(*args, **kwargs)

        # One pipeline = one pooled connection taken for one write of every call and the reading of their replies.
        monkeypatch.setattr(pool, "get_connection", counting_checkout)
        outcomes = await asyncio.gather(*(limiter.charge(bucket) for _ in range(20)))
        assert checkouts == 1
        assert [o.allowed for o in outcomes] == [True] * 5 + [False] * 15
        assert [o.remaining for o in outcomes[:5]] == [4, 3, 2, 1, 0]

    async def test_a_script_flush_under_concurrency_is_survived(self, store: RedisCacheStore) -> None:
        limiter = DistributedLimiter(store)
        bucket = Bucket(key=f"rate_limit:user:{unique()}:60", quota=Quota.per_minute(3))
        await limiter.charge(Bucket(key=f"rate_limit:user:{unique()}:60", quota=Quota.per_minute(3)))
        await store.client.script_flush()
        outcomes = await asyncio.gather(*(limiter.charge(bucket) for _ in range(6)))
        assert sorted(o.allowed for o in outcomes) == [False, False, False, True, True, True]

    async def test_a_failed_call_fails_alone(self, store: RedisCacheStore) -> None:
        from redis.exceptions import ResponseError

        limiter = DistributedLimiter(store)
        good = Bucket(key=f"rate_limit:user:{unique()}:60", quota=Quota.per_minute(3))
        await limiter.charge(good)
        wrong_type = unique("wrong")
        await store.client.lpush(wrong_type, "x")  # GET on a list fails inside the script
        bad = Bucket(key=wrong_type, quota=Quota.per_minute(3))
        results = await asyncio.gather(limiter.charge(good), limiter.charge(bad), return_exceptions=True)
        assert results[0].allowed is True  # type: ignore[union-attr]
        assert isinstance(results[1], CacheStoreError)
        assert isinstance(results[1].__cause__, ResponseError)

    async def test_a_caller_that_gives_up_leaves_the_others_answered(self, store: RedisCacheStore) -> None:
        limiter = DistributedLimiter(store)
        bucket = Bucket(key=f"rate_limit:user:{unique()}:60", quota=Quota.per_minute(10))
        await limiter.charge(bucket)
        doomed = asyncio.ensure_future(limiter.charge(bucket))
        kept = asyncio.ensure_future(limiter.charge(bucket))
        await asyncio.sleep(0)
        doomed.cancel()
        outcome = await kept
        assert outcome.allowed
        with pytest.raises(asyncio.CancelledError):
            await doomed

    async def test_an_outage_fails_every_call_of_the_batch(self, dead_redis_url: str) -> None:
        store = RedisCacheStore(dead_redis_url)
        limiter = DistributedLimiter(store)
        bucket = Bucket(key=f"rate_limit:user:{unique()}:60", quota=Quota.per_minute(10))
        with capture_logs():
            results = await asyncio.gather(*(limiter.charge(bucket) for _ in range(5)), return_exceptions=True)
        await store.close()
        assert [type(result) for result in results] == [CacheStoreError] * 5

    async def test_a_batch_past_the_timeout_fails_closed_and_the_next_call_reads_its_own_reply(
        self, valkey_url: str, store: RedisCacheStore
    ) -> None:
        slow = RedisCacheStore(valkey_url, timeout_secs=0.2)
        limiter = DistributedLimiter(slow)
        bucket = Bucket(key=f"rate_limit:user:{unique()}:60", quota=Quota.per_minute(10))
        assert (await limiter.charge(bucket)).remaining == 9  # connected, script loaded
        await store.client.client_pause(10_000, all=False)  # write commands (the script) wait: past the timeout
        try:
            with capture_logs():
                results = await asyncio.gather(*(limiter.charge(bucket) for _ in range(3)), return_exceptions=True)
        finally:
            await store.client.client_unpause()
        assert [type(result) for result in results] == [CacheStoreError] * 3
        outcome = await limiter.charge(bucket)  # on a new connection: its own reply, not a late one of the batch
        stored = await store.client.get(bucket.key)
        assert int(stored) == pytest.approx(outcome.reset_at * 1_000_000, abs=1)
        await slow.close()

    async def test_a_command_is_packed_as_redis_py_packs_it(self, store: RedisCacheStore) -> None:
        from redis.asyncio.connection import Connection

        limiter = DistributedLimiter(store)
        keys, args = ["rate_limit:user:\u00e5sa k\u00e9:60", "jwt:revoked:j-1"], [6_000_000, 10]
        packed = limiter._batch._command(limiter._windows_script, keys, args)
        command = ("EVALSHA", limiter._windows_script.sha, len(keys), *keys, *args)
        assert packed == b"".join(Connection().pack_command(*command))


class TestThroughTheApp:
    async def test_key_shapes(self, asgi_client: Client, valkey_url: str, store: RedisCacheStore) -> None:
        user = unique()
        settings = distributed_settings(
            valkey_url,
            # A key lives until its bucket is full again: 2 a minute keeps it ~30 s after one request, long
            # enough to read its TTL on a loaded machine (at the default 600 a minute it is gone after 0.1 s).
            per_user_rpm=2,
            per_ip_rpm=2,
            routes={
                "POST /api/*/uploads": {"requests_per_minute": 5},
                "GET /api/v1/missing": {"requests_per_hour": 5, "per_user": False},
            },
        )
        client = asgi_client(service(), settings)
        headers = {"x-test-sub": user}
        await client.get("/api/v1/items", headers=headers)
        await client.post("/api/v1/uploads", headers=headers)
        await client.get("/api/v1/missing", headers=headers)
        await client.get("/api/v1/items", headers={"x-test-sub": "-"})
        assert 0 < await store.client.pttl(f"rate_limit:user:{user}:60") <= 60_000
        assert 0 < await store.client.pttl(f"route:POST /api/*/uploads:user:{user}") <= 60_000
        assert 0 < await store.client.pttl("route:GET /api/v1/missing:global") <= 3_600_000
        assert 0 < await store.client.pttl("rate_limit:ip:127.0.0.1:60") <= 60_000

    async def test_two_instances_share_one_limit_exactly(
        self, asgi_client: Client, valkey_url: str, store: RedisCacheStore
    ) -> None:
        """Two apps (two instances) hammered concurrently: N requests pass in total, not 2N."""
        limit, user = 20, unique()
        # A pool as large as the load: the cache store's pool refuses, rather than queues, beyond max_connections.
        settings = distributed_settings(valkey_url, max_connections=64, per_user_rpm=limit, window_secs=3600)
        first, second = asgi_client(service(), settings), asgi_client(service(), settings)
        headers = {"x-test-sub": user}
        requests = [
            client.get("/api/v1/items", headers=headers) for _ in range(3 * limit) for client in (first, second)
        ]
        statuses = [response.status_code for response in await asyncio.gather(*requests)]
        assert statuses.count(200) == limit
        assert statuses.count(429) == 5 * limit

    async def test_local_limiters_do_not_share(self, asgi_client: Client) -> None:
        """The contrast: the local limiter is per instance, so two instances allow 2N."""
        settings = Settings.model_validate({"token": {"enabled": False}, "rate_limit": {"per_user_rpm": 3}})
        first, second = asgi_client(service(), settings), asgi_client(service(), settings)
        statuses = [(await client.get("/api/v1/items")).status_code for client in (first, second) for _ in range(5)]
        assert statuses.count(200) == 6

    async def test_cache_store_outage_is_500_without_audit(self, asgi_client: Client, dead_redis_url: str) -> None:
        calls: list[str] = []
        client = asgi_client(service(calls=calls), distributed_settings(dead_redis_url))
        with capture_logs() as logs:
            responses = [await client.get("/api/v1/items") for _ in range(3)]
        for response in responses:
            assert response.status_code == 500
            assert response.json() == {"error": "Cache store unavailable", "code": "CACHE_STORE_ERROR", "status": 500}
            assert "x-ratelimit-limit" not in response.headers
        assert calls == []  # never an uncounted pass-through
        events = [entry["event"] for entry in logs]
        assert "HttpRequestDenied" not in events
        assert events.count("rate_limit_store_unavailable") == 1  # once per outage, not per request

    async def test_operator_wired_distributed_limiter(self, asgi_client: Client, valkey_url: str) -> None:
        """auto_apply = false and distributed = false: nothing built in; the operator plugs it in by hand."""
        from bastion.ratelimit import RateLimiting

        settings = Settings.model_validate(
            {
                "token": {"enabled": False},
                "rate_limit": {"auto_apply": False, "per_user_rpm": 1},
                "cache_store": {"url": valkey_url},
            }
        )
        store = RedisCacheStore(valkey_url)
        svc: Service = service()
        svc.use(Slot.RATE_LIMIT, RateLimiting.distributed(settings.rate_limit, store).layer)
        svc.on_shutdown(store.close)
        client = asgi_client(svc, settings)
        user = {"x-test-sub": unique()}
        try:
            assert (await client.get("/api/v1/items", headers=user)).status_code == 200
            assert (await client.get("/api/v1/items", headers=user)).status_code == 429
        finally:
            await store.close()


class TestOnTheMemoryStore:
    async def test_same_algorithm_on_the_memory_store(self) -> None:
        clock = FakeClock()
        memory = MemoryCacheStore(clock=clock)
        limiter = DistributedLimiter(memory, clock=clock)
        bucket = Bucket(key="rate_limit:user:alice:60", quota=Quota.per_minute(2))
        assert [(await limiter.charge(bucket)).allowed for _ in range(3)] == [True, True, False]
        clock.advance(30)
        assert (await limiter.charge(bucket)).allowed
        clock.advance(60)
        assert await memory.get(bucket.key) is None  # expired with the bucket

    async def test_store_failure_is_never_a_pass(self) -> None:
        class BrokenStore(MemoryCacheStore):
            async def get(self, key: str) -> bytes | None:
                raise CacheStoreError()

        limiter = DistributedLimiter(BrokenStore())
        with pytest.raises(CacheStoreError):
            await limiter.charge(Bucket(key="k", quota=Quota.per_minute(1)))

    async def test_unreadable_value_is_overwritten(self) -> None:
        memory = MemoryCacheStore()
        await memory.set("k", b"garbage", ttl_secs=60)
        outcome = await DistributedLimiter(memory).charge(Bucket(key="k", quota=Quota.per_minute(1)))
        assert outcome.allowed
        assert (await memory.get("k") or b"").isdigit()
