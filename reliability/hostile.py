"""Hostile clients against the secured example and MailRelay: slowloris, slow bodies, oversized headers and header
floods, request-smuggling shapes, HTTP/2 protocol errors and a rapid-reset burst, idle SMTP sessions.

Each scenario runs its attack connections and, at the same time, legitimate requests on fresh connections; its
figures are how many legitimate requests were served (and the slowest), how many attack connections the server
closed (and how soon), and the answer the server gave to each malformed shape.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from reliability import probes, servers
from reliability.figures import Figure, at_most, equals, is_true
from reliability.run import Context

LEGIT_WITHIN_SECS = 1.0
"""A legitimate client must still be served within this while an attack runs (the issue's bound)."""
CLOSE_MARGIN_SECS = 3.0
"""An attack connection must be closed by its timeout plus this (a loaded 2-core machine)."""


def _legit_figures(scenario: str, served: probes.Served, what: str) -> list[Figure]:
    return [
        equals(scenario, f"{what} failed", served.sent - served.ok, 0, note=f"{served.ok}/{served.sent} served"),
        at_most(scenario, f"{what} slowest", served.slowest, LEGIT_WITHIN_SECS, unit=" s"),
    ]


def _closed_figures(scenario: str, attacks: list[probes.Attack], timeout: float) -> list[Figure]:
    closed = [a.closed_after for a in attacks if a.closed_after is not None]
    return [
        equals(scenario, "attack connections left open", len(attacks) - len(closed), 0, note=f"of {len(attacks)}"),
        at_most(
            scenario,
            "last attack connection closed after",
            max(closed, default=None),
            timeout + CLOSE_MARGIN_SECS,
            unit=" s",
            note=f"timeout {timeout:g} s",
        ),
    ]


async def _under_attack(
    attacks: Sequence[Awaitable[probes.Attack]], legit: dict[str, Callable[[], Awaitable[bool]]], interval: float = 0.25
) -> tuple[list[probes.Attack], dict[str, probes.Served]]:
    """Run the attack connections to their end while each legitimate probe repeats every ``interval`` seconds."""
    stop = asyncio.Event()
    served = {name: probes.Served() for name in legit}
    probing = [asyncio.create_task(probes.keep_probing(p, served[n], stop, interval)) for n, p in legit.items()]
    try:
        results = await asyncio.gather(*attacks)
    finally:
        stop.set()
        await asyncio.gather(*probing)
    return list(results), served


def slowloris(ctx: Context) -> list[Figure]:
    """Header bytes dripped on many connections, on the HTTP/1.1 port and the gRPC port (a preface dripped)."""
    name = "slowloris"
    timeout = 1.0 if ctx.quick else 5.0
    count = 24 if ctx.quick else 200
    env = {"SERVICE_HEADER_READ_TIMEOUT_SECS": str(timeout)}
    with servers.bastion(ctx.ws, env, separate_grpc=True) as app:
        assert app.grpc_port is not None
        limit = timeout + CLOSE_MARGIN_SECS + 2
        http_attacks = [
            probes.attack_connection(
                app.port,
                b"GET /api/v1/documents HTTP/1.1\r\nHost: x\r\n",
                b"X-a: b\r\n",
                interval=timeout / 4,
                limit=limit,
            )
            for _ in range(count)
        ]
        grpc_attacks = [
            probes.attack_connection(app.grpc_port, probes.PREFACE[:3], b"", interval=timeout / 4, limit=limit)
            for _ in range(count // 4)
        ]
        legit = {
            "HTTP/1.1 requests": probes.http_probe(f"{app.url}/api/v1/documents", app.auth()),
            "gRPC calls": probes.grpc_probe(app.grpc_port, app.user_token),
        }
        attacks, served = asyncio.run(_under_attack([*http_attacks, *grpc_attacks], legit))
    figures = [
        *_legit_figures(name, served["HTTP/1.1 requests"], "HTTP/1.1 requests"),
        *_legit_figures(name, served["gRPC calls"], "gRPC calls"),
    ]
    figures += [replace(f, name="HTTP port: " + f.name) for f in _closed_figures(name, attacks[:count], timeout)]
    figures += [replace(f, name="gRPC port: " + f.name) for f in _closed_figures(name, attacks[count:], timeout)]
    return figures


def slow_body(ctx: Context) -> list[Figure]:
    """POST bodies dripped a byte at a time: the answer must be 408 within the request timeout, the others served."""
    name = "slow body"
    timeout = 2.0 if ctx.quick else 10.0
    count = 8 if ctx.quick else 64
    env = {"SERVICE_MIDDLEWARE_TIMEOUT_SECS": str(timeout)}
    with servers.bastion(ctx.ws, env) as app:
        # A PUT of the user's own document: POST /api/*/documents has a route rule of 10 a minute in the example,
        # which would answer most attackers 429 before their body (and close the connection) instead of 408.
        head = (
            f"PUT /api/v1/documents/alice/doc-1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {app.user_token}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
        ).encode()
        attacks = [
            probes.attack_connection(app.port, head, b" ", interval=0.2, limit=timeout + CLOSE_MARGIN_SECS + 2)
            for _ in range(count)
        ]
        legit = {"HTTP/1.1 requests": probes.http_probe(f"{app.url}/api/v1/documents", app.auth())}
        results, served = asyncio.run(_under_attack(attacks, legit))
        # The same on the gRPC side of the port: unary calls whose message trickles in.
        limit = timeout + CLOSE_MARGIN_SECS
        grpc_statuses = asyncio.run(_slow_grpc_calls(app.port, app.user_token, count // 4, limit))
    statuses = [probes.status_of(a.received) for a in results]
    answered_408 = sum(status == 408 for status in statuses)
    seen = sorted({str(s) for s in statuses})
    ended = sum(status == "4" for status in grpc_statuses)
    grpc_seen = sorted({str(s) for s in grpc_statuses})
    return [
        *_legit_figures(name, served["HTTP/1.1 requests"], "HTTP/1.1 requests"),
        equals(name, "slow bodies answered 408", answered_408, count, note=f"answers seen: {', '.join(seen)}"),
        *_closed_figures(name, results, timeout),
        equals(
            name,
            "slow gRPC messages ended DEADLINE_EXCEEDED",
            ended,
            len(grpc_statuses),
            note=f"grpc-status seen within {limit:g} s: {', '.join(grpc_seen)}",
        ),
    ]


async def _slow_grpc_calls(port: int, token: str, count: int, limit: float) -> list[str | None]:
    return list(await asyncio.gather(*(_slow_grpc_call(port, token, limit) for _ in range(count))))


async def _slow_grpc_call(port: int, token: str, limit: float) -> str | None:
    """A ListDocuments call that announces a 1000-byte message and sends one byte of it every 0.2 s: the
    grpc-status the server ends it with (``None``: not ended within ``limit``)."""
    from hpack import Decoder

    connection = await probes.H2Connection.open(port)
    decoder = Decoder()

    async def drip() -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while True:
                await asyncio.sleep(0.2)
                await connection.send(probes.frame(probes.DATA, 0, 1, b"\x00"))

    headers = probes.frame(probes.HEADERS, probes.END_HEADERS, 1, probes.grpc_request_headers(port, token))
    await connection.send(headers + probes.frame(probes.DATA, 0, 1, b"\x00" + (1000).to_bytes(4, "big")))
    dripper = asyncio.create_task(drip())
    try:
        async with asyncio.timeout(limit):
            while True:
                kind, _flags, stream, payload = await probes.read_frame(connection.reader)
                if kind == probes.HEADERS and stream == 1:
                    fields = {str(name): str(value) for name, value in decoder.decode(payload)}
                    if "grpc-status" in fields:
                        return fields["grpc-status"]
    except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError):
        return None
    finally:
        dripper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dripper
        await connection.close()


def oversized_headers(ctx: Context) -> list[Figure]:
    """Heads over the byte limit and over the header-count limit: 431 each, resident memory flat."""
    name = "oversized headers"
    rounds = 60 if ctx.quick else 600
    with servers.bastion(ctx.ws) as app:
        big = b"GET /api/v1/documents HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
        flood = (
            b"GET /api/v1/documents HTTP/1.1\r\nHost: x\r\n"
            + b"".join(b"X-H%d: v\r\n" % n for n in range(1_000))
            + b"\r\n"
        )

        async def one(request: bytes) -> int | None:
            attack = await probes.attack_connection(app.port, request, b"", interval=1.0, limit=10.0)
            return probes.status_of(attack.received)

        async def batch(request: bytes, number: int) -> list[int | None]:
            results: list[int | None] = []
            for start in range(0, number, 16):
                results += await asyncio.gather(*(one(request) for _ in range(min(16, number - start))))
            return results

        asyncio.run(batch(big, 10))  # warm-up: buffers and code paths allocated once
        asyncio.run(batch(flood, 10))
        rss_before = probes.rss_bytes(app.pid)
        big_statuses = asyncio.run(batch(big, rounds))
        flood_statuses = asyncio.run(batch(flood, rounds))
        rss_after = probes.rss_bytes(app.pid)
        ok = servers.served(f"{app.url}/api/v1/documents", app.auth(), timeout=5.0)
    growth = None if rss_before is None or rss_after is None else (rss_after - rss_before) / rss_before * 100
    return [
        equals(
            name,
            f"{rounds} heads over 64 KiB answered 431",
            sum(s == 431 for s in big_statuses),
            rounds,
            note=f"answers: {sorted({str(s) for s in big_statuses})}",
        ),
        equals(
            name,
            f"{rounds} heads of 1000 headers answered 431",
            sum(s == 431 for s in flood_statuses),
            rounds,
            note=f"answers: {sorted({str(s) for s in flood_statuses})}",
        ),
        at_most(name, "resident memory growth", growth, 5.0, unit=" %"),
        is_true(name, "legitimate request served after", ok is not None),
    ]


SMUGGLING = {
    "CL+TE": b"POST /api/v1/documents HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    b"GET /api/v1/admin/users HTTP/1.1\r\nHost: x\r\n\r\n",
    "duplicate Content-Length": b"POST /api/v1/documents HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}",
    "obs-fold": b"GET /api/v1/documents HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n b\r\n\r\n",
    "TE not chunked last": b"POST /api/v1/documents HTTP/1.1\r\nHost: x\r\n"
    b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
}


def smuggling(ctx: Context) -> list[Figure]:
    """Request-smuggling shapes on the HTTP/1.1 port: each answered 400 (nothing behind it served)."""
    name = "smuggling"
    figures: list[Figure] = []
    with servers.bastion(ctx.ws) as app:
        for shape, request in SMUGGLING.items():
            attack = asyncio.run(probes.attack_connection(app.port, request, b"", interval=1.0, limit=5.0))
            status = probes.status_of(attack.received)
            responses = attack.received.count(b"HTTP/1.1 ")
            figures.append(
                equals(name, f"{shape}: status", status, 400, note=f"{responses} response(s) on the connection")
            )
            figures.append(equals(name, f"{shape}: responses", responses, 1))
        ok = servers.served(f"{app.url}/api/v1/documents", app.auth(), timeout=5.0)
    figures.append(is_true(name, "legitimate request served after", ok is not None))
    return figures


H2_CASES: dict[str, tuple[int, Callable[[probes.H2Connection, int, str], bytes]]] = {
    "bad HPACK": (
        0x9,
        lambda c, p, t: probes.frame(
            probes.HEADERS, probes.END_HEADERS | probes.END_STREAM, 1, b"\xff\xff\xff\xff\xff\x7f"
        ),
    ),
    "HEADERS on stream 0": (
        0x1,
        lambda c, p, t: probes.frame(probes.HEADERS, probes.END_HEADERS, 0, probes.grpc_request_headers(p, t)),
    ),
    "oversized frame": (
        0x6,
        lambda c, p, t: probes.frame(probes.HEADERS, probes.END_HEADERS, 1, b"\x00" * (c.max_frame_size + 1)),
    ),
}
RAPID_RESET_STREAMS = 1_000


def http2_errors(ctx: Context) -> list[Figure]:
    """HTTP/2 protocol errors after the handshake and a rapid-reset burst on the gRPC port: a GOAWAY with the right
    error code each, and HTTP/1.1 and gRPC still served afterwards."""
    name = "HTTP/2 errors"
    figures: list[Figure] = []
    with servers.bastion(ctx.ws, separate_grpc=True) as app:
        port = app.grpc_port
        assert port is not None

        async def case(build: Callable[[probes.H2Connection, int, str], bytes]) -> int | None:
            conn = await probes.H2Connection.open(port)
            try:
                await conn.send(build(conn, port, app.user_token))
                return await conn.goaway(5.0)
            finally:
                await conn.close()

        async def rapid_reset() -> int | None:
            conn = await probes.H2Connection.open(port)
            try:
                block = probes.grpc_request_headers(port, app.user_token)
                burst = b"".join(
                    probes.frame(probes.HEADERS, probes.END_HEADERS, stream, block)
                    + probes.frame(probes.RST_STREAM, 0, stream, (0x8).to_bytes(4, "big"))
                    for stream in range(1, 2 * RAPID_RESET_STREAMS, 2)
                )
                with contextlib.suppress(ConnectionError, OSError):
                    await conn.send(burst)
                return await conn.goaway(5.0)
            finally:
                await conn.close()

        for shape, (expected, build) in H2_CASES.items():
            code = asyncio.run(case(build))
            figures.append(
                equals(name, f"{shape}: GOAWAY code", code, expected, note=probes.goaway_note(code, expected))
            )
        code = asyncio.run(rapid_reset())
        figures.append(
            equals(
                name,
                f"rapid reset ({RAPID_RESET_STREAMS} streams): GOAWAY code",
                code,
                0xB,
                note=probes.goaway_note(code, 0xB),
            )
        )
        http_ok = asyncio.run(probes.once(probes.http_probe(f"{app.url}/api/v1/documents", app.auth())))
        grpc_ok = asyncio.run(probes.once(probes.grpc_probe(port, app.user_token)))
    figures.append(is_true(name, "HTTP/1.1 served after", http_ok))
    figures.append(is_true(name, "gRPC served after", grpc_ok))
    return figures


def idle_smtp(ctx: Context) -> list[Figure]:
    """SMTP sessions that go quiet (after the greeting, after EHLO, inside DATA): closed by the idle timeout while
    a legitimate sender still gets its 250 within a second."""
    name = "idle SMTP"
    timeout = 1.0 if ctx.quick else 5.0
    # Many sources (the per-address cap is raised for the test) holding sessions below MAX_SESSIONS (the default
    # 100): beyond it every newcomer gets 421 until the idle timeout frees a session, which is the cap's job
    # (bounded memory), and a single address is held to MAX_CONCURRENT_PER_IP (10) anyway.
    count = 24 if ctx.quick else 90
    with contextlib.ExitStack() as stack:
        from mailrelay.testing import WebhookReceiver

        receiver = stack.enter_context(WebhookReceiver())
        relay = stack.enter_context(servers.relay(ctx.ws, receiver.url, {"IDLE_TIMEOUT": str(timeout)}))
        openers = [
            b"",
            b"EHLO idle.test\r\n",
            b"EHLO idle.test\r\nMAIL FROM:<a@idle.test>\r\nRCPT TO:<" + servers.RCPT.encode() + b">\r\nDATA\r\n",
        ]
        attacks = [
            probes.attack_connection(
                relay.smtp_port, openers[n % 3], b"", interval=1.0, limit=timeout + CLOSE_MARGIN_SECS + 2
            )
            for n in range(count)
        ]
        sent: list[int] = []

        async def legit() -> bool:
            code = await asyncio.to_thread(servers.send_mail, relay.smtp_port, f"legit {len(sent)}", timeout=5.0)
            sent.append(code)
            return code == 250

        results, served = asyncio.run(_under_attack(attacks, {"mail": legit}))
        delivered = len(receiver.wait_for(sent.count(250), timeout=10.0))
    return [
        *_legit_figures(name, served["mail"], "legitimate mails"),
        equals(name, "250s without a webhook", max(0, sent.count(250) - delivered), 0),
        *_closed_figures(name, results, timeout),
    ]


SCENARIOS = {
    "slowloris": slowloris,
    "slow-body": slow_body,
    "oversized-headers": oversized_headers,
    "smuggling": smuggling,
    "http2-errors": http2_errors,
    "idle-smtp": idle_smtp,
}
