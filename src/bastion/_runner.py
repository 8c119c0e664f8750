"""Running a service: import ``MODULE:ATTR``, build it, serve it with uvicorn on the listener's protocols.

Graceful shutdown (SIGTERM/SIGINT) is uvicorn's: stop accepting, let in-flight requests finish within
``service.graceful_shutdown_secs``, then exit 0. ``--workers N`` uses uvicorn's supervisor; each worker
re-reads the app and the config.

Every start-up failure is a ConfigError of one line (the command line prints ``error: ...`` and exits 2): the
app is imported and built, then the port is bound (:func:`listen`, before any start-up hook runs), and only then
does uvicorn run the lifespan start-up on the bound socket. A start-up that fails there reaches the runner through
``BastionApp.on_startup_failure`` (a worker of ``--workers N`` writes it to a file the supervisor reads).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import inspect
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import structlog
import uvicorn
from fastapi import APIRouter
from uvicorn.config import Config

from bastion import _extras as extras
from bastion._app import BastionApp
from bastion._compat import uvicorn as uvicorn_compat
from bastion._listener import ListenerConfig, ListenerLimits, SniffingProtocol, WebSocketProtocol
from bastion._metrics import MULTIPROC_ENV, multiprocess_exposition
from bastion._metrics_listener import MetricsListener
from bastion._service import Service
from bastion._telemetry import configure_logging
from bastion.config import Settings, load_settings
from bastion.errors import ConfigError

ENV_APP, ENV_CONFIG, ENV_APP_DIR = "BASTION_APP", "BASTION_CONFIG", "BASTION_APP_DIR"
ENV_STARTUP_FAILURE = "BASTION_STARTUP_FAILURE_DIR"
ENV_SUPERVISOR = "BASTION_SUPERVISOR_PID"
"""The ``--workers`` supervisor's process: a worker whose start-up failed stops it (SIGTERM), so no uvicorn
restarts it (uvicorn before 0.50 restarts a dead worker; later ones stop on their own)."""
"""``--workers N``: where the first worker whose start-up fails writes its one line for the supervisor."""
FAILURE_FILE = "failure"
LISTEN_BACKLOG = 2048

log = structlog.get_logger("bastion.run")


def listen(host: str, port: int) -> socket.socket:
    """The listening socket uvicorn, its workers or ``--reload``'s workers serve on (IPv6 when ``host`` is an IPv6
    address), bound before the start-up hooks run. A port in use is a ConfigError of one line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    sock.listen(LISTEN_BACKLOG)
    sock.set_inheritable(True)
    return sock


def log_listening(sock: socket.socket, *, tls: bool) -> None:
    """The one line saying where the service is served (the same in every mode): ``service_listening``."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    log.info("service_listening", url=f"{'https' if tls else 'http'}://{shown}:{port}")


class _Server(uvicorn.Server):
    """uvicorn's server, exiting 0 after a graceful shutdown instead of re-raising SIGTERM/SIGINT, and saying
    where it listens once started (uvicorn says it only for sockets it binds itself)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and sockets:
            log_listening(sockets[0], tls=self.config.is_ssl)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        uvicorn_compat.forget_captured_signals(self)


def _where(exc: BaseException, app_dir: str) -> str:
    """``FILE:LINE: `` of the frame that raised ``exc`` in the user's code (under ``app_dir``; else the last frame
    with a file), or nothing."""
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__) if not frame.filename.startswith("<")]
    root = os.path.abspath(app_dir)
    own = [frame for frame in frames if os.path.abspath(frame.filename).startswith(root + os.sep)]
    shown = own or frames
    return f"{shown[-1].filename}:{shown[-1].lineno}: " if shown else ""


