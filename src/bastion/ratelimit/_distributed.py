"""The distributed limiter: GCRA buckets in the cache store, shared by every instance.

On Redis/Valkey each charge is one round trip (with token revocation on, the revocation check rides in the same
script: ``charge_unless_revoked``): an atomic Lua script (``EVALSHA``, loaded again by
redis-py if the server lost it) that reads the bucket, decides, and writes it back with an expiry of the
time until the bucket is full again (at most ``window_secs`` when the burst is the per-window limit). The
script takes the time from the server (``TIME``), so instances with skewed clocks still share one limit.

Any cache-store failure raises :class:`~bastion.errors.CacheStoreError` (500): a request is never let
through uncounted. Without ``cache_store.url`` the app's store is in-process memory; the same algorithm
then runs on it under a lock (one instance only, like the local limiter).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

import structlog

from bastion._cache_store import CacheStore, RedisCacheStore
from bastion.errors import CacheStoreError
from bastion.ratelimit._buckets import Bucket, Outcome, combine
from bastion.ratelimit._local import gcra
from bastion_core import running_loop

log = structlog.get_logger("bastion.ratelimit")

MICROS = 1_000_000

# KEYS[1] = bucket key; ARGV[1] = emission interval (microseconds), ARGV[2] = burst.
# Returns "allowed (0/1) remaining retry_after_us reset_after_us now_us". Same logic as local.gcra().
# The scripts answer one string of integers, not an array: redis-py reads a bulk string in two reads where an array
# of n integers takes n + 1 line reads, the dearest part of parsing a reply (bench/README.md).
GCRA_SCRIPT = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '') or now
if tat < now then tat = now end
local new_tat = tat + interval
local allow_at = new_tat - burst * interval
if now < allow_at then
  return string.format('0 0 %.0f %.0f %.0f', allow_at - now, tat - now, now)
end
local ttl_ms = math.max(1, math.ceil((new_tat - now) / 1000))
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', ttl_ms)
return string.format('1 %.0f 0 %.0f %.0f', math.floor((now - allow_at) / interval), new_tat - now, now)
"""
# The same with a revocation check first, so that token revocation and the limiter cost one round trip:
# KEYS[2] = jwt:revoked:{jti}; a revoked token returns "-1 ..." and charges nothing.
REVOKED = -1
GCRA_UNLESS_REVOKED_SCRIPT = (
    "if redis.call('EXISTS', KEYS[2]) == 1 then return '-1 0 0 0 0' end\n" + GCRA_SCRIPT.lstrip("\n")
)
# Several windows in one script, so a plan's minute and day windows still cost one round trip: KEYS[1..n] the
# windows' keys (KEYS[n+1], when given, a jwt:revoked:{jti} key checked first); ARGV[1] = n, then the interval
# (microseconds) and burst of each window. Every window decides; the request counts in all of them only when
# all allow it. Returns "allowed retry_after_us now_us remaining_1 reset_after_us_1 ..."
WINDOWS_SCRIPT = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local n = tonumber(ARGV[1])
if #KEYS > n and redis.call('EXISTS', KEYS[n + 1]) == 1 then return '-1 0 0' end
local out = {1, 0, now}
local tats = {}
for i = 1, n do
  local interval = tonumber(ARGV[2 * i])
  local burst = tonumber(ARGV[2 * i + 1])
  local tat = tonumber(redis.call('GET', KEYS[i]) or '') or now
  if tat < now then tat = now end
  local new_tat = tat + interval
  local allow_at = new_tat - burst * interval
  if now < allow_at then
    out[1] = 0
    if allow_at - now > out[2] then out[2] = allow_at - now end
    out[#out + 1] = -1
    out[#out + 1] = tat - now
  else
    tats[i] = new_tat
    out[#out + 1] = math.floor((now - allow_at) / interval)
    out[#out + 1] = new_tat - now
  end
end
if out[1] == 1 then
  for i = 1, n do
    redis.call('SET', KEYS[i], string.format('%.0f', tats[i]), 'PX', math.max(1, math.ceil((tats[i] - now) / 1000)))
  end
end
for i = 1, #out do out[i] = string.format('%.0f', out[i]) end
return table.concat(out, ' ')
"""


class DistributedLimiter:
    """A :class:`~bastion.ratelimit._buckets.LimiterStore` over a :class:`~bastion._cache_store.CacheStore`.

    A :class:`~bastion._cache_store.RedisCacheStore` is charged with the Lua script (one round trip, atomic
    across instances); any other store with ``get``/``set`` under a per-process lock. ``clock`` (Unix
    seconds) is used only on that second path; the script reads the server's clock.
    """

    def __init__(self, store: CacheStore, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self._clock = clock
        self._lock = asyncio.Lock()
        self._script: Any = None
        self._errors: tuple[type[BaseException], ...] = (OSError, asyncio.TimeoutError)
        self._down = False
        if isinstance(store, RedisCacheStore):
            from redis.exceptions import RedisError

            self._script = store.client.register_script(GCRA_SCRIPT)
            self._script_unless_revoked = store.client.register_script(GCRA_UNLESS_REVOKED_SCRIPT)
            self._windows_script = store.client.register_script(WINDOWS_SCRIPT)
            self._batch = ScriptBatch(store.client)
            self._errors = (RedisError, OSError, asyncio.TimeoutError)

    @property
    def shared(self) -> bool:
        """On Redis/Valkey: each charge (with a revocation check or not) is one atomic round trip."""
        return self._script is not None

    async def charge(self, bucket: Bucket) -> Outcome:
        if self._script is None:
            return await self._charge_generic(bucket)
        if bucket.more:
            outcome = await self._run_windows(bucket, None)
        else:
            outcome = await self._run(self._script, [bucket.key], bucket)
        assert outcome is not None
        return outcome

    async def charge_unless_revoked(self, bucket: Bucket, revocation_key: str) -> Outcome | None:
        """None when ``revocation_key`` exists (the token is revoked; nothing is charged), else the charge's
        outcome: on Redis/Valkey in one round trip (one script)."""
        if self._script is None:
            if await self.store.exists(revocation_key):  # CacheStoreError propagates: fail closed
                return None
            return await self._charge_generic(bucket)
        if bucket.more:
            return await self._run_windows(bucket, revocation_key)
        return await self._run(self._script_unless_revoked, [bucket.key, revocation_key], bucket)

    async def _run(self, script: Any, keys: list[str], bucket: Bucket) -> Outcome | None:
        quota = bucket.quota
        interval_us = max(1, round(quota.interval_secs * MICROS))
        try:
            reply = await self._batch.call(script, keys, [interval_us, quota.burst])
        except self._errors as exc:
            raise self._failed(exc) from exc
        self._recovered()
        allowed, remaining, retry_after_us, reset_after_us, now_us = map(int, reply.split())
        if allowed == REVOKED:
            return None
        return Outcome(
            bool(allowed),
            quota.limit,
            remaining,
            retry_after_us / MICROS,
            (now_us + reset_after_us) / MICROS,
            (),
            quota.period_secs,
        )

    async def _run_windows(self, bucket: Bucket, revocation_key: str | None) -> Outcome | None:
        windows = bucket.windows()
        keys = [key for key, _ in windows]
        args = [len(windows)]
        for _, quota in windows:
            args += [max(1, round(quota.interval_secs * MICROS)), quota.burst]
        try:
            reply = await self._batch.call(
                self._windows_script, keys if revocation_key is None else [*keys, revocation_key], args
            )
        except self._errors as exc:
            raise self._failed(exc) from exc
        self._recovered()
        allowed, retry_after_us, now_us, *states = map(int, reply.split())
        if allowed == REVOKED:
            return None
        decided = []
        for index, (_, quota) in enumerate(windows):
            remaining, reset_after_us = states[2 * index], states[2 * index + 1]
            ok = remaining >= 0
            retry_after = 0.0 if ok else retry_after_us / MICROS
            decided.append((quota, ok, max(0, remaining), retry_after, reset_after_us / MICROS))
        return combine(tuple(decided), now_us / MICROS)

    async def _charge_generic(self, bucket: Bucket) -> Outcome:
        async with self._lock:
            # CacheStoreError propagates: never pass uncounted
            raws = [await self.store.get(key) for key, _ in bucket.windows()]
            now = self._clock()
            steps = [
                gcra(_parse_tat(raw), now, interval=quota.interval_secs, burst=quota.burst)
                for raw, (_, quota) in zip(raws, bucket.windows(), strict=True)
            ]
            if all(step.allowed for step in steps):
                for step, (key, _) in zip(steps, bucket.windows(), strict=True):
                    await self.store.set(key, b"%d" % round(step.tat * MICROS), ttl_secs=step.reset_after)
        if not bucket.more:
            step, quota = steps[0], bucket.quota
            reset_at = now + step.reset_after
            return Outcome(step.allowed, quota.limit, step.remaining, step.retry_after, reset_at, (), quota.period_secs)
        windows = tuple(
            (quota, step.allowed, step.remaining, step.retry_after, step.reset_after)
            for step, (_, quota) in zip(steps, bucket.windows(), strict=True)
        )
        return combine(windows, now)

    def _failed(self, exc: BaseException) -> CacheStoreError:
        if not self._down:
            self._down = True
            log.error("rate_limit_store_unavailable", error=f"{type(exc).__name__}: {exc}")
        return CacheStoreError()

    def _recovered(self) -> None:
        if self._down:
            self._down = False
            log.info("rate_limit_store_recovered")


class ScriptBatch:
    """Auto-pipelining of script calls: the calls made during one event-loop iteration (the requests in flight
    reaching the limiter together) go to the server as one pipeline, one write and one read on one pooled
    connection, instead of a connection checkout, a write and a read each. redis-py's client costs about 55-80 us
    of CPU per call here; a batch of n costs about that once plus a few us per call.

    The batch is written and read on the pooled connection itself (redis-py's public ``Connection`` API:
    ``pack_commands``, ``send_packed_command``, ``read_response``), not through a ``Pipeline``: that skips the
    pipeline's command stack, retry wrapper and per-reply timeout (one timer for the whole batch instead, of the
    connection's ``socket_timeout``: ``cache_store.timeout_secs``), about 15 us of CPU per request at 4 in flight
    (bench/README.md).

    Each call still gets its own reply or error: a script error fails that call only; a connection error or a
    timeout fails every call of the batch (the limiter turns it into CacheStoreError: fail closed). A script the
    server does not have (NOSCRIPT: a restarted Valkey) is loaded and the call retried alone, as redis-py's
    ``Script`` does. A caller that gives up (its request timed out) just stops waiting.
    """

    def __init__(self, client: Any) -> None:
        from redis.exceptions import NoScriptError, ResponseError

        self.client = client
        self._no_script: type[Exception] = NoScriptError
        self._reply_error: type[Exception] = ResponseError
        self._encode: Callable[[str], bytes] = client.get_encoder().encode
        self._pending: list[tuple[Any, list[str], list[int], asyncio.Future[Any]]] = []
        self._sending: set[asyncio.Task[None]] = set()

    def call(self, script: Any, keys: list[str], args: list[int]) -> asyncio.Future[Any]:
        loop = running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((script, keys, args, future))
        return future

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = running_loop().create_task(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[Any, list[str], list[int], asyncio.Future[Any]]]) -> None:
        try:
            replies = await self._exchange(
                b"".join(self._command(script, keys, args) for script, keys, args, _ in batch), len(batch)
            )
        except BaseException as exc:  # connection lost, timeout, cancelled: every call of the batch fails
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
            if not isinstance(exc, Exception):
                raise
            return
        for (script, keys, args, future), reply in zip(batch, replies, strict=True):
            if future.done():
                continue
            if isinstance(reply, self._no_script):
                self._retry(script, keys, args, future)
            elif isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    def _command(self, script: Any, keys: list[str], args: list[int]) -> bytes:
        """``EVALSHA sha len(keys) *keys *args`` in the protocol (RESP): what redis-py's ``pack_command`` makes, keys
        encoded by the client's own encoder, in about half its time (no general cases: every argument is
        small)."""
        items = [script.sha.encode(), b"%d" % len(keys), *map(self._encode, keys), *(b"%d" % arg for arg in args)]
        return b"*%d\r\n$7\r\nEVALSHA\r\n%s" % (
            len(items) + 1,
            b"".join(b"$%d\r\n%s\r\n" % (len(item), item) for item in items),
        )

    async def _exchange(self, packed: bytes, count: int) -> list[Any]:
        """One write of ``count`` packed commands and their replies in order, on one pooled connection; a reply that
        is an error (NOSCRIPT, a script error) is returned in its place. A timeout or connection error closes the
        connection (redis-py does, so the next batch reconnects) and raises."""
        pool = self.client.connection_pool
        connection = await pool.get_connection()
        try:
            async with asyncio.timeout(connection.socket_timeout):
                await connection.send_packed_command(packed)
                replies: list[Any] = []
                for _ in range(count):
                    try:
                        replies.append(await connection.read_response(timeout=math.inf))
                    except self._reply_error as exc:
                        replies.append(exc)
        finally:
            await pool.release(connection)
        return replies

    def _retry(self, script: Any, keys: list[str], args: list[int], future: asyncio.Future[Any]) -> None:
        """The call alone through redis-py's Script, which loads the script first."""

        async def again() -> None:
            try:
                reply = await script(keys=keys, args=args)
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)
                return
            if not future.done():
                future.set_result(reply)

        task = asyncio.get_running_loop().create_task(again())
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)


def _parse_tat(raw: bytes | None) -> float | None:
    if raw is None:
        return None
    try:
        return int(raw) / MICROS
    except ValueError:
        return None  # an unreadable value is treated as a full bucket and overwritten
