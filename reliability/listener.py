"""What one client address may make the listener hold: pipelined HTTP/1.1 requests nobody reads the answers to,
half-sent request heads held and reopened, idle HTTP/2 connections by the thousand.

The attack connections come from ``probes.ATTACKER`` (127.0.0.2), the legitimate ``GET /health`` from
``probes.LEGIT`` (127.0.0.1), so ``service.max_connections_per_ip`` tells them apart as it would two clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass

from reliability import probes, servers
from reliability.figures import Figure, at_least, at_most, equals
from reliability.run import Context

MB = 1024 * 1024
LEGIT_WITHIN_SECS = 1.0
PIPELINED_REQUEST = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
RSS_DURING_BYTES = 50 * MB
RSS_AFTER_BYTES = 10 * MB


def _legit_figures(scenario: str, served: probes.Served, *, timed: bool = True) -> list[Figure]:
    """``/health`` failed (0) and, when ``timed``, its slowest answer (<= 1 s; else the slowest is in the note)."""
    slowest = max(served.latencies, default=0.0)
    note = f"{served.ok}/{served.sent} answered 200" + ("" if timed else f", the slowest in {slowest:.2f} s")
    failed = equals(scenario, "/health failed", served.sent - served.ok, 0, note=note)
    if not timed:
        return [failed]
    return [failed, at_most(scenario, "/health slowest", served.slowest, LEGIT_WITHIN_SECS, unit=" s")]


async def _probing(port: int, interval: float) -> tuple[asyncio.Event, probes.Served, asyncio.Task[None]]:
    """``GET /health`` every ``interval`` seconds until ``stop`` is set (then await the task), from a thread with
    an event loop of its own: the legitimate client shares nothing with the attacker's thousands of tasks on this
    side, so its figures are the server's, not this process's queue."""
    stop = asyncio.Event()
    served = probes.Served()
    halt = threading.Event()

    async def probe_loop() -> None:
        own_stop = asyncio.Event()

        async def relay() -> None:
            while not halt.is_set():  # noqa: ASYNC110 (a threading.Event, set from the scenario's loop)
                await asyncio.sleep(0.02)
            own_stop.set()

        relaying = asyncio.create_task(relay())
        await probes.keep_probing(probes.health_probe(port), served, own_stop, interval)
        await relaying

    thread = asyncio.create_task(asyncio.to_thread(asyncio.run, probe_loop()))

    async def until_stopped() -> None:
        try:
            await stop.wait()
        finally:
            halt.set()
            await thread

    return stop, served, asyncio.create_task(until_stopped())


def pipelining(ctx: Context) -> list[Figure]:
    """4 connections each pipelining 10 MB of complete ``GET /health`` requests and never reading an answer:
    resident memory bounded while they are open and back near where it was once they close; /health served."""
    name = "pipelining"
    connections = 4
    volume = (2 if ctx.quick else 10) * MB
    hold = 2.0 if ctx.quick else 10.0
    settle = 3.0 if ctx.quick else 10.0
    with servers.bastion(ctx.ws) as app:
        asyncio.run(_pipeline_and_read(app.port, 64))  # warm-up: the code paths and buffers allocated once
        # A small attack of the same shape first: what the process allocates once for it (socket read buffers,
        # the allocator's mmap threshold moving up after the first large buffers are freed) is not growth that
        # the next attack adds; the figures are what a second, full-size attack leaves behind.
        asyncio.run(_pipelined(app.port, app.pid, connections, MB // 2, 0.5))
        before = probes.rss_bytes(app.pid)
        peak, taken, served = asyncio.run(_pipelined(app.port, app.pid, connections, volume, hold))
        after = _settled_rss(app.pid, before, RSS_AFTER_BYTES, settle)
    during = None if before is None or peak is None else peak - before
    left = None if before is None or after is None else after - before
    return [
        at_most(
            name,
            "resident memory growth while the connections are open",
            None if during is None else during / MB,
            RSS_DURING_BYTES / MB,
            unit=" MB",
            note=f"{connections} x {volume // MB} MB of requests; the server's socket took {taken / MB:.1f} MB",
        ),
        at_most(
            name,
            "resident memory growth after they closed",
            None if left is None else left / MB,
            RSS_AFTER_BYTES / MB,
            unit=" MB",
        ),
        *_legit_figures(name, served),
        *servers.ServerLog.read(app.server.log_path).figures(name),
    ]


async def _pipeline_and_read(port: int, count: int) -> None:
    reader, writer = await probes.open_from(probes.LEGIT, port)
    try:
        writer.write(PIPELINED_REQUEST * count)
        async with asyncio.timeout(10.0):
            answers = 0
            while answers < count and (chunk := await reader.read(65536)):
                answers += chunk.count(b"HTTP/1.1 200")
    finally:
        writer.transport.abort()


async def _pipelined(
    port: int, pid: int, connections: int, volume: int, hold: float
) -> tuple[int | None, int, probes.Served]:
    """Open the attack connections, write ``volume`` bytes of requests into each, read nothing for ``hold``
    seconds, then abort them: the peak resident memory meanwhile, the bytes the server's side took, /health."""
    stop, served, prober = await _probing(port, 0.25)
    sampler = asyncio.create_task(probes.peak_rss(pid, stop))
    writers: list[asyncio.StreamWriter] = []
    payload = PIPELINED_REQUEST * (volume // len(PIPELINED_REQUEST))
    taken = 0
    try:
        for _ in range(connections):
            _reader, writer = await probes.open_from(probes.ATTACKER, port)
            writers.append(writer)
            writer.write(payload)  # what the socket does not take waits in the transport: this side's memory
        await asyncio.sleep(hold)
        taken = sum(len(payload) - writer.transport.get_write_buffer_size() for writer in writers)
    finally:
        for writer in writers:
            writer.transport.abort()
        stop.set()
        await prober
        peak = await sampler
    return peak, taken, served


def _settled_rss(pid: int, before: int | None, bound: int, within: float) -> int | None:
    """Resident memory once it is back within ``bound`` of ``before`` (polled up to ``within`` s), else the last."""
    deadline = time.monotonic() + within
    now = probes.rss_bytes(pid)
    while before is not None and now is not None and now - before > bound and time.monotonic() < deadline:
        time.sleep(0.2)
        now = probes.rss_bytes(pid)
    return now


HALF_HEAD = b"GET /api/v1/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Wait: "
REOPEN_PER_SEC = 100.0


@dataclass(slots=True)
class Tally:
    """The attack connections of a scenario: opened, failed to connect, open now (and at most)."""

    opened: int = 0
    failed: int = 0
    open: int = 0
    most_open: int = 0

    def enter(self) -> None:
        self.opened += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)


