"""Token revocation and the distributed limiter both on (Redis/Valkey): one round trip per request.

Token auth leaves the revocation check in the scope and the limiter's script makes it before charging; what a
client sees (200, 401 TOKEN_REVOKED with its challenge, 429) is what it saw with two round trips.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as redis

from bastion import BastionApp, Service, Slot, load_settings
from bastion.testing import TokenMinter
from tests.conftest import metric_samples, running

REVOKED_BODY = {"error": "Token has been revoked", "code": "TOKEN_REVOKED", "status": 401}


def items() -> Service:
    service = Service("items")
    service.version(1).get("/items")(lambda: {"ok": True})
    return service


def settings_for(valkey_url: str, key: Path, **extra: str) -> object:
    return load_settings(
        environ={
            "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(key),
            "SERVICE_TOKEN_REVOCATION_ENABLED": "true",
            "SERVICE_CACHE_STORE_URL": valkey_url,
            "SERVICE_RATE_LIMIT_ENABLED": "true",
            "SERVICE_RATE_LIMIT_DISTRIBUTED": "true",
            "SERVICE_RATE_LIMIT_PER_USER_RPM": "5",
            "SERVICE_RATE_LIMIT_BURST_SIZE": "5",
            **extra,
        }
    )


@pytest.fixture
def minter() -> TokenMinter:
    return TokenMinter("RS256")


@pytest.fixture
def key(minter: TokenMinter, tmp_path: Path) -> Path:
    path = tmp_path / "public.pem"
    path.write_bytes(minter.public_pem())
    return path


@pytest.fixture
async def valkey(valkey_url: str) -> AsyncIterator[redis.Redis]:
    client = redis.from_url(valkey_url)
    await client.flushall()
    try:
        yield client
    finally:
        await client.aclose()


async def command_counts(client: redis.Redis) -> dict[str, int]:
    stats = await client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


def http(app: BastionApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")


def bearer(minter: TokenMinter, jti: str, sub: str = "alice") -> dict[str, str]:
    return {"authorization": "Bearer " + minter.mint(sub=sub, jti=jti)}


async def test_one_script_per_request_and_no_separate_exists(
    valkey: redis.Redis, valkey_url: str, key: Path, minter: TokenMinter
) -> None:
    app = items().build(settings_for(valkey_url, key))  # type: ignore[arg-type]
    assert app.token_auth is not None and app.token_auth.defer_revocation
    async with running(app), http(app) as client:
        await client.get("/api/v1/items", headers=bearer(minter, "warm-up", sub="warm"))  # loads the script
        await valkey.config_resetstat()
        statuses = [(await client.get("/api/v1/items", headers=bearer(minter, "t-1"))).status_code for _ in range(6)]
        counts = await command_counts(valkey)
    assert statuses == [200, 200, 200, 200, 200, 429]
    # One EVALSHA per request from the client; EXISTS/GET/SET/TIME run inside the script (counted by the server).
    assert counts["evalsha"] == 6
    assert counts["exists"] == 6  # inside the script, not round trips of their own


async def test_a_revoked_token_is_401_and_charges_nothing(
    valkey: redis.Redis, valkey_url: str, key: Path, minter: TokenMinter
) -> None:
    app = items().build(settings_for(valkey_url, key))  # type: ignore[arg-type]
    async with running(app), http(app) as client:
        await app.revoke("stolen-1", "stolen", time.time() + 300)
        await client.get("/api/v1/items", headers=bearer(minter, "warm-up", sub="warm"))  # loads the script
        await valkey.config_resetstat()
        response = await client.get("/api/v1/items", headers=bearer(minter, "stolen-1", sub="mallory"))
        counts = await command_counts(valkey)
        assert (response.status_code, response.json()) == (401, REVOKED_BODY)
        assert response.headers["www-authenticate"] == (
            'Bearer realm="items", error="invalid_token", error_description="Token has been revoked"'
        )
        assert "x-ratelimit-limit" not in response.headers
        assert counts["evalsha"] == 1
        assert [k for k in await valkey.keys("*") if b"mallory" in k] == []  # no bucket was charged
        scraped = (await client.get("/metrics")).text
    samples = metric_samples(scraped)
    assert samples[("bastion_token_rejections_total", (("code", "TOKEN_REVOKED"),))] == 1.0
    assert ("bastion_rate_limit_rejections_total", (("bucket", "user"),)) not in samples


async def test_a_token_without_jti_is_invalid(valkey: redis.Redis, valkey_url: str, key: Path) -> None:
    minter = TokenMinter("RS256")
    key.write_bytes(minter.public_pem())
    app = items().build(settings_for(valkey_url, key))  # type: ignore[arg-type]
    token = minter.mint(sub="alice", jti=None)
    async with running(app), http(app) as client:
        response = await client.get("/api/v1/items", headers={"authorization": f"Bearer {token}"})
    assert (response.status_code, response.json()["code"]) == (401, "INVALID_TOKEN")


async def test_an_operator_token_layer_keeps_the_separate_check(valkey_url: str, key: Path) -> None:
    """A layer of the operator's between token auth and the limiter must not see a revoked token's claims."""
    service = items()
    service.use(Slot.TOKEN_AUTH, lambda app: app)
    app = service.build(settings_for(valkey_url, key))  # type: ignore[arg-type]
    assert app.token_auth is not None and not app.token_auth.defer_revocation


async def test_without_a_cache_store_url_nothing_is_deferred(key: Path) -> None:
    settings = load_settings(
        environ={
            "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(key),
            "SERVICE_TOKEN_REVOCATION_ENABLED": "true",
            "SERVICE_RATE_LIMIT_ENABLED": "true",
            "SERVICE_RATE_LIMIT_DISTRIBUTED": "true",
        }
    )
    app = items().build(settings)
    assert app.token_auth is not None and not app.token_auth.defer_revocation


async def test_cache_store_outage_fails_closed(dead_redis_url: str, key: Path, minter: TokenMinter) -> None:
    app = items().build(settings_for(dead_redis_url, key))  # type: ignore[arg-type]
    assert app.token_auth is not None and app.token_auth.defer_revocation
    async with http(app) as client:
        response = await client.get("/api/v1/items", headers=bearer(minter, "t-1"))
    assert (response.status_code, response.json()["code"]) == (500, "CACHE_STORE_ERROR")
