"""Beyond one instance: a policy reload and a token revocation on one instance reach the others by the broker;
the decision cache can live in the cache store, shared by the instances."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bastion import BastionApp, ConfigError, Service, load_settings
from bastion.testing import TokenMinter
from tests.bastion.broker.conftest import client_for, eventually
from tests.conftest import running
from tests.nats_server import NatsServer

ALLOW = """
permit(principal, action, resource) when { principal.roles.contains("admin") };
permit(principal is User, action == Action::"GET /api/v1/me", resource);
"""
FORBID_ME = (
    ALLOW
    + """
forbid(principal, action == Action::"GET /api/v1/me", resource) unless { principal.roles.contains("admin") };
"""
)


@pytest.fixture(scope="module")
def minter() -> TokenMinter:
    return TokenMinter("ES256")


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def instance(name: str, broker_url: str | None, tmp_path: Path, minter: TokenMinter, **environ: str) -> BastionApp:
    key = tmp_path / "public.pem"
    key.write_bytes(minter.public_pem())
    service = Service(name)
    v1 = service.version(1)

    @v1.get("/me")
    async def me() -> dict[str, bool]:
        return {"me": True}

    service.mount_revoke_token_route()
    service.mount_policy_reload_route()
    settings = load_settings(
        environ={
            "SERVICE_TOKEN_ALGORITHM": "ES256",
            "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(key),
            "SERVICE_TOKEN_REVOCATION_ENABLED": "true",
            "SERVICE_POLICY_POLICY_PATH": str(tmp_path / "policies.cedar"),
            "SERVICE_POLICY_HOT_RELOAD": "false",  # only the announcement may make the other instance reload
            "SERVICE_RATE_LIMIT_ENABLED": "false",
            **({"SERVICE_BROKER_URL": broker_url, "SERVICE_BROKER_LAZY_INIT": "false"} if broker_url else {}),
            **environ,
        }
    )
    return service.build(settings)


@contextlib.asynccontextmanager
async def two_instances(
    broker_url: str | None, tmp_path: Path, minter: TokenMinter, name: str, **environ: str
) -> AsyncIterator[tuple[BastionApp, BastionApp]]:
    (tmp_path / "policies.cedar").write_text(ALLOW)
    first = instance(name, broker_url, tmp_path, minter, **environ)
    second = instance(name, broker_url, tmp_path, minter, **environ)
    async with running(first), running(second):
        yield first, second


async def test_a_reload_on_one_instance_reloads_the_others(
    nats_server: NatsServer, tmp_path: Path, minter: TokenMinter, uid: str
) -> None:
    user, admin = minter.mint(sub="alice"), minter.mint(sub="root", roles=["admin"])
    async with (
        two_instances(nats_server.url, tmp_path, minter, f"docs-{uid}") as (first, second),
        client_for(first) as one,
        client_for(second) as other,
    ):
        assert (await other.get("/api/v1/me", headers=bearer(user))).status_code == 200  # allowed, cached
        (tmp_path / "policies.cedar").write_text(FORBID_ME)
        reloaded = await one.post("/admin/reload-policy", headers=bearer(admin))
        assert reloaded.status_code == 200
        assert second.policy is not None
        await eventually(
            lambda: second.policy is not None and second.policy.policies.digest == reloaded.json()["digest"],
            what="the second instance reloaded",
        )
        denied = await other.get("/api/v1/me", headers=bearer(user))
    assert (denied.status_code, denied.json()["code"]) == (403, "FORBIDDEN")


async def test_a_revocation_on_one_instance_is_applied_by_the_others(
    nats_server: NatsServer, tmp_path: Path, minter: TokenMinter, uid: str
) -> None:
    victim, admin = minter.mint(sub="alice", jti=f"victim-{uid}"), minter.mint(sub="root", roles=["admin"])
    async with (
        two_instances(nats_server.url, tmp_path, minter, f"docs-{uid}") as (first, second),
        client_for(first) as one,
        client_for(second) as other,
    ):
        assert (await other.get("/api/v1/me", headers=bearer(victim))).status_code == 200  # verified, cached
        revoked = await one.post(
            "/admin/revoke-token", json={"jti": f"victim-{uid}", "reason": "stolen"}, headers=bearer(admin)
        )
        assert revoked.status_code == 200
        assert second.token_auth is not None and len(second.token_auth.tokens) == 1
        await eventually(
            lambda: second.token_auth is not None and len(second.token_auth.tokens) == 0,
            what="evicted from the second instance's verified-token cache",
        )
        refused = await other.get("/api/v1/me", headers=bearer(victim))
    assert (refused.status_code, refused.json()["code"]) == (401, "TOKEN_REVOKED")


async def test_without_a_broker_the_other_instance_does_not_learn_of_it(
    tmp_path: Path, minter: TokenMinter, uid: str
) -> None:
    """The control for the two tests above: in-process stores and no broker keep each instance to itself."""
    victim, admin = minter.mint(sub="alice", jti=f"victim-{uid}"), minter.mint(sub="root", roles=["admin"])
    async with (
        two_instances(None, tmp_path, minter, f"docs-{uid}") as (first, second),
        client_for(first) as one,
        client_for(second) as other,
    ):
        await one.post("/admin/revoke-token", json={"jti": f"victim-{uid}", "reason": "r"}, headers=bearer(admin))
        assert (await one.get("/api/v1/me", headers=bearer(victim))).status_code == 401
        assert (await other.get("/api/v1/me", headers=bearer(victim))).status_code == 200


class TestSharedDecisionCache:
    async def test_instances_share_decisions_in_the_cache_store(
        self, tmp_path: Path, minter: TokenMinter, valkey_url: str, uid: str
    ) -> None:
        user = minter.mint(sub=f"alice-{uid}")
        shared = {"SERVICE_CACHE_STORE_URL": valkey_url, "SERVICE_POLICY_CACHE_BACKEND": "cache_store"}
        async with (
            two_instances(None, tmp_path, minter, f"docs-{uid}", **shared) as (first, second),
            client_for(first) as one,
            client_for(second) as other,
        ):
            assert (await one.get("/api/v1/me", headers=bearer(user))).status_code == 200
            assert (await other.get("/api/v1/me", headers=bearer(user))).status_code == 200
            assert first.policy is not None and second.policy is not None
            assert (first.policy.evaluations, second.policy.evaluations) == (1, 0)
            # A new policy version is a new key: the second instance evaluates again after its reload.
            (tmp_path / "policies.cedar").write_text(FORBID_ME)
            second.reload_policies()
            denied = await other.get("/api/v1/me", headers=bearer(user))
            assert (denied.status_code, second.policy.evaluations) == (403, 1)

    async def test_a_cache_store_outage_fails_closed_with_500(
        self, tmp_path: Path, minter: TokenMinter, dead_redis_url: str, uid: str
    ) -> None:
        user = minter.mint(sub="alice")
        down = {
            "SERVICE_CACHE_STORE_URL": dead_redis_url,
            "SERVICE_CACHE_STORE_TIMEOUT_SECS": "0.5",
            "SERVICE_POLICY_CACHE_BACKEND": "cache_store",
            "SERVICE_TOKEN_REVOCATION_ENABLED": "false",
        }
        (tmp_path / "policies.cedar").write_text(ALLOW)
        app = instance(f"docs-{uid}", None, tmp_path, minter, **down)
        async with client_for(app) as client:
            response = await client.get("/api/v1/me", headers=bearer(user))
        await app.aclose()
        assert (response.status_code, response.json()) == (
            500,
            {"error": "Cache store unavailable", "code": "CACHE_STORE_ERROR", "status": 500},
        )

    def test_the_cache_store_backend_without_a_cache_store_refuses_to_build(
        self, tmp_path: Path, minter: TokenMinter
    ) -> None:
        (tmp_path / "policies.cedar").write_text(ALLOW)
        with pytest.raises(ConfigError) as refused:
            instance("docs", None, tmp_path, minter, SERVICE_POLICY_CACHE_BACKEND="cache_store")
        assert str(refused.value) == (
            'policy.cache_backend = "cache_store" shares decisions through the cache store, but cache_store.url is '
            'not set: set it (or SERVICE_CACHE_STORE_URL), or use cache_backend = "memory"'
        )
