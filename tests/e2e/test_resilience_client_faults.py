"""End to end: no client-caused outcome opens a circuit breaker; a real server fault still does.

Against a real ``bastion run`` whose breakers open when more than half of the last 4 outcomes failed: many requests
of one client-caused kind (HTTP and gRPC), then a valid request still succeeds, then the service's own failures
open the circuit (so the breaker under test is really there and counting).
"""

from __future__ import annotations

import concurrent.futures
import socket
import time
from collections.abc import Callable

import grpc
import httpx
import pytest

from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
from examples.documents_api.proto.documents.v1 import documents_pb2_grpc as pb_grpc
from tests.conftest import TOKEN_OFF, BastionProcess
from tests.e2e.apps.resilience_service import FAIL_ON_DEMAND, STALL_ON_DEMAND
from tests.e2e.test_grpc_call_errors import message, raw_call

APP = "tests.e2e.apps.resilience_service:service"
ENV = {
    **TOKEN_OFF,
    "SERVICE_RATE_LIMIT_ENABLED": "false",
    "SERVICE_GRPC_ENABLED": "true",
    "SERVICE_MIDDLEWARE_RESILIENCE_CIRCUIT_BREAKER_THRESHOLD": "0.5",
    "SERVICE_MIDDLEWARE_RESILIENCE_CIRCUIT_BREAKER_MIN_REQUESTS": "4",
    "SERVICE_MIDDLEWARE_RESILIENCE_CIRCUIT_BREAKER_WAIT_SECS": "60",
    "SERVICE_MIDDLEWARE_MAX_BODY_BYTES": "300000",
    "SERVICE_MIDDLEWARE_TIMEOUT_SECS": "1",
}
TIMES = 8
LIST = "/documents.v1.DocumentService/ListDocuments"


@pytest.fixture
def service(bastion_process: Callable[..., BastionProcess]) -> BastionProcess:
    """A fresh process per test: every breaker starts closed with an empty window."""
    return bastion_process(APP, env=ENV)


def post(process: BastionProcess, path: str, content: bytes) -> int:
    headers = {"content-type": "application/json"}
    return httpx.post(process.url + path, content=content, headers=headers, timeout=10).status_code


def raw_http(process: BastionProcess, head: bytes, *, read: bool) -> bytes:
    """``head`` (and the start of a body) on a new connection; the answer when ``read``, else close at once."""
    with socket.create_connection(("127.0.0.1", process.port), timeout=10) as sock:
        sock.sendall(head)
        if not read:
            return b""
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def partial_body(path: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n".encode()
        + b'{"title": "'
    )


def nested_json(process: BastionProcess) -> None:
    """The attack of issue 27: 200 KB of ``[[[[...``, a RecursionError (500) before the depth limit."""
    body = b"[" * 100_000 + b"]" * 100_000
    assert {post(process, "/api/v1/notes", body) for _ in range(TIMES)} == {400}


def malformed_json(process: BastionProcess) -> None:
    assert {post(process, "/api/v1/notes", b'{"title": ') for _ in range(TIMES)} == {400}


def wrong_types(process: BastionProcess) -> None:
    assert {post(process, "/api/v1/notes", b'{"title": 5, "tags": "x"}') for _ in range(TIMES)} == {422}


def too_large(process: BastionProcess) -> None:
    def chunks() -> list[bytes]:
        return [b"x" * 100_000] * 4

    declared = {post(process, "/api/v1/uploads", b"x" * 300_001) for _ in range(TIMES)}
    streamed = {
        httpx.post(process.url + "/api/v1/uploads", content=iter(chunks()), timeout=10).status_code
        for _ in range(TIMES)
    }
    assert declared == streamed == {413}


def body_too_slow(process: BastionProcess) -> None:
    """Half a body, then nothing: 408 after middleware.timeout_secs, the handler still waiting for it."""
    with concurrent.futures.ThreadPoolExecutor(TIMES) as pool:
        answers = list(pool.map(lambda _: raw_http(process, partial_body("/api/v1/uploads"), read=True), range(TIMES)))
    assert {answer.split(b"\r\n", 1)[0] for answer in answers} == {b"HTTP/1.1 408 Request Timeout"}


def client_disconnects(process: BastionProcess) -> None:
    """Half a body, then the client closes: the handler reading it gets ClientDisconnect."""
    for _ in range(TIMES):
        raw_http(process, partial_body("/api/v1/uploads"), read=False)
    deadline = time.monotonic() + 10
    while process.output().count('"client_disconnected"') < TIMES:
        assert time.monotonic() < deadline, process.output()
        time.sleep(0.05)


