"""End to end: the HTTP/2 limits of a real ``bastion run`` process (docs/grpc.md "Limits"), over raw sockets.

Each flood limit is hit by a raw HTTP/2 client and answered with GOAWAY ENHANCE_YOUR_CALM; clients within
the same counts are served; a stream beyond ``max_concurrent_streams`` is refused, not the connection; idle
connections are closed; keepalive PINGs go out; a flooding connection does not stall the others.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from grpclib.health.v1 import health_pb2
from grpclib.reflection.v1 import reflection_pb2
from hpack import Decoder, Encoder

from bastion.grpc._limits import RESET_BURST
from bastion.testing import TokenMinter
from bastion_core.testing import free_port
from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
from tests.conftest import BastionProcess

EXAMPLE = ("examples.documents_api:service", "--config", "examples/documents_api/config.toml")
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
NO_ERROR, PROTOCOL_ERROR, REFUSED_STREAM, ENHANCE_YOUR_CALM = 0x0, 0x1, 0x7, 0xB
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
WATCH_DOCUMENTS = "/documents.v1.DocumentService/WatchDocuments"
REFLECTION = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
MAX_STREAMS = 4
WITHIN_SECS = 10.0  # every wait is bounded by this (a loaded machine included)


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def grpc_message(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


class RawClient:
    """An HTTP/2 client made of frames: what it sends is written as given; HPACK is its own encoder's."""

    def __init__(self, port: int, *, settings: bytes = b"", receive_buffer: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(WITHIN_SECS)
        self.sock.connect(("127.0.0.1", port))
        self.encoder, self.decoder = Encoder(), Decoder()
        self.port = port
        self.buffer = b""
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0, settings))
        while True:
            kind, flags, _, _ = self.next_frame()
            if kind == SETTINGS and not flags & ACK:
                self.send(frame(SETTINGS, ACK, 0))
                return

    def send(self, data: bytes) -> None:
        """Write ``data``; a server that has already closed the connection is not an error here."""
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.sock.sendall(data)

    def request(self, stream: int, path: str, *, extra: list[tuple[str, str]] = (), end_stream: bool = False) -> bytes:
        block = self.encoder.encode(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", f"127.0.0.1:{self.port}"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *extra,
            ]
        )
        return frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), stream, block)

    def next_frame(self) -> tuple[int, int, int, bytes]:
        """The next frame the server sent (``socket.timeout`` after WITHIN_SECS, ``EOFError`` at the close)."""
        while True:
            if len(self.buffer) >= 9:
                length = int.from_bytes(self.buffer[:3], "big")
                if len(self.buffer) >= 9 + length:
                    head, payload = self.buffer[:9], self.buffer[9 : 9 + length]
                    self.buffer = self.buffer[9 + length :]
                    return head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, payload
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self.buffer += chunk

    def goaway_code(self) -> int | None:
        """Read until the server closes: the code of its last GOAWAY (``None``: it closed without one)."""
        code = None
        with contextlib.suppress(EOFError, ConnectionResetError):
            while True:
                kind, _, _, payload = self.next_frame()
                if kind == GOAWAY:
                    code = int.from_bytes(payload[4:8], "big")
        return code

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def server(module_bastion_process: Callable[..., BastionProcess], key_env: dict[str, str]) -> BastionProcess:
    return module_bastion_process(*EXAMPLE, env={**key_env, "SERVICE_GRPC_MAX_CONCURRENT_STREAMS": str(MAX_STREAMS)})


@pytest.fixture
def connect(server: BastionProcess) -> Iterator[Callable[..., RawClient]]:
    """Factory: a raw HTTP/2 client of the module's process, past the handshake; closed after the test."""
    opened: list[RawClient] = []

    def open_client(port: int | None = None, **options: object) -> RawClient:
        client = RawClient(port or server.port, **options)  # type: ignore[arg-type]
        opened.append(client)
        return client

    yield open_client
    for client in opened:
        client.close()


