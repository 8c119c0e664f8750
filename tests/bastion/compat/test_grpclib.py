"""What ``bastion._compat.grpclib`` assumes of grpclib's internals, checked on the installed version (verified on
grpclib 0.4.9, h2 4.4.1): an upgrade that changes one fails here, by name.

Assumptions (each listed with its meaning in ``bastion/_compat/grpclib.py``): ``Connection._connection``,
``Connection._transport``, ``Server._protocol_factory`` (and a protocol and handler whose class can be replaced by
a subclass), ``Server._handlers``, ``Stream._stream`` (``recv_data``: exact size, ``b""`` at a clean end,
AssertionError at a short one), ``Stream._cardinality``, ``Stream._codec``, ``Stream._recv_type``,
``Stream._dispatch``, ``Stream._messages_received``, ``Stream._send_initial_metadata_done``,
``Stream._content_type``, ``Stream._send_trailing_metadata_done``, ``Stream._send_message_done``,
``Stream._status_details_codec`` (and the HTTP/2 stream's ``closable`` and ``reset_nowait``), ``Buffer._eof`` (of the
HTTP/2 stream's ``buffer``).
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import grpclib
import pytest
from grpclib.const import Cardinality
from grpclib.encoding.proto import ProtoCodec
from grpclib.events import _DispatchServerEvents
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpclib.protocol import Buffer, Connection, H2Protocol
from grpclib.protocol import Stream as GrpclibH2Stream
from grpclib.server import Handler, Server, Stream
from h2.connection import H2Connection

from bastion._compat import grpclib as grpclib_compat
from bastion.errors import ConfigError


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class Protocol(H2Protocol):
    marker = "ours"


class CallHandler(Handler):
    marker = "ours"


async def test_a_server_builds_a_protocol_per_connection_and_tracks_its_handler() -> None:
    """The protocol and its handler come out as our subclasses, the handler tracked by the server (for draining)."""
    server = Server([])
    protocol = grpclib_compat.new_protocol(server, protocol_class=Protocol, handler_class=CallHandler)
    assert type(protocol) is Protocol and type(protocol.handler) is CallHandler
    assert list(grpclib_compat.handlers(server)) == [protocol.handler]


def test_every_assumed_internal_is_there() -> None:
    assert grpclib_compat.missing() == []
    grpclib_compat.check()


def test_start_up_refuses_when_an_internal_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grpclib_compat, "missing", lambda: ["grpclib.server.Server._protocol_factory"])
    with pytest.raises(
        ConfigError, match=r"lacks .*Server._protocol_factory.*; supported: grpclib 0\.4\.7 to 0\.4\.x$"
    ):
        grpclib_compat.check()


async def test_a_connection_holds_its_h2_state_machine_and_writes_through_its_transport() -> None:
    protocol = grpclib_compat.new_protocol(Server([]), protocol_class=H2Protocol)
    first = Transport()
    protocol.connection_made(first)
    connection = protocol.connection
    assert isinstance(connection, Connection)
    h2 = grpclib_compat.h2_connection(connection)
    assert isinstance(h2, H2Connection)
    assert first.writes  # the server's SETTINGS
    replacement = Transport()
    grpclib_compat.replace_transport(connection, replacement)
    h2.ping(b"12345678")
    connection.flush()
    assert replacement.writes and len(first.writes) == 1
    stream = connection.create_stream(stream_id=1)
    assert stream._transport is replacement  # streams opened later write through the replacement too
    protocol.connection_lost(None)


class H2Stream:
    """The HTTP/2 stream side of a call: grpclib's own receive buffer, a connection's statistics."""

    def __init__(self) -> None:
        self.buffer = Buffer(lambda size: None)
        self.connection = self

    async def recv_data(self, size: int) -> bytes:
        return await self.buffer.read(size)

    def get_peer(self) -> None:
        return None

    messages_received = Connection.messages_received
    last_message_received = Connection.last_message_received


def call(cardinality: Cardinality = Cardinality.UNARY_UNARY) -> tuple[Stream[Any, Any], H2Stream]:
    h2_stream = H2Stream()
    stream: Stream[Any, Any] = Stream(
        h2_stream,  # type: ignore[arg-type]
        "/grpc.health.v1.Health/Check",
        cardinality,
        HealthCheckRequest,
        HealthCheckResponse,
        codec=ProtoCodec(),
        status_details_codec=None,
        dispatch=_DispatchServerEvents(),
    )
    return stream, h2_stream


def test_the_version_is_one_verified() -> None:
    """0.4.9: the newest (`make test`); 0.4.8 and 0.4.7: `make compat`'s middle and oldest sets. Every assumption
    holds on each (no feature depends on the version)."""
    assert grpclib.__version__ in {"0.4.9", "0.4.8", "0.4.7"}, (
        "re-check bastion/_compat/grpclib.py against this grpclib, then update"
    )


async def test_recv_bytes_reads_exactly_the_size_asked() -> None:
    stream, h2_stream = call()
    h2_stream.buffer.add(b"\x00\x00\x00", 3)
    h2_stream.buffer.add(b"\x00\x02ab", 4)
    assert await grpclib_compat.recv_bytes(stream, 5) == b"\x00\x00\x00\x00\x02"
    assert await grpclib_compat.recv_bytes(stream, 2) == b"ab"


async def test_a_stream_ended_without_data_reads_empty() -> None:
    stream, h2_stream = call()
    h2_stream.buffer.eof()
    assert await grpclib_compat.recv_bytes(stream, 5) == b""


async def test_a_stream_ended_inside_the_bytes_asked_is_stream_ended() -> None:
    """grpclib's Buffer.read raises AssertionError ("Received less data than expected"), not a short read."""
    stream, h2_stream = call()
    h2_stream.buffer.add(b"\x00\x00", 2)
    h2_stream.buffer.eof()
    with pytest.raises(grpclib_compat.StreamEnded):
        await grpclib_compat.recv_bytes(stream, 5)


