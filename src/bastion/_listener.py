"""The listener's protocols: one port, a first-bytes sniffer in front of a bounded HTTP/1.1 protocol.

Every accepted connection starts with :class:`SniffingProtocol`. It looks at the first bytes: anything that
is not the HTTP/2 client preface goes to :class:`BoundedHttpProtocol` (uvicorn's HTTP/1.1 protocol with the
listener limits) at once (the decision costs one comparison); an HTTP/2 preface goes to
``h2_protocol_factory``, which the gRPC capability sets, and is closed while none is set. The sniffer also
enforces ``service.max_connections``. :class:`Http2OnlyProtocol` guards a separate gRPC port.

The protocols build on the internals of uvicorn's httptools protocol (parser callbacks, ``cycle``,
``pipeline``, ``url``, ``headers``, ``flow``) and of its WebSocket protocol; uvicorn (0.54.0) is pinned for
this and httptools ships with uvicorn[standard]. There is deliberately no h11 fallback: it would serve
without the limits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar, cast

import httptools
import structlog
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Http11Protocol
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState

from bastion.config import ServiceSettings
from bastion.errors import BastionError, HeadersTooLarge, Unavailable, render
from bastion.types import H2_PROTOCOL_FACTORY

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER_BYTES = 9
SETTINGS_FRAME, MAX_FRAME_SIZE = 0x4, 16_384
# GOAWAY (type 7) on stream 0: last stream 0, error PROTOCOL_ERROR (1). RFC 9113 3.4 and 6.8.
GOAWAY_PROTOCOL_ERROR = b"\x00\x00\x08\x07\x00\x00\x00\x00\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x01"
SNIFF_TIMEOUT_SECS = 10.0

log = structlog.get_logger("bastion.server")


log = structlog.get_logger("bastion.server")


def valid_first_frame(header: bytes) -> bool:
    """RFC 9113 3.4: the client preface is followed by a SETTINGS frame (stream 0, no ACK, 6-byte entries)."""
    length = int.from_bytes(header[:3], "big")
    frame_type, flags, stream = header[3], header[4], int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
    return (
        frame_type == SETTINGS_FRAME
        and not flags & 0x1
        and stream == 0
        and length % 6 == 0
        and length <= MAX_FRAME_SIZE
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ListenerLimits:
    """What one connection may make the process hold: the ``[service]`` listener keys the protocols read.

    ``keep_alive_timeout_secs`` is not here: it is uvicorn's own ``timeout_keep_alive``.
    """

    max_header_bytes: int
    max_headers: int
    header_read_timeout_secs: float
    max_connections: int

    @classmethod
    def from_settings(cls, service: ServiceSettings) -> ListenerLimits:
        return cls(
            max_header_bytes=service.max_header_bytes,
            max_headers=service.max_headers,
            header_read_timeout_secs=service.header_read_timeout_secs,
            max_connections=service.max_connections,
        )


DEFAULT_LIMITS = ListenerLimits.from_settings(ServiceSettings())


def raw_response(error: BastionError) -> bytes:
    """The complete HTTP/1.1 response for ``error`` in the error shape, with ``connection: close``.

    For answers the listener writes itself, below the ASGI app (so without the app's request id and
    security headers); built once at import.
    """
    status, headers, body = render(error, [(b"connection", b"close")])
    status_line = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()
    return b"\r\n".join([status_line, *(name + b": " + value for name, value in headers), b"", body])


HEADERS_TOO_LARGE_RESPONSE = raw_response(HeadersTooLarge())
TOO_MANY_CONNECTIONS_RESPONSE = raw_response(Unavailable("Service unavailable: too many connections", retry_after=1))
LINGER_SECS = 2.0
# The parser reports the request target and each header's name and value; the rest of a head is counted as
# sent in canonical form: "<method> <target> HTTP/1.1\r\n", "<name>: <value>\r\n" per header, a final "\r\n".
REQUEST_LINE_FRAMING = len(b"  HTTP/1.1\r\n") + len(b"\r\n")
HEADER_LINE_FRAMING = len(b": \r\n")
# Longer than any method llhttp accepts: below this margin under the limit the method cannot matter.
METHOD_MARGIN = 32


def limits_of(config: Config) -> ListenerLimits:
    return config.limits if isinstance(config, ListenerConfig) else DEFAULT_LIMITS


def answer_and_close(
    transport: asyncio.Transport, response: bytes, loop: asyncio.AbstractEventLoop
) -> asyncio.TimerHandle | None:
    """Write a final response and close without letting a reset destroy it; returns the linger timer.

    A socket closed with unread input answers the peer with RST, and a client still sending (a long header,
    a body) may then lose the response before it reads it. So the response is followed by FIN, and the
    caller drops what still arrives until the client closes or ``LINGER_SECS`` pass. TLS cannot half-close:
    there the connection is closed at once.
    """
    transport.write(response)
    if not transport.can_write_eof():
        transport.close()
        return None
    transport.write_eof()
    return loop.call_later(LINGER_SECS, transport.close)


class _Held:
    """A stand-in transport for ``http.response.start``: keeps the head uvicorn writes."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


