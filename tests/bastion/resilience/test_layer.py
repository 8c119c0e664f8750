"""The inbound resilience layer through the ASGI app: classification, scopes, slots, settings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from fastapi import HTTPException, Request

from bastion import ConfigError, Service, load_settings
from bastion.config import Settings
from bastion.resilience import BreakerState, CircuitBreaker, CircuitOpenError, outbound_guard
from tests.conftest import TOKEN_OFF

Client = Callable[..., httpx.AsyncClient]


def settings(**resilience: str) -> Settings:
    environ = {f"SERVICE_MIDDLEWARE_RESILIENCE_{key.upper()}": value for key, value in resilience.items()}
    return load_settings(environ={**TOKEN_OFF, "SERVICE_RATE_LIMIT_ENABLED": "false", **environ})


def service(**use: object) -> Service:
    built = Service("resilient")
    v1 = built.version(1)

    @v1.get("/status/{code}")
    async def status(code: int) -> dict[str, int]:
        if code >= 400:
            raise HTTPException(code)
        return {"code": code}

    @v1.get("/crash")
    async def crash() -> None:
        raise RuntimeError("bug")

    @v1.get("/hang")
    async def hang() -> None:
        await asyncio.sleep(30)

    @v1.get("/dependency")
    async def dependency() -> None:
        raise CircuitOpenError("payments", retry_after=7.2)

    @v1.post("/upload")
    async def upload(request: Request) -> dict[str, int]:
        return {"size": len(await request.body())}

    built.use_resilience(**use)  # type: ignore[arg-type]
    return built


def breaker_of(client: httpx.AsyncClient) -> CircuitBreaker:
    app = client._transport.app  # type: ignore[attr-defined]
    breaker = app.resilience[0].breaker
    assert breaker is not None
    return breaker  # type: ignore[no-any-return]


async def test_exceptions_in_the_handler_count_as_failures(asgi_client: Client) -> None:
    client = asgi_client(service(), settings(circuit_breaker_min_requests="2"))
    assert [(await client.get("/api/v1/crash")).status_code for _ in range(2)] == [500, 500]
    assert breaker_of(client).state is BreakerState.OPEN


async def test_http_errors_below_500_raised_by_the_handler_are_not_failures(asgi_client: Client) -> None:
    client = asgi_client(service(), settings(circuit_breaker_min_requests="2"))
    assert [(await client.get("/api/v1/status/404")).status_code for _ in range(5)] == [404] * 5
    assert breaker_of(client).failure_rate == 0.0


async def test_a_hanging_handler_is_freed_by_the_timeout_and_counts_as_a_failure(asgi_client: Client) -> None:
    app_settings = load_settings(
        environ={
            **TOKEN_OFF,
            "SERVICE_MIDDLEWARE_TIMEOUT_SECS": "0.05",
            "SERVICE_MIDDLEWARE_RESILIENCE_CIRCUIT_BREAKER_MIN_REQUESTS": "1",
            "SERVICE_MIDDLEWARE_RESILIENCE_BULKHEAD_MAX_CONCURRENT": "1",
        }
    )
    client = asgi_client(service(), app_settings)
    assert (await client.get("/api/v1/hang")).status_code == 504
    layer = client._transport.app.resilience[0]  # type: ignore[attr-defined]
    assert (layer.bulkhead.in_use, layer.breaker.state) == (0, BreakerState.OPEN)


async def test_a_body_too_slow_to_arrive_is_not_counted(asgi_client: Client) -> None:
    """The 408: the deadline passed while the handler waited for the client's body."""
    app_settings = load_settings(
        environ={
            **TOKEN_OFF,
            "SERVICE_MIDDLEWARE_TIMEOUT_SECS": "0.05",
            "SERVICE_MIDDLEWARE_RESILIENCE_CIRCUIT_BREAKER_MIN_REQUESTS": "1",
        }
    )

    async def half_a_body() -> AsyncIterator[bytes]:
        yield b"{"
        await asyncio.sleep(30)

    client = asgi_client(service(), app_settings)
    assert (await client.post("/api/v1/upload", content=half_a_body())).status_code == 408
    assert breaker_of(client).snapshot().window == 0
    assert (await client.get("/api/v1/hang")).status_code == 504  # a hanging handler still counts
    assert breaker_of(client).state is BreakerState.OPEN


