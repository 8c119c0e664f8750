"""The SMTP listener: opens the socket, creates a RelaySMTP per connection, drains them on shutdown."""

from __future__ import annotations

import asyncio
import ssl

from mailrelay.smtp import _replies as r
from mailrelay.smtp._hub import ConnectionHub
from mailrelay.smtp._protocol import RelaySMTP
from mailrelay.smtp._session import EnvelopeHandler, SenderPolicy, SmtpObserver, SmtpOptions


class SmtpServer:
    """Owns the listening socket and the live connections; `shutdown()` drains them gracefully."""

    def __init__(
        self,
        *,
        options: SmtpOptions,
        handler: EnvelopeHandler,
        tls_context: ssl.SSLContext | None,
        sender_policy: SenderPolicy | None = None,
        observer: SmtpObserver | None = None,
    ) -> None:
        self.options = options
        self.handler = handler
        self.tls_context = tls_context
        self.sender_policy = sender_policy
        self.observer = observer
        self.hub = ConnectionHub(max_per_ip=options.max_concurrent_per_ip, max_sessions=options.max_sessions)
        self._server: asyncio.Server | None = None

    def _protocol(self) -> RelaySMTP:
        return RelaySMTP(
            options=self.options,
            handler=self.handler,
            hub=self.hub,
            tls_context=self.tls_context,
            sender_policy=self.sender_policy,
            observer=self.observer,
        )

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._protocol, host=host, port=port)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def shutdown(self, grace: float) -> None:
        """Stop accepting; 421 to idle sessions now; let sessions inside DATA or delivery finish
        within `grace` seconds, then 421 and close whatever is left."""
        if self._server is None:
            return
        self._server.close()
        self.hub.shutting_down = True
        for connection in list(self.hub.connections):
            if not connection.busy:
                connection.close_with(r.SHUTTING_DOWN)
        await self.hub.wait_idle(grace)
        for connection in list(self.hub.connections):
            connection.close_with(r.SHUTTING_DOWN)
        for task in list(self.hub.deliveries):
            task.cancel()
        if self.hub.deliveries:
            await asyncio.wait(list(self.hub.deliveries), timeout=1.0)
        await self._server.wait_closed()
        self._server = None
