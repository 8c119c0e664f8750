"""The call's request id goes out with the initial metadata, added by Bastion's own send (no event listener)."""

from __future__ import annotations

from typing import Any

import pytest
from grpclib.exceptions import ProtocolError

from bastion._compat.grpclib import initial_metadata_sender


class FakeH2Stream:
    def __init__(self) -> None:
        self.sent: list[list[tuple[str, str]]] = []

    async def send_headers(self, headers: list[tuple[str, str]]) -> None:
        self.sent.append(list(headers))


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