def served(process: BastionProcess, port: int | None = None, within: float = WITHIN_SECS) -> bool:
    """HTTP/1.1 and a gRPC call on other connections are answered (each within ``within`` seconds)."""
    assert httpx.get(process.url + "/health", timeout=within).status_code == 200
    with grpc.insecure_channel(f"127.0.0.1:{port or process.port}") as channel:
        check = channel.unary_unary(
            HEALTH_CHECK,
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        answer = check(health_pb2.HealthCheckRequest(), timeout=within)
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def open_stream(client: RawClient, stream: int) -> bytes:
    """A health check whose request message has not been sent: the stream stays open."""
    return client.request(stream, HEALTH_CHECK)


FLOODS = {
    "ping": lambda client: b"".join(frame(PING, 0, 0, n.to_bytes(8, "big")) for n in range(3000)),
    "settings": lambda client: frame(SETTINGS, 0, 0) * 3000,
    "empty-data": lambda client: open_stream(client, 1) + frame(DATA, 0, 1) * 2,
    "priority": lambda client: frame(PRIORITY, 0, 3, b"\x00\x00\x00\x00\x10") * 150,
    "window-update": lambda client: frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x01") * 10,
    "empty-continuation": lambda client: (
        open_stream(client, 1).replace(bytes([HEADERS, END_HEADERS]), bytes([HEADERS, 0]), 1)
        + frame(CONTINUATION, 0, 1) * 10
    ),
    "oversized-field-block": lambda client: (
        frame(HEADERS, 0, 1, b"\x00" * 16_384) + frame(CONTINUATION, 0, 1, b"\x00" * 16_384) * 4
    ),
}


@pytest.mark.parametrize("flood", FLOODS.values(), ids=FLOODS.keys())
def test_a_flood_gets_goaway_enhance_your_calm_and_others_are_served(
    server: BastionProcess, connect: Callable[..., RawClient], flood: Callable[[RawClient], bytes]
) -> None:
    client = connect()
    client.send(flood(client))
    assert client.goaway_code() == ENHANCE_YOUR_CALM
    assert served(server)


def error_lines(process: BastionProcess) -> list[str]:
    """The process's log lines at error level or above, and any traceback."""
    return [
        line
        for line in process.output().splitlines()
        if '"level":"error"' in line or '"level":"critical"' in line or "Traceback" in line
    ]


def test_a_call_cut_off_by_the_goaway_ends_without_an_error_line(
    bastion_process: Callable[..., BastionProcess], key_env: dict[str, str], minter: TokenMinter
) -> None:
    """A call still waiting for its message when a flood ends the connection is dropped quietly: grpclib must not
    try to write its trailers on the closed connection (h2 refuses them and grpclib logs a server error)."""
    process = bastion_process(*EXAMPLE, env=key_env)
    bearer = [("authorization", f"Bearer {minter.mint(sub='alice', roles=['user'], ttl=300)}")]
    watch = grpc_message(pb.WatchDocumentsRequest(max_events=50, interval_ms=50).SerializeToString())
    client = RawClient(process.port)
    with contextlib.closing(client):
        # A server-streaming call that is running (its first event arrived) when the flood ends the connection.
        client.send(client.request(1, WATCH_DOCUMENTS, extra=bearer) + frame(DATA, END_STREAM, 1, watch))
        while client.next_frame()[0] != DATA:
            pass
        client.send(client.request(3, HEALTH_CHECK) + frame(DATA, 0, 3) * 2)
        assert client.goaway_code() == ENHANCE_YOUR_CALM
    assert served(process)
    process.wait_for_output('"limit":"max_consecutive_inbound_frames_with_empty_payload"')
    assert error_lines(process) == []


MALFORMED_REQUESTS = {
    "no-path": [(":method", "POST"), (":scheme", "http"), ("content-type", "application/grpc")],
    "no-method": [(":scheme", "http"), (":path", HEALTH_CHECK), ("content-type", "application/grpc")],
    "empty-path": [(":method", "POST"), (":scheme", "http"), (":path", "")],
    "empty-name": [(":method", "POST"), (":scheme", "http"), (":path", HEALTH_CHECK), ("", "x")],
}


@pytest.mark.parametrize("fields", MALFORMED_REQUESTS.values(), ids=MALFORMED_REQUESTS.keys())
def test_a_malformed_request_ends_the_connection_with_protocol_error(
    bastion_process: Callable[..., BastionProcess], key_env: dict[str, str], fields: list[tuple[str, str]]
) -> None:
    """RFC 9113 8.3.1: a request without :method, :scheme or :path (or with an empty field name) is malformed:
    GOAWAY PROTOCOL_ERROR (Envoy's default; a flood of them must not cost the server a decode each), no
    traceback, and other connections are served."""
    process = bastion_process(*EXAMPLE, env=key_env)
    client = RawClient(process.port)
    with contextlib.closing(client):
        client.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, client.encoder.encode(fields)))
        assert client.goaway_code() == PROTOCOL_ERROR
    assert served(process)
    process.wait_for_output("a malformed request")
    assert error_lines(process) == []


