"""The broker's NATS connection: connecting with retries (now or in the background), nats-py's callbacks, draining.

``[broker]``: ``url`` (several comma-separated for a cluster, ``tls://`` for TLS, ``user:password@`` credentials,
never logged), ``name``, ``max_reconnects`` once connected, ``max_retries`` for the first connection with
exponential backoff from ``retry_delay_secs``. ``lazy_init`` (default): the app starts at once and connects in the
background, trying until it succeeds; otherwise start-up waits and fails after the retries. ``tls_ca_path``,
``tls_cert_path``/``tls_key_path``: the server's CAs and a client certificate for ``tls://`` URLs (NATS with TLS
client auth), re-read when the files change: each new connection (and reconnection) presents the current pair.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.errors import Error as JetStreamError
from nats.js.errors import ServiceUnavailableError as JetStreamServiceUnavailable

from bastion.config import BrokerSettings
from bastion.errors import BrokerUnavailable, ConfigError
from bastion_core import mask_url
from bastion_core._tls import CertificateFiles, CertificateSetError, ReloadingClientContext

log = structlog.get_logger("bastion.broker")

MAX_BACKGROUND_BACKOFF_SECS = 10.0


def client_tls(settings: BrokerSettings) -> ReloadingClientContext | None:
    """The broker's client TLS from ``broker.tls_*_path`` (``None`` when none is set); ConfigError on a bad set."""
    files = CertificateFiles(
        cert_path=settings.tls_cert_path, key_path=settings.tls_key_path, ca_path=settings.tls_ca_path
    )
    if not files.paths:
        return None
    try:
        return ReloadingClientContext(files, name="broker")
    except CertificateSetError as exc:
        raise ConfigError(f"broker.tls_*_path: {exc}") from None


