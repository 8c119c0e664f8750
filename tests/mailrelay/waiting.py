"""Waiting in async tests for something another task or process brings about."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

EVENTUALLY_SECS = 5.0
POLL_SECS = 0.01


async def eventually(predicate: Callable[[], bool], *, what: str, within: float = EVENTUALLY_SECS) -> None:
    """Return once ``predicate()`` holds: a bound against hangs, not a timing assertion (AssertionError naming
    `what` after `within` seconds)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"not within {within:g}s: {what}")
        await asyncio.sleep(POLL_SECS)