class _Joined:
    """A stand-in transport for the first body message: its first write carries the held head."""

    __slots__ = ("head", "real")

    def __init__(self, real: asyncio.Transport, head: bytes) -> None:
        self.real = real
        self.head: bytes | None = head

    def write(self, data: bytes) -> None:
        if self.head is not None:
            data, self.head = self.head + data, None
        self.real.write(data)

    def close(self) -> None:
        self.real.close()

    def is_closing(self) -> bool:
        return self.real.is_closing()


class CoalescingCycle(RequestResponseCycle):
    """uvicorn's request/response cycle, writing a fixed-length response's head and body in one ``write``.

    uvicorn writes the status line and headers at ``http.response.start`` and the body at
    ``http.response.body``: two writes, and on an idle socket two ``send`` system calls per response. When the
    start declares a ``content-length`` (the body follows at once), its head is held and written together with
    the first body bytes, before anything that completing the response sets off (closing, the next pipelined
    response). A response without one (chunked, streaming: server-sent events) has its head written at start, as
    before, so a client sees it before the first chunk however late that is; so does the answer to ``HEAD``.
    """

    head: bytes | None = None

    async def send(self, message: Any) -> None:
        head = self.head
        if head is None:
            if (
                message["type"] == "http.response.start"
                and not self.response_started
                and self.scope["method"] != "HEAD"
                and _declares_length(message)
            ):
                transport, held = self.transport, _Held()
                self.transport = held  # type: ignore[assignment]
                try:
                    await super().send(message)
                finally:
                    self.transport = transport
                self.head = held.data
                return
            await super().send(message)
            return
        self.head = None
        transport = self.transport
        joined = _Joined(transport, head)
        self.transport = joined  # type: ignore[assignment]
        try:
            await super().send(message)
        finally:
            self.transport = transport
            if joined.head and not self.disconnected:  # nothing was written (an invalid message): the head alone
                transport.write(joined.head)


def _declares_length(message: Any) -> bool:
    for name, _ in message.get("headers", ()):  # noqa: SIM110 (a loop: any() over a generator costs more here)
        if name == b"content-length":
            return True
    return False


