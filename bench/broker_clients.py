"""Which NATS client Bastion's broker is built on: nats-py directly vs FastStream's NATS broker (issue 15).

Run by hand (not part of the test suite; needs the ``bench`` extra for FastStream)::

    .venv/bin/python -m bench.broker_clients

Starts its own ``nats-server -js`` and measures, for each client, on the same server and payload:

- acknowledged publishes per second (one at a time, each awaiting the stream's ack, as a request handler does);
- messages consumed per second by a durable pull consumer (batches of 64, validate into a pydantic model,
  ack each) from a pre-filled stream.

Prints the best of three rounds per figure (the least noisy estimate of cost on a shared machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats
from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig

from bench.apps.broker_events import Event, payload
from bench.brokerload import prefill
from bench.processes import ServerProcess, free_port, port_open

NATS_SERVER = Path(sys.executable).with_name("nats-server")
PUBLISHES = 3_000
BACKLOG = 60_000
BATCH = 64
ROUNDS = 3


async def _publish_nats_py(url: str, subject: str) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream()
    started = time.perf_counter()
    for number in range(PUBLISHES):
        await js.publish(subject, payload(number))
    elapsed = time.perf_counter() - started
    await nc.close()
    return PUBLISHES / elapsed


async def _publish_faststream(url: str, subject: str) -> float:
    from faststream.nats import NatsBroker

    broker = NatsBroker(url, logger=None)  # no per-message log lines: the nats-py loop writes none either
    await broker.connect()
    started = time.perf_counter()
    for number in range(PUBLISHES):
        await broker.publish(Event(id=number, kind="k", owner="o", title="t"), subject, stream="PUB")
    elapsed = time.perf_counter() - started
    await broker.stop()
    return PUBLISHES / elapsed


async def _consume_nats_py(url: str, stream: str, subject: str) -> float:
    await prefill(url, stream=stream, subject=subject, count=BACKLOG)
    nc = await nats.connect(url)
    subscription = await nc.jetstream().pull_subscribe(
        subject, durable="d", stream=stream, config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT)
    )
    done = 0

    async def handle(msg: nats.aio.msg.Msg) -> None:
        Event.model_validate_json(msg.data)
        await msg.ack()

    started = time.perf_counter()
    while done < BACKLOG:
        messages = await subscription.fetch(batch=BATCH, timeout=5)
        await asyncio.gather(*(handle(msg) for msg in messages))
        done += len(messages)
    elapsed = time.perf_counter() - started
    await nc.close()
    return BACKLOG / elapsed


async def _consume_faststream(url: str, stream: str, subject: str) -> float:
    from faststream.nats import JStream, NatsBroker, PullSub

    await prefill(url, stream=stream, subject=subject, count=BACKLOG)
    broker = NatsBroker(url, logger=None)  # no per-message log lines: the nats-py loop writes none either
    done = asyncio.Event()
    count = 0

    @broker.subscriber(subject, stream=JStream(name=stream, declare=False), durable="d", pull_sub=PullSub(BATCH))
    async def handle(event: Event) -> None:
        nonlocal count
        count += 1
        if count == BACKLOG:
            done.set()

    started = time.perf_counter()
    await broker.start()
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.perf_counter() - started
    await broker.stop()
    return BACKLOG / elapsed


async def _best(measure: Callable[[str, str, str], Awaitable[float]], url: str, name: str) -> float:
    results = []
    for round_number in range(ROUNDS):
        stream = f"{name}{round_number}"
        results.append(await measure(url, stream, f"{stream.lower()}.events"))
    return max(results)


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        argv = [str(NATS_SERVER), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", tmp]
        server = ServerProcess("nats-server", argv, log_path=Path(tmp) / "nats.log")
        server.wait_ready(lambda: port_open(port))
        url = f"nats://127.0.0.1:{port}"
        try:
            nc = await nats.connect(url)
            await nc.jetstream().add_stream(StreamConfig(name="PUB", subjects=["pub.>"], storage=StorageType.MEMORY))
            await nc.close()
            publish = {
                "nats-py": max([await _publish_nats_py(url, "pub.a") for _ in range(ROUNDS)]),
                "faststream": max([await _publish_faststream(url, "pub.b") for _ in range(ROUNDS)]),
            }
            consume = {
                "nats-py": await _best(_consume_nats_py, url, "NP"),
                "faststream": await _best(_consume_faststream, url, "FS"),
            }
        finally:
            with contextlib.suppress(Exception):
                server.stop()
    print(f"{'client':<12} {'acked publish/s':>16} {'consumed/s':>12}")
    for client in ("nats-py", "faststream"):
        print(f"{client:<12} {publish[client]:>16,.0f} {consume[client]:>12,.0f}")


if __name__ == "__main__":
    asyncio.run(main())
