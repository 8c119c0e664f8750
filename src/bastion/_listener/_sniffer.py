"""The protocols every accepted connection starts with: admission against the connection caps, then the
first-bytes decision between HTTP/1.1 and HTTP/2."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, ClassVar, cast

import structlog
from uvicorn.config import Config
from uvicorn.server import ServerState

from bastion._connections import UNCOUNTED, ConnectionSlots, Refusal, Slot
from bastion._listener._answers import (
    TOO_MANY_CONNECTIONS_RESPONSE,
    TOO_MANY_FROM_ADDRESS_RESPONSE,
    answer_and_close,
)
from bastion._listener._config import limits_of, slots_of
from bastion._listener._http11 import BoundedHttpProtocol
from bastion.types import H2_PROTOCOL_FACTORY

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER_BYTES = 9
SETTINGS_FRAME, MAX_FRAME_SIZE = 0x4, 16_384
# GOAWAY (type 7) on stream 0: last stream 0, error PROTOCOL_ERROR (1). RFC 9113 3.4 and 6.8.
GOAWAY_PROTOCOL_ERROR = b"\x00\x00\x08\x07\x00\x00\x00\x00\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x01"
SNIFF_TIMEOUT_SECS = 10.0

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


def peer_address(transport: asyncio.BaseTransport) -> str | None:
    """The client's IP address, or ``None`` (a Unix socket: counted in the total only)."""
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else None


def log_refusal(slots: ConnectionSlots, refusal: Refusal, now: float, address: str | None) -> None:
    """``connection_refused`` at info, at most once a second per reason, counting the refusals in between."""
    refused = slots.note_refusal(refusal, now)
    if not refused:
        return
    if refusal is Refusal.MAX_CONNECTIONS_PER_IP:
        log.info(
            "connection_refused",
            reason=refusal.value,
            refused=refused,
            client=address,
            max_connections_per_ip=slots.max_per_address,
        )
    else:
        log.info("connection_refused", reason=refusal.value, refused=refused, max_connections=slots.max_connections)


def hand_slot(protocol: asyncio.Protocol, slot: Slot) -> None:
    """Give the connection's slot to the HTTP/2 protocol that will own it (before its ``connection_made``); it
    releases the slot when the connection is lost."""
    protocol.slot = slot  # type: ignore[attr-defined]


