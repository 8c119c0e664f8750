"""grpclib internals Bastion relies on (verified on grpclib 0.4.9; `make compat` runs on 0.4.8 and 0.4.7).

The server (``bastion.grpc._server``):

- ``grpclib.protocol.Connection._connection``: the connection's ``h2.connection.H2Connection`` (its public
  API then: the HPACK encoder and decoder, settings, open streams, ``ping``).
- ``grpclib.protocol.Connection._transport``: the transport frames are written to; streams take it when they
  open, so replacing it right after ``connection_made`` routes every later frame through the replacement.
- ``grpclib.server.Server._protocol_factory``: builds the HTTP/2 protocol of one connection (with its handler).
  Bastion's connections are grpclib's protocol and handler with their classes replaced by subclasses that add
  state only through class attributes and methods (``new_protocol``): grpclib builds both, so a subclass's
  ``__init__`` would never run.
- ``grpclib.server.Server._handlers``: the live connections' handlers (closed and awaited at shutdown).

The call layer (``bastion.grpc._interceptors``) reads a request message itself, to check its length prefix before
the message is read and to tell a broken message from a handler's fault:

- ``grpclib.server.Stream._stream``: the call's HTTP/2 stream; its ``recv_data(n)`` returns exactly ``n`` bytes,
  ``b""`` when the client ended the stream without sending any, and raises ``AssertionError`` when the client
  ended it after fewer (``grpclib.protocol.Buffer.read``).
- ``Stream._cardinality``, ``Stream._codec``, ``Stream._recv_type``: whether the client streams, how its
  messages decode.
- ``grpclib.protocol.Buffer._eof`` (of the HTTP/2 stream's ``buffer``): the client has ended its request stream,
  so every byte of it is there and reading it never waits (no message timer is needed).
- ``Stream._dispatch.recv_message``, ``Stream._messages_received`` and the connection's ``messages_received`` /
  ``last_message_received``: what ``Stream.recv_message`` does with a decoded message (the ``RecvMessage``
  event, the statistics).

It sends the initial metadata with the call's request id last (what ``Stream.send_initial_metadata`` does):
``Stream._send_initial_metadata_done``, ``Stream._content_type``, ``Stream._dispatch.send_initial_metadata`` and
the HTTP/2 stream's ``send_headers``. It sends the trailers of a call its handler ran without the
``SendTrailingMetadata`` event (what ``Stream.send_trailing_metadata`` does): ``Stream._send_trailing_metadata_done``,
``Stream._send_message_done``, ``Stream._status_details_codec`` and the HTTP/2 stream's ``closable`` and
``reset_nowait``.

The HTTP/2 limits and the message checks depend on these: ``check()`` runs at start-up (with gRPC enabled) and
refuses to serve, in one line naming the supported versions, when one is missing.
``tests/bastion/compat/test_grpclib.py`` checks each of these on the installed grpclib.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Any, TypeVar, cast

from grpclib.const import Status
from grpclib.exceptions import ProtocolError
from grpclib.metadata import encode_grpc_message, encode_metadata
from grpclib.protocol import Buffer, Connection, H2Protocol
from grpclib.server import Handler, Server, Stream
from h2.connection import H2Connection
from multidict import MultiDict

from bastion.errors import ConfigError

ProtocolT = TypeVar("ProtocolT", bound=H2Protocol)

VERIFIED = "grpclib 0.4.9"
"""The grpclib version these assumptions were last checked on."""
SUPPORTED = "grpclib 0.4.7 to 0.4.x"
"""The range pyproject.toml declares (`make compat` runs its oldest release)."""
_ASSUMED = {
    Buffer: ("_eof",),
    Connection: ("_connection", "_transport"),
    Server: ("_protocol_factory", "_handlers"),
    Stream: (
        "_stream",
        "_cardinality",
        "_codec",
        "_recv_type",
        "_dispatch",
        "_messages_received",
        "_send_initial_metadata_done",
        "_content_type",
        "_send_trailing_metadata_done",
        "_send_message_done",
        "_status_details_codec",
    ),
}
PRIVATE_NAMES = frozenset(name for names in _ASSUMED.values() for name in names)
"""Every private name of grpclib this module touches (the wall test looks for them outside ``bastion._compat``)."""


def version() -> str:
    """The installed grpclib's version."""
    return importlib.metadata.version("grpclib")


def missing() -> list[str]:
    """The internals the installed grpclib lacks (``[]``: none): each is a class attribute or set by its class."""
    absent = []
    for cls, names in _ASSUMED.items():
        source = inspect.getsource(cls)
        absent += [
            f"{cls.__module__}.{cls.__name__}.{name}"
            for name in names
            if not hasattr(cls, name) and f"self.{name} =" not in source and f"self.{name}: " not in source
        ]
    return absent


def check() -> None:
    """Refuse to serve (ConfigError, one line) when the installed grpclib lacks an internal the HTTP/2 limits or the
    message checks rely on."""
    absent = missing()
    if absent:
        raise ConfigError(
            f"grpclib {version()} lacks what Bastion's gRPC limits rely on ({', '.join(absent)}); "
            f"supported: {SUPPORTED}"
        )


def h2_connection(connection: Connection) -> H2Connection:
    """The h2 state machine behind a grpclib connection."""
    return connection._connection


def replace_transport(connection: Connection, transport: asyncio.Transport) -> None:
    """Make ``transport`` the one a grpclib connection (and the streams it opens later) writes to."""
    connection._transport = transport


