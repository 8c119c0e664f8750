"""The listener: one port, a first-bytes sniffer in front of the uvicorn HTTP/1.1 protocol.

Every accepted connection starts with :class:`SniffingProtocol`. It looks at the first bytes: anything that
is not the HTTP/2 client preface goes to uvicorn's HTTP/1.1 protocol at once (the decision costs one
comparison); an HTTP/2 preface goes to ``h2_protocol_factory``, which the gRPC capability sets, and is
closed while none is set. Graceful shutdown (SIGTERM/SIGINT) is uvicorn's: stop accepting, let in-flight
requests finish within ``service.graceful_shutdown_secs``, then exit.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, ClassVar, cast

import structlog
import uvicorn
from uvicorn.config import Config
from uvicorn.server import ServerState

from bastion.app import BastionApp
from bastion.config import Settings, load_settings
from bastion.errors import ConfigError
from bastion.service import Service
from bastion.telemetry import configure_logging
from bastion.types import H2_PROTOCOL_FACTORY

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Http11Protocol
except ImportError:  # pragma: no cover - httptools is in uvicorn[standard]; h11 is the pure-Python fallback
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Http11Protocol  # type: ignore[assignment]

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER_BYTES = 9
SETTINGS_FRAME, MAX_FRAME_SIZE = 0x4, 16_384
# GOAWAY (type 7) on stream 0: last stream 0, error PROTOCOL_ERROR (1). RFC 9113 3.4 and 6.8.
GOAWAY_PROTOCOL_ERROR = b"\x00\x00\x08\x07\x00\x00\x00\x00\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x01"
SNIFF_TIMEOUT_SECS = 10.0
ENV_APP, ENV_CONFIG, ENV_APP_DIR = "BASTION_APP", "BASTION_CONFIG", "BASTION_APP_DIR"

log = structlog.get_logger("bastion.server")


def valid_first_frame(header: bytes) -> bool:
    """RFC 9113 3.4: the client preface is followed by a SETTINGS frame (stream 0, no ACK, 6-byte entries)."""
    length = int.from_bytes(header[:3], "big")
    frame_type, flags, stream = header[3], header[4], int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
    return (
        frame_type == SETTINGS_FRAME
        and not flags & 0x1
        and stream == 0
        and length % 6 == 0
        and length <= MAX_FRAME_SIZE
    )


class SniffingProtocol(asyncio.Protocol):
    """Decide per connection between HTTP/1.1 (uvicorn) and HTTP/2 (gRPC) from the first bytes.

    Constructed by uvicorn exactly like its own HTTP protocols. A connection that sends a partial preface
    and then nothing is closed after ``SNIFF_TIMEOUT_SECS``.
    """

    h2_protocol_factory: ClassVar[Callable[[], asyncio.Protocol] | None] = None

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.config = config
        self.server_state = server_state
        self.app_state = app_state
        self.loop = _loop or asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop transports do not subclass it
        ssl_object = transport.get_extra_info("ssl_object")
        negotiated = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        if negotiated == "h2":
            # TLS: ALPN already chose the protocol (RFC 7301), no need to look at the bytes.
            self._hand_to_h2()
            return
        if negotiated == "http/1.1":
            self._hand_over(self._http11())
            return
        self.timer = self.loop.call_later(SNIFF_TIMEOUT_SECS, self._give_up)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        seen = min(len(self.buffer), len(H2_PREFACE))
        if self.buffer[:seen] != H2_PREFACE[:seen]:
            self._hand_over(self._http11())
        elif len(self.buffer) >= len(H2_PREFACE) + FRAME_HEADER_BYTES:
            if valid_first_frame(self.buffer[len(H2_PREFACE) : len(H2_PREFACE) + FRAME_HEADER_BYTES]):
                self._hand_to_h2()
            else:
                log.info("http2_protocol_error", reason="the preface is not followed by a SETTINGS frame")
                assert self.transport is not None
                self.transport.write(GOAWAY_PROTOCOL_ERROR)
                self._close()

    def _http11(self) -> asyncio.Protocol:
        return _Http11Protocol(
            config=self.config, server_state=self.server_state, app_state=self.app_state, _loop=self.loop
        )

    def _hand_to_h2(self) -> None:
        factory = self.app_state.get(H2_PROTOCOL_FACTORY) or type(self).h2_protocol_factory
        if factory is None:
            log.info("http2_refused", reason="gRPC is not enabled on this port")
            self._close()
            return
        self._hand_over(factory())

    def _hand_over(self, protocol: asyncio.Protocol) -> None:
        assert self.transport is not None
        self._cancel_timer()
        buffered, self.buffer = self.buffer, b""
        self.transport.set_protocol(protocol)
        protocol.connection_made(self.transport)
        if buffered:
            protocol.data_received(buffered)

    def _give_up(self) -> None:
        log.info("connection_sniff_timeout")
        self._close()

    def _close(self) -> None:
        self._cancel_timer()
        if self.transport is not None:
            self.transport.close()

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def eof_received(self) -> bool | None:
        self._close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()


class _Server(uvicorn.Server):
    """uvicorn's server, exiting 0 after a graceful shutdown instead of re-raising SIGTERM/SIGINT."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self._captured_signals.clear()


