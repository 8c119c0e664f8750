"""What the listener (``bastion._listener``) assumes of uvicorn's internals, checked on the installed version.

Verified on uvicorn 0.54.0 (constraints.txt), 0.44.0 and 0.30.0 (`make compat`). The listener subclasses uvicorn's
httptools protocol and its WebSocket protocol (websockets-sansio from 0.35, the legacy websockets one before); an
upgrade that changes one of these behaviours fails here, by name.

Assumptions (the private ones are named in ``bastion/_compat/uvicorn.py``): ``HttpToolsProtocol``'s
``_unset_keepalive_if_required``, ``_should_upgrade`` and (0.32 and later) ``_unsupported_upgrade_warning``; a
``RequestResponseCycle`` whose class is replaced before its task runs; ``uvicorn.Server._captured_signals``; and
the public attributes the listener reads: the pipeline queue (``appendleft``, reading paused), resume before the
next request, the body high-water mark, ``on_header``, ``connection_lost`` marking only the last request, the
cycle's and flow control's attributes, the WebSocket upgrade and message assembly.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import json
import os
import subprocess
import sys
from collections import deque
from typing import Any

import pytest
import uvicorn
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import Server, ServerState

from bastion._compat import fastapi as fastapi_compat
from bastion._compat import uvicorn as uvicorn_compat
from bastion._listener import WebSocketProtocol
from bastion.errors import ConfigError
from tests.conftest import REPO

REQUEST = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"
UPGRADE = (
    b"GET / HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)
VERSION = tuple(map(int, uvicorn.__version__.split(".")[:2]))


class Transport:
    """Enough of an asyncio transport for uvicorn's protocols, recording the reading state."""

    def __init__(self) -> None:
        self.reading = True
        self.closing = False
        self.written = b""
        self.protocol: Any = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 80)}.get(name, default)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def write(self, data: bytes) -> None:
        self.written += data

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass  # websockets' legacy protocol sets them when the connection is made

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def get_protocol(self) -> Any:
        return self.protocol


async def never_answers(scope: Any, receive: Any, send: Any) -> None:
    await asyncio.Event().wait()


def http_protocol(app: Any = never_answers) -> tuple[HttpToolsProtocol, Transport]:
    ws = "websockets-sansio" if uvicorn_compat.SANSIO_WEBSOCKETS else "websockets"
    config = Config(app, http="httptools", ws=ws, lifespan="off", log_config=None)
    config.load()
    protocol = HttpToolsProtocol(config, ServerState(), {}, asyncio.get_running_loop())
    transport = Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol, transport


