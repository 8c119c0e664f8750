"""Micro-benchmark of the guards' cached path: what token auth, rate limit and policy cost per request.

Run by hand (not part of the test suite)::

    .venv/bin/python -m bench.guards_micro

The ``bastion-secured`` app of ``bench.pipeline_micro`` (RS256 token, local limiter that never trips, Cedar policy)
serves one ``GET /api/v2/documents``; the scope its guards saw is kept, and their checks are then called on copies
of it as the fused pipeline calls them (exemptions, the check, the outcome's cleanup): the token guard alone, then
token and rate limit, then all three, so each guard's figure is the difference. Every cache is warm (token
verified, decision cached). Prints microseconds of this process's CPU per request, the median of 9 rounds (the
garbage collector off while a round runs). Run it in two checkouts, interleaved, for an A/B of a change: it only
uses what both have (``Checks.guards``, ``Checks.plains``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time
from pathlib import Path
from types import CoroutineType

import bastion._fused as fused
from bastion.testing import TokenMinter
from bastion.types import Receive, Scope, Send
from bench.pipeline_micro import SECURED, build, get_once

ROUNDS = 9


def captured_guards() -> tuple[fused.Checks, Scope]:
    """The secured app's run of plain steps and guards, and the scope of one request as its guards see it."""
    minter = TokenMinter("RS256")
    token = minter.mint(sub="alice", roles=["user"], ttl=3600)
    with tempfile.TemporaryDirectory() as tmp:
        key = Path(tmp) / "public.pem"
        key.write_bytes(minter.public_pem())
        secured = build(key, SECURED)
    headers = [(b"host", b"bench"), (b"accept", b"*/*"), (b"user-agent", b"bench")]
    headers.append((b"authorization", f"Bearer {token}".encode()))
    seen: dict[str, object] = {}
    original = fused.Checks.__call__

    async def spy(self: fused.Checks, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and "scope" not in seen:
            for plain in self.plains:
                receive = plain.enter(scope, receive) or receive
            seen["scope"], seen["checks"] = dict(scope), self
        await original(self, scope, receive, send)

    fused.Checks.__call__ = spy  # type: ignore[method-assign]
    try:
        asyncio.run(get_once(secured, headers)())
    finally:
        fused.Checks.__call__ = original  # type: ignore[method-assign]
    return seen["checks"], seen["scope"]  # type: ignore[return-value]


async def guards_us(checks: fused.Checks, scope: Scope, n: int) -> list[float]:
    """CPU per request of the first 1, 2 and 3 guards, medians."""
    results: list[list[float]] = [[], [], []]
    for _ in range(ROUNDS):
        for count, times in enumerate(results, start=1):
            guards = checks.guards[:count]
            scopes = [dict(scope) for _ in range(n)]
            gc.collect()
            gc.disable()
            start = time.process_time_ns()
            for copy in scopes:
                for skips, check in guards:
                    if skips(copy):
                        continue
                    outcome = check(copy)
                    if type(outcome) is CoroutineType:
                        outcome = await outcome
                    if outcome is not None:
                        outcome.callback()  # token auth's Cleanup: unbind the caller's sub
            times.append((time.process_time_ns() - start) / n / 1000)
            gc.enable()
    return [statistics.median(times) for times in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=20_000, help="requests per round")
    args = parser.parse_args()
    checks, scope = captured_guards()
    token, limit, policy = asyncio.run(guards_us(checks, scope, args.n))
    print(f"token auth {token:6.2f} us  rate limit {limit - token:6.2f} us  policy {policy - limit:6.2f} us")
    print(f"the three  {policy:6.2f} us")


if __name__ == "__main__":
    main()
