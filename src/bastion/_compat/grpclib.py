"""grpclib internals Bastion's gRPC call layer relies on (grpclib is pinned; verified on grpclib 0.4.9).

Reading a request message (``bastion.grpc._interceptors`` reads it itself, to check its length prefix before the
message is read and to tell a broken message from a handler's fault):

- ``grpclib.server.Stream._stream``: the call's HTTP/2 stream; its ``recv_data(n)`` returns exactly ``n`` bytes,
  ``b""`` when the client ended the stream without sending any, and raises ``AssertionError`` when the client
  ended it after fewer (``grpclib.protocol.Buffer.read``).
- ``Stream._cardinality``, ``Stream._codec``, ``Stream._recv_type``: whether the client streams, how its
  messages decode.
- ``Stream._dispatch.recv_message``, ``Stream._messages_received`` and the connection's ``messages_received`` /
  ``last_message_received``: what ``Stream.recv_message`` does with a decoded message (the ``RecvMessage``
  event, the statistics).

Sending the initial metadata with the call's request id last (what ``Stream.send_initial_metadata`` does):
``Stream._send_initial_metadata_done``, ``Stream._content_type``, ``Stream._dispatch.send_initial_metadata`` and
the HTTP/2 stream's ``send_headers``.

``tests/bastion/compat/test_grpclib.py`` checks each of these on the installed grpclib.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from grpclib.exceptions import ProtocolError
from grpclib.metadata import encode_metadata
from grpclib.server import Stream
from multidict import MultiDict


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
