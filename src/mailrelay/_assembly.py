"""How the running relay is put together: `build(...)` makes each part with a small named function into one frozen
`RelayParts`, `run(parts, stack)` opens the listeners and waits for SIGTERM/SIGINT.

Every part that holds something open registers its closing on the one AsyncExitStack as it is made, so teardown is
the reverse of assembly, also when a later step fails: the SMTP listener shuts down gracefully first (and the
delivery workers after it), then the health and metrics ports, then the target's HTTP session, the queue's
connection, the worker processes, the S3 store and the DNS client.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import ssl
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from bastion_core import CircuitBreaker, ConfigError, Guard
from bastion_core._tls import ReloadingServerContext
from mailrelay import _extras as extras
from mailrelay._attachment_policy import AttachmentPolicy, PolicyAction
from mailrelay._attachments import InlineSink
from mailrelay._config import PREFIX, Settings, mask_nats_url
from mailrelay._config.routes import relay_routes
from mailrelay._delivery import WebhookClient
from mailrelay._errors import ListenFailed
from mailrelay._health import HealthServer
from mailrelay._http_client import open_webhook_transport
from mailrelay._metrics import RelayMetrics, TimedTransport
from mailrelay._metrics_server import MetricsServer
from mailrelay._processes import WorkerProcesses
from mailrelay._raw import InlineRaw, RawStore, S3Raw
from mailrelay._redelivery import RedeliveryRules
from mailrelay._relay import Relay
from mailrelay._routing import DEFAULT_ROUTE, Route, Router, target_label
from mailrelay._version import __version__
from mailrelay._workers import DeliveryWorkers
from mailrelay.smtp._server import SmtpServer
from mailrelay.smtp._session import SmtpOptions

if TYPE_CHECKING:  # the dmarc and queue extras' packages: imported where each feature is built
    from mailrelay._mailauth import DmarcChecker
    from mailrelay._queue import JetStreamQueue
    from mailrelay._s3 import S3Sink
    from mailrelay._sender_rules import SenderRules

USER_AGENT = f"MailRelay/{__version__}"
SMTP_VARIABLES = f"{PREFIX}BIND_ADDRESS/{PREFIX}PORT"
HEALTH_VARIABLES = f"{PREFIX}HEALTH_BIND_ADDRESS/{PREFIX}HEALTH_PORT"
METRICS_VARIABLES = f"{PREFIX}HEALTH_BIND_ADDRESS/{PREFIX}METRICS_PORT"

log = structlog.get_logger("mailrelay")


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayParts:
    """Everything `run` starts and watches; built by `build`, closed by the stack it was built on."""

    settings: Settings
    target: WebhookClient
    smtp: SmtpServer
    health: HealthServer
    queue: JetStreamQueue | None
    workers: DeliveryWorkers | None
    metrics: RelayMetrics | None
    metrics_server: MetricsServer | None


async def serve(
    settings: Settings,
    tls_context: ssl.SSLContext | None,
    dmarc: DmarcChecker | None = None,
    *,
    routes: Sequence[Route] | None = None,
    sender: SenderRules | None = None,
    tls_reload: ReloadingServerContext | None = None,
) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully (see SmtpServer.shutdown). In queue mode the stream
    is set up before anything listens (QueueUnavailable when it cannot be). `routes` and `sender` as checked at
    start-up (`relay_routes`, `sender_rules`); None: made from `settings` here. `tls_reload`: the configured
    STARTTLS pair, re-read every `tls_reload_interval` when its files change and at once on SIGHUP."""
    async with contextlib.AsyncExitStack() as stack:
        if tls_reload is not None:
            watch_tls(tls_reload, settings.tls_reload_interval, stack)
        parts = await build(settings, tls_context, dmarc, stack, routes=routes, sender=sender)
        await run(parts, stack)
    log.info("mailrelay_stopped")


