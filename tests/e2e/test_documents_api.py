"""End to end: ``bastion run`` of the example (what ``make run`` does) over a real socket."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from bastion.testing import TokenMinter
from tests.bastion.test_listener import HEADERS_TOO_LARGE
from tests.conftest import TOKEN_OFF, BastionProcess

EXAMPLE = ("examples.documents_api:service", "--config", "examples/documents_api/config.toml")


@pytest.fixture(scope="module")
def example(module_bastion_process: Callable[..., BastionProcess], key_env: dict[str, str]) -> BastionProcess:
    """One example process shared by the read-mostly tests of this module."""
    return module_bastion_process(*EXAMPLE, env=key_env)


@pytest.fixture(scope="module")
def user(minter: TokenMinter) -> dict[str, str]:
    return {"authorization": "Bearer " + minter.mint(sub="alice", roles=["user"], ttl=3600)}


def test_health_and_ready(example: BastionProcess) -> None:
    health = httpx.get(example.url + "/health")
    assert health.status_code == 200
    assert health.json() == {"status": "healthy", "service": "documents-api", "version": "1.0.0"}
    ready = httpx.get(example.url + "/ready")
    assert ready.status_code == 200
    assert ready.json() == {"ready": True, "service": "documents-api", "dependencies": {}}


def test_v1_list_is_deprecated_with_headers(example: BastionProcess, user: dict[str, str]) -> None:
    response = httpx.get(example.url + "/api/v1/documents", headers=user)
    assert response.status_code == 200
    assert isinstance(response.json(), list) and response.json()
    assert set(response.json()[0]) == {"id", "owner_id", "title", "content"}
    assert response.headers["deprecation"] == 'version="v1"'
    assert response.headers["sunset"] == "Wed, 30 Jun 2027 00:00:00 GMT"
    assert response.headers["link"] == '</v2/>; rel="successor-version"'
    assert response.headers["warning"] == (
        '299 - "API version v1 is deprecated. Please migrate to version v2. v2 pages the document list."'
    )
    example.wait_for_output("deprecated_api_version_accessed")
    line = next(json.loads(raw) for raw in example.output().splitlines() if "deprecated_api_version_accessed" in raw)
    assert line["level"] == "warning"
    assert line["deprecated_version"] == "v1" and line["replacement_version"] == "v2"
    assert line["sunset_date"] == "2027-06-30T00:00:00Z"
    assert line["request_id"] == response.headers["x-request-id"]


def test_v2_list_is_paged_and_not_deprecated(example: BastionProcess, user: dict[str, str]) -> None:
    first = httpx.get(example.url + "/api/v2/documents", params={"limit": 2}, headers=user)
    assert first.status_code == 200
    assert "deprecation" not in first.headers
    page = first.json()
    assert set(page) == {"items", "next_cursor"} and len(page["items"]) == 2
    rest = httpx.get(example.url + "/api/v2/documents", params={"cursor": page["next_cursor"]}, headers=user).json()
    assert rest["next_cursor"] is None
    assert {d["id"] for d in page["items"]}.isdisjoint({d["id"] for d in rest["items"]})


def test_crud_round_trip_on_v2(example: BastionProcess, user: dict[str, str]) -> None:
    body = {"title": "T", "content": "C", "owner_id": "carol"}
    created = httpx.post(example.url + "/api/v2/documents", json=body, headers=user)
    assert created.status_code == 200
    doc = created.json()
    assert doc["owner_id"] == "alice"
    path = f"{example.url}/api/v2/documents/{doc['owner_id']}/{doc['id']}"
    assert httpx.get(path, headers=user).json() == doc
    updated = httpx.put(path, json={"title": "T2", "content": "C2"}, headers=user).json()
    assert updated["title"] == "T2"
    assert httpx.delete(path, headers=user).status_code == 200
    assert httpx.get(path, headers=user).status_code == 404


class TestTokenAuth:
    def test_no_token_is_401(self, example: BastionProcess) -> None:
        response = httpx.get(example.url + "/api/v2/documents")
        assert response.status_code == 401
        assert response.json() == {"error": "Missing bearer token", "code": "UNAUTHORIZED", "status": 401}
        assert response.headers["www-authenticate"] == 'Bearer realm="documents-api"'

    def test_valid_token_is_200(self, example: BastionProcess, user: dict[str, str]) -> None:
        assert httpx.get(example.url + "/api/v2/documents", headers=user).status_code == 200

    def test_expired_token_is_401(self, example: BastionProcess, minter: TokenMinter) -> None:
        token = minter.mint(sub="alice", ttl=-120)
        response = httpx.get(example.url + "/api/v2/documents", headers={"authorization": f"Bearer {token}"})
        assert response.status_code == 401
        assert response.json()["code"] == "TOKEN_EXPIRED"
        assert 'error="invalid_token"' in response.headers["www-authenticate"]

    def test_token_from_another_key_is_401(self, example: BastionProcess) -> None:
        token = TokenMinter("RS256").mint(sub="alice")
        response = httpx.get(example.url + "/api/v2/documents", headers={"authorization": f"Bearer {token}"})
        assert (response.status_code, response.json()["code"]) == (401, "INVALID_TOKEN")

    def test_revoked_token_is_401(self, example: BastionProcess, minter: TokenMinter) -> None:
        victim = minter.mint(sub="bob", roles=["user"], jti="e2e-revoked-1", ttl=600)
        headers = {"authorization": f"Bearer {victim}"}
        assert httpx.get(example.url + "/api/v2/documents", headers=headers).status_code == 200
        admin = {"authorization": "Bearer " + minter.mint(sub="admin", roles=["admin"])}
        revoked = httpx.post(
            example.url + "/admin/revoke-token", json={"jti": "e2e-revoked-1", "reason": "laptop stolen"}, headers=admin
        )
        assert revoked.status_code == 200
        assert revoked.json() == {"revoked": True, "jti": "e2e-revoked-1"}
        response = httpx.get(example.url + "/api/v2/documents", headers=headers)
        assert response.status_code == 401
        assert response.json() == {"error": "Token has been revoked", "code": "TOKEN_REVOKED", "status": 401}

    def test_revoke_route_needs_the_admin_role(self, example: BastionProcess, user: dict[str, str]) -> None:
        response = httpx.post(example.url + "/admin/revoke-token", json={"jti": "x", "reason": "r"}, headers=user)
        assert response.status_code == 403
        assert response.json()["code"] == "FORBIDDEN"

    def test_health_ready_and_docs_are_public(self, example: BastionProcess) -> None:
        for path in ("/health", "/ready", "/api/v2/openapi.json"):
            assert httpx.get(example.url + path).status_code == 200, path


def test_unmatched_path_is_empty_404(example: BastionProcess, minter: TokenMinter) -> None:
    admin = {"authorization": "Bearer " + minter.mint(sub="admin", roles=["admin"])}
    response = httpx.get(example.url + "/definitely/not/here", headers=admin)
    assert response.status_code == 404
    assert response.content == b""


def test_request_id_echo_and_security_headers(example: BastionProcess, user: dict[str, str]) -> None:
    response = httpx.get(example.url + "/api/v2/documents", headers={"x-request-id": "e2e-abc-1", **user})
    assert response.headers["x-request-id"] == "e2e-abc-1"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["referrer-policy"] == "no-referrer"
    generated = httpx.get(example.url + "/nowhere").headers["x-request-id"]
    assert len(generated) == 32


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"),
    [
        pytest.param(
            "POST",
            "/api/v2/documents",
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
            400,
            id="malformed-json",
        ),
        pytest.param("POST", "/api/v2/documents", {"json": {"title": 5}}, 422, id="wrong-types"),
        pytest.param(
            "POST",
            "/api/v2/documents",
            {"content": b"title=x", "headers": {"content-type": "text/plain"}},
            422,
            id="wrong-content-type",
        ),
        pytest.param("POST", "/api/v2/documents", {"content": b"x" * 1_100_000}, 413, id="oversized"),
        pytest.param("GET", "/api/v2/documents", {"params": {"limit": "-3"}}, 422, id="bad-query"),
        pytest.param("GET", "/api/v2/documents/alice/nope", {}, 404, id="missing-doc"),
    ],
)
def test_bad_input_gets_the_error_shape(
    example: BastionProcess, user: dict[str, str], method: str, path: str, kwargs: dict[str, object], status: int
) -> None:
    kwargs = dict(kwargs)
    headers = {**user, **kwargs.pop("headers", {})}  # type: ignore[dict-item]
    response = httpx.request(method, example.url + path, headers=headers, **kwargs)  # type: ignore[arg-type]
    assert response.status_code == status
    body = response.json()
    assert set(body) == {"error", "code", "status"} and body["status"] == status


def test_absurd_header_is_431_without_a_crash(example: BastionProcess) -> None:
    with socket.create_connection(("127.0.0.1", example.port), timeout=5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Huge: " + b"a" * 200_000 + b"\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply == HEADERS_TOO_LARGE
    assert httpx.get(example.url + "/health").status_code == 200


def test_garbage_request_line_gets_400(example: BastionProcess) -> None:
    with socket.create_connection(("127.0.0.1", example.port), timeout=5) as sock:
        sock.sendall(b"\x16\x03\x01garbage\r\n\r\n")
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 400")
    assert httpx.get(example.url + "/health").status_code == 200


def test_500_shows_no_traceback_and_logs_request_id(bastion_process: Callable[..., BastionProcess]) -> None:
    process = bastion_process("slow_service:service", "--app-dir", "tests/e2e/apps", env=TOKEN_OFF)
    response = httpx.get(process.url + "/api/v1/boom", headers={"x-request-id": "boom-1"})
    assert response.status_code == 500
    assert response.json() == {"error": "Internal server error", "code": "INTERNAL_ERROR", "status": 500}
    assert "secret internal detail" not in response.text
    process.wait_for_output("unhandled_exception")
    line = next(json.loads(raw) for raw in process.output().splitlines() if "unhandled_exception" in raw)
    assert line["request_id"] == "boom-1"
    assert "secret internal detail" in line["exception"]


def test_sigterm_drains_in_flight_requests(bastion_process: Callable[..., BastionProcess]) -> None:
    process = bastion_process("slow_service:service", "--app-dir", "tests/e2e/apps", env=TOKEN_OFF)
    result: dict[str, httpx.Response] = {}

    def call() -> None:
        result["response"] = httpx.get(process.url + "/api/v1/slow", params={"seconds": 1.5}, timeout=20)

    worker = threading.Thread(target=call)
    worker.start()
    process.wait_for_output("slow_request_started")
    process.proc.send_signal(signal.SIGTERM)
    worker.join(timeout=20)
    assert result["response"].status_code == 200
    assert result["response"].json() == {"slept": 1.5}
    assert process.proc.wait(timeout=20) == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(process.url + "/health")


def test_sigint_stops_cleanly(bastion_process: Callable[..., BastionProcess], key_env: dict[str, str]) -> None:
    process = bastion_process(*EXAMPLE, env=key_env)
    assert process.stop(signal.SIGINT) == 0


def test_multiple_workers_serve_the_same_port(
    bastion_process: Callable[..., BastionProcess], key_env: dict[str, str], user: dict[str, str]
) -> None:
    process = bastion_process(*EXAMPLE, "--workers", "2", env=key_env)
    for _ in range(10):
        response = httpx.get(process.url + "/api/v2/documents", headers={"connection": "close", **user})
        assert response.status_code == 200
    deadline = time.monotonic() + 20  # the second worker may still be starting when the first answers
    while process.output().count("service_started") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.output().count("service_started") == 2
    assert process.stop(signal.SIGTERM) == 0
