"""End to end: the example's policy matrix and the bypass paths over a real ``bastion run`` process."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from bastion.testing import TokenMinter
from tests.conftest import BASTION, REPO, BastionProcess, start_up_stderr

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


REACHES_NOTHING = {
    "/api/v1/admin/users/",
    "/API/v1/admin/users",
    "/api/v1/Admin/users",
    "/api/v1/admin/users%3F",
    "/api/v1/admin/users%23",
    "/api/v1/admin/users/.",
    "/api/v1/admin/users/..",
}
BYPASS_PATHS = [
    "//api/v1/admin/users",
    "/api/v1/./admin/users",
    "/api/v1/documents/../admin/users",
    "/api/v1/documents/%2e%2e/admin/users",
    "/api/v1/documents%2F..%2Fadmin/users",
    "/api/v1/documents/..%2Fadmin%2Fusers",
    "/api/v1/%61dmin/users",
    "/api/v1/admin/users?x=1",
    "/api/v1/documents/alice/../../admin/users",
    *sorted(REACHES_NOTHING),
]


@pytest.mark.parametrize("path", BYPASS_PATHS)
def test_bypass_paths_are_never_served_to_a_user(example: BastionProcess, minter: TokenMinter, path: str) -> None:
    """Sent raw (no client-side normalization), each is authorized as the route it reaches (the policy denies a
    user: 403), or reaches no route at all (the empty 404, no policy asked)."""
    authorization = as_user(minter, "alice", "user")["authorization"]
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {authorization}\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", example.port), timeout=10) as sock:
        sock.sendall(request.encode())
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    status = int(reply.split(b" ", 2)[1])
    assert status == (404 if path in REACHES_NOTHING else 403), (path, reply[:200])
    assert b"Administrator" not in reply


def test_reload_route_is_admin_only(example: BastionProcess, minter: TokenMinter) -> None:
    assert httpx.post(example.url + "/admin/reload-policy", headers=as_user(minter, "alice", "user")).status_code == 403
    reloaded = httpx.post(example.url + "/admin/reload-policy", headers=as_user(minter, "root", "admin"))
    assert reloaded.status_code == 200 and reloaded.json()["policies"] == 6


READERS_V2 = """
@id("readers-v2")
permit(principal, action, resource)
when { principal.roles.contains("reader") && context.method == "GET" && context.version == 2 };
"""


def test_context_method_and_version_decide(
    bastion_process: Callable[..., BastionProcess], key_env: dict[str, str], minter: TokenMinter, tmp_path: Path
) -> None:
    """One rule ("readers may GET anything in v2") through a real server, no route listed."""
    policies = tmp_path / "readers.cedar"
    policies.write_text(READERS_V2)
    process = bastion_process(*EXAMPLE, env={**key_env, "SERVICE_POLICY_POLICY_PATH": str(policies)})
    reader = as_user(minter, "rita", "reader")
    statuses = [
        httpx.get(f"{process.url}/api/v2/documents", headers=reader).status_code,
        httpx.get(f"{process.url}/api/v2/documents/bob/doc-3", headers=reader).status_code,
        httpx.get(f"{process.url}/api/v1/documents", headers=reader).status_code,
        httpx.post(f"{process.url}/api/v2/documents", json={"title": "t", "content": "c"}, headers=reader).status_code,
        httpx.get(f"{process.url}/api/v2/documents", headers=as_user(minter, "ursula", "user")).status_code,
    ]
    assert statuses == [200, 200, 403, 403, 403]


def test_a_policy_the_schema_rejects_stops_the_start(key_env: dict[str, str], tmp_path: Path) -> None:
    policies = tmp_path / "typo.cedar"
    policies.write_text(
        '// readers\n@id("readers")\npermit(principal, action, resource)\nwhen { principal.role.contains("reader") };\n'
    )
    env = {**os.environ, **key_env, "SERVICE_POLICY_POLICY_PATH": str(policies)}
    result = subprocess.run(
        [BASTION, "run", *EXAMPLE, "--host", "127.0.0.1", "--port", "0"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout, start_up_stderr(result.stderr)) == (
        2,
        "",
        f"error: policy.policy_path = {str(policies)!r} does not validate against the service's schema: statement 1 "
        '(line 2), @id("readers"): attribute `role` on entity type `User` not found; did you mean `roles`?\n',
    )


def test_openapi_operations_note_the_roles_the_policies_permit(example: BastionProcess) -> None:
    paths = httpx.get(f"{example.url}/api/v2/openapi.json").json()["paths"]
    assert paths["/api/v2/documents"]["get"]["x-permitted-roles"] == {"user": "any", "admin": "any"}
    assert paths["/api/v2/documents/{user_id}/{doc_id}"]["delete"]["x-permitted-roles"] == {
        "user": "own",
        "admin": "any",
    }
    assert paths["/api/v2/admin/users"]["get"]["x-permitted-roles"] == {"admin": "any"}