async def build(
    settings: Settings,
    tls_context: ssl.SSLContext | None,
    dmarc: DmarcChecker | None,
    stack: contextlib.AsyncExitStack,
    *,
    routes: Sequence[Route] | None = None,
    sender: SenderRules | None = None,
) -> RelayParts:
    """Every part of the relay, nothing listening yet; each one's closing is on `stack`."""
    queue = await open_queue(settings, stack)
    if dmarc is not None:
        stack.callback(dmarc.close)
    metrics = None if settings.metrics_port is None else RelayMetrics(queue=queue is not None, dmarc=dmarc is not None)
    routes = relay_routes(settings) if routes is None else routes
    targets = {route.name: delivery_target(settings, metrics, stack, route) for route in routes}
    target = targets.get(DEFAULT_ROUTE) or next(iter(targets.values()))
    s3 = s3_sink(settings)
    if s3 is not None:
        stack.callback(s3.close)
    relay = Relay(
        target=target,
        route_targets=targets,
        sender_policy=sender if sender is not None else sender_rules(settings),
        sender_policy_deny_text=settings.sender_policy_deny_text,
        attachment_policy=attachment_policy(settings),
        attachment_sink=s3 if s3 is not None and settings.attachment_delivery == "s3" else InlineSink(),
        raw_store=raw_store(settings, s3),
        header_prefixes=settings.header_prefixes,
        dmarc=dmarc,
        dmarc_enforce=settings.dmarc_mode == "enforce",
        queue=queue,
        processes=stack.enter_context(contextlib.closing(WorkerProcesses())),
        metrics=metrics,
        payload_version=settings.payload_version,
    )
    smtp = smtp_server(settings, relay, tls_context, metrics, Router(routes, strip_tag=settings.strip_recipient_tag))
    if metrics is not None:
        metrics.watch_sessions(lambda: len(smtp.hub.connections))
        for name, each in targets.items():
            if each.breaker is not None:
                metrics.watch_breaker(each.breaker, target=target_label(name))
        if queue is not None:
            metrics.watch_queue(queue)
    return RelayParts(
        settings=settings,
        target=target,
        smtp=smtp,
        health=HealthServer(queue),
        queue=queue,
        workers=delivery_workers(settings, queue, target, metrics, targets),
        metrics=metrics,
        metrics_server=None if metrics is None else MetricsServer(metrics),
    )


async def run(parts: RelayParts, stack: contextlib.AsyncExitStack) -> None:
    """Open the health, metrics and SMTP ports (ListenFailed naming the variables when one cannot be), start the
    delivery workers, and return once a signal asks to stop: the stack then shuts everything down."""
    settings, workers, grace = parts.settings, parts.workers, parts.settings.shutdown_grace
    host = settings.health_bind_address
    await listen(parts.health.start(host, settings.health_port), HEALTH_VARIABLES, host, settings.health_port)
    stack.push_async_callback(parts.health.stop)
    if parts.metrics_server is not None and settings.metrics_port is not None:
        port = settings.metrics_port
        await listen(parts.metrics_server.start(host, port), METRICS_VARIABLES, host, port)
        stack.push_async_callback(parts.metrics_server.stop)
    if workers is not None:
        stack.push_async_callback(workers.stop, grace)  # after the SMTP sessions: they may still queue messages
    host, port = settings.bind_address, settings.port
    await listen(parts.smtp.start(host, port), SMTP_VARIABLES, host, port)
    stack.push_async_callback(parts.smtp.shutdown, grace)
    if workers is not None:
        workers.start()
    log_started(parts)
    await signalled()
    log.info("mailrelay_stopping", grace=grace)


def watch_tls(tls: ReloadingServerContext, interval: float, stack: contextlib.AsyncExitStack) -> None:
    """Poll the STARTTLS files and answer SIGHUP until the stack closes."""
    loop = asyncio.get_running_loop()
    task = loop.create_task(tls.watch(interval), name="starttls-reload")
    loop.add_signal_handler(signal.SIGHUP, lambda: tls.reload(reason="sighup"))

    async def stop() -> None:
        loop.remove_signal_handler(signal.SIGHUP)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    stack.push_async_callback(stop)


