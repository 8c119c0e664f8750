"""The bulkhead: a bounded pool of slots, a bounded wait, no slot ever lost."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from bastion_core import Bulkhead, BulkheadFullError, ConfigError


async def hold(bulkhead: Bulkhead, release: asyncio.Event) -> None:
    async with bulkhead.slot():
        await release.wait()


async def test_max_concurrent_callers_hold_slots_at_once() -> None:
    bulkhead = Bulkhead("db", max_concurrent=2, max_wait=0.05)
    release = asyncio.Event()
    holders = [asyncio.create_task(hold(bulkhead, release)) for _ in range(2)]
    await asyncio.sleep(0)
    assert bulkhead.in_use == 2
    with capture_logs() as logs, pytest.raises(BulkheadFullError) as info:
        await bulkhead.acquire()
    assert str(info.value) == "bulkhead 'db' is full (2 concurrent calls)"
    assert info.value.retry_after == 1
    assert [(e["event"], e["log_level"]) for e in logs] == [("bulkhead_rejected", "warning")]
    release.set()
    await asyncio.gather(*holders)
    assert (bulkhead.in_use, bulkhead.rejected) == (0, 1)


async def test_a_waiting_caller_gets_the_slot_released_in_time() -> None:
    bulkhead = Bulkhead("db", max_concurrent=1, max_wait=5)
    release = asyncio.Event()
    holder = asyncio.create_task(hold(bulkhead, release))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(bulkhead.acquire())
    await asyncio.sleep(0)
    assert bulkhead.snapshot().waiting == 1
    release.set()
    await asyncio.wait_for(waiter, 1)
    await holder
    assert bulkhead.in_use == 1  # the waiter holds the slot the holder gave back
    bulkhead.release()
    assert bulkhead.in_use == 0


async def test_a_cancelled_waiter_loses_no_slot() -> None:
    bulkhead = Bulkhead("db", max_concurrent=1, max_wait=5)
    await bulkhead.acquire()
    waiter = asyncio.create_task(bulkhead.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    bulkhead.release()
    assert (bulkhead.in_use, bulkhead.snapshot().waiting) == (0, 0)
    await asyncio.wait_for(bulkhead.acquire(), 1)  # the slot is there for the next caller


async def test_a_waiter_cancelled_as_the_slot_is_handed_over_passes_it_on() -> None:
    bulkhead = Bulkhead("db", max_concurrent=1, max_wait=5)
    await bulkhead.acquire()
    first = asyncio.create_task(bulkhead.acquire())
    second = asyncio.create_task(bulkhead.acquire())
    await asyncio.sleep(0)
    bulkhead.release()  # hands the slot to `first`...
    first.cancel()  # ...which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1)  # the slot went on to the next waiter
    assert bulkhead.in_use == 1


async def test_an_exception_in_the_block_returns_the_slot() -> None:
    bulkhead = Bulkhead("db", max_concurrent=1, max_wait=0.05)
    with pytest.raises(RuntimeError):
        async with bulkhead.slot():
            raise RuntimeError("boom")
    assert bulkhead.in_use == 0


async def test_a_block_stopped_by_a_timeout_returns_the_slot() -> None:
    bulkhead = Bulkhead("db", max_concurrent=1, max_wait=0.05)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01), bulkhead.slot():
            await asyncio.sleep(10)
    assert bulkhead.in_use == 0


async def test_bulkheads_have_independent_pools() -> None:
    first, second = Bulkhead("a", max_concurrent=1, max_wait=0.05), Bulkhead("b", max_concurrent=1, max_wait=0.05)
    await first.acquire()
    await second.acquire()  # not blocked by the other pool
    assert (first.in_use, second.in_use) == (1, 1)


@pytest.mark.parametrize(("key", "value"), [("max_concurrent", 0), ("max_wait", 0), ("max_wait", -1.0)])
def test_zero_or_negative_values_are_refused(key: str, value: float) -> None:
    with pytest.raises(ConfigError) as info:
        Bulkhead("db", **{key: value})  # type: ignore[arg-type]
    assert str(info.value) == f"bulkhead 'db': {key} must be positive, got {value!r}"
