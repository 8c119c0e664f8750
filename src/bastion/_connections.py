"""Connection slots: how many connections a port holds, in all and per client address.

One :class:`ConnectionSlots` per listening port and process. Every protocol that ends up owning a connection
(the sniffer until it hands over, HTTP/1.1, WebSocket, HTTP/2) holds its :class:`Slot` and releases it when the
connection is lost, so HTTP/2 and upgraded connections count as long as they live, like HTTP/1.1 ones.
"""

from __future__ import annotations

import math
from enum import Enum

REFUSAL_LOG_INTERVAL_SECS = 1.0
"""At most one ``connection_refused`` line per reason in this time: a flood of refused connections does not flood
the log (each line counts the refusals since the previous one)."""


class Refusal(Enum):
    """Why a connection was not admitted (the ``reason`` of the ``connection_refused`` log line)."""

    MAX_CONNECTIONS = "max_connections"
    MAX_CONNECTIONS_PER_IP = "max_connections_per_ip"


class Slot:
    """One admitted connection's place; :meth:`release` is idempotent."""

    __slots__ = ("_slots", "address")

    def __init__(self, slots: ConnectionSlots | None, address: str | None) -> None:
        self._slots = slots
        self.address = address

    def release(self) -> None:
        slots, self._slots = self._slots, None
        if slots is not None:
            slots._release(self.address)


class ConnectionSlots:
    """Counts a port's live connections, in all and per client address, against ``service.max_connections``
    and ``service.max_connections_per_ip`` (``0``: no per-address cap).

    A connection without an address (a Unix socket) counts in the total only.
    """

    __slots__ = ("_logged_at", "_unlogged", "by_address", "max_connections", "max_per_address", "total")

    def __init__(self, max_connections: int, max_per_address: int = 0) -> None:
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self.total = 0
        self.by_address: dict[str, int] = {}
        self._unlogged: dict[Refusal, int] = {}
        self._logged_at: dict[Refusal, float] = {}

    def refusal(self, address: str | None) -> Refusal | None:
        """Why a new connection from ``address`` would be refused now, or ``None`` when it may be admitted."""
        if self.max_per_address and address is not None and self.by_address.get(address, 0) >= self.max_per_address:
            return Refusal.MAX_CONNECTIONS_PER_IP
        if self.total >= self.max_connections:
            return Refusal.MAX_CONNECTIONS
        return None

    def take(self, address: str | None) -> Slot:
        """Admit a connection (check :meth:`refusal` first: this does not)."""
        self.total += 1
        if address is not None:
            self.by_address[address] = self.by_address.get(address, 0) + 1
        return Slot(self, address)

    def note_refusal(self, refusal: Refusal, now: float) -> int:
        """Count a refused connection. Returns how many were refused for this reason since its last log line when
        a line is due (the first refusal, then at most one per ``REFUSAL_LOG_INTERVAL_SECS``), else ``0``."""
        refused = self._unlogged.get(refusal, 0) + 1
        if now - self._logged_at.get(refusal, -math.inf) < REFUSAL_LOG_INTERVAL_SECS:
            self._unlogged[refusal] = refused
            return 0
        self._unlogged[refusal] = 0
        self._logged_at[refusal] = now
        return refused

    def _release(self, address: str | None) -> None:
        self.total -= 1
        if address is not None:
            left = self.by_address[address] - 1
            if left:
                self.by_address[address] = left
            else:
                del self.by_address[address]


UNCOUNTED = Slot(None, None)
"""The slot of a connection no cap counts (a protocol built outside a listener, e.g. in a unit test)."""
