"""End to end: the example's policy matrix and the bypass paths over a real ``bastion run`` process."""

from __future__ import annotations

import socket
from collections.abc import Callable

import httpx
import pytest

from bastion.testing import TokenMinter
from tests.conftest import BastionProcess

EXAMPLE = ("examples.documents_api:service", "--config", "examples/documents_api/config.toml")
FORBIDDEN = {"error": "Access denied by policy", "code": "FORBIDDEN", "status": 403}


@pytest.fixture(scope="module")
def example(module_bastion_process: Callable[..., BastionProcess], key_env: dict[str, str]) -> BastionProcess:
    return module_bastion_process(*EXAMPLE, env=key_env)


def as_user(minter: TokenMinter, sub: str, *roles: str) -> dict[str, str]:
    return {"authorization": "Bearer " + minter.mint(sub=sub, roles=list(roles))}


@pytest.mark.parametrize("version", [1, 2])
def test_policy_matrix(example: BastionProcess, minter: TokenMinter, version: int) -> None:
    user, admin = as_user(minter, "alice", "user"), as_user(minter, "root", "admin")
    base = f"{example.url}/api/v{version}"
    assert httpx.get(f"{base}/documents", headers=user).status_code == 200
    assert httpx.get(f"{base}/documents/alice/doc-1", headers=user).status_code == 200
    other = httpx.get(f"{base}/documents/bob/doc-3", headers=user)
    assert (other.status_code, other.json()) == (403, FORBIDDEN)
    assert httpx.get(f"{base}/documents/bob/doc-3", headers=admin).status_code == 200
    users = httpx.get(f"{base}/admin/users", headers=user)
    assert (users.status_code, users.json()) == (403, FORBIDDEN)
    listed = httpx.get(f"{base}/admin/users", headers=admin)
    assert listed.status_code == 200
    assert {"id": "admin", "username": "Administrator", "roles": ["admin"]} in listed.json()
    assert httpx.get(f"{base}/documents").status_code == 401


BYPASS_PATHS = [
    "//api/v1/admin/users",
    "/api/v1/admin/users/",
    "/api/v1/./admin/users",
    "/api/v1/documents/../admin/users",
    "/api/v1/documents/%2e%2e/admin/users",
    "/api/v1/documents%2F..%2Fadmin/users",
    "/api/v1/documents/..%2Fadmin%2Fusers",
    "/api/v1/%61dmin/users",
    "/API/v1/admin/users",
    "/api/v1/Admin/users",
    "/api/v1/admin/users?x=1",
    "/api/v1/admin/users%3F",
    "/api/v1/admin/users%23",
    "/api/v1/admin/users/.",
    "/api/v1/admin/users/..",
    "/api/v1/documents/alice/../../admin/users",
]


@pytest.mark.parametrize("path", BYPASS_PATHS)
def test_bypass_paths_are_never_served_to_a_user(example: BastionProcess, minter: TokenMinter, path: str) -> None:
    """Sent raw (no client-side normalization), each is authorized as the route it reaches, or rejected."""
    authorization = as_user(minter, "alice", "user")["authorization"]
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {authorization}\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", example.port), timeout=10) as sock:
        sock.sendall(request.encode())
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    status = int(reply.split(b" ", 2)[1])
    # Every spelling reaches the admin route (or an unknown path): the policy denies a user either way.
    assert status == 403, (path, reply[:200])
    assert b"Administrator" not in reply


def test_reload_route_is_admin_only(example: BastionProcess, minter: TokenMinter) -> None:
    assert httpx.post(example.url + "/admin/reload-policy", headers=as_user(minter, "alice", "user")).status_code == 403
    reloaded = httpx.post(example.url + "/admin/reload-policy", headers=as_user(minter, "root", "admin"))
    assert reloaded.status_code == 200 and reloaded.json()["policies"] == 7