async def listen(start: Awaitable[None], variables: str, host: str, port: int) -> None:
    """Await a listener's start(), turning its OSError into ListenFailed naming the `variables` that chose the
    address (an unknown host name, a port in use or below 1024 all end up here)."""
    try:
        await start
    except OSError as exc:
        raise ListenFailed(variables, f"{host}:{port}", exc) from exc


async def signalled() -> None:
    """Until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def log_started(parts: RelayParts) -> None:
    settings, queue, metrics_server = parts.settings, parts.queue, parts.metrics_server
    log.info(
        "mailrelay_started",
        version=__version__,
        smtp=f"{settings.bind_address}:{parts.smtp.port}",
        health=f"{settings.health_bind_address}:{parts.health.port}",
        **({"metrics": f"{settings.health_bind_address}:{metrics_server.port}"} if metrics_server else {}),
        targets=parts.smtp.options.router.pattern_count if parts.smtp.options.router else 0,
        routes=len(parts.smtp.options.router.routes) if parts.smtp.options.router else 0,
        sender_policy=settings.sender_policy_file is not None,
        signing=settings.webhook_signing_secret is not None,
        payload_version=settings.payload_version,
        dmarc=settings.dmarc_mode,
        attachments=settings.attachment_delivery,
        attachment_policy=settings.attachment_policy_action,
        queue=settings.queue,
        **(
            {"nats": queue.shown_url, "stream": queue.stream, "workers": settings.queue_workers}
            if queue is not None
            else {}
        ),
    )


async def open_queue(settings: Settings, stack: contextlib.AsyncExitStack) -> JetStreamQueue | None:
    """Queue mode's stream, connected and set up (QueueUnavailable when it cannot be); None in direct mode."""
    queue = message_queue(settings)
    if queue is not None:
        await queue.open()
        stack.push_async_callback(queue.close)
    return queue


def sender_rules(settings: Settings) -> SenderRules | None:
    """The sender policy (the policy extra's cedarpy is imported only then); ConfigError for a bad file."""
    if settings.sender_policy_file is None:
        return None
    extras.POLICY.require()
    from mailrelay._sender_rules import SenderRules

    return SenderRules.load(settings.sender_policy_file, variable=f"{PREFIX}SENDER_POLICY_FILE")


def delivery_target(
    settings: Settings, metrics: RelayMetrics | None, stack: contextlib.AsyncExitStack, route: Route
) -> WebhookClient:
    """The webhook target of `route` over its own HTTP session, every POST through its own breaker (and timed, with
    metrics). The spec's outbound order: the breaker, then the call (no bulkhead: MAIL_RELAY_MAX_SESSIONS bounds
    the calls)."""
    breaker = CircuitBreaker(
        target_label(route.name),
        threshold=settings.circuit_breaker_failure_rate,
        min_requests=settings.circuit_breaker_min_requests,
        wait_secs=settings.circuit_breaker_reset,
        half_open_requests=settings.circuit_breaker_half_open_requests,
    )
    transport = open_webhook_transport(
        url=route.webhook_url, guard=Guard(breaker=breaker), timeout=settings.webhook_timeout
    )
    stack.push_async_callback(transport.close)
    return WebhookClient(
        transport=transport if metrics is None else TimedTransport(transport, metrics, target=target_label(route.name)),
        user_agent=USER_AGENT,
        breaker=breaker,
        secret=route.signing_secret,
        max_retries=settings.webhook_max_retries,
        backoff_base=settings.webhook_backoff_base,
        url=route.webhook_url,
    )


def delivery_workers(
    settings: Settings,
    queue: JetStreamQueue | None,
    target: WebhookClient,
    metrics: RelayMetrics | None,
    route_targets: Mapping[str, WebhookClient] | None = None,
) -> DeliveryWorkers | None:
    """Queue mode's workers, unless MAIL_RELAY_QUEUE_WORKERS is 0 (a relay that only accepts)."""
    if queue is None or settings.queue_workers <= 0:
        return None
    return DeliveryWorkers(
        inbox=queue,
        target=target,
        route_targets=route_targets,
        concurrency=settings.queue_workers,
        rules=RedeliveryRules(
            max_attempts=settings.queue_max_attempts,
            max_age=settings.queue_max_age,
            backoff_base=settings.webhook_backoff_base,
        ),
        metrics=metrics,
    )


