"""The Python fallback HTTP load generator: N keep-alive connections, one request in flight on each.

Used when ``wrk`` is not installed (and always by the smoke test). A bare asyncio protocol on uvloop
with the request bytes built once; it tops out around 15-20k req/s on one core here, so it
under-reports the fastest rows (``raw``, ``starlette``): the results say which generator ran.
Prints one JSON object. Run: ``python -m bench.pyload URL --duration S --connections N [-H 'name: value']``
(``--method POST --body TEXT --fresh-header Idempotency-Key`` for the POST rows).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from urllib.parse import urlsplit

from bench.loops import run_fast
from bench.stats import load_result

HEADER_END = b"\r\n\r\n"
CONNECT_TIMEOUT_SECS = 5.0


class Tally:
    """What all connections of one run measured."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.non_2xx = 0
        self.errors = 0


class HttpClient(asyncio.Protocol):
    """Sends ``request``, reads one Content-Length-framed response, records it, sends the next."""

    def __init__(self, request: Request, tally: Tally, deadline: float, done: asyncio.Future[None]) -> None:
        self.request = request
        self.tally = tally
        self.deadline = deadline
        self.done = done
        self.buffer = bytearray()
        self.sent_at = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._send()

    def _send(self) -> None:
        assert self.transport is not None
        self.sent_at = time.perf_counter()
        self.transport.write(self.request.next())

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(HEADER_END)
        if end < 0:
            return
        head = bytes(self.buffer[:end]).lower()
        marker = head.find(b"\r\ncontent-length:")
        if marker < 0:
            self._fail()
            return
        line_end = head.find(b"\r\n", marker + 2)
        total = end + 4 + int(head[marker + 17 : line_end if line_end >= 0 else None])
        if len(self.buffer) < total:
            return
        now = time.perf_counter()
        self.tally.latencies.append(now - self.sent_at)
        if head[9:10] != b"2":
            self.tally.non_2xx += 1
        del self.buffer[:total]
        if time.monotonic() < self.deadline:
            self._send()
        else:
            self._finish()

    def _fail(self) -> None:
        self.tally.errors += 1
        self._finish()

    def _finish(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            if time.monotonic() < self.deadline:
                self.tally.errors += 1
            self.done.set_result(None)


class Request:
    """The bytes of each request: always the same, or with ``fresh_header`` set to a new value each time
    (``<run prefix>-<n>``, the prefix new per run)."""

    def __init__(self, head: bytes, body: bytes, fresh_header: str | None) -> None:
        self.head, self.body = head, body
        self.fresh = f"{fresh_header}: {uuid.uuid4().hex}-".encode() if fresh_header else None
        self.whole = head + b"\r\n" + body
        self.count = 0

    def next(self) -> bytes:
        if self.fresh is None:
            return self.whole
        self.count += 1
        return b"%s%s%d\r\n\r\n%s" % (self.head, self.fresh, self.count, self.body)


def build_request(
    url: str, headers: list[str], *, method: str = "GET", body: bytes = b"", fresh_header: str | None = None
) -> tuple[str, int, Request]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}", "User-Agent: bench-pyload/1", *headers]
    if body or method != "GET":
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n").encode()
    return host, port, Request(head, body, fresh_header)


async def run(
    url: str,
    *,
    duration: float,
    connections: int,
    headers: list[str],
    method: str = "GET",
    body: bytes = b"",
    fresh_header: str | None = None,
) -> dict[str, object]:
    host, port, request = build_request(url, headers, method=method, body=body, fresh_header=fresh_header)
    loop = asyncio.get_running_loop()
    tally = Tally()
    started = time.perf_counter()
    deadline = time.monotonic() + duration
    waiters: list[asyncio.Future[None]] = []
    transports: list[asyncio.BaseTransport] = []
    for _ in range(connections):
        done: asyncio.Future[None] = loop.create_future()
        transport, _protocol = await asyncio.wait_for(
            loop.create_connection(lambda done=done: HttpClient(request, tally, deadline, done), host, port),
            CONNECT_TIMEOUT_SECS,
        )
        waiters.append(done)
        transports.append(transport)
    try:
        # Every connection stops after its first response past the deadline; a server that hangs is cut off.
        await asyncio.wait_for(asyncio.gather(*waiters), duration + CONNECT_TIMEOUT_SECS)
    except TimeoutError:
        tally.errors += sum(not waiter.done() for waiter in waiters)
    finally:
        for transport in transports:
            transport.close()
    elapsed = time.perf_counter() - started
    return load_result(tally.latencies, seconds=elapsed, non_2xx=tally.non_2xx, errors=tally.errors)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("-H", "--header", action="append", default=[])
    parser.add_argument("--method", default="GET")
    parser.add_argument("--body", default="", help="the request body (sent with a Content-Length)")
    parser.add_argument("--fresh-header", help="a header sent with a new value on every request")
    args = parser.parse_args(argv)
    result = run_fast(
        run(
            args.url,
            duration=args.duration,
            connections=args.connections,
            headers=args.header,
            method=args.method,
            body=args.body.encode(),
            fresh_header=args.fresh_header,
        )
    )
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
