"""Starting a gRPC call whose deadline has already passed: grpclib cannot (see :class:`CallHandler`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grpclib.metadata import decode_timeout
from grpclib.server import Handler

MIN_DEADLINE = "1m"
"""The shortest ``grpc-timeout`` a call starts with (1 ms)."""
_MIN_TIMEOUT_SECS = decode_timeout(MIN_DEADLINE)


class CallHandler(Handler):
    """grpclib's handler of one connection's calls, starting a call whose deadline has already passed.

    grpclib cannot: a ``grpc-timeout`` that has run out by the time the call starts (``1n``, or a client that
    sends its call too late) makes it raise before the handler, log an error with a traceback and answer
    UNKNOWN. Such a call starts with :data:`MIN_DEADLINE` left instead, and grpclib's own deadline ends it:
    DEADLINE_EXCEEDED and one info line (``Deadline exceeded``), as for any call whose deadline passes. A
    ``grpc-timeout`` that does not parse is left to grpclib (it answers it without running the call).
    """

    def accept(self, stream: Any, headers: list[tuple[str, str]], release_stream: Callable[[], Any]) -> None:
        super().accept(stream, _with_deadline_floor(headers), release_stream)


def _with_deadline_floor(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    for name, _ in headers:  # most calls carry no deadline: one pass that compares names only
        if name == "grpc-timeout":
            break
    else:
        return headers
    for index, (name, value) in enumerate(headers):
        if name == "grpc-timeout":
            try:
                too_short = decode_timeout(value) < _MIN_TIMEOUT_SECS
            except ValueError:
                continue
            if too_short:
                headers = [*headers[:index], (name, MIN_DEADLINE), *headers[index + 1 :]]
    return headers
