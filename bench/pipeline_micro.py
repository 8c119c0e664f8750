"""Micro-benchmark of issue 35's compiled pipeline: what the layers cost per request, fused against nested.

Run by hand (not part of the test suite)::

    .venv/bin/python -m bench.pipeline_micro            # the bastion-secured and bastion-open rows' settings
    .venv/bin/python -m bench.pipeline_micro --profile  # and cProfile's top entries of the fused secured row

``GET /api/v2/documents`` of the example API (the handler every HTTP row of ``bench.harness`` serves), driven
in-process through the ASGI app (no sockets, no server: the pipeline's own cost plus the handler), with the
environment of the ``bastion-secured`` row (RS256 token, Cedar policy, local rate limiter that never trips; metrics
on, access log off) and of the ``bastion-open`` row. Each app is driven twice: as built (``assemble``: adjacent
steps fused, ``bastion._pipeline``) and with the same steps nested one ASGI layer each (``assemble(fuse=False)``).

Prints microseconds of this process's CPU per request (``time.process_time``), the median of several rounds, the
rows interleaved round by round (so drift on a shared machine spreads over all of them).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bastion import BastionApp, load_settings
from bastion._pipeline import assemble
from bastion.testing import TokenMinter
from bastion.types import ASGIApp, Message, Scope
from examples.documents_api import create_service
from examples.documents_api.store import seeded_store

ROUNDS = 9
EXAMPLE_CONFIG = Path("examples/documents_api/config.toml")
PATH = "/api/v2/documents"
NEVER_TRIP = "1000000000"
COMMON = {
    "SERVICE_LOG_LEVEL": "warning",
    "SERVICE_MIDDLEWARE_ACCESS_LOG_ENABLED": "false",
    "SERVICE_GRPC_ENABLED": "false",
    "SERVICE_POLICY_HOT_RELOAD": "false",
}
SECURED = {
    "SERVICE_TOKEN_ENABLED": "true",
    "SERVICE_POLICY_ENABLED": "true",
    "SERVICE_TOKEN_REVOCATION_ENABLED": "false",
    "SERVICE_RATE_LIMIT_ENABLED": "true",
    "SERVICE_RATE_LIMIT_PER_USER_RPM": NEVER_TRIP,
    "SERVICE_RATE_LIMIT_PER_CLIENT_RPM": NEVER_TRIP,
    "SERVICE_RATE_LIMIT_PER_IP_RPM": NEVER_TRIP,
    "SERVICE_RATE_LIMIT_BURST_SIZE": NEVER_TRIP,
}
OPEN = {"SERVICE_TOKEN_ENABLED": "false", "SERVICE_POLICY_ENABLED": "false", "SERVICE_RATE_LIMIT_ENABLED": "false"}


def build(public_key: Path, environ: dict[str, str]) -> BastionApp:
    full = {**COMMON, "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(public_key), **environ}
    return create_service(seeded_store()).build(load_settings(EXAMPLE_CONFIG, environ=full))


def get_once(app: ASGIApp, headers: list[tuple[bytes, bytes]]) -> Callable[[], Awaitable[None]]:
    async def receive() -> Message:
        return {"type": "http.disconnect"}

    status = 0

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    async def once(prepared: Scope | None = None) -> None:
        scope: Scope = (
            dict(prepared)
            if prepared is not None
            else {
                "type": "http",
                "asgi": {"version": "3.0"},
                "http_version": "1.1",
                "method": "GET",
                "scheme": "http",
                "path": PATH,
                "raw_path": PATH.encode(),
                "root_path": "",
                "query_string": b"",
                "headers": headers,
                "client": ("127.0.0.1", 50000),
                "server": ("127.0.0.1", 8080),
            }
        )
        await app(scope, receive, send)
        if status != 200:
            raise RuntimeError(f"GET answered {status}")

    return once


async def median_us(fns: list[Callable[[], Awaitable[None]]], n: int) -> list[float]:
    results: list[list[float]] = [[] for _ in fns]
    for fn in fns:  # warm up: caches (token, policy decision), compiled paths
        for _ in range(200):
            await fn()
    for _ in range(ROUNDS):
        for fn, times in zip(fns, results, strict=True):
            start = time.process_time()
            for _ in range(n):
                await fn()
            times.append((time.process_time() - start) / n * 1e6)
    return [statistics.median(times) for times in results]


async def main_async(n: int, profile: bool) -> None:
    minter = TokenMinter("RS256")
    token = minter.mint(sub="alice", roles=["user"], ttl=3600)
    with tempfile.TemporaryDirectory() as tmp:
        key = Path(tmp) / "public.pem"
        key.write_bytes(minter.public_pem())
        secured, opened = build(key, SECURED), build(key, OPEN)
    base = [(b"host", b"bench"), (b"accept", b"*/*"), (b"user-agent", b"bench")]
    auth = [*base, (b"authorization", f"Bearer {token}".encode())]
    rows = {
        "secured, fused": get_once(secured, auth),
        "secured, nested": get_once(assemble(secured.steps, secured.dispatcher, fuse=False), auth),
        "open, fused": get_once(opened, base),
        "open, nested": get_once(assemble(opened.steps, opened.dispatcher, fuse=False), base),
    }
    medians = await median_us(list(rows.values()), n)
    print("steps (secured):", ", ".join(step.name for step in secured.steps))
    for name, value in zip(rows, medians, strict=True):
        print(f"{name:<20} {value:8.2f} us")
    if profile:
        once, profiler = rows["secured, fused"], cProfile.Profile()
        profiler.enable()
        for _ in range(n):
            await once()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=2000, help="requests per round and row")
    parser.add_argument("--profile", action="store_true", help="also print cProfile's top entries (secured, fused)")
    args = parser.parse_args()
    asyncio.run(main_async(args.n, args.profile))


if __name__ == "__main__":
    main()
