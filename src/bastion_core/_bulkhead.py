"""The bulkhead: at most ``max_concurrent`` calls at once; a caller waits up to ``max_wait`` for a slot.

Each Bulkhead owns its own pool of slots (spec: "each bulkhead layer owns an independent slot pool").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

import structlog

from bastion_core._errors import ConfigError

log = structlog.get_logger("bastion_core.bulkhead")

DEFAULT_MAX_CONCURRENT = 100
DEFAULT_MAX_WAIT_SECS = 5.0
# What a refused caller is told to wait (Retry-After): slots free up within about one call.
BULKHEAD_RETRY_AFTER_SECS = 1


class BulkheadFullError(Exception):
    """No slot became free within ``max_wait``: the call was not made."""

    def __init__(self, name: str, max_concurrent: int) -> None:
        super().__init__(f"bulkhead {name!r} is full ({max_concurrent} concurrent calls)")
        self.name = name
        self.max_concurrent = max_concurrent
        self.retry_after = BULKHEAD_RETRY_AFTER_SECS


@dataclass(frozen=True, slots=True)
class BulkheadSnapshot:
    name: str
    max_concurrent: int
    in_use: int
    waiting: int
    rejected: int


class Bulkhead:
    """A pool of ``max_concurrent`` slots; ``async with bulkhead.slot():`` holds one for the block.

    A caller that gets no slot within ``max_wait`` seconds gets BulkheadFullError (counted in ``rejected``). A
    slot is returned whatever ends the block: success, an exception, a timeout or the caller's cancellation;
    a caller cancelled while waiting takes no slot. Logs ``bulkhead_permitted`` (debug) and
    ``bulkhead_rejected`` (warning).
    """

    def __init__(
        self,
        name: str = "default",
        *,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        max_wait: float = DEFAULT_MAX_WAIT_SECS,
    ) -> None:
        if not max_concurrent > 0:
            raise ConfigError(f"bulkhead {name!r}: max_concurrent must be positive, got {max_concurrent!r}")
        if not max_wait > 0:
            raise ConfigError(f"bulkhead {name!r}: max_wait must be positive, got {max_wait!r}")
        self.name = name
        self.max_concurrent = max_concurrent
        self.max_wait = max_wait
        self._free = max_concurrent
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.rejected = 0

    @property
    def in_use(self) -> int:
        return self.max_concurrent - self._free

    async def acquire(self) -> None:
        """Take a slot, waiting up to ``max_wait``; BulkheadFullError when none came free in time."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            log.debug("bulkhead_permitted", bulkhead=self.name, in_use=self.in_use)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self.max_wait):
                await waiter
        except BaseException as exc:  # the wait timed out, or the caller was cancelled
            if waiter.done() and not waiter.cancelled():
                self.release()  # a slot was handed over just as the caller gave up: pass it on
            else:
                waiter.cancel()
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                self.rejected += 1
                log.warning("bulkhead_rejected", bulkhead=self.name, max_concurrent=self.max_concurrent)
                raise BulkheadFullError(self.name, self.max_concurrent) from None
            raise
        log.debug("bulkhead_permitted", bulkhead=self.name, in_use=self.in_use)

    def release(self) -> None:
        """Return a slot: hand it to the longest waiter, or back to the pool."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()

    def snapshot(self) -> BulkheadSnapshot:
        return BulkheadSnapshot(
            name=self.name,
            max_concurrent=self.max_concurrent,
            in_use=self.in_use,
            waiting=len(self._waiters),
            rejected=self.rejected,
        )
