"""End to end: gRPC with a real grpcio client against ``bastion run``, same port and separate port."""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import pytest
from grpclib.health.v1 import health_pb2
from grpclib.reflection.v1 import reflection_pb2
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import RemoteSettingsChanged, ResponseReceived, TrailersReceived

from bastion.grpc._limits import RESET_BURST
from bastion.testing import TokenMinter
from bastion_core.testing import free_port
from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
from examples.documents_api.proto.documents.v1 import documents_pb2_grpc as pb_grpc
from tests.conftest import BastionProcess

EXAMPLE = ("examples.documents_api:service", "--config", "examples/documents_api/config.toml")
LIST = "/documents.v1.DocumentService/ListDocuments"


class Target:
    """Where the gRPC client connects (the main port, or grpc.port) and the HTTP base URL."""

    def __init__(self, process: BastionProcess, grpc_port: int) -> None:
        self.process = process
        self.grpc_address = f"127.0.0.1:{grpc_port}"
        self.http = process.url


def start(factory: Callable[..., BastionProcess], env: dict[str, str], separate: bool) -> Target:
    if not separate:
        process = factory(*EXAMPLE, env=env)
        return Target(process, process.port)
    grpc_port = free_port()
    process = factory(
        *EXAMPLE, env={**env, "SERVICE_GRPC_USE_SEPARATE_PORT": "true", "SERVICE_GRPC_PORT": str(grpc_port)}
    )
    return Target(process, grpc_port)


@pytest.fixture(scope="module", params=["same-port", "separate-port"])
def target(
    request: pytest.FixtureRequest, module_bastion_process: Callable[..., BastionProcess], key_env: dict[str, str]
) -> Target:
    return start(module_bastion_process, key_env, request.param == "separate-port")


@pytest.fixture
def channel(target: Target) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(target.grpc_address) as chan:
        yield chan


def auth(minter: TokenMinter, sub: str = "alice", *roles: str) -> list[tuple[str, str]]:
    return [("authorization", "Bearer " + minter.mint(sub=sub, roles=list(roles) or ["user"]))]


def test_health_check_serving(channel: grpc.Channel) -> None:
    check = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    for service in ("", "documents.v1.DocumentService"):
        assert (
            check(health_pb2.HealthCheckRequest(service=service), timeout=10).status
            == health_pb2.HealthCheckResponse.SERVING
        )


def test_reflection_lists_the_services(channel: grpc.Channel) -> None:
    reflect = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    (reply,) = list(reflect(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10))
    names = {service.name for service in reply.list_services_response.service}
    assert {"documents.v1.DocumentService", "grpc.health.v1.Health"} <= names


