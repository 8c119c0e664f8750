"""Tests of the README's service (examples/readme_service) with bastion.testing: the file docs/testing.md shows.

The service's own service.toml names keys/jwt-public.pem, which tests do not have: the client replaces the
token key with one it generates and keeps every other setting (the policy file, the algorithm, ...).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion import Service
from bastion.testing import AsyncServiceClient, ServiceClient
from examples.readme_service import app

CONFIG = Path(app.__file__).with_name("service.toml")
DENIED = {"error": "Access denied by policy", "code": "FORBIDDEN", "status": 403}


@pytest.fixture
def bastion_service() -> Service:
    return app.service


@pytest.fixture
def bastion_config() -> Path:
    return CONFIG


def test_health_is_public(bastion_client: ServiceClient) -> None:
    response = bastion_client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "healthy", "service": "documents-api", "version": "1.0.0"}


def test_a_reader_lists_documents(bastion_client: ServiceClient) -> None:
    alice = bastion_client.as_user("alice", roles=["reader"])
    response = alice.get("/api/v2/documents", params={"limit": 1})
    assert response.status_code == 200
    assert response.json() == {
        "items": [{"id": "doc-1", "owner_id": "alice", "title": "Quarterly report"}],
        "total": 3,
        "caller": "alice",
    }


def test_without_a_token_gets_401(bastion_client: ServiceClient) -> None:
    response = bastion_client.get("/api/v2/documents")
    assert response.status_code == 401
    assert response.json() == {"error": "Missing bearer token", "code": "UNAUTHORIZED", "status": 401}
    assert response.headers["www-authenticate"] == 'Bearer realm="documents-api"'


def test_an_expired_token_gets_401(bastion_client: ServiceClient) -> None:
    """``ttl`` (seconds) is a claim like any other; the service allows 60 s of clock skew by default."""
    response = bastion_client.as_user("alice", roles=["reader"], ttl=-120).get("/api/v2/documents")
    assert response.status_code == 401
    assert response.json() == {"error": "Token has expired", "code": "TOKEN_EXPIRED", "status": 401}


def test_the_policy_denies_a_user_without_the_reader_role(bastion_client: ServiceClient) -> None:
    response = bastion_client.as_user("bob", roles=["guest"]).get("/api/v2/documents")
    assert response.status_code == 403
    assert response.json() == DENIED


def test_v1_answers_with_deprecation_headers(bastion_client: ServiceClient) -> None:
    response = bastion_client.as_user("alice", roles=["reader"]).get("/api/v1/documents")
    assert response.status_code == 200
    assert len(response.json()) == 3
    assert response.headers["deprecation"] == 'version="v1"'
    assert response.headers["sunset"] == "Wed, 30 Jun 2027 00:00:00 GMT"
    assert response.headers["link"] == '</v2/>; rel="successor-version"'
    assert response.headers["warning"] == (
        '299 - "API version v1 is deprecated. Please migrate to version v2. v2 pages the document list."'
    )


def test_the_rate_limit_answers_429() -> None:
    """Settings overrides take the ``SERVICE_*`` names the service reads in production."""
    with ServiceClient(app.service, config=CONFIG, environ={"SERVICE_RATE_LIMIT_PER_USER_RPM": "2"}) as client:
        alice = client.as_user("alice", roles=["reader"])
        assert [alice.get("/api/v2/documents").status_code for _ in range(2)] == [200, 200]
        response = alice.get("/api/v2/documents")
    assert response.status_code == 429
    body = response.json()
    retry_after = body.pop("retry_after")
    assert body == {"error": "Rate limit exceeded", "code": "RATE_LIMIT_EXCEEDED", "status": 429}
    # 2 a minute: both at once, then one every 30 seconds; the wait left is rounded up (30 unless the
    # three requests took over a second), and the header says the same.
    assert 0 < retry_after <= 30
    assert response.headers["retry-after"] == str(retry_after)
    assert response.headers["x-ratelimit-remaining"] == "0"


async def test_the_async_client(bastion_async_client: AsyncServiceClient) -> None:
    reader = bastion_async_client.as_user("alice", roles=["reader"])
    assert (await reader.get("/api/v2/documents")).status_code == 200
    assert (await bastion_async_client.as_user("bob").get("/api/v2/documents")).json() == DENIED


async def test_an_async_client_of_its_own() -> None:
    async with AsyncServiceClient(app.service, config=CONFIG) as client:
        response = await client.as_user("carol", roles=["reader"]).get("/api/v2/documents", params={"limit": 2})
    assert response.status_code == 200
    assert [item["id"] for item in response.json()["items"]] == ["doc-1", "doc-2"]
