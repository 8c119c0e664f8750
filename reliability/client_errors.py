"""A client's bad input: JSON nested 100,000 deep into a protected PUT, gRPC calls whose request message is missing
or cut short, SMTP lines over RFC 5321's lengths. Each is the client's fault: a 4xx (gRPC: INVALID_ARGUMENT or
INTERNAL; SMTP: 500 and the session goes on), never a 5xx, never a circuit breaker opening, never a traceback or an
error-level line in the server's log.

The HTTP and gRPC server is :mod:`reliability.resilient_app`: the example with a breaker over every route and
method that opens after a few failures, so a client error counted as a failure shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import smtplib
from collections.abc import Callable

import httpx
from hpack import Decoder, Encoder

from reliability import probes, servers
from reliability.figures import Figure, equals, is_true
from reliability.run import Context

RESILIENT_APP = "reliability.resilient_app:service"
BREAKER = "reliability"
"""The name of :mod:`reliability.resilient_app`'s breaker (the label of its state in ``/metrics``)."""
NESTED_BODIES = {
    "200 KB of [": b"[" * 200_000,
    "[ x 100,000 then ] x 100,000": b"[" * 100_000 + b"]" * 100_000,
}
INVALID_ARGUMENT, INTERNAL = "3", "13"
CALL_WITHIN_SECS = 5.0
BREAKER_STATE = re.compile(rf'^bastion_circuit_breaker_state\{{breaker="{BREAKER}"\}} (\S+)$', re.M)


def _prefixed(message: bytes, length: int | None = None) -> bytes:
    """A gRPC length-prefixed message whose prefix announces ``length`` bytes (default: its own length)."""
    return b"\x00" + (len(message) if length is None else length).to_bytes(4, "big") + message


BROKEN_MESSAGES: dict[str, Callable[[], list[tuple[int, bytes]]]] = {
    "no message": lambda: [],
    "message cut short": lambda: [(probes.END_STREAM, _prefixed(b"\x08", length=100))],
    "prefix cut short": lambda: [(probes.END_STREAM, b"\x00\x00\x00")],
    "message announced, none sent": lambda: [(probes.END_STREAM, _prefixed(b"", length=20))],
}
METHODS = ("ListDocuments", "GetDocument")


async def _broken_call(port: int, token: str, method: str, data: list[tuple[int, bytes]]) -> tuple[str, str]:
    """One call with ``data`` as its DATA frames (no DATA: HEADERS ends the stream): the ``:status`` and
    ``grpc-status`` it ended with (``"-"`` where none came within ``CALL_WITHIN_SECS``)."""
    connection = await probes.H2Connection.open(port, source=probes.ATTACKER)
    decoder = Decoder()
    fields: dict[str, str] = {}
    try:
        block = Encoder().encode(probes.grpc_request_fields(port, token, method))
        flags = probes.END_HEADERS | (0 if data else probes.END_STREAM)
        frames = probes.frame(probes.HEADERS, flags, 1, block)
        frames += b"".join(probes.frame(probes.DATA, data_flags, 1, payload) for data_flags, payload in data)
        await connection.send(frames)
        async with asyncio.timeout(CALL_WITHIN_SECS):
            while "grpc-status" not in fields:
                kind, _flags, stream, payload = await probes.read_frame(connection.reader)
                if kind == probes.HEADERS and stream == 1:
                    fields.update((str(name), str(value)) for name, value in decoder.decode(payload))
                elif kind == probes.RST_STREAM and stream == 1:
                    fields["grpc-status"] = f"RST_STREAM {int.from_bytes(payload, 'big')}"
                elif kind == probes.GOAWAY:
                    fields["grpc-status"] = f"GOAWAY {int.from_bytes(payload[4:8], 'big')}"
    except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError):
        pass
    finally:
        await connection.close()
    return fields.get(":status", "-"), fields.get("grpc-status", "-")


def _nested_statuses(app: servers.Bastion, rounds: int) -> list[int]:
    """The status of each PUT (0: no answer within 10 s, or the connection broke)."""
    url = f"{app.url}/api/v1/documents/alice/doc-1"
    headers = {**app.auth(), "Content-Type": "application/json"}
    statuses = []
    for _ in range(rounds):
        for body in NESTED_BODIES.values():
            try:
                statuses.append(httpx.put(url, content=body, headers=headers, timeout=10.0).status_code)
            except httpx.HTTPError:
                statuses.append(0)
    return statuses


async def _broken_calls(port: int, token: str, rounds: int) -> list[tuple[str, str]]:
    answers = []
    for _ in range(rounds):
        for method in METHODS:
            for shape in BROKEN_MESSAGES.values():
                answers.append(await _broken_call(port, token, method, shape()))
    return answers


def _breaker_state(app: servers.Bastion) -> float | None:
    match = BREAKER_STATE.search(httpx.get(f"{app.url}/metrics", timeout=5.0).text)
    return float(match.group(1)) if match else None