class BrokerConnection:
    """One NATS connection with JetStream; ``set_up`` runs on each new connection before it counts as ready.

    A ``set_up`` that finds no JetStream fails start-up with a ConfigError; one that times out or meets a NATS
    error makes the attempt fail (BrokerUnavailable: retried like a refused connection).
    """

    def __init__(
        self,
        settings: BrokerSettings,
        *,
        service: str,
        set_up: Callable[[], Awaitable[None]],
        reload_interval_secs: float = 10.0,
    ) -> None:
        if settings.url is None:
            raise ConfigError("the broker needs broker.url (or SERVICE_BROKER_URL)")
        self.tls = client_tls(settings)
        self.reload_interval_secs = reload_interval_secs
        self._tls_watch: asyncio.Task[None] | None = None
        self.settings = settings
        self.service = service
        self._set_up = set_up
        self._servers = [part.strip() for part in settings.url.get_secret_value().split(",")]
        self.shown_url = mask_url(settings.url.get_secret_value(), cluster=True)
        self.nc: Client | None = None
        self.js: JetStreamContext | None = None
        self._connector: asyncio.Task[None] | None = None
        self.stopping = False
        self._set_up_done = False

    @property
    def connected(self) -> bool:
        """Connected, and ``set_up`` has completed."""
        return self._set_up_done and self.nc is not None and self.nc.is_connected

    def client(self) -> Client:
        """The connected client; BrokerUnavailable while there is none."""
        if self.nc is None or not self.nc.is_connected:
            raise BrokerUnavailable()
        return self.nc

    async def start(self) -> None:
        """Connect now (``lazy_init = false``: raising after the retries) or in the background."""
        if self.tls is not None and self._tls_watch is None:
            self._tls_watch = asyncio.create_task(self.tls.watch(self.reload_interval_secs), name="broker-tls-watch")
        if self.settings.lazy_init:
            self._connector = asyncio.create_task(self._connect_until_connected(), name="broker-connect")
            return
        await self._connect_with_retries(self.settings.max_retries)

    async def stop_connecting(self) -> None:
        """From now on the connection is stopping: no further attempt, and disconnections are not reported."""
        self.stopping = True
        if self._tls_watch is not None:
            self._tls_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tls_watch
        if self._connector is not None:
            self._connector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connector

    async def drain(self) -> None:
        """Drain the connection: what was published is flushed (closed at once when draining fails)."""
        if self.nc is not None and not self.nc.is_closed:
            try:
                await self.nc.drain()
            except (TimeoutError, NatsError) as exc:
                log.warning("broker_drain_failed", error=f"{type(exc).__name__}: {exc}")
                await self.nc.close()

    async def _connect_until_connected(self) -> None:
        attempt = 0
        while not self.stopping:
            attempt += 1
            try:
                await self._connect()
                return
            except BrokerUnavailable as exc:
                delay = min(MAX_BACKGROUND_BACKOFF_SECS, max(0.1, self.settings.retry_delay_secs) * 2 ** (attempt - 1))
                log.warning(
                    "broker_connect_failed", url=self.shown_url, attempt=attempt, retry_in=delay, error=str(exc)
                )
                await asyncio.sleep(delay)
            except ConfigError as exc:
                log.error("broker_setup_failed", error=str(exc))
                return

    async def _connect_with_retries(self, retries: int) -> None:
        for attempt in range(1, retries + 2):
            try:
                await self._connect()
                return
            except BrokerUnavailable as exc:
                if attempt > retries:
                    fix = (
                        "check the user and password in broker.url"
                        if "Authorization" in str(exc.detail)
                        else "start NATS, fix the URL, or set broker.lazy_init = true to start without it"
                    )
                    tries = f"{attempt} attempt{'s' if attempt > 1 else ''}"
                    raise ConfigError(
                        f"broker.url {self.shown_url}: cannot connect after {tries} ({exc.detail}); {fix}"
                    ) from None
                delay = max(0.0, self.settings.retry_delay_secs) * 2 ** (attempt - 1)
                log.warning(
                    "broker_connect_failed", url=self.shown_url, attempt=attempt, retry_in=delay, error=str(exc)
                )
                await asyncio.sleep(delay)

    async def _connect(self) -> None:
        options: dict[str, Any] = {
            "servers": self._servers,
            "name": self.settings.name or self.service,
            "connect_timeout": self.settings.connect_timeout_secs,
            # The start-up attempts are ours (max_retries with backoff): nats-py tries each server twice and
            # reports the real error (an authorization failure, say) rather than retrying it 60 times.
            "allow_reconnect": False,
            "max_reconnect_attempts": 1,
            "reconnect_time_wait": 0.1,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
            "closed_cb": self._on_closed,
            "error_cb": self._on_error,
            "drain_timeout": math.ceil(self.settings.drain_timeout_secs),
        }
        if self.tls is not None:
            options["tls"] = self.tls.context
        elif any(server.startswith("tls://") for server in self._servers):
            options["tls"] = ssl.create_default_context()
        nc = Client()
        try:
            await nc.connect(**options)
        except (TimeoutError, OSError, NatsError) as exc:
            with contextlib.suppress(Exception):
                await nc.close()  # the transport of a refused attempt (bad credentials) is still open
            raise BrokerUnavailable(f"{type(exc).__name__}: {exc}".removesuffix(": ")) from None
        # Connected: from now on nats-py reconnects by itself, max_reconnects times (-1: forever, 0: never),
        # retry_delay_secs apart. nats-py reads these options on each reconnect.
        nc.options["allow_reconnect"] = self.settings.max_reconnects != 0
        nc.options["max_reconnect_attempts"] = self.settings.max_reconnects
        nc.options["reconnect_time_wait"] = max(0.1, float(self.settings.retry_delay_secs))
        self.nc = nc
        self.js = nc.jetstream()
        log.info("broker_connected", url=self.shown_url)
        try:
            await self._set_up()
        except BaseException as exc:
            self.nc = None  # first: the closing connection's callbacks stay quiet, and readiness stays false
            with contextlib.suppress(Exception):
                await nc.close()
            if isinstance(exc, NoRespondersError | JetStreamServiceUnavailable):
                raise ConfigError(
                    f"broker.url {self.shown_url}: JetStream is not enabled on this NATS server (start it with -js)"
                ) from None
            if isinstance(exc, TimeoutError | NatsError | JetStreamError):
                raise BrokerUnavailable(f"set-up failed: {type(exc).__name__}: {exc}") from None
            raise
        self._set_up_done = True

    async def _on_disconnected(self) -> None:
        if self.nc is not None and not self.stopping:  # (a failed start-up attempt is reported by its loop)
            log.warning("broker_disconnected", url=self.shown_url)

    async def _on_reconnected(self) -> None:
        log.info("broker_reconnected", url=self.shown_url)

    async def _on_closed(self) -> None:
        if self.nc is not None and not self.stopping:
            log.error("broker_connection_closed", url=self.shown_url, reason="reconnect attempts exhausted")

    async def _on_error(self, exc: Exception) -> None:
        if self.nc is None:
            return  # a failed start-up attempt: reported by the connect loop
        log.warning("broker_error", error=f"{type(exc).__name__}: {exc}")