def test_list_without_token_is_unauthenticated(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as info:
        pb_grpc.DocumentServiceStub(channel).ListDocuments(pb.ListDocumentsRequest(), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "Missing bearer token" in (info.value.details() or "")


def test_list_with_token_and_request_id(channel: grpc.Channel, minter: TokenMinter) -> None:
    stub = pb_grpc.DocumentServiceStub(channel)
    reply, call = stub.ListDocuments.with_call(
        pb.ListDocumentsRequest(limit=2), metadata=[*auth(minter), ("x-request-id", "grpc-rid-1")], timeout=10
    )
    assert len(reply.items) == 2 and reply.next_cursor
    assert ("x-request-id", "grpc-rid-1") in [(m.key, m.value) for m in call.initial_metadata()]
    assert "x-request-id" not in [m.key for m in call.trailing_metadata()]  # said once, in the initial metadata


def test_a_refused_call_carries_its_request_id_in_the_trailers(channel: grpc.Channel) -> None:
    """A call refused before its handler runs gets a trailers-only answer: the id travels there."""
    stub = pb_grpc.DocumentServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.ListDocuments(pb.ListDocumentsRequest(), metadata=[("x-request-id", "grpc-rid-2")], timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ("x-request-id", "grpc-rid-2") in [(m.key, m.value) for m in info.value.trailing_metadata()]


def test_expired_token_is_unauthenticated(channel: grpc.Channel, minter: TokenMinter) -> None:
    token = minter.mint(sub="alice", ttl=-120)
    with pytest.raises(grpc.RpcError) as info:
        pb_grpc.DocumentServiceStub(channel).ListDocuments(
            pb.ListDocumentsRequest(), metadata=[("authorization", f"Bearer {token}")], timeout=10
        )
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "TOKEN_EXPIRED" in (info.value.details() or "")


def test_policy_deny_is_permission_denied(channel: grpc.Channel, minter: TokenMinter) -> None:
    stub = pb_grpc.DocumentServiceStub(channel)
    own = stub.GetDocument(pb.GetDocumentRequest(user_id="alice", doc_id="doc-1"), metadata=auth(minter), timeout=10)
    assert own.owner_id == "alice"
    with pytest.raises(grpc.RpcError) as info:
        stub.GetDocument(pb.GetDocumentRequest(user_id="bob", doc_id="doc-3"), metadata=auth(minter), timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    admin = stub.GetDocument(
        pb.GetDocumentRequest(user_id="bob", doc_id="doc-3"), metadata=auth(minter, "root", "admin"), timeout=10
    )
    assert admin.owner_id == "bob"


def test_bastion_error_in_a_handler_keeps_its_status(channel: grpc.Channel, minter: TokenMinter) -> None:
    """The handler raises bastion.NotFound: the call ends NOT_FOUND with its message, never INTERNAL."""
    stub = pb_grpc.DocumentServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.GetDocument(
            pb.GetDocumentRequest(user_id="alice", doc_id="missing"), metadata=auth(minter, "alice"), timeout=10
        )
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.NOT_FOUND, "Document not found")


def test_deadline_exceeded(channel: grpc.Channel, minter: TokenMinter) -> None:
    stub = pb_grpc.DocumentServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        list(stub.WatchDocuments(pb.WatchDocumentsRequest(interval_ms=2000), metadata=auth(minter), timeout=0.5))
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_many_calls_in_flight_on_one_connection_each_get_their_own_answer(
    channel: grpc.Channel, minter: TokenMinter
) -> None:
    """Frames of calls finishing together are written together (one write per loop round): 64 calls in
    flight on one HTTP/2 connection, refused and allowed mixed, each gets its own status, reply and id."""
    stub = pb_grpc.DocumentServiceStub(channel)
    futures = []
    for n in range(64):
        metadata = [("x-request-id", f"many-{n}")] + (auth(minter) if n % 4 else [])
        futures.append(
            stub.ListDocuments.future(pb.ListDocumentsRequest(limit=1 + n % 3), metadata=metadata, timeout=20)
        )
    for n, future in enumerate(futures):
        if n % 4 == 0:
            assert future.code() == grpc.StatusCode.UNAUTHENTICATED
            assert ("x-request-id", f"many-{n}") in [(m.key, m.value) for m in future.trailing_metadata()]
            continue
        assert len(future.result().items) == 1 + n % 3
        assert ("x-request-id", f"many-{n}") in [(m.key, m.value) for m in future.initial_metadata()]


def test_server_streaming(channel: grpc.Channel, minter: TokenMinter) -> None:
    stub = pb_grpc.DocumentServiceStub(channel)
    docs = list(stub.WatchDocuments(pb.WatchDocumentsRequest(max_events=3), metadata=auth(minter), timeout=10))
    assert [doc.id for doc in docs] == ["doc-1", "doc-2", "doc-3"]


def test_http_and_grpc_at_the_same_time(target: Target, channel: grpc.Channel, minter: TokenMinter) -> None:
    stub = pb_grpc.DocumentServiceStub(channel)
    http_statuses: list[int] = []
    stream = stub.WatchDocuments(
        pb.WatchDocumentsRequest(max_events=3, interval_ms=100), metadata=auth(minter), timeout=20
    )

    def http_calls() -> None:
        headers = {"authorization": auth(minter)[0][1]}
        for _ in range(10):
            http_statuses.append(httpx.get(target.http + "/api/v2/documents", headers=headers, timeout=10).status_code)

    worker = threading.Thread(target=http_calls)
    worker.start()
    docs = list(stream)
    worker.join(timeout=30)
    assert len(docs) == 3
    assert http_statuses == [200] * 10


def test_unknown_method_is_unimplemented(channel: grpc.Channel, minter: TokenMinter) -> None:
    call = channel.unary_unary(
        "/documents.v1.DocumentService/Nope", request_serializer=bytes, response_deserializer=bytes
    )
    with pytest.raises(grpc.RpcError) as info:
        call(b"", metadata=auth(minter), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_oversized_message_is_resource_exhausted(channel: grpc.Channel, minter: TokenMinter) -> None:
    stub = pb_grpc.DocumentServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.GetDocument(pb.GetDocumentRequest(user_id="a" * 5_000_000, doc_id="x"), metadata=auth(minter), timeout=10)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_http11_with_grpc_content_type_is_plain_http(target: Target) -> None:
    response = httpx.post(target.http + LIST, headers={"content-type": "application/grpc"}, content=b"\x00" * 5)
    assert response.status_code == 401
    assert response.json()["code"] == "UNAUTHORIZED"


@pytest.mark.parametrize(
    "garbage", [b"\xff" * 64, b"\x00\x00\x04\x01\x00\x00\x00\x00\x01abcd"], ids=["bytes", "headers"]
)
def test_garbage_after_the_http2_preface_closes_only_that_connection(target: Target, garbage: bytes) -> None:
    host, port = target.grpc_address.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + garbage)
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
    assert received.endswith(b"\x00\x00\x00\x01"), received  # a GOAWAY with PROTOCOL_ERROR, then close
    assert httpx.get(target.http + "/health").status_code == 200


def _handshaken(address: str) -> tuple[socket.socket, H2Connection]:
    """A raw socket past the HTTP/2 handshake (preface and SETTINGS both ways), and the client's h2 state."""
    host, port = address.split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    client = H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
    client.initiate_connection()
    sock.sendall(client.data_to_send())
    while not any(isinstance(event, RemoteSettingsChanged) for event in client.receive_data(sock.recv(65536))):
        pass
    sock.sendall(client.data_to_send())  # our SETTINGS ack
    return sock, client


def _goaway_code(sock: socket.socket) -> int:
    """Read frames until the server's GOAWAY and the close; its error code (fails if it closes without one)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    offset, codes = 0, []
    while offset + 9 <= len(received):
        length = int.from_bytes(received[offset : offset + 3], "big")
        if received[offset + 3] == 0x7:  # GOAWAY: last stream id, then the error code
            codes.append(int.from_bytes(received[offset + 13 : offset + 17], "big"))
        offset += 9 + length
    assert codes, f"closed without a GOAWAY: {received!r}"
    return codes[-1]


def _request_headers(target: Target) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", target.grpc_address),
        (":path", LIST),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        pytest.param(
            # HEADERS on stream 1 whose field block is an index beyond both tables
            b"\x00\x00\x05\x01\x05\x00\x00\x00\x01" + b"\xff\xff\xff\xff\x0f",
            ErrorCodes.COMPRESSION_ERROR,
            id="bad-hpack",
        ),
        pytest.param(b"\x00\x00\x01\x01\x05\x00\x00\x00\x00\x82", ErrorCodes.PROTOCOL_ERROR, id="headers-on-stream-0"),
        pytest.param(
            b"\x00\x40\x01\x00\x00\x00\x00\x00\x01" + b"\x00" * 16385, ErrorCodes.FRAME_SIZE_ERROR, id="oversized-frame"
        ),
    ],
)
def test_a_protocol_error_after_the_handshake_is_a_goaway_with_its_code(
    target: Target, channel: grpc.Channel, minter: TokenMinter, frames: bytes, code: ErrorCodes
) -> None:
    sock, _ = _handshaken(target.grpc_address)
    with sock:
        sock.sendall(frames)
        assert _goaway_code(sock) == code
    # Only that connection: HTTP/1.1 and gRPC on other connections are served.
    assert httpx.get(target.http + "/health", timeout=10).status_code == 200
    assert (
        len(
            pb_grpc.DocumentServiceStub(channel)
            .ListDocuments(pb.ListDocumentsRequest(limit=1), metadata=auth(minter), timeout=10)
            .items
        )
        == 1
    )


def test_a_rapid_reset_burst_is_a_goaway_enhance_your_calm(
    target: Target, channel: grpc.Channel, minter: TokenMinter
) -> None:
    """CVE-2023-44487: streams opened and reset at once. The first RESET_BURST pass; the connection then ends."""
    sock, client = _handshaken(target.grpc_address)
    with sock:
        for batch in range(0, 2 * RESET_BURST, 100):
            for stream_id in range(2 * batch + 1, 2 * (batch + 100) + 1, 2):
                client.send_headers(stream_id, _request_headers(target))
                client.reset_stream(stream_id)
            try:
                sock.sendall(client.data_to_send())
            except (BrokenPipeError, ConnectionResetError):
                break  # the server has had enough and closed
        assert _goaway_code(sock) == ErrorCodes.ENHANCE_YOUR_CALM
    assert httpx.get(target.http + "/health", timeout=10).status_code == 200
    assert (
        len(
            pb_grpc.DocumentServiceStub(channel)
            .ListDocuments(pb.ListDocumentsRequest(limit=1), metadata=auth(minter), timeout=10)
            .items
        )
        == 1
    )


def test_a_request_message_sent_too_slowly_ends_the_call_deadline_exceeded(
    bastion_process: Callable[..., BastionProcess], key_env: dict[str, str], minter: TokenMinter
) -> None:
    """The gRPC form of a slow HTTP body: a unary call's message not all there within middleware.timeout_secs."""
    process = bastion_process(*EXAMPLE, env={**key_env, "SERVICE_MIDDLEWARE_TIMEOUT_SECS": "1"})
    target = Target(process, process.port)
    sock, client = _handshaken(target.grpc_address)
    with sock:
        headers = [*_request_headers(target), ("authorization", auth(minter)[0][1])]
        client.send_headers(1, headers)
        client.send_data(1, b"\x00\x00\x00\x00\x10")  # a 16-byte message is announced; none of it follows
        sock.sendall(client.data_to_send())
        trailers: dict[str, str] = {}
        while not trailers:
            chunk = sock.recv(65536)
            assert chunk, "closed without ending the call"
            for event in client.receive_data(chunk):
                if isinstance(event, TrailersReceived):
                    trailers = dict(event.headers)
                elif isinstance(event, ResponseReceived) and dict(event.headers).get("grpc-status"):
                    trailers = dict(event.headers)  # a trailers-only answer
            sock.sendall(client.data_to_send())
    assert (trailers["grpc-status"], trailers["grpc-message"]) == ("4", "Request message not received within 1s")
    # the connection and the service go on
    with grpc.insecure_channel(target.grpc_address) as chan:
        reply = pb_grpc.DocumentServiceStub(chan).ListDocuments(
            pb.ListDocumentsRequest(limit=1), metadata=auth(minter), timeout=10
        )
    assert len(reply.items) == 1


def test_http2_is_refused_where_grpc_is_disabled(
    bastion_process: Callable[..., BastionProcess], key_env: dict[str, str]
) -> None:
    process = bastion_process(*EXAMPLE, env={**key_env, "SERVICE_GRPC_ENABLED": "false"})
    with socket.create_connection(("127.0.0.1", process.port), timeout=10) as sock:
        # The preface and an empty SETTINGS frame: the sniffer decides at once (with the preface alone it waits
        # for the first frame until its 10 s timeout, which would race this socket's).
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        assert sock.recv(1024) == b""
    with grpc.insecure_channel(f"127.0.0.1:{process.port}") as chan, pytest.raises(grpc.RpcError) as info:
        pb_grpc.DocumentServiceStub(chan).ListDocuments(pb.ListDocumentsRequest(), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("separate", [False, True], ids=["same-port", "separate-port"])
def test_sigterm_drains_grpc_streams(
    bastion_process: Callable[..., BastionProcess], key_env: dict[str, str], minter: TokenMinter, separate: bool
) -> None:
    target = start(bastion_process, key_env, separate)
    received: list[Any] = []
    errors: list[BaseException] = []

    def watch() -> None:
        with grpc.insecure_channel(target.grpc_address) as chan:
            stream = pb_grpc.DocumentServiceStub(chan).WatchDocuments(
                pb.WatchDocumentsRequest(max_events=3, interval_ms=400), metadata=auth(minter), timeout=30
            )
            try:
                for doc in stream:
                    received.append(doc.id)
            except grpc.RpcError as exc:
                errors.append(exc)

    worker = threading.Thread(target=watch)
    worker.start()
    for _ in range(200):
        if received:
            break
        threading.Event().wait(0.02)
    target.process.proc.send_signal(signal.SIGTERM)
    worker.join(timeout=30)
    assert errors == []
    assert received == ["doc-1", "doc-2", "doc-3"]
    assert target.process.proc.wait(timeout=30) == 0


def test_rate_limited_call_is_resource_exhausted_with_retry_info(
    bastion_process: Callable[..., BastionProcess], key_env: dict[str, str], minter: TokenMinter, tmp_path: Any
) -> None:
    from tests.conftest import REPO

    config = tmp_path / "config.toml"
    config.write_text(
        (REPO / "examples/documents_api/config.toml").read_text()
        + '\n[rate_limit.routes."POST /documents.v1.DocumentService/ListDocuments"]\n'
        + "requests_per_minute = 1\nburst_size = 1\n"
    )
    policies = str(REPO / "examples/documents_api/policies.cedar")  # the copied config's relative path moved
    env = {**key_env, "SERVICE_POLICY_POLICY_PATH": policies}
    process = bastion_process("examples.documents_api:service", "--config", str(config), env=env)
    with grpc.insecure_channel(f"127.0.0.1:{process.port}") as chan:
        stub = pb_grpc.DocumentServiceStub(chan)
        metadata = auth(minter)
        stub.ListDocuments(pb.ListDocumentsRequest(), metadata=metadata, timeout=10)
        with pytest.raises(grpc.RpcError) as info:
            stub.ListDocuments(pb.ListDocumentsRequest(), metadata=metadata, timeout=10)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailers = {m.key: m.value for m in info.value.trailing_metadata()}
    assert int(trailers["retry-after"]) >= 1
    assert trailers["x-ratelimit-remaining"] == "0"
    process.wait_for_output("HttpRequestDenied")
