"""The relay's own protocol code on uvloop's loop, whose transports are not subclasses of asyncio's: an
application that embeds MailRelay on uvloop (or a future `mailrelay` on it) gets the same answers as on asyncio's
loop. bench/README.md ("uvloop (evaluated, not adopted)") says why `mailrelay` itself stays on asyncio's loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import uvloop

from bastion_core import CircuitBreaker, Guard
from mailrelay._delivery import Attempt
from mailrelay._http_client import Http11Transport
from mailrelay.smtp import _replies as r
from mailrelay.smtp._server import SmtpServer
from mailrelay.smtp._session import SmtpOptions
from mailrelay.testing import FakeClock, WebhookReceiver
from tests.mailrelay.smtp.support import Client, ScriptedHandler

T = TypeVar("T")


def on_uvloop(main: Callable[[], Awaitable[T]]) -> T:
    async def checked() -> T:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        return await main()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(asyncio.wait_for(checked(), 20))


def test_the_webhook_client_posts_on_uvloop() -> None:
    async def post() -> Attempt:
        breaker = CircuitBreaker("webhook", threshold=0.5, min_requests=2, wait_secs=60, clock=FakeClock())
        transport = Http11Transport(url=receiver.url, guard=Guard(breaker=breaker), timeout=5.0)
        try:
            return await transport.post(b'{"a":1}', {"Content-Type": "application/json"})
        finally:
            await transport.close()

    with WebhookReceiver() as receiver:
        assert on_uvloop(post) == Attempt(status=200)
        (request,) = receiver.requests
        assert request.body == b'{"a":1}'


def test_the_smtp_server_accepts_and_refuses_on_uvloop() -> None:
    handler = ScriptedHandler()

    async def session() -> tuple[list[bytes], list[bytes], bool]:
        options = SmtpOptions(
            targets=frozenset({"inbox@example.test"}), max_message_size=10_000, max_concurrent_per_ip=1
        )
        server = SmtpServer(options=options, handler=handler, tls_context=None, observer=None)
        await server.start("127.0.0.1", 0)
        try:
            first = Client(*await asyncio.open_connection("127.0.0.1", server.port))
            await first.reply()
            await first.command("EHLO tester")
            await first.command("MAIL FROM:<a@example.org>")
            await first.command("RCPT TO:<inbox@example.test>")
            await first.command("DATA")
            first.writer.write(b"Subject: x\r\n\r\nhello\r\n.\r\n")
            accepted = await first.reply()
            # The per-IP cap answers the second connection from outside the command loop (close_with).
            second = Client(*await asyncio.open_connection("127.0.0.1", server.port))
            refused = await second.reply()
            closed = await second.at_eof()
            await first.close()
            await second.close()
            return accepted, refused, closed
        finally:
            await server.shutdown(grace=1.0)

    accepted, refused, closed = on_uvloop(session)
    assert accepted == [str(r.MESSAGE_ACCEPTED).encode()]
    assert refused == [str(r.TOO_MANY_CONNECTIONS).encode()]
    assert closed
    (envelope,) = handler.envelopes
    assert envelope.content == b"Subject: x\r\n\r\nhello\r\n"