async def test_a_request_has_ended_once_the_client_ended_its_stream() -> None:
    stream, h2_stream = call()
    h2_stream.buffer.add(b"\x00\x00\x00\x00\x00", 5)
    assert not grpclib_compat.request_ended(stream)
    h2_stream.buffer.eof()
    assert grpclib_compat.request_ended(stream)
    assert await grpclib_compat.recv_bytes(stream, 5) == b"\x00\x00\x00\x00\x00"


def test_cardinality_says_whether_the_client_streams() -> None:
    assert not grpclib_compat.client_streams(call(Cardinality.UNARY_UNARY)[0])
    assert not grpclib_compat.client_streams(call(Cardinality.UNARY_STREAM)[0])
    assert grpclib_compat.client_streams(call(Cardinality.STREAM_UNARY)[0])
    assert grpclib_compat.client_streams(call(Cardinality.STREAM_STREAM)[0])


async def test_a_request_decodes_with_the_calls_codec_and_counts_as_received() -> None:
    stream, h2_stream = call()
    message = grpclib_compat.decode_request(stream, HealthCheckRequest(service="x").SerializeToString())
    assert message == HealthCheckRequest(service="x")
    assert await grpclib_compat.received(stream, message) == message
    assert stream._messages_received == 1
    assert h2_stream.messages_received == 1
    assert h2_stream.last_message_received is not None


def test_a_request_that_does_not_decode_raises() -> None:
    with pytest.raises(Exception, match="Error parsing message"):
        grpclib_compat.decode_request(call()[0], b"\xff\xff\xff")


def test_the_initial_metadata_state_the_sender_reads() -> None:
    stream = call()[0]
    assert stream._send_initial_metadata_done is False
    assert stream._content_type == "application/grpc+proto"
    assert callable(stream._dispatch.send_initial_metadata)


def test_the_trailing_metadata_state_the_sender_reads() -> None:
    stream = call()[0]
    assert stream._send_trailing_metadata_done is False
    assert stream._send_message_done is False
    assert stream._status_details_codec is None
    assert isinstance(GrpclibH2Stream.closable, property)
    assert callable(GrpclibH2Stream.reset_nowait)
    assert list(inspect.signature(Stream.send_trailing_metadata).parameters) == [
        "self",
        "status",
        "status_message",
        "status_details",
        "metadata",
    ]