class Http2OnlyProtocol(asyncio.Protocol):
    """For a port that speaks only HTTP/2 (``grpc.use_separate_port``): check the preface and first frame.

    A client that sends anything else gets GOAWAY(PROTOCOL_ERROR) and is closed; one that stalls before the
    first frame is closed after ``SNIFF_TIMEOUT_SECS``. Then the connection belongs to ``factory()``.
    """

    def __init__(self, factory: Callable[[], asyncio.Protocol]) -> None:
        self.factory = factory
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.timer = asyncio.get_running_loop().call_later(SNIFF_TIMEOUT_SECS, self._close)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buffer += data
        seen = min(len(self.buffer), len(H2_PREFACE))
        needed = len(H2_PREFACE) + FRAME_HEADER_BYTES
        if self.buffer[:seen] != H2_PREFACE[:seen] or (
            len(self.buffer) >= needed and not valid_first_frame(self.buffer[len(H2_PREFACE) : needed])
        ):
            log.info("http2_protocol_error", reason="not an HTTP/2 client preface and SETTINGS frame")
            self.transport.write(GOAWAY_PROTOCOL_ERROR)
            self._close()
        elif len(self.buffer) >= needed:
            if self.timer is not None:
                self.timer.cancel()
            protocol = self.factory()
            buffered, self.buffer = self.buffer, b""
            self.transport.set_protocol(protocol)
            protocol.connection_made(self.transport)
            protocol.data_received(buffered)

    def _close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()


def import_service(reference: str, *, app_dir: str = ".") -> Service:
    """The :class:`Service` named by ``MODULE:ATTR`` (an attribute, or a zero-argument factory returning one)."""
    module_name, _, attr = reference.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"app {reference!r} must have the form MODULE:ATTR, e.g. examples.documents_api:service")
    if app_dir:
        sys.path.insert(0, os.path.abspath(app_dir))
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigError(f"cannot import module {module_name!r} (from {os.path.abspath(app_dir)})") from None
        raise
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(target, Service) and callable(target):
        target = target()
    if not isinstance(target, Service):
        raise ConfigError(f"{reference!r} is a {type(target).__name__}, not a bastion.Service")
    return target


def build(reference: str, settings: Settings, *, app_dir: str = ".") -> BastionApp:
    """Import the service and build its ASGI app for ``settings``."""
    return import_service(reference, app_dir=app_dir).build(settings)


def _worker_app() -> BastionApp:
    """uvicorn factory for ``--workers N``: each worker process re-reads the same app and config."""
    settings = load_settings(os.environ.get(ENV_CONFIG) or None)
    configure_logging(settings.service.log_level, settings.service.log_format)
    return build(os.environ[ENV_APP], settings, app_dir=os.environ.get(ENV_APP_DIR, "."))


class _Config(Config):
    """uvicorn's Config, with ALPN ``h2``/``http/1.1`` offered on TLS when gRPC shares the port."""

    alpn_h2 = False

    def load(self) -> None:
        super().load()
        if self.ssl is not None:
            self.ssl.set_alpn_protocols(["h2", "http/1.1"] if self.alpn_h2 else ["http/1.1"])


def uvicorn_config(
    app: Any, settings: Settings, *, host: str, port: int, workers: int = 1, factory: bool = False
) -> Config:
    """The uvicorn configuration Bastion serves with: our sniffer, our logging, no proxy-header rewriting."""
    config = _Config(
        app,
        host=host,
        port=port,
        http=SniffingProtocol,
        lifespan="on",
        log_config=None,
        access_log=False,
        server_header=False,
        # The rate limiter decides whether forwarded headers are trusted (rate_limit.trust_forwarded_headers);
        # uvicorn must not rewrite the client address behind its back.
        proxy_headers=False,
        timeout_graceful_shutdown=round(settings.service.graceful_shutdown_secs),
        workers=workers,
        factory=factory,
        ssl_certfile=settings.service.tls_cert_path,
        ssl_keyfile=settings.service.tls_key_path,
    )
    config.alpn_h2 = settings.grpc.enabled and not settings.grpc.use_separate_port
    return config


def serve(
    reference: str,
    settings: Settings,
    *,
    config_path: str | None = None,
    host: str | None = None,
    port: int | None = None,
    workers: int | None = None,
    app_dir: str = ".",
) -> int:
    """Run the service until SIGTERM/SIGINT; the return value is the process exit code."""
    host = host if host is not None else settings.service.host
    port = port if port is not None else settings.service.port
    workers = workers or settings.service.workers
    if workers > 1:
        os.environ.update({ENV_APP: reference, ENV_APP_DIR: os.path.abspath(app_dir)})
        if config_path:
            os.environ[ENV_CONFIG] = os.path.abspath(config_path)
        build(reference, settings, app_dir=app_dir)  # fail in the parent, before binding, on a bad app
        config = uvicorn_config(
            "bastion.server:_worker_app", settings, host=host, port=port, workers=workers, factory=True
        )
        from uvicorn.supervisors import Multiprocess

        Multiprocess(config, sockets=[config.bind_socket()]).run()
        return 0
    app = build(reference, settings, app_dir=app_dir)
    server = _Server(uvicorn_config(app, settings, host=host, port=port))
    server.run()
    return 0 if server.started else 1
