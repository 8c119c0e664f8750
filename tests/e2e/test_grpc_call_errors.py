"""End to end: a gRPC call the client breaks (its request message missing, truncated or undecodable) or lets
expire ends with a clean status and an info line, never a handler crash or an error-level traceback. Raw HTTP/2
frames (the ``h2`` library as the client) against a real ``bastion run`` of the example."""

from __future__ import annotations

import json
from collections.abc import Callable

import grpc
import pytest
from h2.events import ResponseReceived, TrailersReceived

from bastion.testing import TokenMinter
from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
from examples.documents_api.proto.documents.v1 import documents_pb2_grpc as pb_grpc
from tests.conftest import BastionProcess
from tests.e2e.test_grpc import EXAMPLE, _handshaken, auth

LIST = "/documents.v1.DocumentService/ListDocuments"
GET = "/documents.v1.DocumentService/GetDocument"  # its policy waits for the request message
WATCH = "/documents.v1.DocumentService/WatchDocuments"
HEALTH = "/grpc.health.v1.Health/Check"  # public: no token, no policy
INVALID_ARGUMENT, INTERNAL, DEADLINE_EXCEEDED = "3", "13", "4"
MISSING = "Request message missing: the call ended without one"
TRUNCATED = "Request message truncated: the call ended inside it"
UNDECODABLE = "Request message does not decode"


@pytest.fixture(scope="module")
def example(module_bastion_process: Callable[..., BastionProcess], key_env: dict[str, str]) -> BastionProcess:
    return module_bastion_process(*EXAMPLE, env=key_env)


def raw_call(
    process: BastionProcess, path: str, body: bytes | None, *, token: str = "", timeout: str = ""
) -> tuple[str, str]:
    """One call on a new connection: HEADERS, then ``body`` in one DATA frame with END_STREAM (``None``: END_STREAM
    on the HEADERS, no DATA at all); the ``grpc-status`` and ``grpc-message`` the server ends it with."""
    address = f"127.0.0.1:{process.port}"
    sock, client = _handshaken(address)
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", address),
        (":path", path),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    if token:
        headers.append(("authorization", token))
    if timeout:
        headers.append(("grpc-timeout", timeout))
    with sock:
        client.send_headers(1, headers, end_stream=body is None)
        if body is not None:
            client.send_data(1, body, end_stream=True)
        sock.sendall(client.data_to_send())
        while True:
            chunk = sock.recv(65536)
            assert chunk, "closed without ending the call"
            for event in client.receive_data(chunk):
                if isinstance(event, TrailersReceived | ResponseReceived):
                    fields = dict(event.headers)
                    if "grpc-status" in fields:
                        return fields["grpc-status"], fields.get("grpc-message", "")
            sock.sendall(client.data_to_send())


def message(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


BROKEN = [
    pytest.param(None, INVALID_ARGUMENT, MISSING, id="end-stream-on-the-headers"),
    pytest.param(b"", INVALID_ARGUMENT, MISSING, id="empty-data-frame"),
    pytest.param(b"\x00\x00\x00", INTERNAL, TRUNCATED, id="half-a-length-prefix"),
    pytest.param(b"\x00\x00\x00\x00\x10", INTERNAL, TRUNCATED, id="prefix-without-the-message"),
    pytest.param(b"\x00\x00\x00\x00\x10abc", INTERNAL, TRUNCATED, id="prefix-larger-than-the-message"),
    pytest.param(message(b"\xff\xff\xff"), INTERNAL, UNDECODABLE, id="not-protobuf"),
]


@pytest.mark.parametrize(("body", "status", "text"), BROKEN)
@pytest.mark.parametrize("path", [LIST, GET, HEALTH])
def test_a_broken_request_message_ends_the_call_with_a_clean_status(
    example: BastionProcess, minter: TokenMinter, path: str, body: bytes | None, status: str, text: str
) -> None:
    token = auth(minter)[0][1]
    assert raw_call(example, path, body, token=token) == (status, text)


def test_the_service_goes_on_after_broken_calls(example: BastionProcess, minter: TokenMinter) -> None:
    for body in (None, b"\x00\x00\x00\x00\x10abc"):
        raw_call(example, LIST, body, token=auth(minter)[0][1])
    assert raw_call(example, HEALTH, message(b"")) == ("0", "")
    with grpc.insecure_channel(f"127.0.0.1:{example.port}") as channel:
        reply = pb_grpc.DocumentServiceStub(channel).ListDocuments(
            pb.ListDocumentsRequest(limit=1), metadata=auth(minter), timeout=10
        )
    assert len(reply.items) == 1


def test_a_broken_call_is_one_info_line_and_no_traceback(
    bastion_process: Callable[..., BastionProcess], key_env: dict[str, str], minter: TokenMinter
) -> None:
    process = bastion_process(*EXAMPLE, env=key_env)
    for body in (None, b"\x00\x00\x00\x00\x10abc", message(b"\xff\xff\xff")):
        raw_call(process, LIST, body, token=auth(minter)[0][1])
        raw_call(process, HEALTH, body)
    process.wait_for_output(UNDECODABLE)
    lines = [json.loads(line) for line in process.output().splitlines() if line.startswith("{")]
    refused = [line for line in lines if line["event"] == "grpc_request_message_refused"]
    assert len(refused) == 6
    assert {(line["level"], line["status"]) for line in refused} == {
        ("info", "INVALID_ARGUMENT"),
        ("info", "INTERNAL"),
    }
    assert all("exception" not in line for line in refused)
    assert [line for line in lines if line["level"] in ("error", "critical")] == []


def test_a_deadline_that_passes_during_the_call_is_one_info_line(
    bastion_process: Callable[..., BastionProcess], key_env: dict[str, str], minter: TokenMinter
) -> None:
    """The server's deadline ends the call: a raw client that keeps the stream open (grpcio would cancel it at its
    own deadline, racing the server's) gets DEADLINE_EXCEEDED from the server."""
    process = bastion_process(*EXAMPLE, env=key_env)
    body = message(pb.WatchDocumentsRequest(interval_ms=2000).SerializeToString())
    assert raw_call(process, WATCH, body, token=auth(minter)[0][1], timeout="500m")[0] == DEADLINE_EXCEEDED
    process.wait_for_output("Deadline exceeded")
    lines = [json.loads(line) for line in process.output().splitlines() if line.startswith("{")]
    assert [line["level"] for line in lines if line["event"] == "Deadline exceeded"] == ["info"]
    assert [line for line in lines if line["level"] in ("error", "critical")] == []


@pytest.mark.parametrize("timeout", ["1n", "0S"])
def test_a_deadline_already_passed_on_arrival_is_deadline_exceeded_not_a_traceback(
    bastion_process: Callable[..., BastionProcess], key_env: dict[str, str], minter: TokenMinter, timeout: str
) -> None:
    """grpclib alone answers UNKNOWN and logs an error with a traceback ("Timeout occurred")."""
    process = bastion_process(*EXAMPLE, env=key_env)
    body = message(pb.WatchDocumentsRequest(interval_ms=2000).SerializeToString())
    assert raw_call(process, WATCH, body, token=auth(minter)[0][1], timeout=timeout)[0] == DEADLINE_EXCEEDED
    assert raw_call(process, HEALTH, message(b""), timeout=timeout)[0] in {"0", DEADLINE_EXCEEDED}
    process.wait_for_output("Deadline exceeded")
    lines = [json.loads(line) for line in process.output().splitlines() if line.startswith("{")]
    assert [line for line in lines if line["level"] in ("error", "critical")] == []
