"""The SMTP server tells its observer (the relay's metrics, as cli.py wires them) each reply that is counted: refused
sessions, answers to RCPT TO, the final reply to each message's data; and the open sessions are read from its hub."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable

from mailrelay._metrics import RelayMetrics
from mailrelay.smtp import _replies as r
from mailrelay.smtp._server import SmtpServer
from tests.mailrelay.scrape import samples
from tests.mailrelay.smtp.support import Client, Connect, ScriptedHandler
from tests.mailrelay.waiting import eventually

MakeServer = Callable[..., Awaitable[tuple[SmtpServer, Connect]]]


def recorded(metrics: RelayMetrics, name: str) -> dict[str, float]:
    """The non-zero samples named exactly `name`, keyed by their labels (`code="250",outcome="accepted"`)."""
    prefix = name + "{"
    return {
        key[len(prefix) : -1] if key.startswith(prefix) else "": value
        for key, value in samples(metrics.exposition().decode(), name).items()
        if value and (key == name or key.startswith(prefix))
    }


async def greeted(client: Client) -> Client:
    assert await client.reply() == [str(r.GREETING).encode()]
    await client.command("EHLO tester")
    assert await client.command("MAIL FROM:<a@example.org>") == [b"250 OK"]
    return client


async def open_data(client: Client) -> None:
    await greeted(client)
    assert await client.command("RCPT TO:<inbox@example.test>") == [b"250 OK"]
    assert await client.command("DATA") == [str(r.START_MAIL_INPUT).encode()]


async def test_recipients_are_counted_by_reply(make_server: MakeServer) -> None:
    metrics = RelayMetrics(process_collector=False)
    _, connect = await make_server(observer=metrics, max_unknown_recipients=1)
    client = await greeted(await connect())
    assert await client.command("RCPT TO:<inbox@example.test>") == [b"250 OK"]
    assert await client.command("RCPT TO:<INBOX@example.test>") == [b"250 OK"]
    assert await client.command("RCPT TO:<nobody@example.test>") == [str(r.NO_SUCH_USER).encode()]
    assert await client.command("RCPT TO:") == [str(r.RCPT_TO_SYNTAX).encode()]  # names no address
    assert await client.command("RCPT TO:<other@example.test>") == [str(r.TOO_MANY_UNKNOWN_RCPTS).encode()]
    assert recorded(metrics, "mailrelay_smtp_recipients_total") == {
        'code="250",outcome="accepted"': 2.0,
        'code="550",outcome="rejected"': 1.0,
        'code="421",outcome="rejected"': 1.0,
    }


async def test_the_final_reply_to_each_message_is_counted(make_server: MakeServer) -> None:
    metrics = RelayMetrics(process_collector=False)
    _, connect = await make_server(observer=metrics, max_message_size=10_000)
    client = await connect()
    await open_data(client)
    client.writer.write(b"Subject: x\r\n\r\nbody\r\n.\r\n")
    assert await client.reply() == [str(r.MESSAGE_ACCEPTED).encode()]
    assert await client.command("MAIL FROM:<a@example.org>") == [b"250 OK"]
    assert await client.command("RCPT TO:<inbox@example.test>") == [b"250 OK"]
    assert await client.command("DATA") == [str(r.START_MAIL_INPUT).encode()]
    client.writer.write(b"x" * 100 + b"\r\n" + (b"y" * 998 + b"\r\n") * 11 + b".\r\n")  # 11 KB over 10_000
    assert await client.reply() == [str(r.MESSAGE_TOO_LARGE).encode()]
    assert await client.command("MAIL FROM:<a@example.org>") == [b"250 OK"]
    assert await client.command("RCPT TO:<inbox@example.test>") == [b"250 OK"]
    assert await client.command("DATA") == [str(r.START_MAIL_INPUT).encode()]
    client.writer.write(b"z" * 2000 + b"\r\n.\r\n")
    assert await client.reply() == [str(r.DATA_LINE_TOO_LONG).encode()]
    assert recorded(metrics, "mailrelay_smtp_messages_total") == {
        'code="250",outcome="accepted"': 1.0,
        'code="552",outcome="rejected"': 1.0,
        'code="500",outcome="rejected"': 1.0,
    }


async def test_a_message_is_counted_even_when_its_connection_was_lost_before_the_reply(
    make_server: MakeServer, handler: ScriptedHandler
) -> None:
    """The delivery goes on after the connection is reset, and its outcome is counted (the webhook did get the
    message). A plain FIN would not do: the server keeps a half-closed connection to send the reply."""
    metrics = RelayMetrics(process_collector=False)
    server, connect = await make_server(observer=metrics)
    handler.release = asyncio.Event()
    client = await connect()
    await open_data(client)
    client.writer.write(b"Subject: x\r\n\r\nbody\r\n.\r\n")
    await client.writer.drain()
    await handler.started.wait()
    deliveries = set(server.hub.deliveries)
    sock = client.writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST
    await client.close()
    await eventually(lambda: not server.hub.connections, what="the reset session is gone")
    assert recorded(metrics, "mailrelay_smtp_messages_total") == {}
    handler.release.set()
    await asyncio.gather(*deliveries)
    assert recorded(metrics, "mailrelay_smtp_messages_total") == {'code="250",outcome="accepted"': 1.0}


async def test_refused_sessions_are_counted_by_limit(make_server: MakeServer) -> None:
    metrics = RelayMetrics(process_collector=False)
    _, connect = await make_server(observer=metrics, max_concurrent_per_ip=1, max_sessions=2)
    first = await connect()
    assert await first.reply() == [str(r.GREETING).encode()]
    second = await connect()
    assert await second.reply() == [str(r.TOO_MANY_CONNECTIONS).encode()]
    assert recorded(metrics, "mailrelay_smtp_sessions_refused_total") == {'reason="max_per_ip"': 1.0}


async def test_a_full_server_is_counted_as_max_sessions(make_server: MakeServer) -> None:
    metrics = RelayMetrics(process_collector=False)
    _, connect = await make_server(observer=metrics, max_sessions=1)
    first = await connect()
    assert await first.reply() == [str(r.GREETING).encode()]
    second = await connect()
    assert await second.reply() == [str(r.TOO_MANY_SESSIONS).encode()]
    assert recorded(metrics, "mailrelay_smtp_sessions_refused_total") == {'reason="max_sessions"': 1.0}


async def test_open_sessions_are_read_from_the_hub(make_server: MakeServer) -> None:
    metrics = RelayMetrics(process_collector=False)
    server, connect = await make_server(observer=metrics)
    metrics.watch_sessions(lambda: len(server.hub.connections))
    assert recorded(metrics, "mailrelay_smtp_sessions_active") == {}
    for _ in range(2):
        assert await (await connect()).reply() == [str(r.GREETING).encode()]
    assert recorded(metrics, "mailrelay_smtp_sessions_active") == {"": 2.0}
