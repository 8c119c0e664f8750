"""grpclib internals Bastion's gRPC server relies on (verified on grpclib 0.4.9).

- ``grpclib.protocol.Connection._connection``: the connection's ``h2.connection.H2Connection`` (its public
  API then: the HPACK encoder and decoder, settings, open streams, ``ping``).
- ``grpclib.protocol.Connection._transport``: the transport frames are written to; streams take it when they
  open, so replacing it right after ``connection_made`` routes every later frame through the replacement.
- ``grpclib.server.Server._protocol_factory``: builds the HTTP/2 protocol of one connection (with its handler).
- ``grpclib.server.Server._handlers``: the live connections' handlers (closed and awaited at shutdown).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

from grpclib.protocol import Connection, H2Protocol
from grpclib.server import Server
from h2.connection import H2Connection


def h2_connection(connection: Connection) -> H2Connection:
    """The h2 state machine behind a grpclib connection."""
    return connection._connection


def replace_transport(connection: Connection, transport: asyncio.Transport) -> None:
    """Make ``transport`` the one a grpclib connection (and the streams it opens later) writes to."""
    connection._transport = transport


def new_protocol(server: Server) -> H2Protocol:
    """The HTTP/2 protocol grpclib builds for one connection of ``server``."""
    return server._protocol_factory()


def handlers(server: Server) -> Collection[Any]:
    """The handlers of ``server``'s live connections (``close()`` and ``await wait_closed()`` each)."""
    return server._handlers