def new_protocol(
    server: Server, *, protocol_class: type[ProtocolT], handler_class: type[Handler] = Handler
) -> ProtocolT:
    """The HTTP/2 protocol grpclib builds for one connection of ``server`` (its handler tracked by the server for
    draining), as a ``protocol_class`` whose handler is a ``handler_class``: subclasses of grpclib's ``H2Protocol``
    and ``Handler`` without an ``__init__`` of their own."""
    protocol = server._protocol_factory()
    protocol.__class__ = protocol_class
    protocol.handler.__class__ = handler_class
    return cast(ProtocolT, protocol)


def handlers(server: Server) -> Collection[Any]:
    """The handlers of ``server``'s live connections (``close()`` and ``await wait_closed()`` each)."""
    return server._handlers


class StreamEnded(Exception):
    """The client ended its request stream before the bytes asked for had all arrived."""


async def recv_bytes(stream: Stream[Any, Any], size: int) -> bytes:
    """The next ``size`` bytes of the call's request stream; ``b""`` when the client ended the stream without
    sending any; StreamEnded when it ended after fewer."""
    try:
        data: bytes = await stream._stream.recv_data(size)
    except AssertionError:  # grpclib's Buffer.read: "Received less data than expected"
        raise StreamEnded from None
    return data


def request_ended(stream: Stream[Any, Any]) -> bool:
    """Whether the client has ended its request stream: all of it has arrived, reading it never waits."""
    return bool(stream._stream.buffer._eof)


def client_streams(stream: Stream[Any, Any]) -> bool:
    """Whether the client sends a stream of messages (else exactly one)."""
    return bool(stream._cardinality.client_streaming)


def decode_request(stream: Stream[Any, Any], data: bytes) -> Any:
    """``data`` decoded as the call's request message (the codec's own error when it does not decode)."""
    return stream._codec.decode(data, stream._recv_type)


async def received(stream: Stream[Any, Any], message: Any) -> Any:
    """What ``Stream.recv_message`` does with a decoded message: the ``RecvMessage`` event (whose listeners may
    replace it) and the statistics; the message the handler gets."""
    (message,) = await stream._dispatch.recv_message(message)
    stream._messages_received += 1
    connection = stream._stream.connection
    connection.messages_received += 1
    connection.last_message_received = time.monotonic()
    return message


def initial_metadata_sender(
    stream: Stream[Any, Any], request_id: str, *, sent: Callable[[], object]
) -> Callable[..., Awaitable[None]]:
    """``Stream.send_initial_metadata`` with ``x-request-id: request_id`` last (a handler's own is replaced); calls
    ``sent()`` once the headers are out.

    The id is a sane token (checked or generated), so it skips grpclib's metadata validation and no event object is
    built for it.
    """

    async def send_initial_metadata(*, metadata: Any = None) -> None:
        if stream._send_initial_metadata_done:
            raise ProtocolError("Initial metadata was already sent")
        headers = [(":status", "200"), ("content-type", stream._content_type)]
        if metadata:
            given = MultiDict(metadata)
            given.popall("x-request-id", None)
            (given,) = await stream._dispatch.send_initial_metadata(given)
            headers.extend(encode_metadata(given))
        headers.append(("x-request-id", request_id))
        await stream._stream.send_headers(headers)
        stream._send_initial_metadata_done = True
        sent()

    return send_initial_metadata


_STATUS_VALUES = {status: str(status.value) for status in Status}
"""``grpc-status`` values, made once."""


def trailing_metadata_sender(
    stream: Stream[Any, Any], ending: Callable[[Status, bool], Iterable[tuple[str, str]]]
) -> Callable[..., Awaitable[None]]:
    """``Stream.send_trailing_metadata`` without the ``SendTrailingMetadata`` event: ``ending(status, trailers_only)``
    is told the call's status and gives the trailing metadata to add (names and values Bastion made: sane, so
    grpclib's metadata validation is skipped, as is the event object and its empty ``MultiDict``).

    Trailers with the handler's own metadata or status details go through grpclib's method (and its event).
    """
    original = stream.send_trailing_metadata

    async def send_trailing_metadata(
        *,
        status: Status = Status.OK,
        status_message: str | None = None,
        status_details: Any = None,
        metadata: Any = None,
    ) -> None:
        if metadata or (status_details is not None and stream._status_details_codec is not None):
            await original(
                status=status, status_message=status_message, status_details=status_details, metadata=metadata
            )
            return
        if stream._send_trailing_metadata_done:
            raise ProtocolError("Trailing metadata was already sent")
        if not stream._cardinality.server_streaming and not stream._send_message_done and status is Status.OK:
            raise ProtocolError("Unary response with OK status requires a single message to be sent")
        trailers_only = not stream._send_initial_metadata_done
        headers = [(":status", "200"), ("content-type", stream._content_type)] if trailers_only else []
        headers.append(("grpc-status", _STATUS_VALUES[status]))
        if status_message is not None:
            headers.append(("grpc-message", encode_grpc_message(status_message)))
        headers.extend(ending(status, trailers_only))
        h2_stream = stream._stream
        await h2_stream.send_headers(headers, end_stream=True)
        stream._send_trailing_metadata_done = True
        if status != Status.OK and h2_stream.closable:
            h2_stream.reset_nowait()

    return send_trailing_metadata
