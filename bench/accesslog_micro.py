"""Micro-benchmark of issue 35's access log: what one line costs, and what it adds to a secured request.

Run by hand (not part of the test suite)::

    .venv/bin/python -m bench.accesslog_micro

1. ``ObserveMiddleware._log`` alone: the fields, the context variables (a request id and the caller's ``sub``, as a
   secured request binds them), the JSON line and its place in the once-per-loop-iteration write; JSON logging
   configured as ``bastion run`` does, the lines going to a temporary file.
2. ``GET /api/v2/documents`` of the example API, secured (RS256 token, Cedar policy, local rate limiter that never
   trips), driven in-process through the ASGI app (no sockets: the pipeline's own cost), access log off and on.

Prints microseconds of this process's CPU (``time.process_time``: on a shared machine wall time swings with the
neighbours' load), the best of several rounds, the rows interleaved round by round.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace

import structlog

from bastion import BastionApp, load_settings
from bastion.config import AccessLogSettings
from bastion.middleware._observe import ObserveMiddleware
from bastion.testing import TokenMinter
from bastion.types import SCOPE_CLAIMS, SCOPE_ROUTE, Scope
from bastion_core import configure_logging
from bench.pipeline_micro import get_once
from examples.documents_api import create_service
from examples.documents_api.store import seeded_store

ROUNDS = 9
EXAMPLE_CONFIG = Path("examples/documents_api/config.toml")
NEVER_TRIP = "1000000000"
PATH = "/api/v2/documents"


async def best_us(*fns: Callable[[], Awaitable[object]], n: int) -> list[float]:
    """The best of ROUNDS rounds of ``n`` calls of each of ``fns``, interleaved round by round."""
    results: list[list[float]] = [[] for _ in fns]
    for _ in range(ROUNDS):
        for fn, times in zip(fns, results, strict=True):
            start = time.process_time()
            for _ in range(n):
                await fn()
            times.append((time.process_time() - start) / n * 1e6)
            await asyncio.sleep(0.003)  # the pending lines' flush runs, as between a server's loop iterations
    return [min(times) for times in results]


def secured_app(tmp: Path, minter: TokenMinter, *, access_log: bool) -> BastionApp:
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
        "SERVICE_MIDDLEWARE_ACCESS_LOG_ENABLED": "true" if access_log else "false",
        "SERVICE_GRPC_ENABLED": "false",
    }
    return create_service(seeded_store()).build(load_settings(EXAMPLE_CONFIG, environ=environ))


def log_once() -> Callable[[], Awaitable[None]]:
    observe = ObserveMiddleware(None, access_log=AccessLogSettings(), metrics=None)  # type: ignore[arg-type]
    scope: Scope = {
        "type": "http",
        "method": "GET",
        "path": PATH,
        "client": ("127.0.0.1", 50000),
        "query_string": b"",
        "headers": [],
        SCOPE_CLAIMS: SimpleNamespace(sub="alice"),
        SCOPE_ROUTE: SimpleNamespace(template=PATH),
    }

    async def once() -> None:
        observe._log(scope, "http", "GET", PATH, 200, 0.0012345)

    return once


async def main_async(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, (Path(tmp) / "access.log").open("w") as sink:
        sys.stderr = sink  # where `bastion run` under a supervisor writes: a file, not a terminal
        try:
            configure_logging("info", "json")
            with structlog.contextvars.bound_contextvars(request_id="5f0c9a0e2b7d4c1e8a3b6d9f0e1c2b3a", sub="alice"):
                [line] = await best_us(log_once(), n=n * 4)
            minter = TokenMinter("RS256")
            token = minter.mint(sub="alice", roles=["user"], ttl=3600)
            headers = [(b"host", b"bench"), (b"authorization", f"Bearer {token}".encode())]
            off = get_once(secured_app(Path(tmp), minter, access_log=False), headers)
            on = get_once(secured_app(Path(tmp), minter, access_log=True), headers)
            await off()
            await on()
            plain, logged = await best_us(off, on, n=n)
        finally:
            sys.stderr = sys.__stderr__
    print(f"{'access line (ObserveMiddleware._log)':<52} {line:8.2f} us")
    print(f"{'GET secured, access log off':<52} {plain:8.2f} us")
    print(f"{'GET secured, access log on':<52} {logged:8.2f} us")
    print(f"{'  access log cost':<52} {(logged / plain - 1) * 100:8.2f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=2000, help="requests per round (the line row runs 4x as many)")
    args = parser.parse_args()
    asyncio.run(main_async(args.n))


if __name__ == "__main__":
    main()
