"""Plain ``def`` and ``async def`` callables alike: readiness checks, hooks, extractors, fallbacks, ``lifespan=``."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi import Request
from starlette.responses import PlainTextResponse

from bastion import ConfigError, Service
from bastion.testing import AsyncServiceClient, ServiceClient

OWNERS_ONLY = (
    "permit(principal, action, resource) when { resource has owner_id && resource.owner_id == principal.sub };\n"
)


def versioned(name: str, **kwargs: Any) -> Service:
    """A service with an (empty) API version 1, as every service needs one."""
    service = Service(name, **kwargs)
    service.version(1)
    return service


async def test_sync_readiness_check_runs_in_a_worker_thread() -> None:
    service = versioned("sync-ready")
    threads: list[str] = []

    def db() -> bool:
        threads.append(threading.current_thread().name)
        return True

    service.add_readiness_check("db", db)
    async with AsyncServiceClient(service) as client:
        ready = await client.get("/ready")
    assert (ready.status_code, ready.json()["dependencies"]) == (200, {"db": {"healthy": True}})
    assert threads != [threading.main_thread().name] and len(threads) == 1


async def test_sync_readiness_check_returning_false_makes_ready_503() -> None:
    service = versioned("sync-not-ready")
    service.add_readiness_check("db", lambda: False)
    async with AsyncServiceClient(service) as client:
        ready = await client.get("/ready")
    assert (ready.status_code, ready.json()["dependencies"]) == (
        503,
        {"db": {"healthy": False, "message": "check failed"}},
    )


async def test_sync_startup_and_shutdown_hooks_run() -> None:
    service = Service("sync-hooks")
    events: list[str] = []
    v1 = service.version(1)

    @service.on_startup
    def started() -> None:
        events.append("startup")

    @service.on_shutdown
    def stopped() -> None:
        events.append("shutdown")

    @v1.get("/events")
    async def seen() -> list[str]:
        return list(events)

    async with AsyncServiceClient(service) as client:
        during = (await client.as_user("alice").get("/api/v1/events")).json()
    assert (during, events) == (["startup"], ["startup", "shutdown"])


@pytest.mark.parametrize(
    ("register", "message"),
    [
        pytest.param(
            lambda s: s.add_readiness_check("db", lambda conn: True),
            "add_readiness_check('db'): <lambda>(conn) cannot be called with 0 positional arguments",
            id="check-with-argument",
        ),
        pytest.param(
            lambda s: s.add_readiness_check("db", True),
            "add_readiness_check('db'): expected a function, got bool",
            id="check-not-callable",
        ),
        pytest.param(
            lambda s: s.on_startup(lambda app: None),
            "on_startup: <lambda>(app) cannot be called with 0 positional arguments",
            id="hook-with-argument",
        ),
        pytest.param(
            lambda s: s.resource_extractor("/api/v1/x/{id}")(lambda scope: {}),
            "resource_extractor('/api/v1/x/{id}'): <lambda>(scope) cannot be called with 2 positional arguments",
            id="extractor-with-one-argument",
        ),
        pytest.param(
            lambda s: s.set_fallback(lambda: None),
            "set_fallback(): <lambda>() cannot be called with 1 positional argument",
            id="fallback-without-request",
        ),
        pytest.param(
            lambda s: Service("x", lifespan=lambda: None),
            "Service(lifespan=...): <lambda>() cannot be called with 1 positional argument",
            id="lifespan-without-app",
        ),
    ],
)
def test_wrong_shaped_callable_is_refused_at_registration_with_one_line(register: Any, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        register(Service("wrong-shape"))
    assert str(raised.value) == message


def test_generator_hook_is_refused_at_registration() -> None:
    def hook() -> Any:
        yield

    with pytest.raises(ConfigError, match=r"^on_startup: .*hook is a generator; expected a def or async def function$"):
        Service("generator").on_startup(hook)


async def test_sync_resource_extractor_feeds_the_policy(tmp_path: Path) -> None:
    (tmp_path / "owners.cedar").write_text(OWNERS_ONLY)
    service = Service("sync-extractor")
    v1 = service.version(1)

    @v1.get("/notes/{note_id}")
    async def note(note_id: str) -> dict[str, str]:
        return {"id": note_id}

    @service.resource_extractor("/api/v1/notes/{note_id}", attributes={"owner_id": str})
    def owner(scope: Any, params: dict[str, Any]) -> dict[str, str]:
        return {"owner_id": {"n1": "alice"}.get(params["note_id"], "bob")}

    async with AsyncServiceClient(service, environ={"SERVICE_POLICY_POLICY_PATH": str(tmp_path / "owners.cedar")}) as c:
        alice = c.as_user("alice")
        statuses = [(await alice.get(f"/api/v1/notes/{n}")).status_code for n in ("n1", "n2")]
    assert statuses == [200, 403]


async def test_sync_fallback_answers_unmatched_paths() -> None:
    service = versioned("sync-fallback")

    def fallback(request: Request) -> PlainTextResponse:
        return PlainTextResponse(f"fallback {request.url.path}", status_code=404)

    service.set_fallback(fallback)
    async with AsyncServiceClient(service) as client:
        response = await client.as_user("alice").get("/nowhere")
    assert (response.status_code, response.text) == (404, "fallback /nowhere")


async def test_lifespan_context_runs_around_the_service_and_shares_its_state() -> None:
    events: list[str] = []

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[dict[str, Any]]:
        events.append("enter")
        yield {"pool": "the-pool"}
        events.append("exit")

    service = Service("lifespan", lifespan=lifespan)
    v1 = service.version(1)

    @service.on_shutdown
    def stopped() -> None:
        events.append("shutdown hook")

    @v1.get("/pool")
    async def pool(request: Request) -> dict[str, Any]:
        return {"pool": request.state.pool, "app_pool": request.app.state.pool, "events": list(events)}

    async with AsyncServiceClient(service) as client:
        during = (await client.as_user("alice").get("/api/v1/pool")).json()
    assert during == {"pool": "the-pool", "app_pool": "the-pool", "events": ["enter"]}
    assert events == ["enter", "exit", "shutdown hook"]


async def test_lifespan_that_is_not_a_context_manager_stops_the_start_with_one_line() -> None:
    async def lifespan(app: Any) -> None:
        return None

    with pytest.raises(RuntimeError) as raised:
        async with AsyncServiceClient(versioned("bad-lifespan", lifespan=lifespan)):
            pass
    assert str(raised.value) == (
        "service 'bad-lifespan' failed to start: ConfigError: Service(lifespan=...): lifespan(app) returned coroutine; "
        "expected an async context manager (decorate it with @contextlib.asynccontextmanager)"
    )


def test_lifespan_state_reaches_requests_through_the_sync_client() -> None:
    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[dict[str, Any]]:
        yield {"pool": "sync-pool"}

    service = Service("lifespan-sync", lifespan=lifespan)
    v1 = service.version(1)

    @v1.get("/pool")
    def pool(request: Request) -> dict[str, Any]:
        return {"pool": request.state.pool}

    with ServiceClient(service) as client:
        assert client.as_user("alice").get("/api/v1/pool").json() == {"pool": "sync-pool"}
