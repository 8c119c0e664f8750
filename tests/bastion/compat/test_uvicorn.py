"""What the listener (``bastion._listener``) assumes of uvicorn's internals, checked on the installed version.

Verified on uvicorn 0.54.0 (pinned in pyproject.toml). The listener subclasses uvicorn's httptools and
websockets-sansio protocols; an upgrade that changes one of these behaviours fails here, by name.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from typing import Any

import uvicorn
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState

REQUEST = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"


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

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def get_protocol(self) -> Any:
        return self.protocol


async def never_answers(scope: Any, receive: Any, send: Any) -> None:
    await asyncio.Event().wait()


def http_protocol(app: Any = never_answers) -> tuple[HttpToolsProtocol, Transport]:
    config = Config(app, http="httptools", ws="websockets-sansio", lifespan="off", log_config=None)
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


def test_the_verified_version_is_installed() -> None:
    assert uvicorn.__version__ == "0.54.0"


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
    assert isinstance(protocol.cycle.body, bytearray) and len(protocol.cycle.body) > HIGH_WATER_LIMIT
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
    for name in ("_unset_keepalive_if_required", "_should_upgrade", "_unsupported_upgrade_warning"):
        assert callable(getattr(HttpToolsProtocol, name)), name


async def test_the_websocket_upgrade_sets_the_websocket_protocol_on_the_transport() -> None:
    protocol, transport = http_protocol()
    protocol.data_received(
        b"GET / HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    assert isinstance(transport.get_protocol(), WebSocketsSansIOProtocol)
    await cancel_tasks(protocol)


def test_the_websocket_protocol_assembles_messages_where_the_listener_checks_them() -> None:
    source = inspect.getsource(WebSocketsSansIOProtocol.send_receive_event_to_app)
    for name in ("self.frames", "self.curr_msg_data_type", "self.close_sent", "self.conn.send_close(1007)"):
        assert name in source, name
    assert callable(WebSocketsSansIOProtocol.handle_parser_exception)