class Pacer:
    """Spaces reopened connections ``1 / rate`` seconds apart across every slot."""

    def __init__(self, rate: float) -> None:
        self.gap = 1.0 / rate
        self.next = 0.0

    async def wait(self) -> None:
        now = time.monotonic()
        turn = max(self.next, now)
        self.next = turn + self.gap
        await asyncio.sleep(turn - now)


async def _hold_head(port: int, pacer: Pacer, tally: Tally) -> None:
    """One slot, until cancelled: open from the attacker's address, send half a head, wait for the server to close
    it; then again, paced."""
    first = True
    while True:
        if not first:
            await pacer.wait()
        first = False
        try:
            reader, writer = await probes.open_from(probes.ATTACKER, port)
        except OSError:
            tally.failed += 1
            continue
        tally.enter()
        try:
            writer.write(HALF_HEAD)
            with contextlib.suppress(ConnectionError, OSError):
                await reader.read()
        finally:
            tally.open -= 1
            writer.transport.abort()


def half_heads(ctx: Context) -> list[Figure]:
    """One address holding about 1,100 half-sent request heads (more than ``service.max_connections``, 1024), each
    reopened when the server closes it (about 100 new connections a second): /health from another address is
    answered 200 every time."""
    name = "half heads, one source"
    heads = 1_100
    duration = 6.0 if ctx.quick else 25.0
    interval = 0.2 if ctx.quick else 0.35
    wanted = 16 if ctx.quick else 64
    with servers.bastion(ctx.ws) as app:
        tally, served = asyncio.run(_holding(app.port, heads, duration, interval))
    return [
        # Not timed: the burst of 1,100 connects waits in the listening socket's accept queue ahead of the probe.
        *_legit_figures(name, served, timed=False),
        at_least(name, "/health probes", served.sent, wanted),
        at_least(
            name,
            "attack connections opened",
            tally.opened,
            heads,
            note=f"{tally.most_open} open at most, {tally.failed} connects failed",
        ),
        *servers.ServerLog.read(app.server.log_path).figures(name),
    ]


async def _holding(port: int, heads: int, duration: float, interval: float) -> tuple[Tally, probes.Served]:
    stop, served, prober = await _probing(port, interval)
    tally = Tally()
    pacer = Pacer(REOPEN_PER_SEC)
    slots = [asyncio.create_task(_hold_head(port, pacer, tally)) for _ in range(heads)]
    try:
        await asyncio.sleep(duration)
    finally:
        for slot in slots:
            slot.cancel()
        await asyncio.gather(*slots, return_exceptions=True)
        stop.set()
        await prober
    return tally, served