class BoundedHttpProtocol(_Http11Protocol):
    """uvicorn's HTTP/1.1 (httptools) protocol, bounding each request head in size, header count and time.

    - Head over ``max_header_bytes`` or more than ``max_headers`` headers: ``431`` in the error shape and
      close (after the responses to earlier pipelined requests). While a head is unfinished, the bytes
      received count against the limit: httptools holds an unfinished header value until its line ends, so
      the per-header callback alone would let one endless header grow without bound.
    - Head not complete ``header_read_timeout_secs`` after its first byte (after the accept, for the
      connection's first request): the connection is closed without a response, like nginx and Go do; a
      ``408`` would race with a client that starts its next request at that moment.

    Per request this costs a few integer updates; the only timer a request allocates is for a head that
    arrives in more than one read.
    """

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        connected_at: float | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits = limits_of(config)
        self.max_header_bytes = limits.max_header_bytes
        self.max_headers = limits.max_headers
        self.header_read_timeout = limits.header_read_timeout_secs
        self.connected_at = connected_at
        # The header read deadline, or after a refusal the linger; never both.
        self.timer: asyncio.TimerHandle | None = None
        # From a request's end (or the accept) to the end of the next head: bytes received belong to a head.
        self.awaiting_head = True
        # Bytes received for the unfinished head, counted per read (a head that starts inside a read is counted
        # from the next read on: under by at most one read, never over).
        self.wire_head_bytes = 0
        # The current head as parsed so far: header names, values and their framing.
        self.parsed_head_bytes = 0
        self.head_refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        started = self.connected_at if self.connected_at is not None else self.loop.time()
        self.timer = self.loop.call_at(started + self.header_read_timeout, self._header_read_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # uvicorn's data_received, with the head bounds around the parser.
        if self.awaiting_head:
            self.wire_head_bytes += len(data)
        elif self.head_refused:
            return  # answered (or about to be): the parser must not buffer any more of the refused head
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, HeadersTooLarge):
                self._refuse_head()
                return
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return
        if self.awaiting_head and self.wire_head_bytes:
            # Still unfinished after the whole read: every byte of it belonged to the head.
            if self.wire_head_bytes > self.max_header_bytes:
                self._refuse_head()
            elif self.timer is None:
                self.timer = self.loop.call_later(self.header_read_timeout, self._header_read_timeout)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.parsed_head_bytes += len(name) + len(value) + HEADER_LINE_FRAMING
        if len(self.headers) >= self.max_headers or self.parsed_head_bytes > self.max_header_bytes:
            raise HeadersTooLarge  # stops the parser; data_received answers
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        size = self.parsed_head_bytes + len(self.url) + REQUEST_LINE_FRAMING
        if (
            size > self.max_header_bytes - METHOD_MARGIN
            and size + len(self.parser.get_method()) > self.max_header_bytes
        ):
            raise HeadersTooLarge
        self._cancel_timer()
        self.awaiting_head = False
        self.wire_head_bytes = self.parsed_head_bytes = 0
        super().on_headers_complete()
        if type(self.cycle) is RequestResponseCycle:
            self.cycle.__class__ = CoalescingCycle  # before its task first runs: its send is ours

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.awaiting_head = True

    def on_response_complete(self) -> None:
        # Answered before the request's body had all arrived (a 401, 404, 413 or 429 refuses before reading it, a
        # 408 because it did not come): the rest is not worth waiting for, and a client trickling it would hold the
        # connection for as long as it likes. Closed like a refused head: FIN, then what arrives is dropped.
        # self.cycle is the last request parsed: with a pipelined request queued behind this response it is that
        # one (its response not started), whose body may simply not have been read yet.
        cycle = self.cycle
        unfinished = cycle is not None and cycle.response_complete and cycle.more_body and not self.head_refused
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self.head_refused and self.cycle.response_complete:
            self.timer = answer_and_close(self.transport, HEADERS_TOO_LARGE_RESPONSE, self.loop)
        elif unfinished:
            self.head_refused = True  # drop the rest of the body
            if self.timeout_keep_alive_task is not None:
                self.timeout_keep_alive_task.cancel()
                self.timeout_keep_alive_task = None
            self._cancel_timer()
            self.timer = answer_and_close(self.transport, b"", self.loop)

    def _refuse_head(self) -> None:
        self.head_refused = True
        self.awaiting_head = False
        self._cancel_timer()
        log.info(
            "http_headers_too_large",
            client=self.client[0] if self.client else None,
            max_header_bytes=self.max_header_bytes,
            max_headers=self.max_headers,
        )
        if self.cycle is None or self.cycle.response_complete:
            self.timer = answer_and_close(self.transport, HEADERS_TOO_LARGE_RESPONSE, self.loop)
        else:
            # An earlier pipelined request is still being answered: the 431 follows the last of its responses
            # (on_response_complete); what arrives meanwhile is dropped.
            self.flow.pause_reading()

    def _header_read_timeout(self) -> None:
        self.timer = None
        log.info("http_header_read_timeout", client=self.client[0] if self.client else None)
        if self.cycle is None or self.cycle.response_complete:
            self.transport.close()
        else:
            # The late head is pipelined behind a response still being written: close once it is done.
            self.cycle.keep_alive = False

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class WebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, which treats a refused handshake (``websocket.http.response``) as done.

    uvicorn 0.54 sends the refusal (401, 403, 404, ...) but leaves ``handshake_complete`` unset, then logs
    "ASGI callable returned without completing handshake." at error level for every refused handshake.
    """

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body", False):
            self.handshake_complete = True


class SniffingProtocol(asyncio.Protocol):
    """Decide per connection between HTTP/1.1 (uvicorn) and HTTP/2 (gRPC) from the first bytes.

    Constructed by uvicorn exactly like its own HTTP protocols. A connection that sends nothing, or a partial
    preface and then nothing, is closed after ``SNIFF_TIMEOUT_SECS`` or ``service.header_read_timeout_secs``,
    whichever is shorter.

    Connections count against ``service.max_connections`` from the accept: while sniffed, this protocol sits
    in uvicorn's connection set (which the cap counts and shutdown closes), then the HTTP/1.1 protocol does.
    A connection over the cap is refused once its first bytes show what it speaks: HTTP/1.1 gets ``503`` in
    the error shape with ``retry-after: 1`` and ``connection: close``; an HTTP/2 preface is closed (gRPC
    clients see UNAVAILABLE and retry). HTTP/2 connections leave the count when handed to gRPC.
    """

    h2_protocol_factory: ClassVar[Callable[[], asyncio.Protocol] | None] = None

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.config = config
        self.server_state = server_state
        self.app_state = app_state
        self.loop = _loop or asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.timer: asyncio.TimerHandle | None = None
        self.limits = limits_of(config)
        self.connected_at = 0.0
        self.refused = False
        self.answered = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop transports do not subclass it
        self.connected_at = self.loop.time()
        connections: set[Any] = self.server_state.connections
        if len(connections) >= self.limits.max_connections:
            # Answered by _to_http11 or _hand_to_h2 once the first bytes show the protocol (ALPN is not
            # trusted for this: the bytes say the same and need no second path).
            self.refused = True
        else:
            connections.add(self)
            ssl_object = transport.get_extra_info("ssl_object")
            negotiated = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
            if negotiated == "h2":
                # TLS: ALPN already chose the protocol (RFC 7301), no need to look at the bytes.
                self._hand_to_h2()
                return
            if negotiated == "http/1.1":
                self._hand_over(self._http11())
                return
        # The first bytes of an HTTP/1.1 head count against its header read timeout, from the accept.
        timeout = min(SNIFF_TIMEOUT_SECS, self.limits.header_read_timeout_secs)
        self.timer = self.loop.call_later(timeout, self._give_up)

    def data_received(self, data: bytes) -> None:
        if self.answered:
            return  # refused and lingering: drop what the client still sends
        self.buffer += data
        seen = min(len(self.buffer), len(H2_PREFACE))
        if self.buffer[:seen] != H2_PREFACE[:seen]:
            self._to_http11()
        elif len(self.buffer) >= len(H2_PREFACE) + FRAME_HEADER_BYTES:
            if valid_first_frame(self.buffer[len(H2_PREFACE) : len(H2_PREFACE) + FRAME_HEADER_BYTES]):
                self._hand_to_h2()
            else:
                log.info("http2_protocol_error", reason="the preface is not followed by a SETTINGS frame")
                assert self.transport is not None
                self.transport.write(GOAWAY_PROTOCOL_ERROR)
                self._close()

    def _http11(self) -> asyncio.Protocol:
        return BoundedHttpProtocol(
            config=self.config,
            server_state=self.server_state,
            app_state=self.app_state,
            _loop=self.loop,
            connected_at=self.connected_at,
        )

    def _to_http11(self) -> None:
        if not self.refused:
            self._hand_over(self._http11())
            return
        assert self.transport is not None
        log.info("connection_refused", reason="max_connections", max_connections=self.limits.max_connections)
        self._cancel_timer()
        self.buffer, self.answered = b"", True
        self.timer = answer_and_close(self.transport, TOO_MANY_CONNECTIONS_RESPONSE, self.loop)

    def _hand_to_h2(self) -> None:
        if self.refused:
            log.info("connection_refused", reason="max_connections", max_connections=self.limits.max_connections)
            self._close()
            return
        factory = self.app_state.get(H2_PROTOCOL_FACTORY) or type(self).h2_protocol_factory
        if factory is None:
            log.info("http2_refused", reason="gRPC is not enabled on this port")
            self._close()
            return
        self._hand_over(factory())

    def _hand_over(self, protocol: asyncio.Protocol) -> None:
        assert self.transport is not None
        self._cancel_timer()
        self.server_state.connections.discard(self)  # the protocol takes its place
        buffered, self.buffer = self.buffer, b""
        self.transport.set_protocol(protocol)
        protocol.connection_made(self.transport)
        if buffered:
            protocol.data_received(buffered)

    def _give_up(self) -> None:
        log.info("connection_sniff_timeout")
        self._close()

    def _close(self) -> None:
        self._cancel_timer()
        if self.transport is not None:
            self.transport.close()

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def eof_received(self) -> bool | None:
        self._close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self.server_state.connections.discard(self)

    def shutdown(self) -> None:
        """Called by uvicorn at graceful shutdown, like its own protocols: nothing is in flight yet."""
        self._close()


class Http2OnlyProtocol(asyncio.Protocol):
    """For a port that speaks only HTTP/2 (``grpc.use_separate_port``): check the preface and first frame.

    A client that sends anything else gets GOAWAY(PROTOCOL_ERROR) and is closed; one that stalls before the
    first frame is closed after ``timeout_secs`` (the main port's sniffer: ``SNIFF_TIMEOUT_SECS`` or
    ``service.header_read_timeout_secs``, whichever is shorter). Then the connection belongs to ``factory()``.
    """

    def __init__(self, factory: Callable[[], asyncio.Protocol], *, timeout_secs: float = SNIFF_TIMEOUT_SECS) -> None:
        self.factory = factory
        self.timeout_secs = timeout_secs
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.timer = asyncio.get_running_loop().call_later(self.timeout_secs, self._close)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buffer += data
        seen = min(len(self.buffer), len(H2_PREFACE))
        needed = len(H2_PREFACE) + FRAME_HEADER_BYTES
        if self.buffer[:seen] != H2_PREFACE[:seen] or (
            len(self.buffer) >= needed and not valid_first_frame(self.buffer[len(H2_PREFACE) : needed])
        ):
            log.info("http2_protocol_error", reason="not an HTTP/2 client preface and SETTINGS frame")
            self.transport.write(GOAWAY_PROTOCOL_ERROR)
            self._close()
        elif len(self.buffer) >= needed:
            if self.timer is not None:
                self.timer.cancel()
            protocol = self.factory()
            buffered, self.buffer = self.buffer, b""
            self.transport.set_protocol(protocol)
            protocol.connection_made(self.transport)
            protocol.data_received(buffered)

    def _close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()


class ListenerConfig(Config):
    """uvicorn's Config, with ALPN ``h2``/``http/1.1`` offered on TLS when gRPC shares the port.

    ``limits`` carries the listener limits to the protocols uvicorn builds from it (per process: each worker
    gets its own copy).
    """

    alpn_h2 = False
    limits = DEFAULT_LIMITS

    def load(self) -> None:
        super().load()
        if self.ssl is not None:
            self.ssl.set_alpn_protocols(["h2", "http/1.1"] if self.alpn_h2 else ["http/1.1"])
