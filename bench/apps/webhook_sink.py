"""The fast local webhook receiver for the MailRelay rows: 200 to every POST, ``GET /count`` says how many.

A bare asyncio protocol (uvloop when installed) with HTTP/1.1 keep-alive, so the receiver costs as little
CPU as possible next to the relay. It does not verify signatures: the relay's cost of signing is measured,
the receiver's cost of checking is not. Run: ``python -m bench.apps.webhook_sink PORT``.
"""

from __future__ import annotations

import asyncio
import sys

from bench.loops import run_fast

OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'
HEADER_END = b"\r\n\r\n"


class Receiver(asyncio.Protocol):
    """Counts complete POSTs across all connections in ``Receiver.delivered``."""

    delivered = 0

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.awaiting = 0
        """Bytes the request being received needs in all (0: its head is not complete yet); a 30 MB body is not
        searched for the end of the head again on every chunk."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.awaiting and len(self.buffer) < self.awaiting:
            return
        self.awaiting = 0
        while True:
            end = self.buffer.find(HEADER_END)
            if end < 0:
                return
            head = bytes(self.buffer[:end]).lower()
            length = 0
            marker = head.find(b"\r\ncontent-length:")
            if marker >= 0:
                line_end = head.find(b"\r\n", marker + 2)
                length = int(head[marker + 17 : line_end if line_end >= 0 else None])
            total = end + 4 + length
            if len(self.buffer) < total:
                self.awaiting = total
                return
            del self.buffer[:total]
            assert self.transport is not None
            if head.startswith(b"get /count"):
                body = str(Receiver.delivered).encode()
                self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            else:
                Receiver.delivered += 1
                self.transport.write(OK)


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Receiver, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    run_fast(serve(int(sys.argv[1])))


if __name__ == "__main__":
    main()
