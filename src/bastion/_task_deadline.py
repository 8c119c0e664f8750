"""A deadline that cancels one task once and says so: the HTTP request timeout's and a gRPC request message's."""

from __future__ import annotations

import asyncio
from typing import Any


class TaskDeadline:
    """A deadline that cancels ``task`` once (``expire``, from a loop timer) and says so (``expired``), keeping
    the task's cancel count from before, so the catcher can tell its own cancellation from another's (the
    request timeout in ``middleware/_limits.py``, a gRPC request message's in ``grpc/_interceptors.py``)."""

    __slots__ = ("cancelling", "expired", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.cancelling = task.cancelling()
        self.expired = False

    def expire(self) -> None:
        self.expired = True
        self.task.cancel()
