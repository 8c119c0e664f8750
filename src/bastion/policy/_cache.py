"""Decision caching: an in-process LRU with a TTL, keyed by everything the decision depends on."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from bastion._cache_store import CacheStore
from bastion._lru import LRU
from bastion.policy._engine import Decision


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((key, _frozen(item)) for key, item in value.items()))
    if isinstance(value, set | frozenset):
        return tuple(sorted((_frozen(item) for item in value), key=repr))  # one order in every process
    if isinstance(value, list | tuple):
        return tuple(_frozen(item) for item in value)
    return value


def frozen_flat(values: Mapping[str, Any]) -> Hashable:
    """A hashable form of a flat mapping of plain values (the common case), else of any nesting."""
    if not values:
        return ()  # a route without path parameters
    items = tuple(sorted(values.items()))
    try:
        hash(items)
    except TypeError:
        nested: Hashable = _frozen(values)
        return nested
    return items


def decision_key(
    *,
    digest: str,
    principal: Hashable,
    action: str,
    resource: Mapping[str, Any],
    context: Mapping[str, Any],
) -> Hashable:
    """Everything a decision depends on: the policy version, the principal (a hashable form of every attribute
    it carries; the authorizer passes the claims' fields, ``None`` for the anonymous principal), the action,
    the resource attributes and the context attributes the loaded policies actually read (callers pass only
    those).

    A tuple, not a digest: hashing it is a fraction of a microsecond and it cannot collide.
    """
    return (digest, action, principal, frozen_flat(resource), frozen_flat(context))


class DecisionCache:
    """LRU of decisions that expire after ``ttl_secs``. Failed evaluations are never cached."""

    def __init__(self, *, size: int, ttl_secs: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.size = size
        self.ttl_secs = ttl_secs
        self._clock = clock
        self._entries: LRU[Hashable, tuple[Decision, float]] = LRU(size)
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> Decision | None:
        entry = self._entries.get(key)
        if entry is None or entry[1] <= self._clock():
            if entry is not None:
                self._entries.pop(key)
            self.misses += 1
            return None
        self.hits += 1
        return entry[0]

    def put(self, key: Hashable, decision: Decision) -> None:
        if decision.failed or self.ttl_secs <= 0:
            return
        self._entries.put(key, (decision, self._clock() + self.ttl_secs))

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


class SharedDecisionCache:
    """Decisions in the cache store (``policy.cache_backend = "cache_store"``), shared by every instance.

    The key is a SHA-256 of everything the decision depends on, the policy-set digest included, so a reload
    anywhere makes the old entries unreachable (they expire after ``ttl_secs``). A cache-store outage raises
    CacheStoreError: the request fails closed with 500, as the spec's Errors table asks for a cache-store
    connection problem (the in-process backend has no such dependency).
    """

    PREFIX = "policy:decision:"

    def __init__(self, store: CacheStore, *, ttl_secs: float) -> None:
        self.store = store
        self.ttl_secs = ttl_secs

    @classmethod
    def store_key(cls, key: Hashable) -> str:
        return cls.PREFIX + hashlib.sha256(repr(key).encode()).hexdigest()

    async def get(self, key: Hashable) -> Decision | None:
        raw = await self.store.get(self.store_key(key))
        if raw is None:
            return None
        value = json.loads(raw)
        return Decision(allowed=bool(value["allowed"]), reasons=tuple(value["reasons"]))

    async def put(self, key: Hashable, decision: Decision) -> None:
        if decision.failed or self.ttl_secs <= 0:
            return
        body = json.dumps({"allowed": decision.allowed, "reasons": list(decision.reasons)}).encode()
        await self.store.set(self.store_key(key), body, ttl_secs=self.ttl_secs)
