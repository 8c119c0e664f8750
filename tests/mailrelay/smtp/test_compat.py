"""What ``mailrelay.smtp._compat`` assumes of aiosmtpd's internals, checked on the installed version (verified on
aiosmtpd 1.4.6, Python 3.11): an upgrade that changes one fails here, by name.

Assumptions: ``SMTP._reader`` / ``SMTP._writer`` (the connection's streams), ``SMTP._tls_protocol`` and
``SMTP._original_transport`` (``None`` before STARTTLS; set by the switch, and ``connection_made`` runs again once
the handshake is done), ``SMTP._timeout_duration``, ``SMTP._reset_timeout(duration)`` (starts the idle timer,
which calls ``SMTP._timeout_cb``), ``SMTP._handle_client`` (the command loop ``connection_made`` starts), and the
standard library's ``SSLProtocol._app_transport``.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiosmtpd
import pytest

from bastion_core import ConfigError
from mailrelay._tls import server_context
from mailrelay.smtp import _compat as smtp_compat


class Echo(smtp_compat.SmtpTransport):
    """A command loop on the compat surface: echoes lines, ``TLS`` switches, ``IDLE`` arms a short idle timer."""

    def __init__(self, tls_context: ssl.SSLContext | None) -> None:
        super().__init__(None, tls_context=tls_context, timeout=30, loop=asyncio.get_running_loop())
        self.made = 0
        self.idled = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made += 1
        super().connection_made(transport)

    async def serve_commands(self) -> None:
        while True:
            line = (await self.reader.readuntil()).strip()
            if line == b"TLS":
                self.writer.write(b"go\r\n")
                await self.writer.drain()
                await self.start_tls(self.tls_context)
                continue
            if line == b"IDLE":
                self.restart_idle_timer(0.01)
            state = b"tls=%d plain=%d made=%d" % (self.tls_active, self.plain_transport is not None, self.made)
            self.writer.write(line + b" " + state + b"\r\n")
            await self.writer.drain()

    def on_idle_timeout(self) -> None:
        self.idled.set()


@pytest.fixture
async def echo() -> AsyncIterator[tuple[list[Echo], int, ssl.SSLContext]]:
    context, _ = server_context(None, None)
    protocols: list[Echo] = []

    def make() -> Echo:
        protocols.append(Echo(context))
        return protocols[-1]

    server = await asyncio.get_running_loop().create_server(make, "127.0.0.1", 0)
    yield protocols, server.sockets[0].getsockname()[1], context
    server.close()
    for protocol in protocols:
        if protocol.transport is not None:
            protocol.transport.close()
    await server.wait_closed()


def test_the_version_is_one_verified() -> None:
    """1.4.6: the newest (`make test`); 1.4.5 and 1.4.4: `make compat`'s middle and oldest sets."""
    assert aiosmtpd.__version__ in {"1.4.6", "1.4.5", "1.4.4"}, (
        "re-check mailrelay/smtp/_compat.py against this aiosmtpd, then update"
    )


def test_every_internal_is_there() -> None:
    assert smtp_compat.missing() == []
    smtp_compat.check()


def test_start_up_refuses_when_an_internal_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smtp_compat, "missing", lambda: ["SMTP._reader"])
    with pytest.raises(ConfigError, match=r"lacks .*SMTP._reader.*; supported: aiosmtpd 1\.4\.4 to 1\.4\.x$"):
        smtp_compat.check()


async def test_the_command_loop_reads_and_writes_the_connections_streams(echo: tuple[list[Echo], int, object]) -> None:
    protocols, port, _ = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"hello\r\n")
    assert await asyncio.wait_for(reader.readline(), 5) == b"hello tls=0 plain=0 made=1\r\n"
    assert protocols[0].idle_timeout == 30
    writer.close()


async def test_the_idle_timer_calls_on_idle_timeout(echo: tuple[list[Echo], int, object]) -> None:
    protocols, port, _ = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"IDLE\r\n")
    await asyncio.wait_for(reader.readline(), 5)
    await asyncio.wait_for(protocols[0].idled.wait(), 5)
    writer.close()


async def test_start_tls_switches_and_connection_made_runs_again(echo: tuple[list[Echo], int, object]) -> None:
    _, port, _ = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"TLS\r\n")
    assert await asyncio.wait_for(reader.readline(), 5) == b"go\r\n"
    client = ssl.create_default_context()
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    await asyncio.wait_for(writer.start_tls(client), 5)
    writer.write(b"after\r\n")
    assert await asyncio.wait_for(reader.readline(), 5) == b"after tls=1 plain=1 made=2\r\n"
    writer.close()


REFUSING = """
import sys
from mailrelay.smtp import _compat as compat
compat.missing = lambda: ["SMTP._reader"]  # our compat module's probe: aiosmtpd itself is untouched
from mailrelay.cli import main
sys.exit(main([]))
"""


def test_mailrelay_refuses_to_start_in_one_line_without_an_internal(tmp_path: Path) -> None:
    """The session limits rely on aiosmtpd's internals: no serving without them."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MAIL_RELAY_")}
    env |= {
        "MAIL_RELAY_TARGET_EMAILS": "inbox@example.test",
        "MAIL_RELAY_WEBHOOK_URL": "http://127.0.0.1:9/webhook",
        "MAIL_RELAY_BIND_ADDRESS": "127.0.0.1",
        "MAIL_RELAY_HEALTH_BIND_ADDRESS": "127.0.0.1",
        "MAIL_RELAY_PORT": "0",
        "MAIL_RELAY_HEALTH_PORT": "0",
    }
    result = subprocess.run(
        [sys.executable, "-c", REFUSING], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stderr) == (
        2,
        f"mailrelay: configuration error: aiosmtpd {aiosmtpd.__version__} lacks what MailRelay's SMTP server relies on "
        "(SMTP._reader); supported: aiosmtpd 1.4.4 to 1.4.x\n",
    )
