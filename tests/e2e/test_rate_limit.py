"""End to end: rate limiting in real ``bastion run`` processes over real sockets (and a real Valkey)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import pytest

from bastion.testing import TokenMinter
from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
from examples.documents_api.proto.documents.v1 import documents_pb2_grpc as pb_grpc
from tests.conftest import BastionProcess

SLOW_SERVICE = ("slow_service:service", "--app-dir", "tests/e2e/apps")
EXAMPLE = ("examples.documents_api:service", "--config", "examples/documents_api/config.toml")
LIMITED = "/api/v1/slow?seconds=0"
UNMATCHED = "/api/v1/nothing-here"  # no route: 404, but still charged to the caller's global bucket
PUBLIC = "/api/v1/openapi.json"


@pytest.fixture(scope="module")
def public_key(minter: TokenMinter, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "public.pem"
    path.write_bytes(minter.public_pem())
    return path


def write_config(directory: Path, public_key: Path, extra: str = "", *, route_rule: bool = True) -> Path:
    """Token auth on (the OpenAPI document public); per hour 2 requests per user and 3 per IP; 1 per second on
    the slow route."""
    rule = '[rate_limit.routes."GET /api/v1/slow"]\nrequests_per_second = 1\nburst_size = 1\n' if route_rule else ""
    path = directory / f"ratelimit-{uuid.uuid4().hex[:6]}.toml"
    path.write_text(
        f"""
[service]
name = "rate-limit-e2e"

[token]
algorithm = "RS256"
public_key_path = "{public_key}"
exclude_paths = ["{PUBLIC}"]

[rate_limit]
per_user_rpm = 2
per_ip_rpm = 3
window_secs = 3600

{rule}
{extra}
"""
    )
    return path


@pytest.fixture(scope="module")
def limited(
    module_bastion_process: Callable[..., BastionProcess],
    public_key: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> BastionProcess:
    config = write_config(tmp_path_factory.mktemp("config"), public_key)
    return module_bastion_process(*SLOW_SERVICE, "--config", str(config))


def bearer(minter: TokenMinter, sub: str) -> dict[str, str]:
    return {"authorization": "Bearer " + minter.mint(sub=sub, ttl=600)}


def test_429_body_and_headers(limited: BastionProcess, minter: TokenMinter) -> None:
    headers = bearer(minter, "carol")
    first = httpx.get(limited.url + UNMATCHED, headers=headers)
    assert first.status_code == 404
    assert (first.headers["x-ratelimit-limit"], first.headers["x-ratelimit-remaining"]) == ("2", "1")
    assert abs(int(first.headers["x-ratelimit-reset"]) - (time.time() + 1800)) <= 5
    assert httpx.get(limited.url + UNMATCHED, headers=headers).status_code == 404
    refused = httpx.get(limited.url + UNMATCHED, headers={**headers, "x-request-id": "e2e-rl-1", "user-agent": "e2e/1"})
    assert refused.status_code == 429
    assert refused.json() == {
        "error": "Rate limit exceeded",
        "code": "RATE_LIMIT_EXCEEDED",
        "status": 429,
        "retry_after": 1800,
    }
    assert refused.headers["content-type"] == "application/json"
    assert refused.headers["retry-after"] == "1800"
    assert refused.headers["x-ratelimit-limit"] == "2"
    assert refused.headers["x-ratelimit-remaining"] == "0"
    assert abs(int(refused.headers["x-ratelimit-reset"]) - (time.time() + 3600)) <= 5
    assert refused.headers["x-request-id"] == "e2e-rl-1"
    limited.wait_for_output('"e2e-rl-1"')
    event = next(
        json.loads(line) for line in limited.output().splitlines() if "HttpRequestDenied" in line and "e2e-rl-1" in line
    )
    assert (event["level"], event["subject"], event["user_agent"]) == ("warning", "carol", "e2e/1")
    assert event["client_ip"] == "127.0.0.1"
    assert event["details"]["event_type"] == "http.request.denied"
    assert event["details"]["bucket"] == "rate_limit:user:carol:3600"


def test_retry_after_is_honoured(limited: BastionProcess, minter: TokenMinter) -> None:
    """A rule of one request per second: after a 429, waiting Retry-After (1 s) is enough."""
    headers = bearer(minter, "dave")
    assert httpx.get(limited.url + LIMITED, headers=headers).status_code == 200
    for _ in range(5):  # the next request within the second is refused (a few tries for a very slow machine)
        refused = httpx.get(limited.url + LIMITED, headers=headers)
        if refused.status_code == 429:
            break
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    time.sleep(int(refused.headers["retry-after"]))
    assert httpx.get(limited.url + LIMITED, headers=headers).status_code == 200


def test_spoofed_forwarded_for_is_ignored_when_untrusted(limited: BastionProcess) -> None:
    statuses = [
        httpx.get(limited.url + PUBLIC, headers={"x-forwarded-for": f"203.0.113.{n}", "x-real-ip": f"198.51.100.{n}"})
        for n in range(5)
    ]
    assert [r.status_code for r in statuses] == [200, 200, 200, 429, 429]


def test_forwarded_for_separates_clients_when_trusted(
    bastion_process: Callable[..., BastionProcess], public_key: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path, public_key)
    process = bastion_process(
        *SLOW_SERVICE, "--config", str(config), env={"SERVICE_RATE_LIMIT_TRUST_FORWARDED_HEADERS": "true"}
    )
    distinct = [httpx.get(process.url + PUBLIC, headers={"x-forwarded-for": f"203.0.113.{n}"}) for n in range(5)]
    assert [r.status_code for r in distinct] == [200] * 5
    same = [httpx.get(process.url + PUBLIC, headers={"x-forwarded-for": "192.0.2.77, 10.0.0.1"}) for _ in range(4)]
    assert [r.status_code for r in same] == [200, 200, 200, 429]


def test_example_config_shows_a_429_on_document_creation(
    bastion_process: Callable[..., BastionProcess], public_key: Path, minter: TokenMinter
) -> None:
    """The example's visible rule: POST /api/*/documents, 10 a minute per user."""
    process = bastion_process(*EXAMPLE, env={"SERVICE_TOKEN_PUBLIC_KEY_PATH": str(public_key)})
    headers = {"authorization": "Bearer " + minter.mint(sub="erin", roles=["user"], ttl=600)}
    body = {"title": "t", "content": "c"}
    statuses = [
        httpx.post(process.url + f"/api/v{1 + n % 2}/documents", json=body, headers=headers).status_code
        for n in range(11)
    ]
    assert statuses == [200] * 10 + [429]
    assert httpx.get(process.url + "/api/v2/documents", headers=headers).status_code == 200


