"""One bounded least-recently-used map, for the verified-token cache and the decision cache."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most ``size`` entries; a read or write makes an entry the most recent, the least recent goes first.

    ``size`` 0 keeps nothing (caching off). Not thread-safe: one event loop owns it.
    """

    __slots__ = ("_entries", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        if not self.size:
            return
        self._entries[key] = value
        self._entries.move_to_end(key)
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def pop(self, key: K) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()

    def items(self) -> list[tuple[K, V]]:
        """A snapshot of the entries, least recent first."""
        return list(self._entries.items())

    def __len__(self) -> int:
        return len(self._entries)