async def cancel_tasks(protocol: HttpToolsProtocol) -> None:
    tasks = list(protocol.tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# uvicorn release -> (a websockets-sansio protocol, a refused handshake sent with the app's headers, Multiprocess
# building its workers' servers): what uvicorn does itself there; before 0.53 bastion._compat.uvicorn does the last
# two as 0.53 does, and before 0.35 the listener's WebSocket protocol is the legacy one (``_websocket_legacy``).
FEATURES = {
    "0.54.0": (True, True, True),  # the newest: `make test`
    "0.44.0": (True, False, False),  # `make compat`'s middle set
    "0.30.0": (False, False, False),  # `make compat`'s oldest set
}


def test_the_version_is_one_verified() -> None:
    assert uvicorn.__version__ in FEATURES


def test_what_this_uvicorn_does_itself() -> None:
    from uvicorn.supervisors import Multiprocess

    builds_servers = "target" not in inspect.signature(Multiprocess.__init__).parameters
    assert (
        uvicorn_compat.SANSIO_WEBSOCKETS,
        uvicorn_compat.REFUSAL_KEEPS_APP_HEADERS,
        builds_servers,
    ) == FEATURES[uvicorn.__version__]


async def test_a_pipelined_request_is_queued_with_appendleft_and_reading_paused() -> None:
    protocol, transport = http_protocol()
    protocol.data_received(REQUEST * 3)
    assert isinstance(protocol.pipeline, deque) and len(protocol.pipeline) == 2
    assert protocol.pipeline[0][0] is protocol.cycle  # the newest on the left; on_response_complete pops the right
    assert protocol.flow.read_paused and not transport.reading
    await cancel_tasks(protocol)


async def test_on_response_complete_resumes_reading_before_it_starts_the_next_request() -> None:
    """The listener's ReadGate relies on both: uvicorn resumes even with requests queued, then pops one."""
    protocol, _ = http_protocol()
    protocol.data_received(REQUEST * 3)
    resumed_with: list[int] = []
    flow = protocol.flow
    original = flow.resume_reading

    def resume() -> None:
        resumed_with.append(len(protocol.pipeline))
        original()

    flow.resume_reading = resume  # type: ignore[method-assign]
    protocol.on_response_complete()
    assert resumed_with == [2]
    assert len(protocol.pipeline) == 1
    await cancel_tasks(protocol)


async def test_a_body_over_the_high_water_mark_pauses_reading() -> None:
    protocol, transport = http_protocol()
    body = b"a" * (HIGH_WATER_LIMIT + 1)
    protocol.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert len(protocol.cycle.body) > HIGH_WATER_LIMIT  # bytes before uvicorn 0.42, a bytearray since
    assert protocol.flow.read_paused and not transport.reading
    await cancel_tasks(protocol)


async def test_on_header_lowercases_appends_and_notes_expect_100_continue() -> None:
    """The listener inlines this (it runs for every header line)."""
    protocol, _ = http_protocol()
    protocol.on_message_begin()
    protocol.on_header(b"Expect", b"100-Continue")
    protocol.on_header(b"X-A", b"B")
    assert protocol.headers == [(b"expect", b"100-Continue"), (b"x-a", b"B")]
    assert protocol.expect_100_continue


async def test_connection_lost_marks_only_the_last_request_parsed_as_disconnected() -> None:
    """Why the listener marks the request being answered itself: uvicorn does not."""
    protocol, _ = http_protocol()
    protocol.data_received(REQUEST)
    answering = protocol.cycle
    protocol.data_received(REQUEST)
    queued = protocol.cycle
    protocol.connection_lost(None)
    assert queued.disconnected
    assert not answering.disconnected
    await cancel_tasks(protocol)


def test_the_cycle_and_flow_control_attributes_the_listener_reads() -> None:
    cycle_init = inspect.signature(RequestResponseCycle.__init__).parameters
    assert {"scope", "transport", "flow", "message_event", "keep_alive", "on_response"} <= set(cycle_init)
    source = inspect.getsource(RequestResponseCycle.__init__)
    for attribute in ("self.body", "self.more_body", "self.disconnected", "self.response_complete"):
        assert attribute in source, attribute
    assert {"read_paused", "pause_reading", "resume_reading"} <= set(dir(FlowControl(Transport())))  # type: ignore[arg-type]
    for name in ("_unset_keepalive_if_required", "_should_upgrade"):
        assert callable(getattr(HttpToolsProtocol, name)), name
    # 0.32 and later; before, uvicorn_compat.warn_unsupported_upgrade logs the same text itself
    assert callable(getattr(HttpToolsProtocol, "_unsupported_upgrade_warning", None)) == (VERSION >= (0, 32))


async def test_the_websocket_upgrade_sets_the_websocket_protocol_on_the_transport() -> None:
    protocol, transport = http_protocol()
    protocol.data_received(UPGRADE)
    uvicorns = next(cls for cls in WebSocketProtocol.__mro__ if cls.__module__.startswith("uvicorn."))
    assert isinstance(transport.get_protocol(), uvicorns)  # the uvicorn class the listener's extends
    await cancel_tasks(protocol)


def test_the_websocket_protocol_works_as_the_listener_assumes() -> None:
    if uvicorn_compat.SANSIO_WEBSOCKETS:
        sansio_assumptions()
    else:
        legacy_assumptions()


def sansio_assumptions() -> None:
    """uvicorn 0.35 and later: ``_websocket_sansio`` checks a text message where uvicorn assembles it."""
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

    source = inspect.getsource(WebSocketsSansIOProtocol.send_receive_event_to_app)
    # uvicorn 0.50 and later assemble a message in ``frames``; 0.35 to 0.49 in ``bytes`` (uvicorn_compat reads both).
    message = "self.frames" if VERSION >= (0, 50) else "self.bytes"
    for name in (message, "self.curr_msg_data_type", "self.conn.send_close(1007)"):
        assert name in source, name
    assert "self.close_sent" in inspect.getsource(WebSocketsSansIOProtocol)
    assert callable(WebSocketsSansIOProtocol.handle_parser_exception)


def legacy_assumptions() -> None:
    """uvicorn 0.30 to 0.34: what ``_websocket_legacy`` relies on: ``process_request`` returns ``initial_response``
    once the response has started, ``asgi_send`` sets ``closed_event`` when its last body part arrives, and
    websockets fails a text message that is not UTF-8 through ``fail_connection`` with 1007."""
    from uvicorn.protocols.websockets.websockets_impl import WebSocketProtocol as Legacy
    from websockets.legacy.protocol import WebSocketCommonProtocol

    request = inspect.getsource(Legacy.process_request)
    assert "await self.handshake_started_event.wait()" in request and "return self.initial_response" in request
    assert "self.closed_event.set()" in inspect.getsource(Legacy.asgi_send)
    transfer = inspect.getsource(WebSocketCommonProtocol.transfer_data)
    assert "except UnicodeDecodeError" in transfer and "self.fail_connection(CloseCode.INVALID_DATA)" in transfer


async def refuses_slowly(scope: Any, receive: Any, send: Any) -> None:
    """A WebSocket refusal whose body comes in two parts, with the event loop run between them."""
    await receive()  # websocket.connect
    await send({"type": "websocket.http.response.start", "status": 403, "headers": [(b"content-type", b"text/x")]})
    for part in (b"not ", b"yours"):
        await asyncio.sleep(0)
        await send({"type": "websocket.http.response.body", "body": part, "more_body": part == b"not "})


async def test_a_refused_handshake_is_answered_with_the_whole_body_and_the_apps_headers() -> None:
    """The same answer on every supported uvicorn, whichever WebSocket protocol it has."""
    config = Config(refuses_slowly, http="httptools", ws=WebSocketProtocol, lifespan="off", log_config=None)
    loop = asyncio.get_running_loop()
    config.load()
    state = ServerState()
    listening = await loop.create_server(
        lambda: HttpToolsProtocol(config, state, {}, loop),
        "127.0.0.1",
        0,  # type: ignore[arg-type]
    )
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listening.sockets[0].getsockname()[1])
        writer.write(UPGRADE)
        answer = await asyncio.wait_for(reader.read(), timeout=10)
        writer.close()
    finally:
        listening.close()
        await listening.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    headers = [line.lower() for line in head.split(b"\r\n")[1:]]
    assert head.startswith(b"HTTP/1.1 403 ")
    assert body == b"not yours"
    assert [h for h in headers if h.startswith((b"content-type:", b"content-length:"))] == [
        b"content-type: text/x",
        b"content-length: 9",
    ]


