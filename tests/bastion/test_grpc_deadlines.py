"""CallHandler: a call whose deadline has already passed when it arrives, on a real grpclib server and socket."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest
from grpclib.server import Server
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import ResponseReceived, TrailersReceived

from bastion.grpc._deadlines import MIN_DEADLINE, CallHandler, _with_deadline_floor
from examples.documents_api.grpc_service import DocumentService
from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
from examples.documents_api.store import seeded_store

WATCH = "/documents.v1.DocumentService/WatchDocuments"


@pytest.mark.parametrize(
    ("value", "started_with"),
    [
        pytest.param("1n", MIN_DEADLINE, id="one-nanosecond"),
        pytest.param("0S", MIN_DEADLINE, id="zero"),
        pytest.param("999u", MIN_DEADLINE, id="just-under-a-millisecond"),
        pytest.param("1m", "1m", id="one-millisecond"),
        pytest.param("5S", "5S", id="five-seconds"),
        pytest.param("soon", "soon", id="unparsable-left-to-grpclib"),
    ],
)
def test_a_deadline_under_a_millisecond_starts_with_one(value: str, started_with: str) -> None:
    headers = [(":path", WATCH), ("grpc-timeout", value), ("te", "trailers")]
    assert _with_deadline_floor(headers) == [(":path", WATCH), ("grpc-timeout", started_with), ("te", "trailers")]


def test_headers_without_a_deadline_are_passed_as_they_are() -> None:
    headers = [(":path", WATCH), ("te", "trailers")]
    assert _with_deadline_floor(headers) is headers


def call_with_timeout(port: int, timeout: str) -> str:
    """A WatchDocuments call (two seconds between messages) with ``grpc-timeout: timeout``; its grpc-status."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    client = H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
    client.initiate_connection()
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "test"),
        (":path", WATCH),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("grpc-timeout", timeout),
    ]
    client.send_headers(1, headers)
    payload = pb.WatchDocumentsRequest(interval_ms=2000).SerializeToString()
    client.send_data(1, b"\x00" + len(payload).to_bytes(4, "big") + payload, end_stream=True)
    with sock:
        sock.sendall(client.data_to_send())
        while chunk := sock.recv(65536):
            for event in client.receive_data(chunk):
                if isinstance(event, TrailersReceived | ResponseReceived):
                    status = dict(event.headers).get("grpc-status")
                    if status is not None:
                        return status
            sock.sendall(client.data_to_send())
    raise AssertionError("closed without ending the call")


@pytest.mark.parametrize(("handler", "status"), [(None, "2"), (CallHandler, "4")], ids=["grpclib", "call-handler"])
async def test_a_call_arriving_past_its_deadline(
    caplog: pytest.LogCaptureFixture, handler: type[CallHandler] | None, status: str
) -> None:
    """grpclib alone: UNKNOWN and an error-level traceback; CallHandler: DEADLINE_EXCEEDED and an info line."""
    server = Server([DocumentService(seeded_store())])

    def protocol() -> asyncio.Protocol:
        built = server._protocol_factory()
        if handler is not None:
            built.handler.__class__ = handler
        return built

    listener = await asyncio.get_running_loop().create_server(protocol, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        with caplog.at_level(logging.INFO, logger="grpclib.server"):
            assert await asyncio.to_thread(call_with_timeout, port, "1n") == status
    finally:
        listener.close()
    records = [(record.levelname, record.getMessage()) for record in caplog.records if record.name == "grpclib.server"]
    if handler is None:
        assert records == [("ERROR", "Timeout occurred")]
    else:
        assert records == [("INFO", "Deadline exceeded")]