HELD_MARGIN_SECS = 2.0
"""An idle HTTP/2 connection still open ``grpc.idle_timeout_secs`` plus this after it opened counts as held."""


@dataclass(slots=True)
class IdleTally:
    """Idle HTTP/2 connections by fate: ``refused`` (closed at once, without the server's SETTINGS),
    ``timed_out`` (admitted, closed by the idle timeout), ``held`` (still open at the timeout plus the margin)."""

    refused: int = 0
    timed_out: int = 0
    held: int = 0
    failed: int = 0

    @property
    def admitted(self) -> int:
        return self.timed_out + self.held


async def _idle_connection(port: int, idle: float, tally: IdleTally) -> None:
    """Preface and one SETTINGS frame, then nothing (not even the acknowledgement); wait for the close."""
    try:
        reader, writer = await probes.open_from(probes.ATTACKER, port)
    except OSError:
        tally.failed += 1
        return
    started = time.monotonic()
    settings = False
    closed_after: float | None = None
    buffer = bytearray()
    try:
        writer.write(probes.PREFACE + probes.frame(probes.SETTINGS, 0, 0))
        async with asyncio.timeout(idle + HELD_MARGIN_SECS):
            with contextlib.suppress(ConnectionError, OSError):
                while chunk := await reader.read(65536):
                    buffer += chunk
                    settings = settings or any(
                        kind == probes.SETTINGS and not flags & probes.ACK
                        for kind, flags, _s, _p in probes.take_frames(buffer)
                    )
            closed_after = time.monotonic() - started
    except TimeoutError:
        closed_after = None
    finally:
        writer.transport.abort()
    if closed_after is None:
        tally.held += 1
    elif settings and closed_after >= idle / 2:
        tally.timed_out += 1
    else:
        tally.refused += 1


async def _idle_connections(
    port: int, total: int, at_once: int, idle: float, limit: float
) -> tuple[IdleTally, probes.Served]:
    """``total`` idle connections, at most ``at_once`` open on this side (file descriptors), started within
    ``limit`` seconds; /health probed meanwhile."""
    stop, served, prober = await _probing(port, 0.1)
    tally = IdleTally()
    room = asyncio.Semaphore(at_once)
    running: set[asyncio.Task[None]] = set()

    async def one() -> None:
        try:
            await _idle_connection(port, idle, tally)
        finally:
            room.release()

    deadline = time.monotonic() + limit
    try:
        for _ in range(total):
            if time.monotonic() > deadline:
                break
            await room.acquire()
            task = asyncio.create_task(one())
            running.add(task)
            task.add_done_callback(running.discard)
        await asyncio.gather(*running)  # each ends by its own timeout
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        stop.set()
        await prober
    return tally, served


def idle_http2(ctx: Context) -> list[Figure]:
    """20,000 connections from one address that send the HTTP/2 preface and a SETTINGS frame, then nothing, at
    most 2,000 open at once on this side: none held past ``grpc.idle_timeout_secs`` + 2 s (most are refused at
    once by ``service.max_connections_per_ip``), /health from another address answered every time."""
    name = "idle HTTP/2"
    idle = 1.0 if ctx.quick else 5.0
    total, at_once = (2_000, 500) if ctx.quick else (20_000, 2_000)
    limit = 30.0 if ctx.quick else 180.0
    env = {"SERVICE_GRPC_IDLE_TIMEOUT_SECS": str(idle)}
    with servers.bastion(ctx.ws, env) as app:
        tally, served = asyncio.run(_idle_connections(app.port, total, at_once, idle, limit))
    opened = tally.admitted + tally.refused
    return [
        equals(
            name,
            f"connections held past the idle timeout + {HELD_MARGIN_SECS:g} s",
            tally.held,
            0,
            note=f"of {opened}: {tally.admitted} admitted, {tally.refused} refused at once, "
            f"{tally.timed_out} closed by the {idle:g} s idle timeout, {tally.failed} connects failed",
        ),
        at_least(name, "connections closed by the idle timeout", tally.timed_out, 1),
        at_least(name, "connections made", opened, total),
        # Not timed: the attacker's connects wait in the listening socket's accept queue ahead of the probe's,
        # whatever the server does once it has accepted them; what the cap must keep is the answer.
        *_legit_figures(name, served, timed=False),
        at_least(name, "/health probes", served.sent, 4 if ctx.quick else 16),
        *servers.ServerLog.read(app.server.log_path).figures(name),
    ]


SCENARIOS = {"pipelining": pipelining, "half-heads": half_heads, "idle-http2": idle_http2}