def test_a_rapid_reset_burst_is_logged_as_a_flood(server: BastionProcess, connect: Callable[..., RawClient]) -> None:
    client = connect()
    burst = b"".join(
        open_stream(client, stream) + frame(RST_STREAM, 0, stream, b"\x00\x00\x00\x08")
        for stream in range(1, 4 * RESET_BURST, 2)
    )
    client.send(burst)
    assert client.goaway_code() == ENHANCE_YOUR_CALM
    server.wait_for_output('"limit":"stream_resets"')


def test_the_limits_apply_on_the_separate_grpc_port(
    module_bastion_process: Callable[..., BastionProcess], key_env: dict[str, str], connect: Callable[..., RawClient]
) -> None:
    port = free_port()
    process = module_bastion_process(
        *EXAMPLE, env={**key_env, "SERVICE_GRPC_USE_SEPARATE_PORT": "true", "SERVICE_GRPC_PORT": str(port)}
    )
    client = connect(port)
    client.send(FLOODS["ping"](client))
    assert client.goaway_code() == ENHANCE_YOUR_CALM
    assert served(process, port)


def test_a_client_within_the_counts_is_served(server: BastionProcess, connect: Callable[..., RawClient]) -> None:
    """A few PINGs and SETTINGS, calls with a WINDOW_UPDATE for every DATA frame received: no GOAWAY."""
    client = connect()
    client.send(b"".join(frame(PING, 0, 0, n.to_bytes(8, "big")) for n in range(10)) + frame(SETTINGS, 0, 0))
    answered, pings = 0, 0
    for stream in range(1, 2 * 50, 2):
        client.send(client.request(stream, HEALTH_CHECK) + frame(DATA, END_STREAM, stream, grpc_message(b"")))
        while True:
            kind, flags, on, payload = client.next_frame()
            assert kind != GOAWAY
            pings += kind == PING and bool(flags & ACK)
            if kind == DATA and payload:
                client.send(frame(WINDOW_UPDATE, 0, on, len(payload).to_bytes(4, "big")))
            if kind == HEADERS and on == stream and flags & END_STREAM:
                answered += 1
                break
    assert (answered, pings) == (50, 10)


