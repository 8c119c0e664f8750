"""The decision cache: TTL, LRU bound, failures never cached, keys that change with what matters."""

from __future__ import annotations

from bastion.policy._cache import DecisionCache, decision_key
from bastion.policy._engine import Decision
from bastion.testing import FakeClock

ALLOW = Decision(allowed=True, reasons=("p",))


def key(**overrides: object) -> str:
    base: dict[str, object] = {
        "digest": "d1",
        # The authorizer's principal key: (sub, roles, perms, username, email, client_id).
        "principal": ("a", ("user",), (), None, None, None),
        "action": "GET /x",
        "resource": {"owner_id": "a"},
        "context": {},
    }
    base.update(overrides)
    return decision_key(**base)  # type: ignore[arg-type]


def test_hit_until_ttl() -> None:
    clock = FakeClock(0.0)
    cache = DecisionCache(size=10, ttl_secs=300, clock=clock)
    cache.put("k", ALLOW)
    clock.now = 299.9
    assert cache.get("k") == ALLOW
    clock.now = 300
    assert cache.get("k") is None
    assert (cache.hits, cache.misses) == (1, 1)


def test_failures_are_not_cached() -> None:
    cache = DecisionCache(size=10, ttl_secs=300)
    cache.put("k", Decision(allowed=False, errors=("boom",)))
    assert cache.get("k") is None


def test_lru_bound() -> None:
    cache = DecisionCache(size=2, ttl_secs=300)
    cache.put("a", ALLOW)
    cache.put("b", ALLOW)
    cache.get("a")
    cache.put("c", ALLOW)
    assert cache.get("b") is None and cache.get("a") == ALLOW and len(cache) == 2


def test_key_changes_with_every_input() -> None:
    base = key()
    assert key() == base
    for change in (
        {"digest": "d2"},
        {"principal": ("a", ("admin",), (), None, None, None)},
        {"principal": None},  # the anonymous principal
        {"action": "PUT /x"},
        {"resource": {"owner_id": "b"}},
        {"context": {"timestamp": 1}},
    ):
        assert key(**change) != base, change


def test_key_ignores_dict_order() -> None:
    assert key(resource={"owner_id": "a", "doc_id": "1"}) == key(resource={"doc_id": "1", "owner_id": "a"})
