"""`mailrelay`: read MAIL_RELAY_* settings, start the SMTP, health and (when configured) metrics listeners, stop
gracefully on SIGTERM/SIGINT. Exit codes: 0 after a clean shutdown, 2 for a configuration error, 1 when a
listener cannot be opened."""

from __future__ import annotations

import asyncio
import signal
import ssl
import sys
from collections.abc import Awaitable, Sequence

import structlog

from bastion_core import UNKNOWN_VARIABLE_EVENT, CircuitBreaker, ConfigError, Guard, configure_logging
from mailrelay._attachment_policy import AttachmentPolicy, PolicyAction
from mailrelay._attachments import AttachmentSink, InlineSink
from mailrelay._config import (
    PREFIX,
    Settings,
    load_settings,
    mask_nats_url,
    read_environment,
    refuse_unknown_variables,
    unknown_variables,
    variable_defaults,
)
from mailrelay._delivery import WebhookClient
from mailrelay._dns import DnsClient, NoResolver
from mailrelay._errors import ListenFailed, QueueUnavailable
from mailrelay._health import HealthServer
from mailrelay._mailauth import DmarcChecker
from mailrelay._metrics import RelayMetrics, TimedTransport
from mailrelay._metrics_server import MetricsServer
from mailrelay._processes import WorkerProcesses
from mailrelay._queue import JetStreamQueue
from mailrelay._redelivery import RedeliveryRules
from mailrelay._relay import Relay
from mailrelay._tls import server_context
from mailrelay._transport import AiohttpTransport
from mailrelay._version import __version__
from mailrelay._workers import DeliveryWorkers
from mailrelay.smtp import _compat as smtp_compat
from mailrelay.smtp._server import SmtpServer
from mailrelay.smtp._session import SmtpOptions

EXIT_CONFIG = 2
EXIT_LISTEN = 1
EXIT_QUEUE = 1
USER_AGENT = f"MailRelay/{__version__}"
SMTP_VARIABLES = f"{PREFIX}BIND_ADDRESS/{PREFIX}PORT"
HEALTH_VARIABLES = f"{PREFIX}HEALTH_BIND_ADDRESS/{PREFIX}HEALTH_PORT"
METRICS_VARIABLES = f"{PREFIX}HEALTH_BIND_ADDRESS/{PREFIX}METRICS_PORT"
# Libraries whose INFO/DEBUG chatter stays out of the relay's log: aiosmtpd, the HTTP client, nats-py (which can
# name the server with its credentials) and asyncio (it names its selector at DEBUG).
QUIET_LOGGERS = ("mail.log", "aiohttp", "nats", "asyncio")

log = structlog.get_logger("mailrelay")


USAGE = "usage: mailrelay [--help] [--version]   (configured by MAIL_RELAY_* variables and ./.env)"