def import_service(reference: str, *, app_dir: str = ".") -> Service:
    """The :class:`Service` named by ``MODULE:ATTR`` (an attribute, or a zero-argument factory returning one).

    Every way this can fail is a ConfigError of one line naming the cause (the CLI prints it and exits 2;
    ``--debug`` or ``BASTION_DEBUG=1`` shows the traceback instead).
    """
    module_name, _, attr = reference.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"app {reference!r} must have the form MODULE:ATTR, e.g. examples.documents_api:service")
    if module_name.endswith(".py"):
        dotted = module_name.removesuffix(".py").replace("/", ".").lstrip(".")
        raise ConfigError(f"app {reference!r}: name the module, not the file: {dotted}:{attr}")
    if app_dir:
        sys.path.insert(0, os.path.abspath(app_dir))
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigError(f"cannot import module {module_name!r} (from {os.path.abspath(app_dir)})") from exc
        raise ConfigError(f"importing {module_name!r} failed: {exc} (is it installed in this environment?)") from exc
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}" if exc.filename else module_name
        raise ConfigError(f"importing {module_name!r} failed: {where}: SyntaxError: {exc.msg}") from exc
    except ConfigError:
        raise
    except Exception as exc:
        where = _where(exc, app_dir)
        raise ConfigError(f"importing {module_name!r} failed: {where}{type(exc).__name__}: {exc}") from exc
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(target, APIRouter):
        raise ConfigError(
            f"{reference!r} is a router ({type(target).__name__}), not a bastion.Service: "
            "point at the Service its routes belong to, e.g. MODULE:service"
        )
    if not isinstance(target, Service) and (
        inspect.isfunction(target) or inspect.ismethod(target) or isinstance(target, functools.partial)
    ):
        try:
            target = target()
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"{reference}() failed: {_where(exc, app_dir)}{type(exc).__name__}: {exc}") from exc
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
    app = build(os.environ[ENV_APP], settings, app_dir=os.environ.get(ENV_APP_DIR, "."))
    report = os.environ.get(ENV_STARTUP_FAILURE)
    if report:
        supervisor = int(os.environ.get(ENV_SUPERVISOR) or 0)
        app.on_startup_failure = functools.partial(_write_failure, Path(report) / FAILURE_FILE, supervisor)
    freeze_startup_objects()
    return app


def _write_failure(path: Path, supervisor: int, failure: ConfigError) -> None:
    """A worker's failed start-up, for the supervisor: the first worker's line is kept, the others' dropped; then
    the supervisor is told to stop (SIGTERM, as an operator would), whatever uvicorn does with a dead worker."""
    with contextlib.suppress(FileExistsError), path.open("x", encoding="utf-8") as file:
        file.write(str(failure))
    if supervisor:
        with contextlib.suppress(ProcessLookupError):
            os.kill(supervisor, signal.SIGTERM)


def uvicorn_config(
    app: Any, settings: Settings, *, host: str, port: int, workers: int = 1, factory: bool = False
) -> Config:
    """The uvicorn configuration Bastion serves with: our sniffer, our logging, no proxy-header rewriting.

    Raises ConfigError (one line naming the supported versions) when the installed uvicorn, or grpclib with gRPC
    enabled, lacks an internal the listener's limits rely on (``bastion._compat``).
    """
    uvicorn_compat.check()
    if settings.grpc.enabled:
        extras.GRPC.require()
        from bastion._compat import grpclib as grpclib_compat

        grpclib_compat.check()
    config = ListenerConfig(
        app,
        host=host,
        port=port,
        http=SniffingProtocol,
        ws=WebSocketProtocol,
        lifespan="on",
        log_config=None,
        access_log=False,
        server_header=False,
        # The rate limiter decides whether forwarded headers are trusted (rate_limit.trust_forwarded_headers);
        # uvicorn must not rewrite the client address behind its back.
        proxy_headers=False,
        timeout_graceful_shutdown=round(settings.service.graceful_shutdown_secs),
        # uvicorn takes whole seconds; a fraction rounds up rather than to an immediate close.
        timeout_keep_alive=math.ceil(settings.service.keep_alive_timeout_secs),
        # No limit_concurrency: SniffingProtocol admits connections at the accept against config.slots
        # (service.max_connections, service.max_connections_per_ip; every protocol counts). uvicorn's check runs
        # only once a head is parsed, also counts in-flight requests, refuses the Nth connection rather than the
        # N+1th, misses HTTP/2 and answers in plain text.
        workers=workers,
        factory=factory,
        ssl_certfile=settings.service.tls_cert_path,
        ssl_keyfile=settings.service.tls_key_path,
    )
    config.alpn_h2 = settings.grpc.enabled and not settings.grpc.use_separate_port
    config.limits = ListenerLimits.from_settings(settings.service)
    if settings.service.tls_cert_path is not None:
        config.tls_settings = settings
    if settings.tls.mtls:
        config.identity_from = tuple(settings.tls.identity_from)
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
    fd: int | None = None,
) -> int:
    """Run the service until SIGTERM/SIGINT; the return value is the process exit code.

    ``fd``: serve on this inherited listening socket (a ``--reload`` worker) instead of binding one.
    """
    host = host if host is not None else settings.service.host
    port = port if port is not None else settings.service.port
    workers = workers or settings.service.workers
    if settings.metrics.enabled and settings.metrics.port == port:
        raise ConfigError(f"metrics.port {port} is the port the service listens on: choose another metrics.port")
    if fd is not None and workers > 1:
        raise ConfigError("an inherited socket (--fd) is served by one worker: drop --workers")
    if workers > 1:
        return _serve_workers(reference, settings, config_path=config_path, host=host, port=port, workers=workers,
                              app_dir=app_dir)  # fmt: skip
    app = build(reference, settings, app_dir=app_dir)
    config = uvicorn_config(app, settings, host=host, port=port)
    # family and type read from the inherited descriptor
    sock = listen(host, port) if fd is None else socket.socket(fileno=fd)
    failures: list[ConfigError] = []
    app.on_startup_failure = failures.append
    server = _Server(config)
    freeze_startup_objects()
    try:
        with _metrics_listener(settings, host, app.metrics.exposition):
            server.run(sockets=[sock])
    except SystemExit:  # uvicorn 0.50 and later exit 3 when the lifespan start-up fails (the failure is below)
        if not failures:
            raise
    if failures:
        raise failures[0]
    return 0 if server.started else 1


