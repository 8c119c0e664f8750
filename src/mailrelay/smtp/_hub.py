"""Bookkeeping shared by all connections of one listener: per-IP counts, live connections,
deliveries still running, and the shutting-down flag."""

from __future__ import annotations

import asyncio
import collections
from typing import Protocol

from mailrelay.smtp import _replies as replies
from mailrelay.smtp._replies import Reply


class Connection(Protocol):
    """What the hub and the shutdown need from a connection."""

    @property
    def busy(self) -> bool: ...

    def close_with(self, reply: Reply) -> None: ...


class ConnectionHub:
    """Bookkeeping shared by all connections of one listener: per-IP counts, live sessions,
    deliveries still running, and the shutting-down flag."""

    def __init__(self, *, max_per_ip: int, max_sessions: int = 100) -> None:
        self.max_per_ip = max_per_ip
        self.max_sessions = max_sessions
        self.per_ip: collections.Counter[str] = collections.Counter()
        self.connections: set[Connection] = set()
        self.deliveries: set[asyncio.Task[Reply]] = set()
        self.shutting_down = False
        self._changed = asyncio.Event()

    def admit(self, connection: Connection, ip: str) -> Reply | None:
        """Take the session, or the 421 to refuse it with: server-wide cap first, then the per-IP cap."""
        if len(self.connections) >= self.max_sessions:
            return replies.TOO_MANY_SESSIONS
        if self.per_ip[ip] >= self.max_per_ip:
            return replies.TOO_MANY_CONNECTIONS
        self.per_ip[ip] += 1
        self.connections.add(connection)
        return None

    def release(self, connection: Connection, ip: str) -> None:
        if connection in self.connections:
            self.connections.discard(connection)
            self.per_ip[ip] -= 1
            if self.per_ip[ip] <= 0:
                del self.per_ip[ip]
            self._changed.set()

    def track(self, task: asyncio.Task[Reply]) -> None:
        self.deliveries.add(task)
        task.add_done_callback(self._delivery_done)

    def _delivery_done(self, task: asyncio.Task[Reply]) -> None:
        self.deliveries.discard(task)
        self._changed.set()

    async def wait_idle(self, grace: float) -> None:
        """Return once no connection and no delivery is left, or after `grace` seconds."""
        try:
            async with asyncio.timeout(grace):
                while self.connections or self.deliveries:
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            pass
