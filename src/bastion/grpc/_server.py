"""The gRPC server: grpclib services plus health and reflection, on the main port or a separate one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import grpclib.utils as grpclib_utils
import structlog
from grpclib.events import RecvRequest, SendTrailingMetadata, listen
from grpclib.health.check import ServiceCheck
from grpclib.health.service import OVERALL, Health
from grpclib.protocol import H2Protocol
from grpclib.reflection.service import ServerReflection
from grpclib.server import Server
from h2.errors import ErrorCodes
from h2.events import StreamReset
from h2.exceptions import ProtocolError as H2ProtocolError
from hpack.exceptions import HPACKError, OversizedHeaderListError
from hyperframe.frame import GoAwayFrame

from bastion._connections import UNCOUNTED, ConnectionSlots, Slot
from bastion._listener import SNIFF_TIMEOUT_SECS, answer_and_close
from bastion.grpc import _hpack
from bastion.grpc._interceptors import GrpcGuard
from bastion_core import running_loop

READINESS_TTL_SECS = 1.0
log = structlog.get_logger("bastion.grpc")


def _current_task(loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Task[Any] | None:
    return asyncio.current_task(loop or running_loop())


def _install_current_task() -> None:
    """grpclib looks up the current task twice per call (its deadline wrapper); ``asyncio.current_task()``
    costs a ``getpid()`` system call each time on Python 3.11 (see ``bastion_core.running_loop``). The same
    answer, from the remembered loop. Idempotent."""
    grpclib_utils._current_task = _current_task


class CoalescingTransport(asyncio.Transport):
    """A connection's transport whose writes of one event-loop iteration go to the socket as one write.

    grpclib writes each frame as it is made: a unary answer is three socket writes (headers, message,
    trailers), and each costs a system call in which the loopback TCP stack does its work (~10-15 us here).
    Frames written while the loop runs one round of callbacks (one answer, or several calls finishing
    together, and the flow-control updates) are joined and written once, right after that round
    (``call_soon``): the same bytes in the same order, a few microseconds later. ``close`` writes what is
    pending first; ``abort`` drops it, as the transport's own ``abort`` drops its buffer.
    """

    __slots__ = ("_lingering", "_loop", "_pending", "transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.transport = transport
        self._loop = loop
        self._pending: list[bytes | bytearray | memoryview] = []
        self._lingering = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self.transport.is_closing():
            self.transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        if not self._lingering:  # else the linger timer closes it
            self.transport.close()

    def answer_and_close(self, data: bytes) -> None:
        """Write what is pending, then ``data`` (a GOAWAY), then FIN; close after the linger (the listener's
        ``answer_and_close``): a socket closed with the client's frames still unread would answer with RST,
        and the client could lose the GOAWAY before reading it."""
        self.flush()
        self._lingering = True
        answer_and_close(self.transport, data, self._loop)

    def abort(self) -> None:
        self._pending = []
        self.transport.abort()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)


RESET_BURST = 500
"""RST_STREAM frames a client may send at once before the rate applies (CVE-2023-44487, "rapid reset")."""
RESETS_PER_SEC = 100.0
"""Sustained RST_STREAM frames per second a connection may send; beyond, GOAWAY ENHANCE_YOUR_CALM and close."""


class ResetBudget:
    """A token bucket of stream resets: ``RESET_BURST`` at once, refilled at ``RESETS_PER_SEC``.

    Each reset stream cost the server a call it started and cancelled; a client opening and resetting streams in
    a loop makes the server work without ever being limited by ``max_concurrent_streams`` (the streams close at
    once). Legitimate clients cancel calls too (deadlines), far below this rate.
    """

    __slots__ = ("_clock", "_stamp", "_tokens")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._tokens = float(RESET_BURST)
        self._stamp = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(float(RESET_BURST), self._tokens + (now - self._stamp) * RESETS_PER_SEC)
        self._stamp = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


def _connection_error_code(exc: H2ProtocolError) -> ErrorCodes:
    """The GOAWAY code for a connection error h2 raised: its own, except a field block that does not decode,
    which RFC 9113 4.3 makes a COMPRESSION_ERROR (h2 says PROTOCOL_ERROR)."""
    if isinstance(exc.__cause__, HPACKError) and not isinstance(exc.__cause__, OversizedHeaderListError):
        return ErrorCodes.COMPRESSION_ERROR
    return ErrorCodes(exc.error_code)


class _H2Protocol(H2Protocol):
    """grpclib's HTTP/2 protocol with Bastion's HPACK encoder for answers (``_hpack.ResponseEncoder``), its
    writes coalesced per loop iteration (``CoalescingTransport``), a GOAWAY before the close on a connection
    error (grpclib closed without sending the one h2 prepared) and a bounded stream-reset rate."""

    slot: Slot = UNCOUNTED
    """The connection's place under the port's connection caps (handed over by the listener), released when lost."""

    def connection_lost(self, exc: BaseException | None) -> None:
        self.slot.release()
        super().connection_lost(exc)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # Nothing is encoded before the first answer, so the encoder can change here; the client's SETTINGS
        # (header table size) arrive later and reach the new one. Streams take the connection's transport
        # when they open, so every frame after the server's SETTINGS goes through the coalescing one.
        loop = running_loop()
        self.connection._connection.encoder = _hpack.ResponseEncoder()
        self.connection._transport = CoalescingTransport(cast(asyncio.Transport, transport), loop)
        self.resets = ResetBudget(loop.time)

    closed = False
    """A connection error ended the connection: what the client still sends is dropped (see ``_goaway``)."""

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        connection = self.connection
        try:
            events = connection.feed(data)
        except H2ProtocolError as exc:
            self._goaway(_connection_error_code(exc), str(exc), replace=True)
            return
        connection.flush()
        for event in events:
            if isinstance(event, StreamReset) and not self.resets.take():
                self._goaway(ErrorCodes.ENHANCE_YOUR_CALM, "too many stream resets", replace=False)
                return
            self.processor.process(event)
        connection.flush()

    def _goaway(self, code: ErrorCodes, reason: str, *, replace: bool) -> None:
        """Send GOAWAY with ``code`` (RFC 9113 5.4.1), then close the connection and its calls.

        ``replace``: h2 has already queued a GOAWAY for the error it raised (and is closed); ours replaces it,
        so the code is the one chosen here (nothing else h2 queued matters on a connection that is closing).
        """
        h2_connection = self.connection._connection
        if replace:
            h2_connection.clear_outbound_data_buffer()
            frame = GoAwayFrame(0, last_stream_id=h2_connection.highest_inbound_stream_id, error_code=code)
            goaway = frame.serialize()
        else:
            h2_connection.close_connection(error_code=code, additional_data=reason.encode()[:256])
            goaway = h2_connection.data_to_send()
        self.closed = True
        transport = self.connection._transport
        assert isinstance(transport, CoalescingTransport)
        transport.answer_and_close(goaway)
        log.info("http2_connection_error", code=code.name, reason=reason[:200])
        self.processor.close("Protocol error")  # the calls end now; the socket after the linger


class GrpcServer:
    """User services (grpclib ``IServable``) with ``grpc.health.v1.Health`` and server reflection.

    Created inside the running event loop (grpclib binds to it). ``protocol_factory`` is what the listener's
    sniffer hands HTTP/2 connections to; ``start(host, port)`` serves on a separate port instead. Health
    reports NOT_SERVING while ``/ready`` would answer 503 (``ready`` is the same readiness function).
    """

    def __init__(self, services: Sequence[Any], *, guard: GrpcGuard, ready: Callable[[], Awaitable[bool]]) -> None:
        _hpack.install()  # the bearer token of every call is not Huffman-decoded again (see _hpack)
        _install_current_task()
        self.guard = guard
        check = ServiceCheck(ready, check_ttl=READINESS_TTL_SECS, check_timeout=READINESS_TTL_SECS * 5)
        health = Health({OVERALL: [check], **{service: [check] for service in services}})
        self.server = Server(ServerReflection.extend([*services, health]))
        listen(self.server, RecvRequest, guard.on_request)
        listen(self.server, SendTrailingMetadata, guard.on_trailing_metadata)
        self._listener: asyncio.Server | None = None

    def protocol_factory(self) -> asyncio.Protocol:
        """A grpclib HTTP/2 protocol for one sniffed connection (tracked for draining)."""
        protocol = self.server._protocol_factory()
        protocol.__class__ = _H2Protocol  # grpclib builds it with its handler; only connection_made differs
        return protocol

    async def start(
        self, host: str, port: int, *, slots: ConnectionSlots, preface_timeout_secs: float = SNIFF_TIMEOUT_SECS
    ) -> None:
        """Listen on a port of its own (HTTP/2 only, checked like the main port's sniffer does; a client that
        has not sent its preface and first frame ``preface_timeout_secs`` after the accept is closed). ``slots``
        caps the port's connections (``service.max_connections``, ``service.max_connections_per_ip``)."""
        from bastion._listener import Http2OnlyProtocol

        loop = asyncio.get_running_loop()
        timeout = min(preface_timeout_secs, SNIFF_TIMEOUT_SECS)
        self._listener = await loop.create_server(
            lambda: Http2OnlyProtocol(self.protocol_factory, slots=slots, timeout_secs=timeout), host, port
        )
        log.info("grpc_listening", host=host, port=port)

    async def drain(self, grace_secs: float) -> None:
        """Refuse new calls, let running calls finish within ``grace_secs``, then cancel what is left."""
        self.guard.draining = True
        if self._listener is not None:
            self._listener.close()
        try:
            async with asyncio.timeout(grace_secs):
                await self.guard.idle.wait()
        except TimeoutError:
            log.warning("grpc_calls_cancelled_at_shutdown", active=self.guard.active)
        for handler in list(self.server._handlers):
            handler.close()
        await asyncio.gather(*(handler.wait_closed() for handler in list(self.server._handlers)))
        if self._listener is not None:
            await self._listener.wait_closed()