def test_every_hook_the_listener_needs_is_there() -> None:
    assert uvicorn_compat.missing() == []
    uvicorn_compat.check()


def test_start_up_refuses_when_a_hook_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uvicorn_compat, "missing", lambda: ["HttpToolsProtocol._should_upgrade"])
    with pytest.raises(ConfigError, match=r"lacks .*_should_upgrade.*; supported: uvicorn 0\.30\.0 to 0\.54\.x$"):
        uvicorn_compat.check()


async def test_a_keepalive_timer_is_cancelled_by_unset_keepalive() -> None:
    protocol, _ = http_protocol(answers)
    protocol.data_received(REQUEST)
    await asyncio.wait_for(asyncio.gather(*protocol.tasks), timeout=5)
    assert protocol.timeout_keep_alive_task is not None  # armed once the response completed
    uvicorn_compat.unset_keepalive(protocol)
    assert protocol.timeout_keep_alive_task is None


async def test_should_upgrade_tells_a_websocket_upgrade() -> None:
    protocol, _ = http_protocol()
    protocol.on_message_begin()
    protocol.on_header(b"Upgrade", b"websocket")
    protocol.on_header(b"Connection", b"Upgrade")
    assert uvicorn_compat.should_upgrade(protocol)
    plain, _ = http_protocol()
    plain.on_message_begin()
    plain.on_header(b"Upgrade", b"h2c")
    assert not uvicorn_compat.should_upgrade(plain)
    uvicorn_compat.warn_unsupported_upgrade(plain)  # callable without arguments


class Cycle(RequestResponseCycle):
    marker = "ours"


async def test_a_cycle_adopts_a_subclass_before_its_task_runs() -> None:
    protocol, _ = http_protocol()
    protocol.data_received(REQUEST)
    cycle = uvicorn_compat.adopt_cycle(protocol.cycle, Cycle)
    assert type(protocol.cycle) is Cycle and cycle is protocol.cycle
    await cancel_tasks(protocol)


def test_captured_signals_are_forgotten() -> None:
    server = Server(Config(never_answers, lifespan="off", log_config=None))
    server.handle_exit(2, None)  # what a SIGINT does
    assert server._captured_signals == [2]
    uvicorn_compat.forget_captured_signals(server)
    assert server._captured_signals == []


async def answers(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


REFUSING = """
import sys
from bastion._compat import {module} as compat
compat.missing = lambda: ["{hook}"]  # our compat module's probe: the library itself is untouched
from bastion._cli import main
sys.exit(main(["run", "examples.documents_api:service", "--port", "0"]))
"""


@pytest.mark.parametrize(
    ("module", "hook", "line"),
    [
        pytest.param(
            "uvicorn",
            "HttpToolsProtocol._should_upgrade",
            f"error: uvicorn {uvicorn.__version__} lacks what Bastion's listener limits rely on "
            "(HttpToolsProtocol._should_upgrade); supported: uvicorn 0.30.0 to 0.54.x",
            id="uvicorn",
        ),
        pytest.param(
            "grpclib",
            "grpclib.server.Server._protocol_factory",
            f"error: grpclib {importlib.metadata.version('grpclib')} lacks what Bastion's gRPC limits rely on "
            "(grpclib.server.Server._protocol_factory); supported: grpclib 0.4.7 to 0.4.x",
            id="grpclib",
        ),
    ],
)
def test_bastion_run_refuses_to_start_in_one_line_without_a_hook(module: str, hook: str, line: str) -> None:
    """The listener's and the gRPC limits are a security boundary: no serving without them."""
    result = subprocess.run(
        [sys.executable, "-c", REFUSING.format(module=module, hook=hook)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SERVICE_TOKEN_ENABLED": "false", "SERVICE_GRPC_ENABLED": "true"},
    )
    *before, last = result.stderr.splitlines()
    assert (result.returncode, last) == (2, line)
    # On a FastAPI without the compiled handlers' internals, their one start-up line comes first; nothing else.
    assert [json.loads(earlier)["event"] for earlier in before] == (
        [] if fastapi_compat.supported() else ["compiled_handlers_unavailable"]
    )