def test_a_large_streamed_answer_with_flow_control_is_served(server: BastionProcess) -> None:
    """grpcio's own flow control (WINDOW_UPDATEs, BDP PINGs) over thousands of streamed messages."""
    requests = [reflection_pb2.ServerReflectionRequest(file_containing_symbol="grpc.health.v1.Health")] * 2000
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = channel.stream_stream(
            REFLECTION,
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        answers = list(call(iter(requests), timeout=60))
    assert len(answers) == 2000
    assert all(answer.file_descriptor_response.file_descriptor_proto for answer in answers)


def test_a_stream_beyond_the_limit_is_refused_and_the_connection_lives_on(connect: Callable[..., RawClient]) -> None:
    """RFC 9113 5.1.2: REFUSED_STREAM for the extra stream; its field block still updates the HPACK table, so a
    later request that refers to the entry it added (the request id) is read right."""
    client = connect()
    opened = b"".join(open_stream(client, stream) for stream in range(1, 2 * MAX_STREAMS, 2))
    extra = 2 * MAX_STREAMS + 1
    refused = client.request(extra, HEALTH_CHECK, extra=[("x-request-id", "hpack-in-sync")])
    client.send(opened + refused + frame(DATA, 0, extra, grpc_message(b"")))
    resets, windows = [], 0
    while not resets or not windows:
        kind, _, stream, payload = client.next_frame()
        assert kind != GOAWAY
        if kind == RST_STREAM:
            resets.append((stream, int.from_bytes(payload, "big")))
        windows += kind == WINDOW_UPDATE and stream == 0 and int.from_bytes(payload, "big") == 5
    assert resets == [(extra, REFUSED_STREAM)]

    def answers(streams: set[int]) -> dict[int, dict[str, str]]:
        """Read until each of ``streams`` has ended: the fields of its headers and trailers."""
        fields: dict[int, dict[str, str]] = {}
        ended: set[int] = set()
        while ended != streams:
            kind, flags, stream, payload = client.next_frame()
            assert kind not in (GOAWAY, RST_STREAM), (kind, stream, payload)
            if kind == HEADERS:
                fields.setdefault(stream, {}).update(client.decoder.decode(payload))
                ended |= {stream} if flags & END_STREAM else set()
        return fields

    first = set(range(1, 2 * MAX_STREAMS, 2))
    client.send(b"".join(frame(DATA, END_STREAM, stream, grpc_message(b"")) for stream in first))
    assert all(fields["grpc-status"] == "0" for fields in answers(first).values())
    later = extra + 2  # the streams above have closed: room for it
    client.send(
        client.request(later, HEALTH_CHECK, extra=[("x-request-id", "hpack-in-sync")])
        + frame(DATA, END_STREAM, later, grpc_message(b""))
    )
    fields = answers({later})[later]
    assert fields["grpc-status"] == "0"
    request_id = fields["x-request-id"]
    assert request_id == "hpack-in-sync"


@pytest.fixture
def timeouts(bastion_process: Callable[..., BastionProcess], key_env: dict[str, str]) -> BastionProcess:
    return bastion_process(
        *EXAMPLE,
        env={
            **key_env,
            "SERVICE_GRPC_IDLE_TIMEOUT_SECS": "1",
            "SERVICE_GRPC_KEEPALIVE_INTERVAL_SECS": "0.5",
            "SERVICE_GRPC_KEEPALIVE_TIMEOUT_SECS": "1",
        },
    )


def test_an_idle_connection_gets_goaway_no_error_and_is_closed(timeouts: BastionProcess) -> None:
    client = RawClient(timeouts.port)
    with contextlib.closing(client):
        answered_pings = 0
        with contextlib.suppress(EOFError):
            while True:
                kind, flags, _, payload = client.next_frame()
                if kind == PING and not flags & ACK:  # keepalive: answered, so only the idle timeout ends it
                    client.send(frame(PING, ACK, 0, payload))
                    answered_pings += 1
                if kind == GOAWAY:
                    assert int.from_bytes(payload[4:8], "big") == NO_ERROR
                    break
        assert answered_pings >= 1
    timeouts.wait_for_output("http2_idle_timeout")


def test_a_connection_with_an_open_stream_is_not_idle(timeouts: BastionProcess) -> None:
    client = RawClient(timeouts.port)
    with contextlib.closing(client):
        client.send(open_stream(client, 1))
        deadline = time.monotonic() + 2.5  # two and a half idle timeouts
        while (left := deadline - time.monotonic()) > 0:
            if select.select([client.sock], [], [], left)[0]:
                kind, flags, _, payload = client.next_frame()
                assert kind != GOAWAY
                if kind == PING and not flags & ACK:
                    client.send(frame(PING, ACK, 0, payload))
        client.send(frame(DATA, END_STREAM, 1, grpc_message(b"")))
        kinds = []
        with contextlib.suppress(EOFError):
            while GOAWAY not in kinds:
                kind, flags, _, payload = client.next_frame()
                kinds.append(kind)
                if kind == PING and not flags & ACK:
                    client.send(frame(PING, ACK, 0, payload))
        assert HEADERS in kinds and GOAWAY in kinds  # answered, then idle


def test_an_unanswered_keepalive_ping_closes_the_connection(timeouts: BastionProcess) -> None:
    client = RawClient(timeouts.port)
    with contextlib.closing(client):
        client.send(open_stream(client, 1))  # not idle: only the keepalive can end it
        pings = 0
        with contextlib.suppress(EOFError, ConnectionResetError):
            while True:
                kind, flags, _, _ = client.next_frame()
                pings += kind == PING and not flags & ACK
    assert pings >= 1
    timeouts.wait_for_output("http2_keepalive_timeout")


@pytest.fixture
def unlimited_pings(bastion_process: Callable[..., BastionProcess], key_env: dict[str, str]) -> BastionProcess:
    """PINGs without a limit, so a flood lasts as long as the client keeps it up."""
    return bastion_process(
        *EXAMPLE,
        env={
            **key_env,
            "SERVICE_GRPC_MAX_INBOUND_CONTROL_FRAMES_PER_SEC": "1e12",
            "SERVICE_GRPC_MAX_OUTBOUND_CONTROL_FRAMES": "1000000000",
        },
    )


def test_a_flooding_connection_does_not_stall_the_others(unlimited_pings: BastionProcess) -> None:
    """While one connection sends PINGs as fast as it can (and reads the ACKs), HTTP/1.1 and gRPC calls on
    other connections are answered: each within 5 s, where a server without turns took 4 to 12 s."""
    stop = threading.Event()
    flooder = RawClient(unlimited_pings.port)
    burst = frame(PING, 0, 0, b"\x00" * 8) * 4000

    def flood() -> None:
        while not stop.is_set():
            flooder.send(burst)

    def drain() -> None:
        with contextlib.suppress(EOFError, OSError):
            while not stop.is_set():
                flooder.sock.recv(1 << 20)

    threads = [threading.Thread(target=flood), threading.Thread(target=drain)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)  # the flood is under way
        for _ in range(5):
            assert served(unlimited_pings, within=5.0)
    finally:
        stop.set()
        flooder.sock.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(WITHIN_SECS)
        flooder.close()


@pytest.mark.parametrize(
    ("env", "limit"),
    [
        ({"SERVICE_GRPC_MAX_OUTBOUND_CONTROL_FRAMES": "100"}, "max_outbound_control_frames"),
        ({"SERVICE_GRPC_MAX_OUTBOUND_FRAMES": "100"}, "max_outbound_frames"),
    ],
    ids=["control-frames", "frames"],
)
def test_a_client_that_does_not_read_is_cut_off(
    bastion_process: Callable[..., BastionProcess], key_env: dict[str, str], env: dict[str, str], limit: str
) -> None:
    """Answers fill the socket while the client reads nothing; the PING ACKs queued after that are counted."""
    process = bastion_process(
        *EXAMPLE, env={**key_env, "SERVICE_GRPC_MAX_INBOUND_CONTROL_FRAMES_PER_SEC": "1e6", **env}
    )
    big_window = struct.pack(">HI", 0x4, 2**31 - 1)  # SETTINGS_INITIAL_WINDOW_SIZE
    client = RawClient(process.port, settings=big_window, receive_buffer=4096)
    with contextlib.closing(client):
        request = grpc_message(
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="grpc.health.v1.Health").SerializeToString()
        )
        client.send(
            frame(WINDOW_UPDATE, 0, 0, (2**31 - 1 - 65_535).to_bytes(4, "big"))
            + client.request(1, REFLECTION)
            + frame(DATA, 0, 1, request * 500) * 40  # about 11 MB of answers: more than the socket buffers hold
        )
        wait_until_idle(process)  # the answers fill the socket buffers; the server waits for the client
        pings = b"".join(frame(PING, 0, 0, n.to_bytes(8, "big")) for n in range(20))
        deadline = time.monotonic() + WITHIN_SECS
        while f'"limit":"{limit}"' not in process.output() and time.monotonic() < deadline:
            client.send(pings)  # within the inbound rate: each batch arrives on its own
            time.sleep(0.02)
        process.wait_for_output(f'"limit":"{limit}"')
        assert client.goaway_code() == ENHANCE_YOUR_CALM


def wait_until_idle(process: BastionProcess) -> None:
    """Until the process has used no CPU time for a while (Linux ``/proc``), within WITHIN_SECS."""
    deadline, used, still = time.monotonic() + WITHIN_SECS, -1, 0
    while still < 3 and time.monotonic() < deadline:
        fields = Path(f"/proc/{process.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        now = int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
        still, used = (still + 1 if now == used else 0), now
        time.sleep(0.1)
