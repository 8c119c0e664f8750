"""The listener's protocols: admission and a first-bytes sniffer in front of a bounded HTTP/1.1 protocol.

Every accepted connection starts with :class:`SniffingProtocol` (``_sniffer``). It admits the connection against
the port's :class:`~bastion._connections.ConnectionSlots` (``service.max_connections``,
``service.max_connections_per_ip``), then looks at the first bytes: anything that is not the HTTP/2 client
preface goes to :class:`BoundedHttpProtocol` (``_http11``: uvicorn's HTTP/1.1 protocol with the listener limits)
at once; an HTTP/2 preface goes to ``h2_protocol_factory``, which the gRPC capability sets, and is closed while
none is set. :class:`Http2OnlyProtocol` guards a separate gRPC port the same way. The answers the listener writes
itself are in ``_answers``, the framing rules in ``_framing``.

The protocols build on the internals of uvicorn's httptools protocol (parser callbacks, ``cycle``,
``pipeline``, ``url``, ``headers``, ``flow``) and of its WebSocket protocol; the supported uvicorn range
(0.30.0 to 0.54.x) is where they hold (``tests/bastion/compat/test_uvicorn.py`` checks what they rely on, `make
compat` runs the oldest and a middle release) and httptools ships with
uvicorn[standard]. There is deliberately no h11 fallback: it would serve without the limits.
"""

from bastion._listener._answers import (
    HEADERS_TOO_LARGE_RESPONSE,
    LINGER_SECS,
    TOO_MANY_CONNECTIONS_RESPONSE,
    TOO_MANY_FROM_ADDRESS_RESPONSE,
    answer_and_close,
    raw_response,
)
from bastion._listener._config import DEFAULT_LIMITS, ListenerConfig, ListenerLimits
from bastion._listener._cycle import CoalescingCycle
from bastion._listener._flow import ReadGate
from bastion._listener._http11 import PARSE_SLICE_BYTES, WHOLE_READ_BYTES, BoundedHttpProtocol
from bastion._listener._sniffer import (
    GOAWAY_PROTOCOL_ERROR,
    H2_PREFACE,
    SNIFF_TIMEOUT_SECS,
    Http2OnlyProtocol,
    SniffingProtocol,
)
from bastion._listener._websocket import WebSocketProtocol

__all__ = [
    "DEFAULT_LIMITS",
    "GOAWAY_PROTOCOL_ERROR",
    "H2_PREFACE",
    "HEADERS_TOO_LARGE_RESPONSE",
    "LINGER_SECS",
    "PARSE_SLICE_BYTES",
    "SNIFF_TIMEOUT_SECS",
    "TOO_MANY_CONNECTIONS_RESPONSE",
    "TOO_MANY_FROM_ADDRESS_RESPONSE",
    "WHOLE_READ_BYTES",
    "BoundedHttpProtocol",
    "CoalescingCycle",
    "Http2OnlyProtocol",
    "ListenerConfig",
    "ListenerLimits",
    "ReadGate",
    "SniffingProtocol",
    "WebSocketProtocol",
    "answer_and_close",
    "raw_response",
]