class SniffingProtocol(asyncio.Protocol):
    """Admit a connection, then decide between HTTP/1.1 (uvicorn) and HTTP/2 (gRPC) from its first bytes.

    Constructed by uvicorn exactly like its own HTTP protocols. A connection that sends nothing, or a partial
    preface and then nothing, is closed after ``SNIFF_TIMEOUT_SECS`` or ``service.header_read_timeout_secs``,
    whichever is shorter.

    Admission (the port's :class:`ConnectionSlots`, ``ListenerConfig.slots``): a client address that already
    holds ``service.max_connections_per_ip`` connections is answered at once, without waiting for a byte:
    ``429`` in the error shape with ``retry-after: 1`` and ``connection: close`` (only the flooding address pays).
    A connection over ``service.max_connections`` is refused once its first bytes show what it speaks: HTTP/1.1
    gets ``503`` in the error shape with ``retry-after: 1``; an HTTP/2 preface is closed (gRPC clients see
    UNAVAILABLE and retry). An admitted connection takes a :class:`Slot` and hands it to the protocol that ends
    up owning it (HTTP/1.1, then perhaps WebSocket, or HTTP/2), which releases it when the connection is lost.

    While sniffed, this protocol sits in uvicorn's connection set (which graceful shutdown closes), then the
    HTTP/1.1 protocol does.
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
        self.slots = slots_of(config)
        self.slot = UNCOUNTED
        self.connected_at = 0.0
        self.refused = False
        self.answered = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop transports do not subclass it
        self.connected_at = self.loop.time()
        address = peer_address(transport)
        refusal = self.slots.refusal(address)
        ssl_object = transport.get_extra_info("ssl_object")
        negotiated = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        if refusal is Refusal.MAX_CONNECTIONS_PER_IP:
            log_refusal(self.slots, refusal, self.connected_at, address)
            if negotiated == "h2":
                self._close()  # an HTTP/2 client (ALPN) would not read an HTTP/1.1 answer
                return
            self.answered = True
            self.timer = answer_and_close(self.transport, TOO_MANY_FROM_ADDRESS_RESPONSE, self.loop)
            return
        if refusal is Refusal.MAX_CONNECTIONS:
            # Answered by _to_http11 or _hand_to_h2 once the first bytes show the protocol (ALPN is not
            # trusted for this: the bytes say the same and need no second path).
            self.refused = True
        else:
            self.slot = self.slots.take(address)
            connections: set[Any] = self.server_state.connections
            connections.add(self)
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
        slot, self.slot = self.slot, UNCOUNTED
        return BoundedHttpProtocol(
            config=self.config,
            server_state=self.server_state,
            app_state=self.app_state,
            _loop=self.loop,
            connected_at=self.connected_at,
            slot=slot,
        )

    def _to_http11(self) -> None:
        if not self.refused:
            self._hand_over(self._http11())
            return
        assert self.transport is not None
        log_refusal(self.slots, Refusal.MAX_CONNECTIONS, self.loop.time(), None)
        self._cancel_timer()
        self.buffer, self.answered = b"", True
        self.timer = answer_and_close(self.transport, TOO_MANY_CONNECTIONS_RESPONSE, self.loop)

    def _hand_to_h2(self) -> None:
        if self.refused:
            log_refusal(self.slots, Refusal.MAX_CONNECTIONS, self.loop.time(), None)
            self._close()
            return
        factory = self.app_state.get(H2_PROTOCOL_FACTORY) or type(self).h2_protocol_factory
        if factory is None:
            log.info("http2_refused", reason="gRPC is not enabled on this port")
            self._close()
            return
        protocol = factory()
        slot, self.slot = self.slot, UNCOUNTED
        hand_slot(protocol, slot)
        self._hand_over(protocol)

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
        self.slot.release()
        self.server_state.connections.discard(self)

    def shutdown(self) -> None:
        """Called by uvicorn at graceful shutdown, like its own protocols: nothing is in flight yet."""
        self._close()


class Http2OnlyProtocol(asyncio.Protocol):
    """For a port that speaks only HTTP/2 (``grpc.use_separate_port``): admit, then check the preface and first
    frame.

    Admission is the main port's (its own :class:`ConnectionSlots`, ``slots``): over ``service.max_connections``
    or ``service.max_connections_per_ip``, the connection is closed at once, without a byte. A client that sends
    anything but the preface gets GOAWAY(PROTOCOL_ERROR) and is closed; one that stalls before the first frame
    is closed after ``timeout_secs`` (the main port's sniffer: ``SNIFF_TIMEOUT_SECS`` or
    ``service.header_read_timeout_secs``, whichever is shorter). Then the connection, and its slot, belong to
    ``factory()``.
    """

    def __init__(
        self,
        factory: Callable[[], asyncio.Protocol],
        *,
        slots: ConnectionSlots,
        timeout_secs: float = SNIFF_TIMEOUT_SECS,
    ) -> None:
        self.factory = factory
        self.slots = slots
        self.slot = UNCOUNTED
        self.timeout_secs = timeout_secs
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        loop = asyncio.get_running_loop()
        address = peer_address(transport)
        refusal = self.slots.refusal(address)
        if refusal is not None:
            log_refusal(self.slots, refusal, loop.time(), address)
            self.transport.close()
            return
        self.slot = self.slots.take(address)
        self.timer = loop.call_later(self.timeout_secs, self._close)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            return
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
            slot, self.slot = self.slot, UNCOUNTED
            hand_slot(protocol, slot)
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
        self.slot.release()
        if self.timer is not None:
            self.timer.cancel()
