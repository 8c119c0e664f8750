"""The grpclib internals ``bastion._compat.grpclib`` relies on (verified on grpclib 0.4.9, h2 4.4.1)."""

from __future__ import annotations

import asyncio
from typing import Any

from grpclib.protocol import Connection, H2Protocol
from grpclib.server import Server
from h2.connection import H2Connection

from bastion._compat import grpclib as grpclib_compat


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


async def test_a_server_builds_a_protocol_per_connection_and_tracks_its_handler() -> None:
    server = Server([])
    protocol = grpclib_compat.new_protocol(server)
    assert isinstance(protocol, H2Protocol)
    assert list(grpclib_compat.handlers(server)) == [protocol.handler]


async def test_a_connection_holds_its_h2_state_machine_and_writes_through_its_transport() -> None:
    protocol = grpclib_compat.new_protocol(Server([]))
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
