"""Microbenchmark: Cedar decision cost through PolicyGuard, uncached and cached.

Run: .venv/bin/python bench/policy_micro.py  (numbers go in the closing note / docs, never in tests)
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

from bastion._audit import Auditor
from bastion._claims import claims_from_payload
from bastion.config import AuditSettings, PolicySettings
from bastion.policy._capability import PolicyGuard
from bastion.routing._resolve import ResolvedRoute, RouteEntry
from bastion.types import SCOPE_CLAIMS, SCOPE_REQUEST_ID, SCOPE_ROUTE

POLICIES = Path(__file__).resolve().parent.parent / "examples" / "documents_api" / "policies.cedar"
ROUNDS, PER_ROUND = 7, 2000


def scope() -> dict[str, object]:
    entry = RouteEntry(path="/api/v2/documents/{user_id}/{doc_id}", methods=frozenset({"GET"}), version=2)
    route = ResolvedRoute(
        template=entry.template,
        path_params={"user_id": "alice", "doc_id": "doc-1"},
        version=2,
        method_allowed=True,
        allowed_methods=frozenset({"GET"}),
        entry=entry,
    )
    return {
        "type": "http",
        "method": "GET",
        "path": "/api/v2/documents/alice/doc-1",
        "headers": [(b"user-agent", b"bench/1.0")],
        "client": ("127.0.0.1", 5000),
        SCOPE_ROUTE: route,
        SCOPE_REQUEST_ID: "bench",
        SCOPE_CLAIMS: claims_from_payload({"sub": "alice", "exp": 9_999_999_999, "roles": ["user"]}),
    }


async def measure(cache_enabled: bool) -> list[float]:
    settings = PolicySettings(enabled=True, policy_path=str(POLICIES), cache_enabled=cache_enabled)
    owner = {"/api/v2/documents/{user_id}/{doc_id}": lambda scope, params: {"owner_id": params["user_id"]}}
    authorizer = PolicyGuard(settings, auditor=Auditor(AuditSettings()), extractors=owner)
    request = scope()
    await authorizer.check(request)
    results = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(PER_ROUND):
            await authorizer.check(request)
        results.append((time.perf_counter() - start) / PER_ROUND * 1e6)
    return results


async def main() -> None:
    for label, cached in (("uncached", False), ("cached", True)):
        samples = await measure(cached)
        median = statistics.median(samples)
        print(f"{label:9s} median {median:7.1f} us/decision  (min {min(samples):.1f}, max {max(samples):.1f})")


if __name__ == "__main__":
    asyncio.run(main())
