"""The SMTP server in-process: limits, timeouts, hand-off and graceful shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from mailrelay._tls import server_context
from mailrelay.smtp import _replies as r
from mailrelay.smtp._server import SmtpServer
from tests.mailrelay.smtp.support import Client, Connect, ScriptedHandler

MakeServer = Callable[..., Awaitable[tuple[SmtpServer, Connect]]]


async def open_data(client: Client) -> None:
    assert await client.reply() == [str(r.GREETING).encode()]
    await client.command("EHLO tester")
    assert await client.command("MAIL FROM:<a@example.org>") == [b"250 OK"]
    assert await client.command("RCPT TO:<inbox@example.test>") == [b"250 OK"]
    assert await client.command("DATA") == [str(r.START_MAIL_INPUT).encode()]


async def test_ehlo_without_tls_context_does_not_offer_starttls(make_server: MakeServer) -> None:
    _, connect = await make_server()
    client = await connect()
    await client.reply()
    lines = await client.command("EHLO")
    assert lines[0] == b"250-MailRelay greets client"
    assert lines[-1] == b"250 SMTPUTF8"
    assert await client.command("STARTTLS") == [str(r.TLS_NOT_AVAILABLE).encode()]


async def test_envelope_is_handed_off_with_unstuffed_bytes(make_server: MakeServer, handler: ScriptedHandler) -> None:
    _, connect = await make_server()
    client = await connect()
    await open_data(client)
    client.writer.write(b"Subject: x\r\n\r\n..dot\r\n\xc3\xa9 8bit\r\n.\r\n")
    assert await client.reply() == [b"250 OK: Message accepted for delivery"]
    (envelope,) = handler.envelopes
    assert envelope.content == b"Subject: x\r\n\r\n.dot\r\n\xc3\xa9 8bit\r\n"
    assert envelope.mail_from == "a@example.org"
    assert envelope.recipients == ["inbox@example.test"]


async def test_idle_session_is_closed_with_421(make_server: MakeServer) -> None:
    _, connect = await make_server(idle_timeout=0.05)
    client = await connect()
    await client.reply()
    assert await client.reply() == [str(r.IDLE_TIMEOUT).encode()]
    assert await client.at_eof()


async def test_per_ip_cap(make_server: MakeServer) -> None:
    server, connect = await make_server(max_concurrent_per_ip=1)
    first = await connect()
    await first.reply()
    second = await connect()
    assert await second.reply() == [str(r.TOO_MANY_CONNECTIONS).encode()]
    assert await second.at_eof()
    await first.command("QUIT")
    assert await first.at_eof()
    third = await connect()
    assert await third.reply() == [str(r.GREETING).encode()]  # the slot was released
    assert server.hub.per_ip["127.0.0.1"] == 1


async def test_zero_unknown_recipients_allowed(make_server: MakeServer) -> None:
    _, connect = await make_server(max_unknown_recipients=0)
    client = await connect()
    await client.reply()
    await client.command("HELO tester")
    await client.command("MAIL FROM:<a@example.org>")
    assert await client.command("RCPT TO:<x@example.test>") == [str(r.TOO_MANY_UNKNOWN_RCPTS).encode()]


async def test_helo_client_cannot_use_esmtp_parameters(make_server: MakeServer) -> None:
    _, connect = await make_server()
    client = await connect()
    await client.reply()
    await client.command("HELO tester")
    assert await client.command("MAIL FROM:<a@example.org> SIZE=10") == [b"501 Syntax error in MAIL FROM parameters"]
    assert await client.command("MAIL FROM:<a@example.org> FOO=bar") == [b"501 Syntax error in MAIL FROM parameters"]


async def test_unknown_mail_parameter_is_555(make_server: MakeServer) -> None:
    _, connect = await make_server()
    client = await connect()
    await client.reply()
    await client.command("EHLO tester")
    assert await client.command("MAIL FROM:<a@example.org> RET=FULL") == [str(r.PARAMETERS_NOT_IMPLEMENTED).encode()]
    assert await client.command("MAIL FROM:<a@example.org> BODY=BINARYMIME") == [
        b"501 Syntax error in MAIL FROM parameters"
    ]


async def test_client_hanging_up_during_delivery_does_not_cancel_it(
    make_server: MakeServer, handler: ScriptedHandler
) -> None:
    _, connect = await make_server()
    handler.release = asyncio.Event()
    client = await connect()
    await open_data(client)
    client.writer.write(b"Subject: x\r\n\r\nbody\r\n.\r\n")
    await client.writer.drain()
    await handler.started.wait()
    await client.close()
    await asyncio.sleep(0)
    handler.release.set()
    await asyncio.wait_for(handler.finished.wait(), 5)
    assert len(handler.envelopes) == 1


async def test_shutdown_421s_idle_sessions_and_lets_deliveries_finish(
    make_server: MakeServer, handler: ScriptedHandler
) -> None:
    server, connect = await make_server()
    handler.release = asyncio.Event()
    idle = await connect()
    await idle.reply()
    await idle.command("EHLO idle")
    busy = await connect()
    await open_data(busy)
    busy.writer.write(b"Subject: x\r\n\r\nbody\r\n.\r\n")
    await busy.writer.drain()
    await handler.started.wait()
    shutdown = asyncio.create_task(server.shutdown(grace=5))
    assert await idle.reply() == [str(r.SHUTTING_DOWN).encode()]
    handler.release.set()
    assert await busy.reply() == [b"250 OK: Message accepted for delivery"]
    assert await busy.reply() == [str(r.SHUTTING_DOWN).encode()]
    await asyncio.wait_for(shutdown, 5)
    assert len(handler.envelopes) == 1


async def test_shutdown_grace_expiry_closes_stragglers(make_server: MakeServer, handler: ScriptedHandler) -> None:
    server, connect = await make_server()
    handler.release = asyncio.Event()  # never released
    busy = await connect()
    await open_data(busy)
    busy.writer.write(b"Subject: x\r\n\r\nbody\r\n.\r\n")
    await busy.writer.drain()
    await handler.started.wait()
    await server.shutdown(grace=0.05)
    assert await busy.reply() == [str(r.SHUTTING_DOWN).encode()]
    assert handler.envelopes == []


async def test_hostile_addresses_are_syntax_errors(make_server: MakeServer) -> None:
    _, connect = await make_server()
    client = await connect()
    await client.reply()
    await client.command("EHLO tester")
    assert await client.command('MAIL FROM:"') == [b"501 Syntax error in MAIL FROM parameters"]
    assert await client.command("MAIL FROM:<=@") == [b"501 Syntax error in MAIL FROM parameters"]
    assert await client.command("MAIL FROM:<a@example.org>") == [b"250 OK"]
    assert await client.command('RCPT TO:"') == [str(r.RCPT_TO_SYNTAX).encode()]
    assert await client.command("NOOP") == [b"250 OK"]


async def test_failed_tls_handshake_closes_and_frees_the_slot(make_server: MakeServer) -> None:
    context, _ = server_context(None, None)
    server, connect = await make_server(tls_context=context)
    client = await connect()
    await client.reply()
    await client.command("EHLO tester")
    assert await client.command("STARTTLS") == [b"220 Go ahead"]
    client.writer.write(b"this is not a TLS ClientHello\r\n" * 4)
    await client.writer.drain()
    assert await client.at_eof()
    for _ in range(100):
        if not server.hub.connections:
            break
        await asyncio.sleep(0.01)
    assert server.hub.per_ip == {}