def test_two_processes_share_one_distributed_limit(
    bastion_process: Callable[..., BastionProcess],
    public_key: Path,
    minter: TokenMinter,
    tmp_path: Path,
    valkey_url: str,
) -> None:
    """Two instances on one Valkey, hammered concurrently: N requests pass in total, not 2N."""
    limit = 10
    extra = f'\n[cache_store]\nurl = "{valkey_url}"\nmax_connections = 32\n'
    config = write_config(tmp_path, public_key, extra, route_rule=False)
    env = {
        "SERVICE_RATE_LIMIT_DISTRIBUTED": "true",
        "SERVICE_RATE_LIMIT_PER_USER_RPM": str(limit),
    }
    first = bastion_process(*SLOW_SERVICE, "--config", str(config), env=env)
    second = bastion_process(*SLOW_SERVICE, "--config", str(config), env=env)
    headers = bearer(minter, f"frank-{uuid.uuid4().hex[:8]}")
    urls = [process.url + LIMITED for process in (first, second)] * (2 * limit)

    def call(url: str) -> int:
        return httpx.get(url, headers=headers, timeout=10).status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(call, urls))
    assert statuses.count(200) == limit
    assert statuses.count(429) == len(urls) - limit


def test_distributed_limiter_with_revocation_one_round_trip_http_and_grpc(
    bastion_process: Callable[..., BastionProcess], key_env: dict[str, str], minter: TokenMinter, valkey_url: str
) -> None:
    """The example with its cache store on Valkey and the distributed limiter: the revocation check rides in the
    limiter's script; a revoked token is refused on HTTP and gRPC alike."""
    env = {**key_env, "SERVICE_CACHE_STORE_URL": valkey_url, "SERVICE_RATE_LIMIT_DISTRIBUTED": "true"}
    example = bastion_process(
        "examples.documents_api:service", "--config", "examples/documents_api/config.toml", env=env
    )
    victim = minter.mint(sub="eve", roles=["user"], jti="e2e-distributed-revoked", ttl=600)
    headers = {"authorization": f"Bearer {victim}"}
    assert httpx.get(example.url + "/api/v2/documents", headers=headers).status_code == 200
    admin = {"authorization": "Bearer " + minter.mint(sub="admin", roles=["admin"])}
    revoked = httpx.post(
        example.url + "/admin/revoke-token", json={"jti": "e2e-distributed-revoked", "reason": "r"}, headers=admin
    )
    assert revoked.status_code == 200
    response = httpx.get(example.url + "/api/v2/documents", headers=headers)
    assert (response.status_code, response.json()) == (
        401,
        {"error": "Token has been revoked", "code": "TOKEN_REVOKED", "status": 401},
    )
    assert 'error="invalid_token"' in response.headers["www-authenticate"]
    with grpc.insecure_channel(f"127.0.0.1:{example.port}") as channel:
        stub = pb_grpc.DocumentServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ListDocuments(pb.ListDocumentsRequest(), metadata=[("authorization", f"Bearer {victim}")], timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert (info.value.details() or "").startswith("TOKEN_REVOKED")
        fresh = minter.mint(sub="eve", roles=["user"], jti="e2e-distributed-fresh", ttl=600)
        reply = stub.ListDocuments(
            pb.ListDocumentsRequest(limit=1), metadata=[("authorization", f"Bearer {fresh}")], timeout=10
        )
        assert len(reply.items) == 1
