"""The gRPC server: grpclib services plus health and reflection, on the main port or a separate one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import structlog
from grpclib.events import RecvRequest, SendTrailingMetadata, listen
from grpclib.health.check import ServiceCheck
from grpclib.health.service import OVERALL, Health
from grpclib.reflection.service import ServerReflection
from grpclib.server import Server

from bastion._compat import grpclib as grpclib_compat
from bastion._connections import ConnectionSlots
from bastion._listener import SNIFF_TIMEOUT_SECS
from bastion.grpc import _hpack
from bastion.grpc._deadlines import CallHandler
from bastion.grpc._interceptors import GrpcGuard
from bastion.grpc._limits import DEFAULT_LIMITS, Http2Limits
from bastion.grpc._protocol import _H2Protocol
from bastion_core._tls import ReloadingServerContext

READINESS_TTL_SECS = 1.0
log = structlog.get_logger("bastion.grpc")


class GrpcServer:
    """User services (grpclib ``IServable``) with ``grpc.health.v1.Health`` and server reflection.

    Created inside the running event loop (grpclib binds to it). ``protocol_factory`` is what the listener's
    sniffer hands HTTP/2 connections to; ``start(host, port)`` serves on a separate port instead. Health
    reports NOT_SERVING while ``/ready`` would answer 503 (``ready`` is the same readiness function). Every
    connection, on either port, gets ``limits``.
    """

    def __init__(
        self,
        services: Sequence[Any],
        *,
        guard: GrpcGuard,
        ready: Callable[[], Awaitable[bool]],
        limits: Http2Limits = DEFAULT_LIMITS,
    ) -> None:
        self.memo_decoder = _hpack.memo_decoder_available()  # a bearer token is not Huffman-decoded per call
        self.guard = guard
        self.limits = limits
        check = ServiceCheck(ready, check_ttl=READINESS_TTL_SECS, check_timeout=READINESS_TTL_SECS * 5)
        health = Health({OVERALL: [check], **{service: [check] for service in services}})
        self.server = Server(ServerReflection.extend([*services, health]))
        listen(self.server, RecvRequest, guard.on_request)
        listen(self.server, SendTrailingMetadata, guard.on_trailing_metadata)
        self._listener: asyncio.Server | None = None

    def protocol_factory(self) -> asyncio.Protocol:
        """A grpclib HTTP/2 protocol for one sniffed connection (tracked for draining); the listener sets its
        ``slot`` before ``connection_made``."""
        # CallHandler starts a call whose deadline already passed (see _deadlines)
        protocol = grpclib_compat.new_protocol(self.server, protocol_class=_H2Protocol, handler_class=CallHandler)
        protocol.limits = self.limits
        protocol.memo_decoder = self.memo_decoder
        return protocol

    async def start(
        self,
        host: str,
        port: int,
        *,
        preface_timeout_secs: float = SNIFF_TIMEOUT_SECS,
        slots: ConnectionSlots,
        tls: ReloadingServerContext | None = None,
    ) -> None:
        """Listen on a port of its own (HTTP/2 only, checked like the main port's sniffer does; a client that
        has not sent its preface and first frame ``preface_timeout_secs`` after the accept is closed).
        ``slots`` caps the port's connections (``service.max_connections``, ``service.max_connections_per_ip``);
        ``tls``: TLS on the port (ALPN ``h2``; the main port's certificate and client-certificate settings)."""
        from bastion._listener import Http2OnlyProtocol

        loop = asyncio.get_running_loop()
        timeout = min(preface_timeout_secs, SNIFF_TIMEOUT_SECS)
        self._listener = await loop.create_server(
            lambda: Http2OnlyProtocol(self.protocol_factory, slots=slots, timeout_secs=timeout),
            host,
            port,
            ssl=tls.front if tls is not None else None,
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
        handlers = list(grpclib_compat.handlers(self.server))
        for handler in handlers:
            handler.close()
        await asyncio.gather(*(handler.wait_closed() for handler in handlers))
        if self._listener is not None:
            await self._listener.wait_closed()
