"""Test clients for a Bastion service: build it, run its lifespan, call it in-process, mint tokens for it.

:class:`AsyncServiceClient` is an ``httpx.AsyncClient`` over ``httpx.ASGITransport``. :class:`ServiceClient` is an
``httpx.Client`` whose transport hands each request to the same ASGI transport in an event loop on a helper
thread (an anyio blocking portal), where the app's lifespan runs too. Neither imports
``starlette.testclient``, which warns (``StarletteDeprecationWarning``) when httpx rather than httpx2 is
installed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import anyio.from_thread
import httpx

from bastion.testing._broker import BrokerChoice, SyncMemoryBroker, build_option, memory_broker
from bastion.testing._harness import Harness, Minter, prepare, resolve_settings
from bastion.testing._lifespan import Lifespan
from bastion.types import Receive, Scope, Send

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from bastion._app import BastionApp
    from bastion._service import Service
    from bastion.broker._memory import MemoryBroker
    from bastion.config import Settings

BASE_URL = "http://testserver"
NOT_STARTED = (
    "the service is not running: use the client as a context manager (`with ServiceClient(service) as client:` "
    "or `async with AsyncServiceClient(service) as client:`); entering it runs the service's start-up"
)


class _AsyncAppTransport(httpx.AsyncBaseTransport):
    """``httpx.ASGITransport`` that refuses requests while the app's lifespan is not running.

    Shared by the client and its ``as_user`` views; closing a view leaves it open (the client owns the app).
    """

    def __init__(self, app: BastionApp) -> None:
        self.app = app
        self.asgi = httpx.ASGITransport(app=self._with_state)
        self.running = False
        self.state: dict[str, Any] = {}

    async def _with_state(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Each request gets a copy of the lifespan state, as a server gives it (``request.state``)."""
        scope["state"] = dict(self.state)
        await self.app(scope, receive, send)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not self.running:
            raise RuntimeError(NOT_STARTED)
        return await self.asgi.handle_async_request(request)

    async def aclose(self) -> None:
        """Nothing to release: the app is stopped by the client that built it."""


