"""The broker end to end on ``bastion run``: /ready follows a non-optional broker, SERVICE_BROKER_URL, optional,
an eager start-up that cannot connect, and the example's documents.created event."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import nats

from tests.conftest import TOKEN_OFF, BastionProcess
from tests.nats_server import NatsServer

EXAMPLE_APP = "examples.documents_api:service"
WAIT_SECS = 20.0
QUICK = {"SERVICE_BROKER_RETRY_DELAY_SECS": "0"}


def ready(process: BastionProcess) -> tuple[int, dict[str, object]]:
    response = httpx.get(process.url + "/ready", timeout=5)
    return response.status_code, response.json()


def wait_ready_status(process: BastionProcess, status: int) -> dict[str, object]:
    deadline = time.monotonic() + WAIT_SECS
    while True:
        code, body = ready(process)
        if code == status:
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"/ready stayed {code} {body}, expected {status}:\n{process.output()}")
        time.sleep(0.1)


BROKER_DOWN = {"healthy": False, "message": "BrokerUnavailable: broker not connected"}


class TestReadiness:
    def test_a_configured_broker_that_is_down_is_503_then_200_once_up(
        self, bastion_process: Callable[..., BastionProcess], tmp_path: Path
    ) -> None:
        server = NatsServer(tmp_path)  # its port; not started yet
        config = tmp_path / "service.toml"
        config.write_text(f'[token]\nenabled = false\n\n[broker]\nurl = "{server.url}"\nretry_delay_secs = 0\n')
        process = bastion_process(EXAMPLE_APP, "--config", str(config))
        try:
            assert ready(process) == (
                503,
                {"ready": False, "service": "documents-api", "dependencies": {"broker": BROKER_DOWN}},
            )
            server.start()
            body = wait_ready_status(process, 200)
            assert body == {"ready": True, "service": "documents-api", "dependencies": {"broker": {"healthy": True}}}
        finally:
            server.stop()

    def test_the_same_through_service_broker_url(
        self, bastion_process: Callable[..., BastionProcess], tmp_path: Path
    ) -> None:
        server = NatsServer(tmp_path)
        process = bastion_process(EXAMPLE_APP, env={**TOKEN_OFF, **QUICK, "SERVICE_BROKER_URL": server.url})
        try:
            assert ready(process)[0] == 503
            server.start()
            wait_ready_status(process, 200)
            server.kill()
            wait_ready_status(process, 503)
            server.start()
            wait_ready_status(process, 200)
        finally:
            server.stop()

    def test_an_optional_broker_keeps_ready_200(
        self, bastion_process: Callable[..., BastionProcess], tmp_path: Path
    ) -> None:
        down = NatsServer(tmp_path)
        env = {**TOKEN_OFF, **QUICK, "SERVICE_BROKER_URL": down.url, "SERVICE_BROKER_OPTIONAL": "true"}
        process = bastion_process(EXAMPLE_APP, env=env)
        assert ready(process) == (
            200,
            {"ready": True, "service": "documents-api", "dependencies": {"broker": BROKER_DOWN}},
        )


def test_an_eager_start_without_the_broker_is_one_error_line_and_exit_2(
    bastion_process: Callable[..., BastionProcess], tmp_path: Path
) -> None:
    down = NatsServer(tmp_path)
    env = {
        **TOKEN_OFF,
        **QUICK,
        "SERVICE_BROKER_URL": down.url,
        "SERVICE_BROKER_LAZY_INIT": "false",
        "SERVICE_BROKER_MAX_RETRIES": "1",
        "SERVICE_LOG_FORMAT": "console",
    }
    process = bastion_process(EXAMPLE_APP, env=env, wait=False)
    assert process.proc.wait(WAIT_SECS) == 2
    output = process.output()
    assert "Traceback" not in output
    assert [line for line in output.splitlines() if line.startswith("error:")] == [
        f"error: broker.url {down.url}: cannot connect after 2 attempts (NoServersError: nats: no servers available "
        "for connection); start NATS, fix the URL, or set broker.lazy_init = true to start without it"
    ]


async def test_the_example_publishes_documents_created(
    bastion_process: Callable[..., BastionProcess], nats_server: NatsServer
) -> None:
    process = bastion_process(
        EXAMPLE_APP, env={**TOKEN_OFF, "SERVICE_BROKER_URL": nats_server.url, "SERVICE_BROKER_LAZY_INIT": "false"}
    )
    nc = await nats.connect(nats_server.url)
    received: list[nats.aio.msg.Msg] = []

    async def on_event(msg: nats.aio.msg.Msg) -> None:
        received.append(msg)

    try:
        await nc.subscribe("documents.created", cb=on_event)
        probe = await nc.subscribe(nc.new_inbox(), max_msgs=1)
        await nc.publish(probe.subject, b"")
        await probe.next_msg(timeout=WAIT_SECS)
        async with httpx.AsyncClient(base_url=process.url) as client:
            created = await client.post(
                "/api/v2/documents", json={"id": "e2e-doc", "owner_id": "bob", "title": "Plan", "content": "x"}
            )
        assert created.status_code == 200
        for _ in range(int(WAIT_SECS / 0.05)):
            if received:
                break
            await asyncio.sleep(0.05)
    finally:
        await nc.close()
    assert [(msg.subject, json.loads(msg.data)) for msg in received] == [
        ("documents.created", {"id": "e2e-doc", "owner_id": "bob", "title": "Plan"})
    ]