def client_errors(ctx: Context) -> list[Figure]:
    name = "client errors"
    rounds = 3 if ctx.quick else 25
    with servers.bastion(ctx.ws, app=RESILIENT_APP) as app:
        nested = _nested_statuses(app, rounds)
        calls = asyncio.run(_broken_calls(app.port, app.user_token, rounds))
        state = _breaker_state(app)
        http_ok = servers.served(f"{app.url}/api/v1/documents", app.auth(), timeout=5.0)
        grpc_ok = asyncio.run(probes.once(probes.grpc_probe(app.port, app.user_token)))
    log = servers.ServerLog.read(app.server.log_path)
    openings = sum(
        event.get("event") == "circuit_breaker_state_changed" and event.get("new_state") == "open"
        for event in log.events
    )
    ended = sum(status == "200" and grpc in (INVALID_ARGUMENT, INTERNAL) for status, grpc in calls)
    return [
        equals(
            name,
            "nested JSON bodies answered 5xx",
            sum(status >= 500 for status in nested),
            0,
            note=f"{len(nested)} PUTs; answers: {sorted(set(nested))}",
        ),
        equals(name, "nested JSON bodies answered 4xx", sum(400 <= status < 500 for status in nested), len(nested)),
        equals(
            name,
            "gRPC calls, message missing or cut short: ended INVALID_ARGUMENT or INTERNAL",
            ended,
            len(calls),
            note=f"(:status, grpc-status) seen: {sorted(set(calls))}",
        ),
        equals(name, "circuit breaker openings", openings, 0),
        equals(name, "circuit breaker state after (0 = closed)", state, 0),
        *log.figures(name),
        is_true(name, "HTTP/1.1 served after", http_ok is not None),
        is_true(name, "gRPC served after", grpc_ok),
    ]


LONG_COMMAND_ARGUMENT = "x" * 10_000
LONG_TEXT_LINE = b"y" * 1_000_000
LONG_LINE_SUBJECT = b"holding an over-long line"


def _long_lines_session(port: int, number: int) -> tuple[int, int, int]:
    """One session from the attacker's address: the replies to a 10,000-octet command line, to the end of a message
    holding a 1,000,000-octet line, and to a normal mail after them in the same session (0: the session broke)."""
    replies = [0, 0, 0]
    with (
        contextlib.suppress(OSError, smtplib.SMTPException),
        smtplib.SMTP(
            "127.0.0.1", port, local_hostname="lines.test", timeout=10.0, source_address=(probes.ATTACKER, 0)
        ) as smtp,
    ):
        smtp.ehlo()
        replies[0] = smtp.docmd("NOOP", LONG_COMMAND_ARGUMENT)[0]
        replies[1] = _send(smtp, b"Subject: " + LONG_LINE_SUBJECT + b"\r\n\r\n" + LONG_TEXT_LINE + b"\r\n")
        smtp.rset()
        replies[2] = _send(smtp, servers.smtp_message(f"after long lines {number}"))
    return replies[0], replies[1], replies[2]


def _send(smtp: smtplib.SMTP, message: bytes) -> int:
    smtp.mail("lines@lines.test")
    smtp.rcpt(servers.RCPT)
    try:
        return smtp.data(message)[0]
    except smtplib.SMTPResponseException as exc:
        return exc.smtp_code


def smtp_long_lines(ctx: Context) -> list[Figure]:
    """Sessions that send a command line and a text line far over RFC 5321's lengths (4.5.3.1.4: 512 octets,
    4.5.3.1.6: 1000), then a normal mail: 500 for each long line, the session goes on, only the normal mail posted."""
    name = "SMTP long lines"
    sessions = 3 if ctx.quick else 50
    from mailrelay.testing import WebhookReceiver

    with WebhookReceiver() as receiver, servers.relay(ctx.ws, receiver.url) as relay:
        replies = [_long_lines_session(relay.smtp_port, number) for number in range(sessions)]
        posted = receiver.wait_for(sessions, timeout=10.0)
    long_posted = sum(LONG_LINE_SUBJECT in request.body for request in posted)
    commands, texts, afters = zip(*replies, strict=True)
    return [
        equals(
            name,
            "10,000-octet command lines answered 500",
            commands.count(500),
            sessions,
            note=f"replies: {sorted(set(commands))}",
        ),
        equals(
            name,
            "1,000,000-octet text lines answered 500 after the data",
            texts.count(500),
            sessions,
            note=f"replies: {sorted(set(texts))}",
        ),
        equals(name, "normal mails after them answered 250", afters.count(250), sessions),
        equals(name, "webhooks for the mails with a long line", long_posted, 0, note=f"{len(posted)} webhooks"),
        *servers.ServerLog.read(relay.server.log_path).figures(name),
    ]


SCENARIOS = {"client-errors": client_errors, "smtp-long-lines": smtp_long_lines}
