"""The idempotency step in a running app: replays, conflicts, bad keys, what is not stored, a store outage."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from bastion import ConfigError, Service
from bastion._cache_store import MemoryCacheStore
from bastion.config import IdempotencySettings
from bastion.idempotency import IdempotencyMiddleware, IdempotentRoutes
from bastion.testing import AsyncServiceClient, ServiceClient
from bastion.types import SCOPE_CLAIMS, Message, ReadAhead, Receive, Scope, Send

KEY = {"Idempotency-Key": '"order-1"'}


def orders_service(
    calls: list[str], gate: asyncio.Event | None = None, entered: asyncio.Event | None = None
) -> Service:
    service = Service("orders")
    v1 = service.version(1)

    @v1.post("/orders", status_code=201, idempotency=True)
    async def create_order(request: Request) -> dict[str, object]:
        calls.append("create")
        if entered is not None:
            entered.set()
        if gate is not None:
            await gate.wait()
        body = await request.json()
        return {"id": f"o-{len(calls)}", "item": body["item"]}

    @v1.post("/failing", idempotency=True)
    async def failing() -> JSONResponse:
        calls.append("failing")
        return JSONResponse({"error": "down"}, status_code=502)

    @v1.post("/stream", idempotency=True)
    async def stream() -> StreamingResponse:
        calls.append("stream")

        async def parts() -> AsyncIterator[bytes]:
            yield b"one,"
            yield b"two"

        return StreamingResponse(parts())

    @v1.post("/plain")
    async def plain() -> dict[str, str]:
        calls.append("plain")
        return {"ok": "yes"}

    return service


def config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "service.toml"
    path.write_text(extra)
    return path


def test_a_repeated_key_replays_the_response_without_running_the_handler(tmp_path: Path) -> None:
    calls: list[str] = []
    with ServiceClient(orders_service(calls), config=config(tmp_path)) as client:
        alice = client.as_user("alice")
        first = alice.post("/api/v1/orders", json={"item": "book"}, headers=KEY)
        again = alice.post("/api/v1/orders", json={"item": "book"}, headers=KEY)
    assert calls == ["create"]
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json() == first.json() == {"id": "o-1", "item": "book"}
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert again.headers["x-request-id"] != first.headers["x-request-id"]  # the replay is a request of its own


def test_a_replay_carries_each_header_of_the_outer_layers_once(tmp_path: Path) -> None:
    """Without Accept-Encoding the response start passes the outer layers as one message, which they extend: the
    record keeps the handler's headers only, so a replay gets the request id, quota and Vary once, its own."""
    calls: list[str] = []
    with ServiceClient(orders_service(calls), config=config(tmp_path)) as client:
        alice = client.as_user("alice")
        plain = {**KEY, "Accept-Encoding": "identity"}
        first = alice.post("/api/v1/orders", json={"item": "book"}, headers=plain)
        again = alice.post("/api/v1/orders", json={"item": "book"}, headers=plain)
    names = [name.decode().lower() for name, _ in again.headers.raw]
    assert again.headers["idempotent-replayed"] == "true"
    assert {"x-ratelimit-remaining", "x-request-id"} <= {*names}
    assert sorted(names) == sorted({*names})
    assert again.headers["x-request-id"] != first.headers["x-request-id"]


def test_the_same_key_with_another_body_is_422(tmp_path: Path) -> None:
    calls: list[str] = []
    with ServiceClient(orders_service(calls), config=config(tmp_path)) as client:
        alice = client.as_user("alice")
        alice.post("/api/v1/orders", json={"item": "book"}, headers=KEY)
        reused = alice.post("/api/v1/orders", json={"item": "lamp"}, headers=KEY)
    assert reused.status_code == 422
    assert reused.json() == {
        "error": "This Idempotency-Key was used with a different request",
        "code": "IDEMPOTENCY_KEY_REUSED",
        "status": 422,
    }
    assert calls == ["create"]


async def test_the_same_key_while_the_first_request_runs_is_409(tmp_path: Path) -> None:
    calls: list[str] = []
    gate, entered = asyncio.Event(), asyncio.Event()
    async with AsyncServiceClient(orders_service(calls, gate, entered), config=config(tmp_path)) as client:
        alice = client.as_user("alice")
        first = asyncio.create_task(alice.post("/api/v1/orders", json={"item": "book"}, headers=KEY))
        await entered.wait()
        second = await alice.post("/api/v1/orders", json={"item": "book"}, headers=KEY)
        gate.set()
        assert (await first).status_code == 201
    assert second.status_code == 409
    assert second.json()["code"] == "IDEMPOTENCY_CONFLICT"
    assert calls == ["create"]


