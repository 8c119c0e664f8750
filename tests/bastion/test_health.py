"""/health and /ready: bodies, concurrent checks under a deadline, 503 for a failed non-optional dependency."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx

from bastion import Service
from tests.conftest import open_settings


def service_with(**checks: tuple[Callable[[], object], bool]) -> Service:
    service = Service("svc", version="2.0.0")
    service.version(1).get("/x")(lambda: {})
    for name, (check, optional) in checks.items():
        service.add_readiness_check(name, check, optional=optional)  # type: ignore[arg-type]
    return service


async def ok() -> None:
    return None


async def down() -> None:
    raise ConnectionRefusedError("connection refused")


async def false() -> bool:
    return False


async def slow() -> None:
    await asyncio.sleep(30)


async def test_health_body(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    response = await asgi_client(service_with()).get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "healthy", "service": "svc", "version": "2.0.0"}


async def test_service_name_from_settings_wins(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    settings = open_settings(environ={"SERVICE_NAME": "renamed", "SERVICE_VERSION": "9"})
    response = await asgi_client(service_with(), settings).get("/health")
    assert response.json() == {"status": "healthy", "service": "renamed", "version": "9"}


async def test_ready_without_checks(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    response = await asgi_client(service_with()).get("/ready")
    assert response.status_code == 200
    assert response.json() == {"ready": True, "service": "svc", "dependencies": {}}


async def test_ready_with_healthy_checks(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    response = await asgi_client(service_with(db=(ok, False), cache=(ok, True))).get("/ready")
    assert response.status_code == 200
    assert response.json()["dependencies"] == {"db": {"healthy": True}, "cache": {"healthy": True}}


async def test_failed_required_dependency_is_503(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    response = await asgi_client(service_with(broker=(down, False), db=(ok, False))).get("/ready")
    assert response.status_code == 503
    assert response.json() == {
        "ready": False,
        "service": "svc",
        "dependencies": {
            "broker": {"healthy": False, "message": "ConnectionRefusedError: connection refused"},
            "db": {"healthy": True},
        },
    }


async def test_failed_optional_dependency_stays_ready(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    response = await asgi_client(service_with(broker=(down, True))).get("/ready")
    assert response.status_code == 200
    assert response.json()["dependencies"]["broker"]["healthy"] is False


async def test_check_returning_false_is_unhealthy(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    response = await asgi_client(service_with(db=(false, False))).get("/ready")
    assert response.status_code == 503
    assert response.json()["dependencies"]["db"] == {"healthy": False, "message": "check failed"}


async def test_hung_check_times_out(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    settings = open_settings(environ={"SERVICE_READY_TIMEOUT_SECS": "0.2"})
    client = asgi_client(service_with(a=(slow, False), b=(ok, False)), settings)
    response = await asyncio.wait_for(client.get("/ready"), timeout=10)
    assert response.status_code == 503
    assert response.json()["dependencies"] == {
        "a": {"healthy": False, "message": "timed out after 0.2s"},
        "b": {"healthy": True},
    }


async def test_checks_run_concurrently(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    """The first check waits for the second: run one after the other, the first would time out."""
    released = asyncio.Event()

    async def waits() -> None:
        await released.wait()

    async def releases() -> None:
        released.set()

    client = asgi_client(service_with(first=(waits, False), second=(releases, False)))
    response = await client.get("/ready")
    assert response.status_code == 200
