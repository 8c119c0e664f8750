"""The call's request id goes out with the initial metadata, added by Bastion's own send (no event listener); the
trailers of a call its handler ran go out through Bastion's own send too (no SendTrailingMetadata event)."""

from __future__ import annotations

from typing import Any

import pytest
from grpclib.const import Cardinality, Status
from grpclib.exceptions import ProtocolError

from bastion._compat.grpclib import initial_metadata_sender, trailing_metadata_sender


class FakeH2Stream:
    def __init__(self) -> None:
        self.sent: list[list[tuple[str, str]]] = []
        self.ended: list[bool] = []
        self.resets = 0
        self.closable = True

    async def send_headers(self, headers: list[tuple[str, str]], end_stream: bool = False) -> None:
        self.sent.append(list(headers))
        self.ended.append(end_stream)

    def reset_nowait(self) -> None:
        self.resets += 1


class FakeDispatch:
    async def send_initial_metadata(self, metadata: Any) -> tuple[Any]:
        return (metadata,)


class FakeStream:
    """What grpclib's server Stream holds that its send_initial_metadata uses (grpclib is pinned)."""

    def __init__(self) -> None:
        self._send_initial_metadata_done = False
        self._content_type = "application/grpc+proto"
        self._dispatch = FakeDispatch()
        self._stream = FakeH2Stream()
        self._send_trailing_metadata_done = False
        self._send_message_done = True
        self._status_details_codec = None
        self._cardinality = Cardinality.UNARY_UNARY
        self.original: list[dict[str, Any]] = []

    async def send_trailing_metadata(self, **kwargs: Any) -> None:
        self.original.append(kwargs)


async def test_the_id_follows_the_status_and_content_type() -> None:
    stream = FakeStream()
    sent: list[bool] = []
    await initial_metadata_sender(stream, "rid-1", sent=lambda: sent.append(True))()  # type: ignore[arg-type]
    assert sent == [True]
    assert stream._stream.sent == [
        [(":status", "200"), ("content-type", "application/grpc+proto"), ("x-request-id", "rid-1")]
    ]
    assert stream._send_initial_metadata_done


async def test_a_handlers_metadata_is_kept_and_its_request_id_replaced() -> None:
    stream = FakeStream()
    send = initial_metadata_sender(stream, "rid-2", sent=lambda: None)  # type: ignore[arg-type]
    await send(metadata={"x-custom": "1", "x-request-id": "from-the-handler"})
    assert stream._stream.sent == [
        [
            (":status", "200"),
            ("content-type", "application/grpc+proto"),
            ("x-custom", "1"),
            ("x-request-id", "rid-2"),
        ]
    ]
    with pytest.raises(ProtocolError, match="already sent"):
        await send()


async def test_trailers_carry_the_status_and_what_the_call_adds() -> None:
    stream = FakeStream()
    stream._send_initial_metadata_done = True
    told: list[tuple[Status, bool]] = []

    def ending(status: Status, trailers_only: bool) -> list[tuple[str, str]]:
        told.append((status, trailers_only))
        return [("retry-after", "3")]

    send = trailing_metadata_sender(stream, ending)  # type: ignore[arg-type]
    await send(status=Status.OK)
    assert told == [(Status.OK, False)]
    assert stream._stream.sent == [[("grpc-status", "0"), ("retry-after", "3")]]
    assert stream._stream.ended == [True] and stream._stream.resets == 0
    assert stream._send_trailing_metadata_done and stream.original == []
    with pytest.raises(ProtocolError, match="already sent"):
        await send()


async def test_a_trailers_only_answer_has_the_status_line_and_resets_an_open_stream() -> None:
    stream = FakeStream()
    send = trailing_metadata_sender(stream, lambda status, only: [("x-request-id", "rid-3")] if only else [])  # type: ignore[arg-type]
    await send(status=Status.NOT_FOUND, status_message="Not found")
    assert stream._stream.sent == [
        [
            (":status", "200"),
            ("content-type", "application/grpc+proto"),
            ("grpc-status", "5"),
            ("grpc-message", "Not found"),
            ("x-request-id", "rid-3"),
        ]
    ]
    assert stream._stream.resets == 1


async def test_a_unary_ok_without_its_message_is_refused_as_grpclib_does() -> None:
    stream = FakeStream()
    stream._send_message_done = False
    send = trailing_metadata_sender(stream, lambda status, only: [])  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="requires a single message"):
        await send(status=Status.OK)
    assert stream._stream.sent == []


async def test_a_handlers_own_trailing_metadata_goes_through_grpclib() -> None:
    stream = FakeStream()
    send = trailing_metadata_sender(stream, lambda status, only: pytest.fail("not ours"))  # type: ignore[arg-type]
    await send(status=Status.OK, metadata={"x-custom": "1"})
    assert stream.original == [
        {"status": Status.OK, "status_message": None, "status_details": None, "metadata": {"x-custom": "1"}}
    ]
    assert stream._stream.sent == []