def test_a_route_that_requires_a_key_and_gets_none_is_400(tmp_path: Path) -> None:
    calls: list[str] = []
    with ServiceClient(orders_service(calls), config=config(tmp_path)) as client:
        missing = client.as_user("alice").post("/api/v1/orders", json={"item": "book"})
    assert missing.status_code == 400
    assert missing.json()["code"] == "IDEMPOTENCY_KEY_MISSING"
    assert calls == []


def test_without_required_a_request_without_a_key_just_runs(tmp_path: Path) -> None:
    calls: list[str] = []
    with ServiceClient(orders_service(calls), config=config(tmp_path, "[idempotency]\nrequired = false\n")) as client:
        alice = client.as_user("alice")
        statuses = [alice.post("/api/v1/orders", json={"item": "book"}).status_code for _ in range(2)]
    assert statuses == [201, 201]
    assert calls == ["create", "create"]


@pytest.mark.parametrize("key", ['""', "x" * 256, "a\tb"], ids=["empty", "over-255", "tab"])
def test_a_bad_key_is_400_and_runs_nothing(tmp_path: Path, key: str) -> None:
    calls: list[str] = []
    with ServiceClient(orders_service(calls), config=config(tmp_path)) as client:
        bad = client.as_user("alice").post("/api/v1/orders", json={"item": "b"}, headers={"Idempotency-Key": key})
    assert bad.status_code == 400
    assert bad.json()["code"] == "IDEMPOTENCY_KEY_INVALID"
    assert calls == []


def test_one_key_of_two_callers_never_replays_across_them(tmp_path: Path) -> None:
    calls: list[str] = []
    with ServiceClient(orders_service(calls), config=config(tmp_path)) as client:
        alice = client.as_user("alice").post("/api/v1/orders", json={"item": "book"}, headers=KEY)
        bob = client.as_user("bob").post("/api/v1/orders", json={"item": "book"}, headers=KEY)
    assert calls == ["create", "create"]
    assert "idempotent-replayed" not in bob.headers
    assert (alice.json()["id"], bob.json()["id"]) == ("o-1", "o-2")


def test_a_5xx_is_not_stored_and_a_retry_runs_again(tmp_path: Path) -> None:
    calls: list[str] = []
    with ServiceClient(orders_service(calls), config=config(tmp_path)) as client:
        alice = client.as_user("alice")
        statuses = [alice.post("/api/v1/failing", headers=KEY).status_code for _ in range(2)]
    assert statuses == [502, 502]
    assert calls == ["failing", "failing"]


def test_a_streaming_response_is_not_stored(tmp_path: Path) -> None:
    calls: list[str] = []
    with ServiceClient(orders_service(calls), config=config(tmp_path)) as client:
        alice = client.as_user("alice")
        bodies = [alice.post("/api/v1/stream", headers=KEY).content for _ in range(2)]
    assert bodies == [b"one,two", b"one,two"]
    assert calls == ["stream", "stream"]


def test_a_response_over_max_response_bytes_is_not_stored(tmp_path: Path) -> None:
    calls: list[str] = []
    settings = config(tmp_path, "[idempotency]\nmax_response_bytes = 16\n")
    with ServiceClient(orders_service(calls), config=settings) as client:
        alice = client.as_user("alice")
        replies = [alice.post("/api/v1/orders", json={"item": "book"}, headers=KEY) for _ in range(2)]
    assert [reply.status_code for reply in replies] == [201, 201]
    assert "idempotent-replayed" not in replies[1].headers
    assert calls == ["create", "create"]


def test_routes_listed_in_the_config_take_a_key(tmp_path: Path) -> None:
    calls: list[str] = []
    settings = config(tmp_path, '[idempotency]\nroutes = ["POST /api/*/plain"]\n')
    with ServiceClient(orders_service(calls), config=settings) as client:
        alice = client.as_user("alice")
        assert alice.post("/api/v1/plain").json()["code"] == "IDEMPOTENCY_KEY_MISSING"
        replies = [alice.post("/api/v1/plain", headers=KEY) for _ in range(2)]
    assert replies[1].headers["idempotent-replayed"] == "true"
    assert calls == ["plain"]


def test_a_store_outage_fails_closed_with_503_and_runs_nothing(tmp_path: Path) -> None:
    calls: list[str] = []
    settings = config(tmp_path, '[cache_store]\nurl = "redis://127.0.0.1:9"\ntimeout_secs = 0.2\n')
    with ServiceClient(orders_service(calls), config=settings) as client:
        down = client.as_user("alice").post("/api/v1/orders", json={"item": "book"}, headers=KEY)
    assert down.status_code == 503
    assert down.json()["code"] == "IDEMPOTENCY_UNAVAILABLE"
    assert calls == []


