"""Decision caching: an in-process LRU with a TTL, keyed by everything the decision depends on."""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from bastion.policy.engine import Decision


def decision_key(
    *,
    digest: str,
    principal: Mapping[str, Any],
    action: str,
    resource: Mapping[str, Any],
    context: Mapping[str, Any],
) -> str:
    """A hash of the policy version, principal attributes, action, resource attributes and the context
    attributes the loaded policies actually read (callers pass only those)."""
    material = json.dumps(
        [digest, principal, action, resource, context], sort_keys=True, separators=(",", ":"), default=str
    )
    return hashlib.blake2b(material.encode(), digest_size=16).hexdigest()


class DecisionCache:
    """LRU of decisions that expire after ``ttl_secs``. Failed evaluations are never cached."""

    def __init__(self, *, size: int, ttl_secs: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.size = size
        self.ttl_secs = ttl_secs
        self._clock = clock
        self._entries: OrderedDict[str, tuple[Decision, float]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> Decision | None:
        entry = self._entries.get(key)
        if entry is None or entry[1] <= self._clock():
            if entry is not None:
                del self._entries[key]
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry[0]

    def put(self, key: str, decision: Decision) -> None:
        if decision.failed or not self.size or self.ttl_secs <= 0:
            return
        self._entries[key] = (decision, self._clock() + self.ttl_secs)
        self._entries.move_to_end(key)
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