@pytest.mark.parametrize(
    "fault",
    [nested_json, malformed_json, wrong_types, too_large, body_too_slow, client_disconnects],
    ids=lambda fault: fault.__name__.replace("_", "-"),
)
def test_client_caused_http_outcomes_never_open_the_breaker(
    service: BastionProcess, fault: Callable[[BastionProcess], None]
) -> None:
    fault(service)
    assert httpx.get(service.url + "/api/v1/flaky", timeout=10).status_code == 200
    # The same breaker opens on the service's own failures: more than half of the last 4 outcomes.
    statuses = [httpx.get(service.url + "/api/v1/flaky?status=500", timeout=10).status_code for _ in range(4)]
    assert statuses[:3] == [500, 500, 500]
    assert httpx.get(service.url + "/api/v1/flaky", timeout=10).status_code == 503


def grpc_status(process: BastionProcess, limit: int, **options: object) -> grpc.StatusCode:
    with grpc.insecure_channel(f"127.0.0.1:{process.port}") as channel:
        try:
            pb_grpc.DocumentServiceStub(channel).ListDocuments(pb.ListDocumentsRequest(limit=limit), **options)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def broken_messages(process: BastionProcess) -> None:
    for body, status in ((None, "3"), (b"\x00\x00\x00\x00\x10abc", "13"), (message(b"\xff\xff"), "13")):
        assert {raw_call(process, LIST, body)[0] for _ in range(TIMES)} == {status}


def message_too_slow(process: BastionProcess) -> None:
    """A length prefix, then nothing: DEADLINE_EXCEEDED after middleware.timeout_secs (the gRPC form of a 408)."""
    with concurrent.futures.ThreadPoolExecutor(TIMES) as pool:
        ends = set(pool.map(lambda _: _stalled_message(process), range(TIMES)))
    assert ends == {("4", "Request message not received within 1s")}


def _stalled_message(process: BastionProcess) -> tuple[str, str]:
    from h2.events import ResponseReceived, TrailersReceived

    from tests.e2e.test_grpc import _handshaken

    address = f"127.0.0.1:{process.port}"
    sock, client = _handshaken(address)
    with sock:
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":authority", address),
            (":path", LIST),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        client.send_headers(1, headers)
        client.send_data(1, b"\x00\x00\x00\x00\x10")
        sock.sendall(client.data_to_send())
        while chunk := sock.recv(65536):
            for event in client.receive_data(chunk):
                if isinstance(event, TrailersReceived | ResponseReceived):
                    fields = dict(event.headers)
                    if "grpc-status" in fields:
                        return fields["grpc-status"], fields.get("grpc-message", "")
            sock.sendall(client.data_to_send())
    raise AssertionError("closed without ending the call")


def client_deadlines(process: BastionProcess) -> None:
    """The handler is still working when the client's deadline passes: the client chose the deadline."""
    assert {grpc_status(process, STALL_ON_DEMAND, timeout=0.2) for _ in range(TIMES)} == {
        grpc.StatusCode.DEADLINE_EXCEEDED
    }


def client_cancels(process: BastionProcess) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{process.port}") as channel:
        stub = pb_grpc.DocumentServiceStub(channel)
        for _ in range(TIMES):
            call = stub.ListDocuments.future(pb.ListDocumentsRequest(limit=STALL_ON_DEMAND), timeout=10)
            time.sleep(0.1)  # the handler has started
            assert call.cancel()
    deadline = time.monotonic() + 10
    while process.output().count("Request was cancelled") < TIMES:
        assert time.monotonic() < deadline, process.output()
        time.sleep(0.05)


@pytest.mark.parametrize(
    "fault",
    [broken_messages, message_too_slow, client_deadlines, client_cancels],
    ids=lambda fault: fault.__name__.replace("_", "-"),
)
def test_client_caused_grpc_outcomes_never_open_the_breaker(
    service: BastionProcess, fault: Callable[[BastionProcess], None]
) -> None:
    fault(service)
    assert grpc_status(service, 1, timeout=10) == grpc.StatusCode.OK
    statuses = [grpc_status(service, FAIL_ON_DEMAND, timeout=10) for _ in range(4)]
    assert statuses[:3] == [grpc.StatusCode.INTERNAL] * 3
    assert grpc_status(service, 1, timeout=10) == grpc.StatusCode.UNAVAILABLE