def test_a_store_outage_with_fail_open_runs_the_handler(tmp_path: Path) -> None:
    calls: list[str] = []
    text = (
        '[cache_store]\nurl = "redis://127.0.0.1:9"\ntimeout_secs = 0.2\n[idempotency]\non_store_error = "fail_open"\n'
    )
    with ServiceClient(orders_service(calls), config=config(tmp_path, text)) as client:
        ran = client.as_user("alice").post("/api/v1/orders", json={"item": "book"}, headers=KEY)
    assert ran.status_code == 201
    assert calls == ["create"]


def test_outcomes_are_counted(tmp_path: Path) -> None:
    calls: list[str] = []
    with ServiceClient(orders_service(calls), config=config(tmp_path)) as client:
        alice = client.as_user("alice")
        for item in ("book", "book", "lamp"):
            alice.post("/api/v1/orders", json={"item": item}, headers=KEY)
        text = client.get("/metrics").text
    assert 'bastion_idempotency_requests_total{outcome="stored"} 1.0' in text
    assert 'bastion_idempotency_requests_total{outcome="replayed"} 1.0' in text
    assert 'bastion_idempotency_requests_total{outcome="mismatch"} 1.0' in text


def test_in_memory_the_oldest_records_are_forgotten_past_memory_max_bytes(tmp_path: Path) -> None:
    calls: list[str] = []
    settings = config(tmp_path, "[idempotency]\nmemory_max_bytes = 600\n")
    with ServiceClient(orders_service(calls), config=settings) as client:
        alice = client.as_user("alice")
        for n in range(8):  # each record is 150 bytes: four fit
            alice.post("/api/v1/orders", json={"item": "book"}, headers={"Idempotency-Key": f"k{n}"})
        newest = alice.post("/api/v1/orders", json={"item": "book"}, headers={"Idempotency-Key": "k7"})
        oldest = alice.post("/api/v1/orders", json={"item": "book"}, headers={"Idempotency-Key": "k0"})
    assert newest.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in oldest.headers
    assert len(calls) == 9


def test_an_in_flight_claim_shorter_than_the_request_timeout_is_refused(tmp_path: Path) -> None:
    settings = config(tmp_path, "[middleware]\ntimeout_secs = 90\n[idempotency]\nin_flight_secs = 60\n")
    with pytest.raises(ConfigError, match=r"idempotency\.in_flight_secs = 60 is shorter than middleware\.timeout_secs"):
        ServiceClient(orders_service([]), config=settings).__enter__()


@pytest.mark.parametrize("takes", [True, False], ids=["a handler that takes the body", "a handler that receives it"])
async def test_the_body_read_by_the_step_reaches_the_handler_once_then_receive_is_the_clients(takes: bool) -> None:
    """The step reads the whole body before the handler runs. A handler given the step's ``receive`` may take the body
    from its owner (a ReadAhead: Bastion's compiled routes do) or receive it as one message; either way it gets the
    body once, and the next ``receive`` is what the client sends next."""
    client = [
        {"type": "http.request", "body": b'{"item": ', "more_body": True},
        {"type": "http.request", "body": b'"book"}', "more_body": False},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Message:
        return client.pop(0)

    got: list[object] = []

    async def handler(scope: Scope, receive: Receive, send: Send) -> None:
        owner = getattr(receive, "__self__", None)
        assert isinstance(owner, ReadAhead)
        if takes:
            got.append(owner.take_body())
        else:
            got.append(await receive())
        got.append(owner.take_body())  # taken or received: nothing left to take
        got.append(await receive())
        await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"created"})

    settings = IdempotencySettings(routes=["POST /orders"])
    store = MemoryCacheStore()
    step = IdempotencyMiddleware(handler, settings=settings, routes=IdempotentRoutes(settings.routes), store=store)
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {
        "type": "http",
        "method": "POST",
        "path": "/orders",
        "query_string": b"",
        "headers": [(b"idempotency-key", b"order-1")],
        SCOPE_CLAIMS: SimpleNamespace(sub="alice", client_id=None),
    }
    await step(scope, receive, send)
    whole = b'{"item": "book"}'
    first = whole if takes else {"type": "http.request", "body": whole, "more_body": False}
    assert got == [first, None, {"type": "http.disconnect"}]
    assert [message.get("status", message.get("body")) for message in sent] == [201, b"created"]
    assert len(store) == 1  # the response was stored
