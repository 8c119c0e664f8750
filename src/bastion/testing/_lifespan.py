"""Drive an ASGI app's lifespan the way a server does: start-up before the first request, shutdown after the last.

A test client without this would serve requests to an app whose start-up hooks, broker and readiness never
ran (Starlette's TestClient outside ``with`` does exactly that), so tests would pass against an app that
production never sees.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bastion.types import ASGIApp, Message


class Lifespan:
    """One run of ``app``'s lifespan protocol: :meth:`start`, then :meth:`stop`, in the same event loop.

    Both raise RuntimeError with the app's own message when it reports ``lifespan.startup.failed`` /
    ``lifespan.shutdown.failed``, or when the lifespan task ends (or raises) without answering.
    """

    def __init__(self, app: ASGIApp, *, name: str) -> None:
        self.app = app
        self.name = name
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._outbox: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.state: dict[str, Any] = {}
        """The lifespan state the app filled at start-up; a server gives each request a copy (``request.state``)."""

    async def start(self) -> None:
        self.state = {}
        scope: dict[str, Any] = {
            "type": "lifespan",
            "asgi": {"version": "3.0", "spec_version": "2.0"},
            "state": self.state,
        }

        async def run() -> None:
            await self.app(scope, self._inbox.get, self._outbox.put)

        self._task = asyncio.create_task(run(), name="lifespan")
        answer = await self._exchange("lifespan.startup")
        if answer["type"] != "lifespan.startup.complete":
            error = await self._finish(cancel=True)
            message = answer.get("message") or answer["type"]
            raise RuntimeError(f"service {self.name!r} failed to start: {message}") from error

    async def stop(self) -> None:
        if self._task is None:
            return
        answer = await self._exchange("lifespan.shutdown")
        error = await self._finish(cancel=False)
        if answer["type"] != "lifespan.shutdown.complete" or error is not None:
            message = answer.get("message") or (f"{type(error).__name__}: {error}" if error else answer["type"])
            raise RuntimeError(f"service {self.name!r} failed to shut down: {message}") from error

    async def _exchange(self, event: str) -> Message:
        """Send ``event`` and wait for the app's answer, or for the lifespan task to end without one."""
        assert self._task is not None
        await self._inbox.put({"type": event})
        answer = asyncio.ensure_future(self._outbox.get())
        await asyncio.wait({answer, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if answer.done():
            return answer.result()
        answer.cancel()
        error = None if self._task.cancelled() else self._task.exception()
        detail = f": {type(error).__name__}: {error}" if error is not None else ""
        return {"type": f"{event}.failed", "message": f"the lifespan ended without answering {event!r}{detail}"}

    async def _finish(self, *, cancel: bool) -> BaseException | None:
        """Wait for the lifespan task to end (cancelled first when ``cancel``); the exception it ended with."""
        task, self._task = self._task, None
        if task is None:
            return None
        if cancel:
            task.cancel()
        await asyncio.wait({task})  # unlike `await task`, neither raises its exception nor swallows our cancel
        return None if task.cancelled() else task.exception()
