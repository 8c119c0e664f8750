"""``tls``: mutual TLS under attack, then under rotation, against the secured example served over TLS with client
certificates (one server, two phases).

- bad handshakes: clients open TLS connections with bad certificates (another CA, expired, revoked, no
  ``clientAuth`` usage) as fast as they can, while legitimate requests with a good certificate and a token are
  made on fresh connections. Figures: every bad handshake refused, every legitimate request served and the
  slowest within the bound, the server's memory after the flood (at least 1,000 refused handshakes).
- rotation: legitimate requests on fresh connections while the certificate files are replaced (an atomic
  symlink swap, as a Kubernetes secret volume does). Figures: no failed request, and new handshakes present the
  new certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from bastion_core.testing import DevCA, Issued
from bench.processes import ServerProcess, free_port, port_open, venv_script
from bench.scenarios import EXAMPLE_APP, EXAMPLE_CONFIG, LIMITS_NEVER_TRIP, Workspace
from reliability import probes
from reliability.figures import Figure, at_least, at_most, equals, is_true
from reliability.run import Context
from reliability.servers import _pythonpath

LEGIT_WITHIN_SECS = 1.0
"""A legitimate request must still be served within this while bad handshakes flood the port."""
MIN_BAD_HANDSHAKES = 1_000
RSS_GROWTH_LIMIT_MIB = 16.0
"""The server's resident memory after the flood, against before it (allocator noise on a loaded machine)."""
ROTATION_REQUESTS = 1_000
BAD = ("foreign", "expired", "revoked", "wrong-usage")


@dataclass(frozen=True, slots=True)
class Pki:
    directory: Path
    ca: DevCA

    def context(self, name: str | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.directory / "ca.pem"))
        if name is not None:
            context.load_cert_chain(self.directory / f"{name}.pem", self.directory / f"{name}-key.pem")
        return context

    def server(self, name: str) -> Issued:
        return self.ca.issue(name, dns=("localhost",), ips=("127.0.0.1",), server=True, client=False)

    def rotate(self, version: str, issued: Issued) -> None:
        issued.write(self.directory / version, "server")
        link = self.directory / "current.new"
        link.symlink_to(version)
        os.replace(link, self.directory / "current")


def make_pki(ws: Workspace) -> Pki:
    directory = ws.root / f"tls-{time.monotonic_ns()}"
    ca = DevCA()
    ca.write(directory)
    pki = Pki(directory, ca)
    pki.rotate("v1", pki.server("server-v1"))
    now = datetime.datetime.now(datetime.UTC)
    ca.issue("good", spiffe="spiffe://reliability.test/good").write(directory, "good")
    ca.issue("expired", valid_from=now - datetime.timedelta(days=3), valid_days=1).write(directory, "expired")
    ca.issue("wrong-usage", server=True, client=False).write(directory, "wrong-usage")
    revoked = ca.issue("revoked")
    revoked.write(directory, "revoked")
    ca.revoke(revoked.serial)
    (directory / "crl.pem").write_bytes(ca.crl_pem())
    DevCA("another CA").issue("foreign").write(directory, "foreign")
    return pki


@contextlib.contextmanager
def tls_example(ctx: Context, pki: Pki, name: str) -> Iterator[tuple[ServerProcess, str]]:
    """The secured example over TLS, client certificates optional and verified, token or certificate per path."""
    port = free_port()
    argv = [venv_script("bastion"), "run", EXAMPLE_APP, "--config", EXAMPLE_CONFIG, "--host", "127.0.0.1"]
    env = {
        **_pythonpath(),
        "SERVICE_LOG_FORMAT": "json",
        "SERVICE_LOG_LEVEL": "warning",
        "SERVICE_MIDDLEWARE_ACCESS_LOG_ENABLED": "false",
        "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(ctx.ws.public_key),
        "SERVICE_POLICY_HOT_RELOAD": "false",
        "SERVICE_TLS_CERT_PATH": str(pki.directory / "current/server.pem"),
        "SERVICE_TLS_KEY_PATH": str(pki.directory / "current/server-key.pem"),
        "SERVICE_TLS_CLIENT_AUTH": "optional",
        "SERVICE_TLS_CLIENT_CA_PATH": str(pki.directory / "ca.pem"),
        "SERVICE_TLS_CRL_PATH": str(pki.directory / "crl.pem"),
        "SERVICE_TLS_RELOAD_INTERVAL_SECS": "0.2",
        **LIMITS_NEVER_TRIP,
    }
    server = ServerProcess(name, [*argv, "--port", str(port)], log_path=ctx.ws.log(name), env=env)
    try:
        server.wait_ready(lambda: port_open(port))
        yield server, f"https://127.0.0.1:{port}"
    finally:
        server.stop()