async def test_a_client_that_disconnects_is_not_counted(asgi_client: Client) -> None:
    client = asgi_client(service(), settings(circuit_breaker_min_requests="1"))
    app = client._transport.app  # type: ignore[attr-defined]
    sent: list[dict[str, object]] = []

    async def gone() -> dict[str, object]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/api/v1/upload",
        "raw_path": b"/api/v1/upload",
        "query_string": b"",
        "headers": [(b"content-length", b"10")],
        "scheme": "http",
        "server": ("t", 80),
        "client": ("127.0.0.1", 1),
        "root_path": "",
        "http_version": "1.1",
        "asgi": {"version": "3.0"},
    }
    await app(scope, gone, send)
    assert sent == []  # nobody to answer
    assert breaker_of(client).snapshot().window == 0
    assert breaker_of(client).state is BreakerState.CLOSED


async def test_an_outbound_rejection_inside_a_handler_is_a_503_with_retry_after(asgi_client: Client) -> None:
    client = asgi_client(service(breaker=False), settings())
    response = await client.get("/api/v1/dependency")
    assert response.status_code == 503
    assert response.json() == {
        "error": "circuit 'payments' is open; retry in 8s",
        "code": "SERVICE_UNAVAILABLE",
        "status": 503,
    }
    assert response.headers["retry-after"] == "8"


async def test_paths_scope_guards_only_those_paths(asgi_client: Client) -> None:
    client = asgi_client(service(paths=["/api/v1/crash"]), settings(circuit_breaker_min_requests="1"))
    assert (await client.get("/api/v1/crash")).status_code == 500
    assert (await client.get("/api/v1/crash")).status_code == 503
    assert (await client.get("/api/v1/status/200")).status_code == 200  # outside the layer's scope


async def test_health_and_ready_are_never_guarded(asgi_client: Client) -> None:
    client = asgi_client(service(), settings(circuit_breaker_min_requests="1"))
    await client.get("/api/v1/crash")
    assert [(await client.get(p)).status_code for p in ("/health", "/ready")] == [200, 200]


async def test_overrides_replace_the_settings_for_one_layer(asgi_client: Client) -> None:
    client = asgi_client(service(min_requests=1, max_concurrent=3), settings(circuit_breaker_min_requests="50"))
    layer = client._transport.app.resilience[0]  # type: ignore[attr-defined]
    assert (layer.breaker.min_requests, layer.bulkhead.max_concurrent) == (1, 3)


def test_unknown_override_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        service(min_request=1)
    assert str(info.value) == (
        "use_resilience(min_request=...): unknown; the values a layer takes are half_open_requests, max_concurrent, "
        "max_wait, min_requests, threshold, wait_secs"
    )


def test_a_layer_with_neither_part_is_refused() -> None:
    with pytest.raises(ConfigError, match="has neither a circuit breaker nor a bulkhead"):
        service().build(settings(circuit_breaker_enabled="false", bulkhead_enabled="false"))


def test_two_layers_with_one_name_are_refused() -> None:
    built = service(name="shared")
    built.use_resilience(name="shared", version=1)
    with pytest.raises(ConfigError, match=r"^use_resilience\(name=\.\.\.\) names 'shared' more than once$"):
        built.build(settings())


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("circuit_breaker_min_requests", "0"),
        ("circuit_breaker_wait_secs", "0"),
        ("circuit_breaker_half_open_requests", "-1"),
        ("bulkhead_max_concurrent", "0"),
        ("bulkhead_max_wait", "0"),
    ],
)
def test_zero_or_negative_settings_are_refused_naming_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings(**{key: value})
    assert f"SERVICE_MIDDLEWARE_RESILIENCE_{key.upper()}='{value}' (middleware.resilience.{key})" in str(info.value)


def test_threshold_outside_zero_one_is_clamped() -> None:
    assert settings(circuit_breaker_threshold="1.5").middleware.resilience.circuit_breaker_threshold == 1.0


def test_outbound_guard_is_built_from_the_settings() -> None:
    guard = outbound_guard(settings(circuit_breaker_min_requests="3", bulkhead_enabled="false"), "payments")
    assert guard.breaker is not None and guard.breaker.min_requests == 3 and guard.breaker.name == "payments"
    assert guard.bulkhead is None