def smtp_server(
    settings: Settings,
    relay: Relay,
    tls_context: ssl.SSLContext | None,
    metrics: RelayMetrics | None,
    router: Router,
) -> SmtpServer:
    return SmtpServer(
        options=SmtpOptions(
            router=router,
            max_message_size=settings.max_message_size,
            idle_timeout=settings.idle_timeout,
            max_concurrent_per_ip=settings.max_concurrent_per_ip,
            max_sessions=settings.max_sessions,
            max_unknown_recipients=settings.max_unknown_rcpts_per_session,
        ),
        handler=relay,
        tls_context=tls_context,
        observer=metrics,
    )


def dmarc_checker(settings: Settings) -> DmarcChecker | None:
    """The DMARC evaluator for monitor and enforce mode; ConfigError when there is no DNS server to ask."""
    if settings.dmarc_mode == "off":
        return None
    extras.DMARC.require()
    from mailrelay._dns import DnsClient, NoResolver
    from mailrelay._mailauth import DmarcChecker

    try:
        dns = DnsClient(servers=settings.dns_servers, timeout=settings.dns_timeout)
    except NoResolver:
        raise ConfigError.invalid(
            PREFIX + "DNS_SERVERS", None, "DNS servers (the system has none configured in /etc/resolv.conf)"
        ) from None
    return DmarcChecker(dns=dns, report=settings.payload_version == 2)


def attachment_policy(settings: Settings) -> AttachmentPolicy:
    return AttachmentPolicy(
        max_bytes=settings.attachment_max_bytes,
        max_total_bytes=settings.attachment_max_total_bytes,
        max_count=settings.attachment_max_count,
        allowed_types=settings.attachment_allowed_types,
        denied_types=settings.attachment_denied_types,
        denied_extensions=settings.attachment_denied_extensions,
        action=PolicyAction(settings.attachment_policy_action),
    )


def raw_store(settings: Settings, s3: S3Sink | None) -> RawStore | None:
    """MAIL_RELAY_RAW: None (off), the message inline under its cap, or uploaded through the S3 sink."""
    if settings.raw == "inline":
        return InlineRaw(max_bytes=settings.raw_inline_max_bytes)
    if settings.raw == "s3" and s3 is not None:
        return S3Raw(s3)
    return None


def s3_sink(settings: Settings) -> S3Sink | None:
    """The S3 store when attachments or raw messages go there (boto3 is imported only then: it adds about a quarter
    of a second to start-up); one thread pool and client for both."""
    if "s3" not in (settings.attachment_delivery, settings.raw) or settings.s3_bucket is None:
        return None
    (extras.S3 if settings.attachment_delivery == "s3" else extras.RAW_S3).require()
    from mailrelay._s3 import S3Sink, has_credentials, make_client

    if not has_credentials():
        log.warning("s3_credentials_missing", hint="set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or an AWS role")
    client = make_client(endpoint_url=settings.s3_endpoint_url, region=settings.s3_region, timeout=settings.s3_timeout)
    return S3Sink(
        client=client,
        bucket=settings.s3_bucket,
        prefix=settings.s3_prefix,
        presign_secs=settings.s3_presign_secs,
        inline_max_bytes=settings.s3_inline_max_bytes,
        timeout=settings.s3_timeout,
    )


def message_queue(settings: Settings) -> JetStreamQueue | None:
    if settings.queue != "jetstream" or settings.nats_url is None:
        return None
    extras.QUEUE.require()
    from mailrelay._queue import JetStreamQueue

    return JetStreamQueue(
        servers=settings.nats_url.split(","),
        stream=settings.queue_stream,
        ack_wait=settings.queue_ack_wait,
        shown_url=mask_nats_url(settings.nats_url),
    )
