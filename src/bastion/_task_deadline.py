"""A deadline that cancels one task once and says so: the HTTP request timeout's and a gRPC request message's; and
the queue that serves the deadlines of one timeout with one loop timer."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

COMPACT_SLACK = 1024
"""Finished deadlines a :class:`DeadlineQueue` may hold beyond twice its live ones before it drops them all."""


class TaskDeadline:
    """A deadline that cancels ``task`` once (``expire``, from a loop timer) and says so (``expired``), keeping
    the task's cancel count from before, so the catcher can tell its own cancellation from another's (the
    request timeout in ``middleware/_limits.py``, a gRPC request message's in ``grpc/_interceptors.py``)."""

    __slots__ = ("cancelling", "done", "due", "expired", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.cancelling = task.cancelling()
        self.expired = False
        self.due = 0.0
        self.done = False

    def expire(self) -> None:
        self.expired = True
        self.task.cancel()


class DeadlineQueue:
    """The deadlines of one timeout on one loop: each lies ``timeout_secs`` after it is added, so they fall in the
    order they were added and one loop timer, for the earliest live one, serves them all (a timer per request,
    ``call_at`` and ``cancel``, costs ~1.7 us on uvloop; this, a tenth of it).

    :meth:`add` sets a deadline, :meth:`finish` takes it back (it will not expire). Bounded by the live deadlines:
    finished ones are dropped as they reach the front, and the queue is rebuilt without them when an add finds it
    holding more than twice its live ones plus :data:`COMPACT_SLACK` (a request hung at the front keeps the finished
    ones behind it until its own deadline): at most twice the most deadlines ever live at once, plus the slack.
    """

    __slots__ = ("live", "loop", "queue", "timeout_secs", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_secs: float) -> None:
        self.loop = loop
        self.timeout_secs = timeout_secs
        self.queue: deque[TaskDeadline] = deque()
        self.live = 0
        self.timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self.queue)

    def add(self, deadline: TaskDeadline) -> None:
        queue = self.queue
        while queue and queue[0].done:
            queue.popleft()
        deadline.due = self.loop.time() + self.timeout_secs
        queue.append(deadline)
        self.live += 1
        if len(queue) > 2 * self.live + COMPACT_SLACK:
            self.queue = deque(entry for entry in queue if not entry.done)
        if self.timer is None:
            self.timer = self.loop.call_at(deadline.due, self._fire, deadline.due)

    def finish(self, deadline: TaskDeadline) -> None:
        if not deadline.done:
            deadline.done = True
            self.live -= 1

    def _fire(self, armed_for: float) -> None:
        """Expire every live deadline that has passed (the one the timer was armed for too, whatever the loop's
        clock resolution says); arm the timer for the next live one."""
        self.timer = None
        now = max(self.loop.time(), armed_for)
        queue = self.queue
        while queue:
            head = queue[0]
            if not head.done:
                if head.due > now:
                    self.timer = self.loop.call_at(head.due, self._fire, head.due)
                    return
                self.finish(head)
                head.expire()
            queue.popleft()