def help_text() -> str:
    """``mailrelay --help``: how it is configured, then every variable with its default."""
    rows = variable_defaults()
    width = max(len(name) for name, _ in rows)
    lines = [
        USAGE,
        "",
        "SMTP server that posts each accepted message to a webhook as signed JSON. Settings come from MAIL_RELAY_*",
        "variables (the process environment wins over ./.env); a bad value or an unknown MAIL_RELAY_* name stops",
        "it with exit code 2 before it listens. What each variable means: docs/mailrelay.md.",
        "",
        f"{'variable':<{width}}  default",
        *(f"{name:<{width}}  {default}" for name, default in rows),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point: ``--help``, ``--version``, or no arguments to run."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["--version"], ["-V"]):
        print(USER_AGENT)
        return 0
    if args in (["--help"], ["-h"]):
        print(help_text())
        return 0
    if args:
        print(USAGE, file=sys.stderr)
        return EXIT_CONFIG
    try:
        settings = load_settings()
        unknown = unknown_variables(read_environment())
        if not settings.ignore_unknown_variables:
            refuse_unknown_variables(unknown)
        tls_context, generated = server_context(settings.tls_cert, settings.tls_key)
        dmarc = dmarc_checker(settings)
        smtp_compat.check()  # the SMTP session limits rely on aiosmtpd internals
    except ConfigError as exc:
        print(f"mailrelay: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(settings.log_level, settings.log_format, quiet=QUIET_LOGGERS)
    for name in unknown:
        log.warning(UNKNOWN_VARIABLE_EVENT, variable=name)
    if generated:
        log.warning(
            "self_signed_certificate_generated",
            hint="set MAIL_RELAY_TLS_CERT and MAIL_RELAY_TLS_KEY to serve a trusted certificate",
        )
    try:
        asyncio.run(serve(settings, tls_context, dmarc))
    except ListenFailed as exc:
        log.error("listen_failed", variables=exc.variables, address=exc.address, error=exc.reason)
        return EXIT_LISTEN
    except QueueUnavailable as exc:
        log.error("queue_unavailable", nats=mask_nats_url(settings.nats_url or ""), error=exc.reason)
        return EXIT_QUEUE
    return 0


async def listen(start: Awaitable[None], *, variables: str, host: str, port: int) -> None:
    """Await a listener's start(), turning its OSError into ListenFailed naming the `variables` that chose the
    address (an unknown host name, a port in use or below 1024 all end up here)."""
    try:
        await start
    except OSError as exc:
        raise ListenFailed(variables, f"{host}:{port}", exc) from exc


def dmarc_checker(settings: Settings) -> DmarcChecker | None:
    """The DMARC evaluator for monitor and enforce mode; ConfigError when there is no DNS server to ask."""
    if settings.dmarc_mode == "off":
        return None
    try:
        dns = DnsClient(servers=settings.dns_servers, timeout=settings.dns_timeout)
    except NoResolver:
        raise ConfigError.invalid(
            PREFIX + "DNS_SERVERS", None, "DNS servers (the system has none configured in /etc/resolv.conf)"
        ) from None
    return DmarcChecker(dns=dns)


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


def attachment_sink(settings: Settings) -> AttachmentSink:
    """Inline, or S3 (boto3 is imported only then: it adds about a quarter of a second to start-up)."""
    if settings.attachment_delivery != "s3" or settings.s3_bucket is None:
        return InlineSink()
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
    return JetStreamQueue(
        servers=settings.nats_url.split(","),
        stream=settings.queue_stream,
        ack_wait=settings.queue_ack_wait,
        shown_url=mask_nats_url(settings.nats_url),
    )


async def serve(settings: Settings, tls_context: ssl.SSLContext | None, dmarc: DmarcChecker | None = None) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully (see SmtpServer.shutdown). In queue mode the stream
    is set up before anything listens (QueueUnavailable when it cannot be)."""
    queue = message_queue(settings)
    if queue is not None:
        await queue.open()
    sink = attachment_sink(settings)
    metrics = None
    if settings.metrics_port is not None:
        metrics = RelayMetrics(queue=queue is not None, dmarc=dmarc is not None)
    # The spec's outbound order: the breaker, then the call (no bulkhead: MAIL_RELAY_MAX_SESSIONS bounds the calls).
    breaker = CircuitBreaker(
        "webhook",
        threshold=settings.circuit_breaker_failure_rate,
        min_requests=settings.circuit_breaker_min_requests,
        wait_secs=settings.circuit_breaker_reset,
        half_open_requests=settings.circuit_breaker_half_open_requests,
    )
    transport = AiohttpTransport.open(
        url=settings.webhook_url, guard=Guard(breaker=breaker), timeout=settings.webhook_timeout
    )
    webhook = WebhookClient(
        transport=transport if metrics is None else TimedTransport(transport, metrics),
        user_agent=USER_AGENT,
        secret=settings.webhook_signing_secret,
        max_retries=settings.webhook_max_retries,
        backoff_base=settings.webhook_backoff_base,
        url=settings.webhook_url,
    )
    processes = WorkerProcesses()
    workers: DeliveryWorkers | None = None
    if queue is not None and settings.queue_workers > 0:
        workers = DeliveryWorkers(
            inbox=queue,
            webhook=webhook,
            breaker=breaker,
            concurrency=settings.queue_workers,
            rules=RedeliveryRules(
                max_attempts=settings.queue_max_attempts,
                max_age=settings.queue_max_age,
                backoff_base=settings.webhook_backoff_base,
            ),
            metrics=metrics,
        )
    try:
        relay = Relay(
            webhook=webhook,
            breaker=breaker,
            attachment_policy=attachment_policy(settings),
            attachment_sink=sink,
            header_prefixes=settings.header_prefixes,
            dmarc=dmarc,
            dmarc_enforce=settings.dmarc_mode == "enforce",
            queue=queue,
            processes=processes,
            metrics=metrics,
        )
        smtp = SmtpServer(
            options=SmtpOptions(
                targets=settings.target_emails,
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
        health = HealthServer()
        metrics_server = None if metrics is None else MetricsServer(metrics)
        if metrics is not None:
            metrics.watch_sessions(lambda: len(smtp.hub.connections))
            metrics.watch_breaker(breaker)
            if queue is not None:
                metrics.watch_queue(queue)
        host, port = settings.health_bind_address, settings.health_port
        await listen(health.start(host, port), variables=HEALTH_VARIABLES, host=host, port=port)
        try:
            if metrics_server is not None and settings.metrics_port is not None:
                port = settings.metrics_port
                await listen(metrics_server.start(host, port), variables=METRICS_VARIABLES, host=host, port=port)
            host, port = settings.bind_address, settings.port
            await listen(smtp.start(host, port), variables=SMTP_VARIABLES, host=host, port=port)
        except ListenFailed:
            await health.stop()
            if metrics_server is not None:
                await metrics_server.stop()
            raise
        if workers is not None:
            workers.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info(
            "mailrelay_started",
            version=__version__,
            smtp=f"{settings.bind_address}:{smtp.port}",
            health=f"{settings.health_bind_address}:{health.port}",
            **({"metrics": f"{settings.health_bind_address}:{metrics_server.port}"} if metrics_server else {}),
            targets=len(settings.target_emails),
            signing=settings.webhook_signing_secret is not None,
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
        await stop.wait()
        log.info("mailrelay_stopping", grace=settings.shutdown_grace)
        await smtp.shutdown(settings.shutdown_grace)
        if workers is not None:
            await workers.stop(settings.shutdown_grace)
        await health.stop()
        if metrics_server is not None:
            await metrics_server.stop()
    finally:
        processes.close()
        await transport.close()
        if queue is not None:
            await queue.close()
        if dmarc is not None:
            dmarc.close()
        sink.close()
    log.info("mailrelay_stopped")
