"""Test clients for a Bastion service: build it, run its lifespan, call it in-process, mint tokens for it.

:class:`AsyncServiceClient` is an ``httpx.AsyncClient`` over ``httpx.ASGITransport``. :class:`ServiceClient` is an
``httpx.Client`` whose transport hands each request to the same ASGI transport in an event loop on a helper
thread (an anyio blocking portal), where the app's lifespan runs too. ``websocket_connect`` opens a WebSocket
session on the same app (``bastion.testing._websocket``). Neither imports ``starlette.testclient``, which warns
(``StarletteDeprecationWarning``) when httpx rather than httpx2 is installed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import anyio.from_thread
import httpx

from bastion.testing._broker import BrokerChoice, SyncMemoryBroker, build_option, memory_broker
from bastion.testing._grpc import GrpcLink, StubT, SyncStub
from bastion.testing._harness import Harness, Minter, prepare, resolve_settings
from bastion.testing._lifespan import Lifespan
from bastion.testing._websocket import AsyncWebSocketSession, WebSocketSession, handshake_scope
from bastion.types import Receive, Scope, Send

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from grpclib.client import Channel

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

    def websocket(self, request: httpx.Request, subprotocols: Sequence[str]) -> AsyncWebSocketSession:
        """A session for the WebSocket handshake ``request`` (opened by entering it), with the lifespan state."""
        if not self.running:
            raise RuntimeError(NOT_STARTED)
        return AsyncWebSocketSession(self.app, handshake_scope(request, subprotocols=subprotocols, state=self.state))

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


def _sync_websocket(
    client: httpx.Client, transport: _PortalTransport, url: str, subprotocols: Sequence[str] | None, **options: Any
) -> WebSocketSession:
    if transport.portal is None:
        raise RuntimeError(NOT_STARTED)
    request = client.build_request("GET", url, **options)
    session = transport.portal.call(transport.inner.websocket, request, list(subprotocols or ()))
    return WebSocketSession(session, transport.portal.call)


def _async_websocket(
    client: httpx.AsyncClient,
    transport: _AsyncAppTransport,
    url: str,
    subprotocols: Sequence[str] | None,
    **options: Any,
) -> AsyncWebSocketSession:
    return transport.websocket(client.build_request("GET", url, **options), list(subprotocols or ()))


class _UserClient(httpx.Client):
    """What :meth:`ServiceClient.as_user` returns: an ``httpx.Client`` for the running app, with WebSockets."""

    def __init__(self, transport: _PortalTransport, **options: Any) -> None:
        self._app_transport = transport
        super().__init__(transport=transport, **options)

    def websocket_connect(
        self, url: str, subprotocols: Sequence[str] | None = None, **options: Any
    ) -> WebSocketSession:
        """See :meth:`ServiceClient.websocket_connect` (this client's token goes with the handshake)."""
        return _sync_websocket(self, self._app_transport, url, subprotocols, **options)


class _AsyncUserClient(httpx.AsyncClient):
    """What :meth:`AsyncServiceClient.as_user` returns: an ``httpx.AsyncClient`` for the running app, with
    WebSockets."""

    def __init__(self, transport: _AsyncAppTransport, **options: Any) -> None:
        self._app_transport = transport
        super().__init__(transport=transport, **options)

    def websocket_connect(
        self, url: str, subprotocols: Sequence[str] | None = None, **options: Any
    ) -> AsyncWebSocketSession:
        """See :meth:`AsyncServiceClient.websocket_connect` (this client's token goes with the handshake)."""
        return _async_websocket(self, self._app_transport, url, subprotocols, **options)


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
        self._grpc = GrpcLink(harness.app)
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
        """A client for the same running app whose requests carry a bearer token for ``sub`` (see :meth:`token`);
        it has :meth:`websocket_connect` too."""
        return _UserClient(
            self._app_transport,
            base_url=self.base_url,
            headers=self._user_headers(self.headers, sub, roles, claims),
            follow_redirects=self.follow_redirects,
        )

    def websocket_connect(
        self, url: str, subprotocols: Sequence[str] | None = None, **options: Any
    ) -> WebSocketSession:
        """A WebSocket session on the running app, opened by ``with`` (as Starlette's TestClient's): the handshake
        goes through the whole pipeline. ``options``: ``params``, ``headers``, ``cookies`` of the handshake.

        ``with`` raises :class:`~bastion.testing.WebSocketDenialResponse` when the app answers the handshake
        with an HTTP response (401 without a token, 403 from the policy), ``WebSocketDisconnect`` when it closes.
        """
        return _sync_websocket(self, self._app_transport, url, subprotocols, **options)

    def grpc(self, stub_class: Callable[[Channel], Any]) -> SyncStub:
        """A grpclib stub of the running app's gRPC service, called from sync code:
        ``client.grpc(DocumentServiceStub).GetDocument(request, metadata={"authorization": f"Bearer {token}"})``
        returns the reply (a list for a server-streaming method) or raises grpclib's ``GRPCError``. No server, no
        port: the calls reach the app's own gRPC guard in-process (``bastion.testing._grpc``). RuntimeError when
        the client is not running or the service serves no gRPC."""
        portal = self._app_transport.portal
        if portal is None:
            raise RuntimeError(NOT_STARTED)
        return SyncStub(self._grpc.stub(stub_class), portal.call)

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
        try:
            await self._grpc.open()
        except BaseException:
            await self._stop()
            raise

    async def _stop(self) -> None:
        self._app_transport.inner.running = False
        try:
            await self._grpc.close()
        finally:
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
        self._grpc = GrpcLink(harness.app)
        super().__init__(transport=self._app_transport, base_url=base_url, **client_options)

    @property
    def broker(self) -> MemoryBroker:
        """The in-memory broker (docs/testing.md): ``published(subject)``, ``await publish(...)``, ``await
        request(...)``, ``await drain()``, ``await advance(s)``; RuntimeError when the client runs the NATS
        broker, or none."""
        return memory_broker(self.app)

    def as_user(self, sub: str | None, *, roles: Iterable[str] = (), **claims: Any) -> httpx.AsyncClient:
        """A client for the same running app whose requests carry a bearer token for ``sub`` (see :meth:`token`);
        it has :meth:`websocket_connect` too."""
        return _AsyncUserClient(
            self._app_transport,
            base_url=self.base_url,
            headers=self._user_headers(self.headers, sub, roles, claims),
            follow_redirects=self.follow_redirects,
        )

    def websocket_connect(
        self, url: str, subprotocols: Sequence[str] | None = None, **options: Any
    ) -> AsyncWebSocketSession:
        """The async counterpart of :meth:`ServiceClient.websocket_connect`: ``async with``, awaited methods."""
        return _async_websocket(self, self._app_transport, url, subprotocols, **options)

    def grpc(self, stub_class: Callable[[Channel], StubT]) -> StubT:
        """``stub_class`` (a grpclib stub) on an in-process channel to the running app: ``await
        client.grpc(DocumentServiceStub).GetDocument(request, metadata=...)``, or ``.open()`` for the stream's
        trailers. See :meth:`ServiceClient.grpc`."""
        if not self._app_transport.running:
            raise RuntimeError(NOT_STARTED)
        return self._grpc.stub(stub_class)

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
        try:
            await self._grpc.open()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        self._app_transport.running = False
        try:
            await self._grpc.close()
            await self._lifespan.stop()
        finally:
            await super().__aexit__(exc_type, exc_value, traceback)
