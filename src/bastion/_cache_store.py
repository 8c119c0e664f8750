"""The cache store behind revocation, decision caching and the distributed limiter: Redis/Valkey or memory.

Both implementations fit :class:`CacheStore`. Every Redis error surfaces as
:class:`~bastion.errors.CacheStoreError` (a 500), logged once per outage rather than once per request.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple, Protocol

import structlog

from bastion import _extras as extras
from bastion.config import CacheStoreSettings
from bastion.errors import CacheStoreError

log = structlog.get_logger("bastion.cache_store")


class DeferredRevocation(NamedTuple):
    """A token's revocation check, left by token auth to the distributed limiter so that the check and the
    charge are one round trip to the cache store (both on, on Redis/Valkey).

    ``key``: the ``jwt:revoked:{jti}`` key to test. ``check()``: the check on its own (raises TokenRevoked), for a
    path that is not charged. ``revoked()``: the TokenRevoked (with its challenge) to raise when the combined call
    finds the key.
    """

    key: str
    check: Callable[[], Awaitable[None]]
    revoked: Callable[[], Exception]


class CacheStore(Protocol):
    """A small key-value store with expiry, shared by every instance when it is Redis/Valkey."""

    async def get(self, key: str) -> bytes | None: ...

    async def set(self, key: str, value: bytes, *, ttl_secs: float) -> None: ...

    async def exists(self, key: str) -> bool: ...

    async def claim(self, key: str, value: bytes, *, ttl_secs: float) -> bytes | None:
        """Set ``key`` to ``value`` unless it exists, atomically: ``None`` when set, else the value already there
        (unchanged). On Redis/Valkey one ``SET NX GET`` (Redis 7+)."""
        ...

    async def delete(self, key: str) -> None: ...

    async def ping(self) -> None: ...

    async def close(self) -> None: ...


class MemoryCacheStore:
    """In-process store: one instance only, lost on restart. Expired keys are dropped when read or swept.

    A sweep runs after every ``max(SWEEP_EVERY, len(self))`` writes, so its cost per write stays constant however
    many keys are held. ``max_bytes`` (unset: no cap) bounds the values held: past it the oldest writes are
    forgotten first, down to 15/16 of the cap at once (the idempotency step's own store uses it; never the store of
    revocations).

    The ``*_now`` methods are the same operations as plain calls, for a caller that holds this store itself (the
    idempotency step's own store): no coroutine per operation; ``replace_now`` also keeps the key's place in the
    order of writes.
    """

    SWEEP_EVERY = 1024

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, max_bytes: int | None = None) -> None:
        # Values and expiry times in two dicts of bytes and floats, not one of (value, expiry) tuples: a tuple per
        # write is one more object for the garbage collector until its first collection, and one per request (the
        # idempotency step's records) doubled the young collections and so brought the full ones (the whole heap)
        # twice as often. Dicts of bytes and floats are never tracked by the collector (bench/README.md, issue 32).
        self._values: dict[str, bytes] = {}
        """In the order of writes, oldest first (the byte cap forgets from the front)."""
        self._expires: dict[str, float] = {}
        self._clock = clock
        self._writes = 0
        self._next_sweep = self.SWEEP_EVERY
        self.max_bytes = max_bytes
        self._bytes = 0

    async def get(self, key: str) -> bytes | None:
        value = self._values.get(key)
        if value is None:
            return None
        if self._expires[key] <= self._clock():
            self._drop(key)
            return None
        return value

    async def set(self, key: str, value: bytes, *, ttl_secs: float) -> None:
        self.set_now(key, value, ttl_secs=ttl_secs)

    def set_now(self, key: str, value: bytes, *, ttl_secs: float) -> None:
        """:meth:`set` as a plain call (the store does no I/O): for a caller that knows it holds this store."""
        self._put(key, value, self._clock() + ttl_secs)

    def replace_now(self, key: str, value: bytes, *, ttl_secs: float) -> None:
        """:meth:`set_now` for a key this caller just wrote (the idempotency step's response after its claim): the
        value is replaced where the key stands in the order of writes (written milliseconds before), one dict write
        instead of a removal and an insertion. A key that is gone by now is set as usual."""
        values = self._values
        old = values.get(key)
        if old is None:
            self._add(key, value, self._clock() + ttl_secs)
            return
        values[key] = value
        self._expires[key] = self._clock() + ttl_secs
        if self.max_bytes is not None:
            self._bytes += len(value) - len(old)
            if self._bytes > self.max_bytes:
                self._forget_oldest(self.max_bytes - self.max_bytes // 16)

    def _put(self, key: str, value: bytes, expires: float) -> None:
        if key in self._values:
            self._drop(key)  # written again: now the newest
        self._add(key, value, expires)

    def _add(self, key: str, value: bytes, expires: float) -> None:
        """Write ``key``, which is not held: the newest write. Sweeps and keeps to the byte cap."""
        self._values[key] = value
        self._expires[key] = expires
        max_bytes = self.max_bytes
        if max_bytes is not None:
            self._bytes += len(value)
        self._writes += 1
        if self._writes >= self._next_sweep:
            now = self._clock()
            for stale in [k for k, expiry in self._expires.items() if expiry <= now]:
                self._drop(stale)
            self._next_sweep = self._writes + max(self.SWEEP_EVERY, len(self._values))
        if max_bytes is not None and self._bytes > max_bytes:
            self._forget_oldest(max_bytes - max_bytes // 16)

    def _forget_oldest(self, goal: int) -> None:
        """Drop the oldest writes until the values hold at most ``goal`` bytes. In one batch: a dict finds its
        oldest key by skipping the slots of the keys removed before it, so one key per write would cost a walk
        over them each time (about 50 us per write at 64 MiB of records); a batch pays it once."""
        victims = []
        held = self._bytes
        for key, value in self._values.items():
            if held <= goal:
                break
            victims.append(key)
            held -= len(value)
        for key in victims:
            self._drop(key)

    def _drop(self, key: str) -> None:
        value = self._values.pop(key, None)
        if value is not None:
            del self._expires[key]
            if self.max_bytes is not None:
                self._bytes -= len(value)

    async def exists(self, key: str) -> bool:
        return await self.get(key) is not None

    async def claim(self, key: str, value: bytes, *, ttl_secs: float) -> bytes | None:
        return self.claim_now(key, value, ttl_secs=ttl_secs)

    def claim_now(self, key: str, value: bytes, *, ttl_secs: float) -> bytes | None:
        """:meth:`claim` as a plain call."""
        now = self._clock()
        held = self._values.get(key)
        if held is not None:
            if self._expires[key] > now:
                return held
            self._drop(key)  # expired: written again below, as the newest
        self._add(key, value, now + ttl_secs)
        return None

    async def delete(self, key: str) -> None:
        self._drop(key)

    def delete_now(self, key: str) -> None:
        """:meth:`delete` as a plain call."""
        self._drop(key)

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def __len__(self) -> int:
        return len(self._values)


class RedisCacheStore:
    """Redis or Valkey through ``redis.asyncio``; connects lazily, pools up to ``max_connections``."""

    def __init__(self, url: str, *, max_connections: int = 10, timeout_secs: float = 1.0) -> None:
        import redis.asyncio as redis
        from redis.exceptions import RedisError

        self._redis_error: type[Exception] = RedisError
        # A blocking pool waits (up to the timeout) for a free connection under load instead of failing with
        # "Too many connections": more requests in flight than max_connections must not become 500s.
        pool = redis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout_secs,
            socket_timeout=timeout_secs,
            socket_connect_timeout=timeout_secs,
        )
        self.client = redis.Redis.from_pool(pool)
        self._down = False

    def available(self) -> bool:
        """False from a failed operation until one succeeds (``/ready``'s ping included): ``bastion_cache_store_up``."""
        return not self._down

    def _failed(self, exc: Exception) -> CacheStoreError:
        if not self._down:
            self._down = True
            log.error("cache_store_unavailable", error=f"{type(exc).__name__}: {exc}")
        return CacheStoreError()

    def _ok(self) -> None:
        if self._down:
            self._down = False
            log.info("cache_store_recovered")

    async def get(self, key: str) -> bytes | None:
        try:
            value = await self.client.get(key)
        except (self._redis_error, OSError) as exc:
            raise self._failed(exc) from exc
        self._ok()
        if value is None or isinstance(value, bytes):
            return value
        return str(value).encode()

    async def set(self, key: str, value: bytes, *, ttl_secs: float) -> None:
        try:
            await self.client.set(key, value, px=max(1, round(ttl_secs * 1000)))
        except (self._redis_error, OSError) as exc:
            raise self._failed(exc) from exc
        self._ok()

    async def exists(self, key: str) -> bool:
        try:
            found = await self.client.exists(key)
        except (self._redis_error, OSError) as exc:
            raise self._failed(exc) from exc
        self._ok()
        return bool(found)

    async def claim(self, key: str, value: bytes, *, ttl_secs: float) -> bytes | None:
        try:
            current = await self.client.set(key, value, px=max(1, round(ttl_secs * 1000)), nx=True, get=True)
        except (self._redis_error, OSError) as exc:
            raise self._failed(exc) from exc
        self._ok()
        if current is None or isinstance(current, bytes):
            return current
        return str(current).encode()

    async def delete(self, key: str) -> None:
        try:
            await self.client.delete(key)
        except (self._redis_error, OSError) as exc:
            raise self._failed(exc) from exc
        self._ok()

    async def ping(self) -> None:
        try:
            await self.client.ping()
        except (self._redis_error, OSError) as exc:
            raise self._failed(exc) from exc
        self._ok()

    async def close(self) -> None:
        await self.client.aclose()


def cache_store_from_settings(settings: CacheStoreSettings) -> CacheStore:
    """Redis/Valkey when ``cache_store.url`` is set, else the in-process memory store."""
    if settings.url is None:
        return MemoryCacheStore()
    extras.REDIS.require()
    return RedisCacheStore(
        settings.url.get_secret_value(),
        max_connections=settings.max_connections,
        timeout_secs=settings.timeout_secs,
    )
