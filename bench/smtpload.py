"""The SMTP load client: N connections, each sending one message after another over one session.

Per message: ``MAIL FROM``, ``RCPT TO``, ``DATA``, the message and the final dot, each step waiting for its
reply (no pipelining, like most sending servers); the latency runs from ``MAIL`` to the ``250`` after the
data. A bare asyncio protocol on uvloop with every command pre-encoded, so the client spends far less CPU
than the server it loads; the harness records both processes' CPU to show it.
Prints one JSON object. Run: ``python -m bench.smtpload PORT --duration S --connections N --rcpt ADDRESS``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from bench.loops import run_fast
from bench.stats import load_result

CONNECT_TIMEOUT_SECS = 5.0
MESSAGE = (
    b"From: Load Client <load@bench.test>\r\n"
    b"To: <{rcpt}>\r\n"
    b"Subject: benchmark message\r\n"
    b"Message-ID: <bench-{n}@bench.test>\r\n"
    b"Date: Sat, 21 Nov 2026 00:00:00 +0000\r\n"
    b"MIME-Version: 1.0\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"\r\n" + b"A line of an ordinary plain-text message body, about seventy characters.\r\n" * 12 + b".\r\n"
)


class Tally:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.failed = 0
        self.errors = 0


class SmtpClient(asyncio.Protocol):
    """A reply-driven state machine: each complete reply triggers the next command of the transaction."""

    def __init__(self, rcpt: str, number: int, tally: Tally, deadline: float, done: asyncio.Future[None]) -> None:
        self.tally = tally
        self.deadline = deadline
        self.done = done
        self.mail = b"MAIL FROM:<load@bench.test>\r\n"
        self.rcpt = f"RCPT TO:<{rcpt}>\r\n".encode()
        self.data = MESSAGE.replace(b"{rcpt}", rcpt.encode()).replace(b"{n}", str(number).encode())
        self.buffer = bytearray()
        self.step = "greeting"
        self.started = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, chunk: bytes) -> None:
        self.buffer += chunk
        while True:
            end = self.buffer.find(b"\r\n")
            if end < 0:
                return
            line = bytes(self.buffer[:end])
            del self.buffer[: end + 2]
            if line[3:4] != b"-":  # the last line of a (possibly multi-line) reply
                self._on_reply(line[:3])

    def _write(self, data: bytes, step: str) -> None:
        assert self.transport is not None
        self.step = step
        self.transport.write(data)

    def _on_reply(self, code: bytes) -> None:
        step = self.step
        if step == "greeting":
            self._write(b"EHLO bench.test\r\n", "ehlo")
        elif step in ("ehlo", "rset"):
            self._next_message()
        elif step == "mail" and code == b"250":
            self._write(self.rcpt, "rcpt")
        elif step == "rcpt" and code == b"250":
            self._write(b"DATA\r\n", "data")
        elif step == "data" and code == b"354":
            self._write(self.data, "dot")
        elif step == "dot" and code == b"250":
            self.tally.latencies.append(time.perf_counter() - self.started)
            self._next_message()
        elif step == "quit":
            self._close()
        else:
            self.tally.failed += 1
            self._write(b"RSET\r\n", "rset")

    def _next_message(self) -> None:
        if time.monotonic() >= self.deadline:
            self._write(b"QUIT\r\n", "quit")
            return
        self.started = time.perf_counter()
        self._write(self.mail, "mail")

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            if self.step != "quit":
                self.tally.errors += 1
            self.done.set_result(None)


async def run(port: int, *, duration: float, connections: int, rcpt: str) -> dict[str, object]:
    loop = asyncio.get_running_loop()
    tally = Tally()
    started = time.perf_counter()
    deadline = time.monotonic() + duration
    waiters: list[asyncio.Future[None]] = []
    transports: list[asyncio.BaseTransport] = []
    for number in range(connections):
        done: asyncio.Future[None] = loop.create_future()
        transport, _protocol = await asyncio.wait_for(
            loop.create_connection(
                lambda number=number, done=done: SmtpClient(rcpt, number, tally, deadline, done), "127.0.0.1", port
            ),
            CONNECT_TIMEOUT_SECS,
        )
        waiters.append(done)
        transports.append(transport)
    try:
        await asyncio.wait_for(asyncio.gather(*waiters), duration + CONNECT_TIMEOUT_SECS)
    except TimeoutError:
        tally.errors += sum(not waiter.done() for waiter in waiters)
    finally:
        for transport in transports:
            transport.close()
    elapsed = time.perf_counter() - started
    return load_result(tally.latencies, seconds=elapsed, non_2xx=tally.failed, errors=tally.errors)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("port", type=int)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--rcpt", default="inbox@bench.test")
    args = parser.parse_args(argv)
    result = run_fast(run(args.port, duration=args.duration, connections=args.connections, rcpt=args.rcpt))
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