def _serve_workers(
    reference: str, settings: Settings, *, config_path: str | None, host: str, port: int, workers: int, app_dir: str
) -> int:
    """``--workers N``: build once here to fail early, bind, then uvicorn's supervisor; a worker whose start-up
    fails leaves its line in a file, raised here as the one error once the supervisor has stopped."""
    os.environ.update({ENV_APP: reference, ENV_APP_DIR: os.path.abspath(app_dir)})
    if config_path:
        os.environ[ENV_CONFIG] = os.path.abspath(config_path)
    with _multiprocess_metrics(settings) as expose, tempfile.TemporaryDirectory(prefix="bastion-start-") as report:
        build(reference, settings, app_dir=app_dir)  # fail in the parent, before binding, on a bad app
        config = uvicorn_config(
            "bastion._runner:_worker_app", settings, host=host, port=port, workers=workers, factory=True
        )
        sock = listen(host, port)
        os.environ.update({ENV_STARTUP_FAILURE: report, ENV_SUPERVISOR: str(os.getpid())})
        try:
            with _metrics_listener(settings, host, expose):
                log_listening(sock, tls=config.is_ssl)
                uvicorn_compat.multiprocess(config, [sock]).run()
        finally:
            os.environ.pop(ENV_STARTUP_FAILURE, None)
            os.environ.pop(ENV_SUPERVISOR, None)
            sock.close()
        failure = Path(report) / FAILURE_FILE
        if failure.exists():
            raise ConfigError(failure.read_text(encoding="utf-8"))
    return 0


def freeze_startup_objects() -> None:
    """Move what start-up built (routes, schemas, validators, policies: most of the heap) out of the collector's
    sight, so that a full collection under load walks only what was made since, not the whole heap again.

    Measured at 64 connections on the example: full (generation 2) collections paused the loop 65-80 ms each,
    a few times in 5 s, and every request in flight waited for them (p99 ~200 ms against p50 ~10 ms). What was
    built before serving lives as long as the process, so ignoring it loses nothing (``gc.freeze``; start-up
    garbage is collected first)."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def _multiprocess_metrics(settings: Settings) -> Iterator[Callable[[], bytes]]:
    """``--workers N``: the workers record into files of one directory, merged by every scrape (a worker's on the
    main port, the supervisor's on ``metrics.port``). ``PROMETHEUS_MULTIPROC_DIR`` when set (prometheus-client's
    own variable; empty it between runs), else a fresh directory removed at exit."""
    given = os.environ.get(MULTIPROC_ENV)
    if given or not settings.metrics.enabled:
        yield multiprocess_exposition(given or "")
        return
    path = tempfile.mkdtemp(prefix="bastion-metrics-")
    os.environ[MULTIPROC_ENV] = path  # before the workers start: they read it when they import prometheus-client
    try:
        yield multiprocess_exposition(path)
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _metrics_listener(settings: Settings, host: str, expose: Callable[[], bytes]) -> Iterator[None]:
    """``metrics.port``: the exposition on its own port of ``host`` while the server runs."""
    port = settings.metrics.port
    if port is None or not settings.metrics.enabled:
        yield
        return
    listener = MetricsListener(expose, path=settings.metrics.path)
    try:
        listener.start(host, port)
    except OSError as exc:
        raise ConfigError(f"metrics.port {port} on {host} cannot be opened ({exc.strerror or exc})") from None
    try:
        yield
    finally:
        listener.stop()
