"""Request ids: a sane incoming id is kept, anything else replaced; echoed on every response."""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import httpx
import pytest
from structlog.testing import capture_logs

from bastion import Service
from bastion._request_ids import new_request_id


def service() -> Service:
    svc = Service()
    svc.version(1).get("/x")(lambda: {"ok": True})
    return svc


async def test_generated_when_absent(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    response = await asgi_client(service()).get("/api/v1/x")
    assert len(response.headers["x-request-id"]) == 32


async def test_kept_when_sane(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    response = await asgi_client(service()).get("/api/v1/x", headers={"x-request-id": "trace-01:abc.DEF_9"})
    assert response.headers["x-request-id"] == "trace-01:abc.DEF_9"


@pytest.mark.parametrize(
    "incoming",
    [
        pytest.param("a" * 129, id="too-long"),
        pytest.param("has space", id="space"),
        pytest.param('quote"d', id="quote"),
        pytest.param("", id="empty"),
        pytest.param('{"json":1}', id="json"),
    ],
)
async def test_replaced_when_not_sane(asgi_client: Callable[..., httpx.AsyncClient], incoming: str) -> None:
    response = await asgi_client(service()).get("/api/v1/x", headers={"x-request-id": incoming})
    assert response.headers["x-request-id"] != incoming
    assert len(response.headers["x-request-id"]) == 32


async def test_128_chars_is_kept(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    response = await asgi_client(service()).get("/api/v1/x", headers={"x-request-id": "b" * 128})
    assert response.headers["x-request-id"] == "b" * 128


@pytest.mark.parametrize("path", ["/health", "/ready", "/nowhere", "/api/v1/x", "/api/v1/openapi.json"])
async def test_echoed_on_every_response(asgi_client: Callable[..., httpx.AsyncClient], path: str) -> None:
    response = await asgi_client(service()).get(path, headers={"x-request-id": "echo-me"})
    assert response.headers.get_list("x-request-id") == ["echo-me"]


async def test_bound_into_log_lines(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    import structlog

    structlog.contextvars.clear_contextvars()
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        await asgi_client(service()).get("/api/v1/x", headers={"x-request-id": "bound-1"})
    access = [entry for entry in logs if entry["event"] == "http_request"]
    assert access and access[0]["request_id"] == "bound-1"
    assert "request_id" not in structlog.contextvars.get_contextvars()


def test_generated_ids_are_distinct_across_pool_refills() -> None:
    ids = [new_request_id() for _ in range(1000)]  # about four refills of the pool
    assert len(set(ids)) == 1000
    assert all(re.fullmatch(r"[0-9a-f]{32}", value) for value in ids)


def test_a_forked_worker_does_not_repeat_the_parents_ids() -> None:
    """Workers are forked: the pool of random bytes is emptied in the child, never shared."""
    new_request_id()  # the pool holds bytes a child would otherwise reuse
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: send its next ids and leave at once
        os.close(reader)
        os.write(writer, "".join(new_request_id() for _ in range(10)).encode())
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        child = pipe.read().decode()
    os.waitpid(pid, 0)
    parent = "".join(new_request_id() for _ in range(10))
    child_ids = {child[i : i + 32] for i in range(0, len(child), 32)}
    parent_ids = {parent[i : i + 32] for i in range(0, len(parent), 32)}
    assert len(child_ids) == 10 and not child_ids & parent_ids
