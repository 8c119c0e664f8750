"""Blocking work off the event loop: a bounded pool of threads, each call bounded in time once it runs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class BoundedExecutor:
    """Runs blocking calls (pyspf, dkimpy, boto3) on at most `workers` threads of its own.

    `run(limit, fn, ...)` waits for a free thread first (the wait does not count), then at most `limit`
    seconds for the call; past it TimeoutError is raised. A thread cannot be interrupted: the call itself must
    bound its own I/O (DNS lifetimes, socket timeouts) so that an abandoned thread finishes soon after.
    """

    def __init__(self, *, workers: int, name: str) -> None:
        self.workers = workers
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._slots: asyncio.Semaphore | None = None

    async def run(self, limit: float, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.workers)
        async with self._slots:
            future = asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))
            async with asyncio.timeout(limit):
                return await future

    def close(self) -> None:
        """Stop accepting work; calls already running finish in the background."""
        self._pool.shutdown(wait=False, cancel_futures=True)
