"""Broker tests: apps run with their lifespan against the session's real NATS server (JetStream on)."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import httpx
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from bastion import BastionApp, Service, Settings, load_settings
from tests.conftest import TOKEN_OFF
from tests.nats_server import NatsServer

EVENTUALLY_SECS = 15.0


def broker_settings(url: str, **environ: str) -> Settings:
    """Embedded defaults, token auth off, ``SERVICE_BROKER_URL = url``; ``environ`` adds ``SERVICE_*`` keys."""
    return load_settings(environ={**TOKEN_OFF, "SERVICE_BROKER_URL": url, **environ})


def client_for(app: BastionApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")


async def eventually(
    predicate: Callable[[], bool | Awaitable[bool]], *, what: str, within: float = EVENTUALLY_SECS
) -> None:
    """Wait until ``predicate()`` (sync or async) holds: a bound against hangs, not a timing assertion."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        outcome = predicate()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return
        if loop.time() > deadline:
            raise AssertionError(f"not within {within:g}s: {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
def uid() -> str:
    """A prefix no other test uses, for subjects, streams and durable names on the shared server."""
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[Client]:
    """A plain nats-py connection to the shared server: the outside world publishing and watching."""
    client = await nats.connect(nats_server.url)
    try:
        yield client
    finally:
        await client.close()


class Inbox:
    """What a plain subscription received, in order."""

    def __init__(self) -> None:
        self.messages: list[Msg] = []

    async def receive(self, msg: Msg) -> None:
        self.messages.append(msg)

    @property
    def headers(self) -> list[Mapping[str, str]]:
        return [dict(msg.headers or {}) for msg in self.messages]


def worker(name: str = "shop") -> Service:
    """A service with one (empty) API version, to declare broker work on."""
    service = Service(name)
    service.version(1)
    return service


async def listen(nc: Client, subject: str) -> Inbox:
    """Subscribe ``nc`` to ``subject`` and return once the server has the subscription (a message to ourselves
    proves it; nats-py's first ``flush()`` after connecting may return early)."""
    inbox = Inbox()
    await nc.subscribe(subject, cb=inbox.receive)
    probe = await nc.subscribe(nc.new_inbox(), max_msgs=1)
    await nc.publish(probe.subject, b"")
    await probe.next_msg(timeout=EVENTUALLY_SECS)
    return inbox