class _PortalTransport(httpx.BaseTransport):
    """A sync transport that runs each request through the ASGI transport in the portal's event loop."""

    def __init__(self, app: BastionApp) -> None:
        self.inner = _AsyncAppTransport(app)
        self.portal: anyio.from_thread.BlockingPortal | None = None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.portal is None:
            raise RuntimeError(NOT_STARTED)
        request.read()  # a sync body (an iterator, a file) becomes bytes the event loop can send
        return self.portal.call(self._send, request)

    async def _send(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        # The raw bytes, still content-encoded: the sync client decodes them as it would off the network.
        body = b"".join([chunk async for chunk in response.aiter_raw()])
        return httpx.Response(response.status_code, headers=response.headers, stream=httpx.ByteStream(body))

    def close(self) -> None:
        """Nothing to release: the app is stopped by the client that built it."""


class _ClientSetup:
    """What both clients share: building the service for tests and minting the tokens it accepts."""

    harness: Harness

    def _prepare(
        self,
        service: Service,
        *,
        settings: Settings | None,
        config: str | os.PathLike[str] | None,
        environ: Mapping[str, str] | None,
        minter: Minter | None,
        replace_token_key: bool,
        broker: BrokerChoice | None = None,
    ) -> Harness:
        loaded = resolve_settings(settings=settings, config=config, environ=environ)
        memory = build_option(service, loaded, broker)
        self.harness = prepare(service, loaded, minter=minter, replace_token_key=replace_token_key, broker=memory)
        return self.harness

    @property
    def app(self) -> BastionApp:
        """The built ASGI application (``service.build(settings)``)."""
        return self.harness.app

    @property
    def settings(self) -> Settings:
        """The settings the app was built with: the loaded ones with the generated token key in place."""
        return self.harness.settings

    @property
    def minter(self) -> Minter | None:
        """What signs ``as_user`` tokens (a TokenMinter, or a PasetoMinter for ``token.format = 'paseto'``)."""
        return self.harness.minter

    def token(self, sub: str | None, *, roles: Iterable[str] = (), **claims: Any) -> str:
        """A bearer token the service accepts, for ``sub`` with ``roles`` and any other claims.

        ``iat``, ``exp`` (``ttl`` seconds, default 300) and a fresh ``jti`` are set; ``iss``/``aud`` too when the
        settings require them. A claim given as ``None`` is left out (``aud=None`` tests a missing audience).
        RuntimeError when token authentication is off (``token.enabled = false``).
        """
        return self.harness.token(sub, roles=roles, **claims)

    def _user_headers(
        self, headers: httpx.Headers, sub: str | None, roles: Iterable[str], claims: Mapping[str, Any]
    ) -> httpx.Headers:
        with_token = httpx.Headers(headers)
        with_token["authorization"] = f"Bearer {self.token(sub, roles=roles, **claims)}"
        return with_token


class ServiceClient(_ClientSetup, httpx.Client):
    """A sync ``httpx.Client`` for ``service``, built with test settings and started (lifespan) on ``with``.

    Settings: ``settings`` as given, or ``config`` (a TOML file; the embedded defaults when ``None``) loaded with
    ``environ`` (``SERVICE_*`` overrides; the process environment is not read). The token key is replaced by a
    generated one (``minter``, when given) unless ``replace_token_key=False``; every other token setting is
    kept. Requests carry no token; :meth:`as_user` returns a client whose requests do.

    Raises ConfigError while building for settings the service refuses (as ``bastion run`` would), and
    RuntimeError on ``with`` when the service's start-up fails (its own message), or for a request made
    outside ``with``.
    """

    def __init__(
        self,
        service: Service,
        settings: Settings | None = None,
        *,
        config: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
        minter: Minter | None = None,
        replace_token_key: bool = True,
        base_url: str = BASE_URL,
        broker: BrokerChoice | None = None,
        **client_options: Any,
    ) -> None:
        harness = self._prepare(
            service,
            settings=settings,
            config=config,
            environ=environ,
            minter=minter,
            replace_token_key=replace_token_key,
            broker=broker,
        )
        self._app_transport = _PortalTransport(harness.app)
        self._lifespan = Lifespan(harness.app, name=harness.app.name)
        self._portal_cm: AbstractContextManager[anyio.from_thread.BlockingPortal] | None = None
        super().__init__(transport=self._app_transport, base_url=base_url, **client_options)

    @property
    def broker(self) -> SyncMemoryBroker:
        """The in-memory broker (docs/testing.md): ``published(subject)``, ``publish``, ``request``, ``drain``,
        ``advance``; RuntimeError when the client runs the NATS broker, or none."""
        return SyncMemoryBroker(memory_broker(self.app), self._in_app_loop)

    def _in_app_loop(self, call: Any) -> Any:
        if self._app_transport.portal is None:
            raise RuntimeError(NOT_STARTED)
        return self._app_transport.portal.call(call)

    def as_user(self, sub: str | None, *, roles: Iterable[str] = (), **claims: Any) -> httpx.Client:
        """A client for the same running app whose requests carry a bearer token for ``sub`` (see :meth:`token`)."""
        return httpx.Client(
            transport=self._app_transport,
            base_url=self.base_url,
            headers=self._user_headers(self.headers, sub, roles, claims),
            follow_redirects=self.follow_redirects,
        )

    def __enter__(self) -> Self:
        if self._portal_cm is not None:
            raise RuntimeError("the client is already running")
        super().__enter__()
        self._portal_cm = anyio.from_thread.start_blocking_portal()
        portal = self._portal_cm.__enter__()
        try:
            portal.call(self._start)
        except BaseException:
            self._stop_portal()
            self.close()
            raise
        self._app_transport.portal = portal
        return self

    async def _start(self) -> None:
        await self._lifespan.start()
        self._app_transport.inner.state = self._lifespan.state
        self._app_transport.inner.running = True

    async def _stop(self) -> None:
        self._app_transport.inner.running = False
        await self._lifespan.stop()

    def _stop_portal(self) -> None:
        portal_cm, self._portal_cm = self._portal_cm, None
        self._app_transport.portal = None
        if portal_cm is not None:
            portal_cm.__exit__(None, None, None)

    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        try:
            if self._app_transport.portal is not None:
                self._app_transport.portal.call(self._stop)
        finally:
            self._stop_portal()
            super().__exit__(exc_type, exc_value, traceback)


class AsyncServiceClient(_ClientSetup, httpx.AsyncClient):
    """The async counterpart of :class:`ServiceClient` (same arguments): started on ``async with``, in the
    running event loop; :meth:`as_user` returns an ``httpx.AsyncClient``."""

    def __init__(
        self,
        service: Service,
        settings: Settings | None = None,
        *,
        config: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
        minter: Minter | None = None,
        replace_token_key: bool = True,
        base_url: str = BASE_URL,
        broker: BrokerChoice | None = None,
        **client_options: Any,
    ) -> None:
        harness = self._prepare(
            service,
            settings=settings,
            config=config,
            environ=environ,
            minter=minter,
            replace_token_key=replace_token_key,
            broker=broker,
        )
        self._app_transport = _AsyncAppTransport(harness.app)
        self._lifespan = Lifespan(harness.app, name=harness.app.name)
        super().__init__(transport=self._app_transport, base_url=base_url, **client_options)

    @property
    def broker(self) -> MemoryBroker:
        """The in-memory broker (docs/testing.md): ``published(subject)``, ``await publish(...)``, ``await
        request(...)``, ``await drain()``, ``await advance(s)``; RuntimeError when the client runs the NATS
        broker, or none."""
        return memory_broker(self.app)

    def as_user(self, sub: str | None, *, roles: Iterable[str] = (), **claims: Any) -> httpx.AsyncClient:
        """A client for the same running app whose requests carry a bearer token for ``sub`` (see :meth:`token`)."""
        return httpx.AsyncClient(
            transport=self._app_transport,
            base_url=self.base_url,
            headers=self._user_headers(self.headers, sub, roles, claims),
            follow_redirects=self.follow_redirects,
        )

    async def __aenter__(self) -> Self:
        if self._app_transport.running:
            raise RuntimeError("the client is already running")
        await super().__aenter__()
        try:
            await self._lifespan.start()
        except BaseException:
            await self.aclose()
            raise
        self._app_transport.state = self._lifespan.state
        self._app_transport.running = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        self._app_transport.running = False
        try:
            await self._lifespan.stop()
        finally:
            await super().__aexit__(exc_type, exc_value, traceback)