async def bad_handshake(port: int, context: ssl.SSLContext) -> bool:
    """Open a TLS connection with a bad certificate and send a request: True when no HTTP answer came."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost"), 5
        )
    except (OSError, TimeoutError):
        return True
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(16), 5)
    except (OSError, TimeoutError):
        return True
    finally:
        writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), 1)
    return not answer.startswith(b"HTTP/")


async def _flood(
    port: int, contexts: list[ssl.SSLContext], seconds: float, workers: int, at_least: int
) -> tuple[int, int]:
    """(handshakes tried, refused) by ``workers`` loops for ``seconds`` and at least ``at_least`` handshakes."""
    tried = refused = 0
    deadline = time.monotonic() + seconds

    async def loop(index: int) -> None:
        nonlocal tried, refused
        while time.monotonic() < deadline or tried < at_least:
            tried += 1
            outcome = await bad_handshake(port, contexts[(tried + index) % len(contexts)])
            refused += outcome  # after the await: `refused += await ...` would read refused before it

    await asyncio.gather(*(loop(index) for index in range(workers)))
    return tried, refused


def legit_probe(url: str, pki: Pki, token: str) -> Callable[[], Awaitable[bool]]:
    context = pki.context("good")

    async def probe() -> bool:
        async with httpx.AsyncClient(verify=context, timeout=5.0) as client:
            answer = await client.get(url, headers={"Authorization": f"Bearer {token}"})
            return answer.status_code == 200

    return probe


def _flood_figures(ctx: Context, pki: Pki, server: ServerProcess, url: str) -> list[Figure]:
    name = "tls bad handshakes"
    seconds, workers, minimum = (1.0, 4, 100) if ctx.quick else (15.0, 16, MIN_BAD_HANDSHAKES)
    port = int(url.rsplit(":", 1)[1])
    contexts = [pki.context(bad) for bad in BAD]
    asyncio.run(_flood(port, contexts, 0.0, 2, 20))  # warm-up: the allocator's pools exist before "before"
    before = probes.rss_bytes(server.pid)

    async def run() -> tuple[tuple[int, int], probes.Served]:
        stop = asyncio.Event()
        served = probes.Served()
        probe = legit_probe(f"{url}/api/v1/documents", pki, ctx.ws.token)
        legit = asyncio.create_task(probes.keep_probing(probe, served, stop, 0.1))
        try:
            counts = await _flood(port, contexts, seconds, workers, minimum)
        finally:
            stop.set()
            await legit
        return counts, served

    (tried, refused), served = asyncio.run(run())
    after = probes.rss_bytes(server.pid)
    growth = None if before is None or after is None else (after - before) / 2**20
    return [
        at_least(name, "bad handshakes tried", tried, minimum, note=f"{workers} clients, {seconds:g} s"),
        equals(name, "bad handshakes answered over HTTP", tried - refused, 0),
        equals(name, "legitimate requests failed", served.sent - served.ok, 0, note=f"{served.ok}/{served.sent}"),
        at_most(name, "legitimate request slowest", served.slowest, LEGIT_WITHIN_SECS, unit=" s"),
        at_most(name, "server memory growth", growth, RSS_GROWTH_LIMIT_MIB, unit=" MiB"),
    ]


def served_name(port: int, context: ssl.SSLContext) -> str:
    """The CN of the certificate a new handshake gets."""
    with (
        socket.create_connection(("127.0.0.1", port), 5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        peer = tls.getpeercert() or {}
    subject: tuple[tuple[tuple[str, str], ...], ...] = peer.get("subject", ())  # type: ignore[assignment]
    return next(value for rdn in subject for key, value in rdn if key == "commonName")


def _rotation_figures(ctx: Context, pki: Pki, url: str) -> list[Figure]:
    name = "tls rotation"
    requests = 100 if ctx.quick else ROTATION_REQUESTS
    port = int(url.rsplit(":", 1)[1])
    probe = legit_probe(f"{url}/api/v1/documents", pki, ctx.ws.token)

    async def run() -> int:
        done = ok = 0

        async def one() -> None:
            nonlocal done, ok
            while done < requests:
                done += 1
                answered = False
                with contextlib.suppress(Exception):  # a failure is what the figure counts
                    answered = await probe()
                ok += answered
                if done == requests // 2:
                    pki.rotate("v2", pki.server("server-v2"))

        await asyncio.gather(*(one() for _ in range(8)))
        return done - ok

    failed = asyncio.run(run())
    deadline = time.monotonic() + 10
    while served_name(port, pki.context("good")) != "server-v2" and time.monotonic() < deadline:
        time.sleep(0.1)
    return [
        equals(name, "requests failed during the swap", failed, 0, note=f"of {requests}, each on a new connection"),
        is_true(
            name, "new handshakes present the new certificate", served_name(port, pki.context("good")) == "server-v2"
        ),
    ]


def mtls(ctx: Context) -> list[Figure]:
    """Both phases on one server: the flood of bad handshakes, then the rotation under load."""
    pki = make_pki(ctx.ws)
    with tls_example(ctx, pki, "bastion-tls") as (server, url):
        return [*_flood_figures(ctx, pki, server, url), *_rotation_figures(ctx, pki, url)]


SCENARIOS = {"tls": mtls}
