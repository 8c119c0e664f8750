"""The real processes a scenario drives: the secured example (`bastion run`), the broker service of `nats-kill`
(`bastion run reliability.broker_app:service`) and MailRelay (`mailrelay`).

Built on bench's process helpers (:class:`bench.processes.ServerProcess`: free loopback ports, output to a log
file, stopped by PID) and bench's :class:`bench.scenarios.Workspace` (a temp dir, an RS256 key pair, a token).
Every context manager here stops what it started, also when the block raises.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.processes import REPO, ServerProcess, free_port, port_open, venv_script
from bench.scenarios import EXAMPLE_APP, EXAMPLE_CONFIG, LIMITS_NEVER_TRIP, Workspace
from reliability.figures import Figure, equals

PROBE_TIMEOUT_SECS = 5.0
RCPT = "inbox@reliability.test"
SIGNING_SECRET = "reliability-signing-secret"


def _pythonpath() -> dict[str, str]:
    """Children import the same checkout as this process (a worktree's ``src`` first when PYTHONPATH says so)."""
    return {"PYTHONPATH": os.environ.get("PYTHONPATH") or f"{REPO / 'src'}{os.pathsep}{REPO}"}


@dataclass(slots=True, kw_only=True)
class Bastion:
    """A running secured example: ``url`` of the main port, ``grpc_port`` when gRPC has its own port."""

    server: ServerProcess
    port: int
    grpc_port: int | None
    user_token: str
    admin_token: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.server.pid

    def auth(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.user_token}"}


def admin_token(ws: Workspace) -> str:
    from bastion.testing import TokenMinter

    minter = TokenMinter.from_private_pem((ws.public_key.parent / "jwt-private.pem").read_bytes(), "RS256")
    return minter.mint(sub="root", roles=["admin"], ttl=6 * 3600)


@contextlib.contextmanager
def bastion(
    ws: Workspace,
    env: dict[str, str] | None = None,
    *,
    separate_grpc: bool = False,
    never_limit: bool = True,
    app: str = EXAMPLE_APP,
) -> Iterator[Bastion]:
    """The documents example with token auth, revocation, Cedar policy and gRPC, on free loopback ports (``app``:
    another service object run with the example's configuration, e.g. :mod:`reliability.resilient_app`)."""
    port = free_port()
    grpc_port = free_port() if separate_grpc else None
    argv = [venv_script("bastion"), "run", app, "--config", EXAMPLE_CONFIG]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    full_env = {
        **_pythonpath(),
        "SERVICE_LOG_FORMAT": "json",
        "SERVICE_LOG_LEVEL": "warning",
        "SERVICE_MIDDLEWARE_ACCESS_LOG_ENABLED": "false",
        "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(ws.public_key),
        # The example's hot reload polls the policy file; no scenario edits it.
        "SERVICE_POLICY_HOT_RELOAD": "false",
        **(LIMITS_NEVER_TRIP if never_limit else {}),
        **({"SERVICE_GRPC_USE_SEPARATE_PORT": "true", "SERVICE_GRPC_PORT": str(grpc_port)} if grpc_port else {}),
        **(env or {}),
    }
    server = ServerProcess("bastion", argv, log_path=ws.log("bastion"), env=full_env)
    try:
        server.wait_ready(lambda: port_open(port) and (grpc_port is None or port_open(grpc_port)))
        running = Bastion(
            server=server, port=port, grpc_port=grpc_port, user_token=ws.token, admin_token=admin_token(ws)
        )
        probe = httpx.get(f"{running.url}/api/v1/documents", headers=running.auth(), timeout=PROBE_TIMEOUT_SECS)
        if probe.status_code != 200:
            raise RuntimeError(f"probe of the example answered {probe.status_code}: {probe.text[:200]}")
        yield running
    finally:
        server.stop()


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerLog:
    """What a server wrote (stdout and stderr, JSON lines): its events, and the tracebacks anywhere in it."""

    events: list[dict[str, Any]]
    tracebacks: int

    @classmethod
    def read(cls, path: Path) -> ServerLog:
        """Read it once the server has stopped, so that everything it wrote is there."""
        events: list[dict[str, Any]] = []
        tracebacks = 0
        for line in path.read_text(errors="replace").splitlines():
            tracebacks += "Traceback (most recent call last)" in line
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    events.append(event)
        return cls(events=events, tracebacks=tracebacks)

    @property
    def errors(self) -> int:
        return sum(event.get("level") in ("error", "critical") for event in self.events)

    def figures(self, scenario: str) -> list[Figure]:
        """Client-caused events log at info or warning without a traceback: both counts must be 0."""
        first = next((str(e.get("event"))[:80] for e in self.events if e.get("level") in ("error", "critical")), "")
        return [
            equals(scenario, "tracebacks in the server's log", self.tracebacks, 0),
            equals(scenario, "error-level lines in the server's log", self.errors, 0, note=first),
        ]


BROKER_APP = "reliability.broker_app:service"


@contextlib.contextmanager
def broker_service(
    ws: Workspace, nats_url: str, handled_file: Path, env: dict[str, str] | None = None
) -> Iterator[str]:
    """`bastion run` of :mod:`reliability.broker_app` (no token, no rate limit, the broker's default reconnect
    settings) on a free loopback port; yields its URL once ``/ready`` answers 200 (connected, consumer running)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [venv_script("bastion"), "run", BROKER_APP, "--host", "127.0.0.1", "--port", str(port)]
    full_env = {
        **_pythonpath(),
        "SERVICE_LOG_FORMAT": "json",
        "SERVICE_LOG_LEVEL": "warning",
        "SERVICE_MIDDLEWARE_ACCESS_LOG_ENABLED": "false",
        "SERVICE_TOKEN_ENABLED": "false",
        "SERVICE_RATE_LIMIT_ENABLED": "false",
        "SERVICE_BROKER_URL": nats_url,
        "RELIABILITY_HANDLED_FILE": str(handled_file),
        **(env or {}),
    }
    server = ServerProcess("bastion-broker", argv, log_path=ws.log("bastion-broker"), env=full_env)
    try:
        server.wait_ready(lambda: port_open(port) and _ready(url) == 200)
        yield url
    finally:
        server.stop()


def _ready(url: str) -> int:
    try:
        return httpx.get(f"{url}/ready", timeout=PROBE_TIMEOUT_SECS).status_code
    except httpx.HTTPError:
        return 0


def served(url: str, headers: dict[str, str], *, timeout: float) -> float | None:
    """Seconds one legitimate GET took to get a 200 on a fresh connection, or None (failed / not within timeout)."""
    started = time.perf_counter()
    try:
        response = httpx.get(url, headers=headers, timeout=timeout)
    except httpx.HTTPError:
        return None
    return time.perf_counter() - started if response.status_code == 200 else None


@dataclass(slots=True, kw_only=True)
class Relay:
    """A running MailRelay with its SMTP and health ports."""

    server: ServerProcess
    smtp_port: int
    health_port: int
    env: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.server.pid


def relay_env(hook_url: str, smtp_port: int, health_port: int, **overrides: str) -> dict[str, str]:
    """MailRelay's settings for a scenario (signed webhooks, loopback ports) plus ``overrides`` (MAIL_RELAY_ + key)."""
    env = {
        "TARGET_EMAILS": RCPT,
        "WEBHOOK_URL": hook_url,
        "WEBHOOK_SIGNING_SECRET": SIGNING_SECRET,
        "BIND_ADDRESS": "127.0.0.1",
        "PORT": str(smtp_port),
        "HEALTH_BIND_ADDRESS": "127.0.0.1",
        "HEALTH_PORT": str(health_port),
        "LOG_LEVEL": "WARNING",
        "MAX_CONCURRENT_PER_IP": "512",
        "WEBHOOK_BACKOFF_BASE": "0.05",
        **overrides,
    }
    return {f"MAIL_RELAY_{key}": value for key, value in env.items()}


def start_relay(
    ws: Workspace, hook_url: str, overrides: dict[str, str] | None = None, *, extra_env: dict[str, str] | None = None
) -> Relay:
    """Start MailRelay (the caller stops it: ``relay.server.stop()``); returns once SMTP greets and health listens."""
    smtp_port, health_port = free_port(), free_port()
    env = relay_env(hook_url, smtp_port, health_port, **(overrides or {}))
    # Run from the workspace so a developer's ./.env cannot change the relay's settings.
    server = ServerProcess(
        "mailrelay",
        [venv_script("mailrelay")],
        log_path=ws.log("mailrelay"),
        env={**_pythonpath(), **(extra_env or {}), **env},
        cwd=ws.root,
    )
    try:
        server.wait_ready(lambda: port_open(smtp_port) and port_open(health_port))
    except Exception:
        server.stop()
        raise
    return Relay(server=server, smtp_port=smtp_port, health_port=health_port, env=env)


@contextlib.contextmanager
def relay(
    ws: Workspace, hook_url: str, overrides: dict[str, str] | None = None, *, extra_env: dict[str, str] | None = None
) -> Iterator[Relay]:
    running = start_relay(ws, hook_url, overrides, extra_env=extra_env)
    try:
        yield running
    finally:
        running.server.stop()


def smtp_message(subject: str) -> bytes:
    return (
        f"From: Reliability <probe@reliability.test>\r\nTo: <{RCPT}>\r\nSubject: {subject}\r\n"
        f"Message-ID: <{secrets.token_hex(8)}@reliability.test>\r\n\r\nbody of {subject}\r\n"
    ).encode()


def send_mail(port: int, subject: str, *, timeout: float = 10.0) -> int:
    """One SMTP transaction on a fresh connection; the reply code to the final dot (0 when the session broke)."""
    import smtplib

    try:
        with smtplib.SMTP("127.0.0.1", port, local_hostname="probe.reliability.test", timeout=timeout) as smtp:
            smtp.ehlo()
            smtp.mail("probe@reliability.test")
            code, _ = smtp.rcpt(RCPT)
            if code != 250:
                return code
            code, _ = smtp.data(smtp_message(subject))
            return code
    except smtplib.SMTPResponseException as exc:
        return exc.smtp_code
    except (OSError, smtplib.SMTPException):
        return 0


def connection_closed(sock: socket.socket, within: float) -> float | None:
    """Seconds until the server closes ``sock`` (reads EOF or a reset), reading and discarding data; None if not
    within ``within`` seconds."""
    started = time.perf_counter()
    deadline = time.monotonic() + within
    while (remaining := deadline - time.monotonic()) > 0:
        sock.settimeout(remaining)
        try:
            if not sock.recv(65536):
                return time.perf_counter() - started
        except (ConnectionResetError, BrokenPipeError):
            return time.perf_counter() - started
        except TimeoutError:
            return None
    return None
