"""Sustained load: the secured example at 256 connections and MailRelay at 32 SMTP sessions with signed webhooks.

The load comes from bench's generators (wrk when installed, else bench/pyload.py; bench/smtpload.py for SMTP).
Figures: errors and non-2xx answers (0), resident-memory growth after warm-up (< 10 %), open files after against
before (no growth), and for MailRelay every 250 matched by a webhook.
"""

from __future__ import annotations

import time

import httpx

from bench import loadgen
from reliability import probes, servers
from reliability.figures import Figure, at_most, equals
from reliability.run import Context

MEMORY_GROWTH_PCT = 10.0
FD_SLACK = 0
"""Open files may not grow at all once the connections are closed again."""


def _settled_fds(pid: int, before: int | None, limit: float = 5.0) -> int | None:
    """Open files after the load, once closing connections have been reaped (polled up to ``limit`` s)."""
    deadline = time.monotonic() + limit
    now = probes.open_fds(pid)
    while before is not None and now is not None and now > before and time.monotonic() < deadline:
        time.sleep(0.2)
        now = probes.open_fds(pid)
    return now


def _growth(before: int | None, after: int | None) -> float | None:
    return None if before is None or after is None else (after - before) / before * 100


def http_load(ctx: Context) -> list[Figure]:
    name = "load: example HTTP"
    duration, warmup, connections = (4.0, 2.0, 64) if ctx.quick else (60.0, 10.0, 256)
    # One load generator on one address stands for many clients: the per-address connection cap (256 by default,
    # as many as the full run opens) is lifted, as the docs advise behind a proxy that concentrates clients.
    with servers.bastion(ctx.ws, env={"SERVICE_MAX_CONNECTIONS_PER_IP": "0"}) as app:
        url = f"{app.url}/api/v2/documents"
        loadgen.http_load(url, duration=warmup, connections=connections, headers=app.auth())
        rss_before, fds_before = probes.rss_bytes(app.pid), probes.open_fds(app.pid)
        sample = loadgen.http_load(url, duration=duration, connections=connections, headers=app.auth())
        rss_after = probes.rss_bytes(app.pid)
        fds_after = _settled_fds(app.pid, fds_before)
        alive = httpx.get(url, headers=app.auth(), timeout=5.0).status_code == 200
    fd_growth = None if fds_before is None or fds_after is None else fds_after - fds_before
    note = f"{sample.requests} requests in {sample.seconds:.0f} s at {connections} connections ({sample.loadgen})"
    return [
        equals(name, "socket errors", sample.errors, 0, note=note),
        equals(name, "non-2xx answers", sample.non_2xx, 0),
        at_most(
            name, "resident memory growth after warm-up", _growth(rss_before, rss_after), MEMORY_GROWTH_PCT, unit=" %"
        ),
        at_most(name, "open files growth", fd_growth, FD_SLACK, note=f"before {fds_before}, after {fds_after}"),
        equals(name, "served after", 1 if alive else 0, 1),
    ]


def smtp_load(ctx: Context) -> list[Figure]:
    name = "load: MailRelay SMTP"
    duration, warmup, sessions = (4.0, 1.0, 8) if ctx.quick else (60.0, 10.0, 32)
    from mailrelay.testing import WebhookReceiver

    with WebhookReceiver() as receiver, servers.relay(ctx.ws, receiver.url) as relay:
        loadgen.smtp_load(relay.smtp_port, duration=warmup, connections=sessions, rcpt=servers.RCPT)
        warm = len(receiver.requests)
        rss_before, fds_before = probes.rss_bytes(relay.pid), probes.open_fds(relay.pid)
        sample = loadgen.smtp_load(relay.smtp_port, duration=duration, connections=sessions, rcpt=servers.RCPT)
        delivered = len(receiver.wait_for(warm + sample.requests, timeout=30.0)) - warm
        rss_after = probes.rss_bytes(relay.pid)
        fds_after = _settled_fds(relay.pid, fds_before)
        signed = all(r.header("X-MailRelay-Signature-256") for r in receiver.requests)
    fd_growth = None if fds_before is None or fds_after is None else fds_after - fds_before
    return [
        equals(
            name,
            "session errors",
            sample.errors,
            0,
            note=f"{sample.requests} mails in {sample.seconds:.0f} s over {sessions} sessions",
        ),
        equals(name, "mails not answered 250", sample.non_2xx, 0),
        equals(
            name,
            "250s without a webhook",
            max(0, sample.requests - delivered),
            0,
            note=f"{delivered} webhooks for {sample.requests} 250s",
        ),
        equals(name, "unsigned webhooks", 0 if signed else 1, 0),
        at_most(
            name, "resident memory growth after warm-up", _growth(rss_before, rss_after), MEMORY_GROWTH_PCT, unit=" %"
        ),
        at_most(name, "open files growth", fd_growth, FD_SLACK, note=f"before {fds_before}, after {fds_after}"),
    ]


SCENARIOS = {"load-http": http_load, "load-smtp": smtp_load}
