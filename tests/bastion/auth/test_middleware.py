"""Token auth in the pipeline: bearer extraction, 401 codes and challenges, path rules, claims in handlers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import httpx
import pytest
from fastapi import Depends

from bastion import BastionApp, Service, Settings, load_settings
from bastion.auth import Claims, current_claims, optional_claims
from bastion.testing import TokenMinter

Client = Callable[..., httpx.AsyncClient]


@pytest.fixture(scope="module")
def minter() -> TokenMinter:
    return TokenMinter("ES256")


def service() -> Service:
    svc = Service("auth-test")
    v1 = svc.version(1)

    @v1.get("/me")
    async def me(claims: Annotated[Claims, Depends(current_claims)]) -> dict[str, object]:
        return {"sub": claims.sub, "roles": list(claims.roles), "extra": dict(claims.extra)}

    @v1.get("/public/info")
    async def info(claims: Annotated[Claims | None, Depends(optional_claims)]) -> dict[str, object]:
        return {"anonymous": claims is None}

    @v1.get("/private")
    async def private() -> dict[str, bool]:
        return {"private": True}

    svc.mount_revoke_token_route()
    return svc


@pytest.fixture
def settings(minter: TokenMinter, tmp_path: Path) -> Callable[..., Settings]:
    path = tmp_path / "public.pem"
    path.write_bytes(minter.public_pem())

    def make(**env: str) -> Settings:
        return load_settings(
            environ={
                "SERVICE_TOKEN_ENABLED": "true",
                "SERVICE_TOKEN_ALGORITHM": "ES256",
                "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(path),
                "SERVICE_TOKEN_EXCLUDE_PATHS": "/api/v1/public/*",
                "SERVICE_TOKEN_LEEWAY_SECONDS": "0",
                **env,
            }
        )

    return make


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


class TestExtraction:
    async def test_missing_header(self, asgi_client: Client, settings: Callable[..., Settings]) -> None:
        response = await asgi_client(service(), settings()).get("/api/v1/me")
        assert response.status_code == 401
        assert response.json() == {"error": "Missing bearer token", "code": "UNAUTHORIZED", "status": 401}
        assert response.headers["www-authenticate"] == 'Bearer realm="auth-test"'

    @pytest.mark.parametrize(
        "value",
        [
            pytest.param("Basic dXNlcjpwYXNz", id="basic"),
            pytest.param("Bearer", id="no-token"),
            pytest.param("Bearer ", id="empty-token"),
            pytest.param("Bearer a b", id="two-tokens"),
            pytest.param("Bearer tok\u00e9n", id="non-ascii"),
            pytest.param("Token abc", id="other-scheme"),
            pytest.param("Bearer abc,def", id="comma"),
        ],
    )
    async def test_malformed_header_is_unauthorized(
        self, asgi_client: Client, settings: Callable[..., Settings], value: str
    ) -> None:
        response = await asgi_client(service(), settings()).get(
            "/api/v1/me", headers=[(b"authorization", value.encode())]
        )
        assert response.status_code == 401
        assert response.json()["code"] == "UNAUTHORIZED"
        assert 'error="invalid_request"' in response.headers["www-authenticate"]

    @pytest.mark.parametrize("scheme", ["bearer", "BEARER", "BeArEr"])
    async def test_scheme_is_case_insensitive(
        self, asgi_client: Client, settings: Callable[..., Settings], minter: TokenMinter, scheme: str
    ) -> None:
        response = await asgi_client(service(), settings()).get(
            "/api/v1/me", headers={"authorization": f"{scheme} {minter.mint(sub='alice')}"}
        )
        assert response.status_code == 200

    async def test_two_authorization_headers(
        self, asgi_client: Client, settings: Callable[..., Settings], minter: TokenMinter
    ) -> None:
        token = minter.mint()
        headers = [(b"authorization", f"Bearer {token}".encode()), (b"authorization", f"Bearer {token}".encode())]
        response = await asgi_client(service(), settings()).get("/api/v1/me", headers=headers)
        assert (response.status_code, response.json()["code"]) == (401, "UNAUTHORIZED")

    async def test_huge_token_is_refused_early(self, asgi_client: Client, settings: Callable[..., Settings]) -> None:
        response = await asgi_client(service(), settings()).get("/api/v1/me", headers=bearer("a" * 20_000))
        assert (response.status_code, response.json()["code"]) == (401, "INVALID_TOKEN")


class TestCodes:
    async def test_valid_token_reaches_the_handler_with_claims(
        self, asgi_client: Client, settings: Callable[..., Settings], minter: TokenMinter
    ) -> None:
        token = minter.mint(sub="alice", roles=["user"], tenant="acme")
        response = await asgi_client(service(), settings()).get("/api/v1/me", headers=bearer(token))
        assert response.status_code == 200
        body = response.json()
        assert body["sub"] == "alice" and body["roles"] == ["user"] and body["extra"]["tenant"] == "acme"

    async def test_garbage_token_is_invalid_token(self, asgi_client: Client, settings: Callable[..., Settings]) -> None:
        response = await asgi_client(service(), settings()).get("/api/v1/me", headers=bearer("abc.def.ghi"))
        assert response.status_code == 401
        body = response.json()
        assert (body["code"], body["status"]) == ("INVALID_TOKEN", 401) and isinstance(body["error"], str)
        assert 'error="invalid_token"' in response.headers["www-authenticate"]

    async def test_expired_token(
        self, asgi_client: Client, settings: Callable[..., Settings], minter: TokenMinter
    ) -> None:
        response = await asgi_client(service(), settings()).get("/api/v1/me", headers=bearer(minter.mint(ttl=-5)))
        assert response.status_code == 401
        assert response.json() == {"error": "Token has expired", "code": "TOKEN_EXPIRED", "status": 401}

    async def test_leeway_lets_a_just_expired_token_through(
        self, asgi_client: Client, settings: Callable[..., Settings], minter: TokenMinter
    ) -> None:
        client = asgi_client(service(), settings(SERVICE_TOKEN_LEEWAY_SECONDS="60"))
        assert (await client.get("/api/v1/me", headers=bearer(minter.mint(ttl=-5)))).status_code == 200

    async def test_wrong_claim_types_are_401_not_500(
        self, asgi_client: Client, settings: Callable[..., Settings], minter: TokenMinter
    ) -> None:
        client = asgi_client(service(), settings())
        for token in (minter.mint(exp="2030-01-01"), minter.mint(roles="admin"), minter.mint(exp=None)):
            response = await client.get("/api/v1/me", headers=bearer(token))
            assert (response.status_code, response.json()["code"]) == (401, "INVALID_TOKEN")

    async def test_message_never_echoes_the_token(
        self, asgi_client: Client, settings: Callable[..., Settings], minter: TokenMinter
    ) -> None:
        token = minter.mint(ttl=-5)
        response = await asgi_client(service(), settings()).get("/api/v1/me", headers=bearer(token))
        assert token not in response.text and token not in response.headers["www-authenticate"]

    async def test_audience_and_issuer(
        self, asgi_client: Client, settings: Callable[..., Settings], minter: TokenMinter
    ) -> None:
        client = asgi_client(
            service(), settings(SERVICE_TOKEN_REQUIRED_AUDIENCE="docs", SERVICE_TOKEN_REQUIRED_ISSUER="https://idp")
        )
        good = minter.mint(aud="docs", iss="https://idp")
        assert (await client.get("/api/v1/me", headers=bearer(good))).status_code == 200
        for bad in (minter.mint(aud="other", iss="https://idp"), minter.mint(aud="docs")):
            assert (await client.get("/api/v1/me", headers=bearer(bad))).json()["code"] == "INVALID_TOKEN"


class TestPaths:
    async def test_health_and_ready_are_public(self, asgi_client: Client, settings: Callable[..., Settings]) -> None:
        client = asgi_client(service(), settings())
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/ready")).status_code == 200

    async def test_excluded_path_is_public_and_has_no_claims(
        self, asgi_client: Client, settings: Callable[..., Settings]
    ) -> None:
        response = await asgi_client(service(), settings()).get("/api/v1/public/info")
        assert response.json() == {"anonymous": True}

    async def test_current_claims_on_a_public_route_is_401(
        self, asgi_client: Client, settings: Callable[..., Settings]
    ) -> None:
        client = asgi_client(service(), settings(SERVICE_TOKEN_EXCLUDE_PATHS="/api/v1/me"))
        response = await client.get("/api/v1/me")
        assert (response.status_code, response.json()["code"]) == (401, "UNAUTHORIZED")
        assert response.headers["www-authenticate"] == "Bearer"

    @pytest.mark.parametrize(
        "path",
        [
            "/api/v1/public/../private",
            "/api/v1/public/./../private",
            "//api/v1/private",
            "/api/v1//private",
            "/api/v1/public/%2e%2e/private",
            "/api/v1/public/..%2Fprivate",
        ],
    )
    async def test_normalization_tricks_cannot_reach_a_protected_route_without_a_token(
        self, asgi_client: Client, settings: Callable[..., Settings], path: str
    ) -> None:
        response = await asgi_client(service(), settings()).get(path)
        assert response.status_code == 401
        assert response.json() == {"error": "Missing bearer token", "code": "UNAUTHORIZED", "status": 401}

    async def test_dot_segments_are_routed_as_the_canonical_path(
        self, asgi_client: Client, settings: Callable[..., Settings], minter: TokenMinter
    ) -> None:
        response = await asgi_client(service(), settings()).get(
            "/api/v1/public/../private", headers=bearer(minter.mint())
        )
        assert response.json() == {"private": True}

    async def test_include_mode_protects_only_listed_paths(
        self, asgi_client: Client, settings: Callable[..., Settings]
    ) -> None:
        client = asgi_client(
            service(), settings(SERVICE_TOKEN_EXCLUDE_PATHS="", SERVICE_TOKEN_INCLUDE_PATHS="/api/v1/private")
        )
        assert (await client.get("/api/v1/private")).status_code == 401
        assert (await client.get("/api/v1/public/info")).status_code == 200

    async def test_cors_preflight_needs_no_token(self, asgi_client: Client, settings: Callable[..., Settings]) -> None:
        response = await asgi_client(service(), settings()).options(
            "/api/v1/me", headers={"origin": "https://app.example", "access-control-request-method": "GET"}
        )
        assert response.status_code != 401


class TestRevocationInThePipeline:
    async def test_revoked_via_admin_route_then_401(
        self, asgi_client: Client, settings: Callable[..., Settings], minter: TokenMinter
    ) -> None:
        client = asgi_client(service(), settings(SERVICE_TOKEN_REVOCATION_ENABLED="true"))
        victim = minter.mint(sub="bob", jti="victim-1")
        assert (await client.get("/api/v1/me", headers=bearer(victim))).status_code == 200
        admin = minter.mint(sub="root", roles=["admin"])
        response = await client.post(
            "/admin/revoke-token", json={"jti": "victim-1", "reason": "stolen"}, headers=bearer(admin)
        )
        assert response.json() == {"revoked": True, "jti": "victim-1"}
        response = await client.get("/api/v1/me", headers=bearer(victim))
        assert (response.status_code, response.json()["code"]) == (401, "TOKEN_REVOKED")

    async def test_revocation_is_checked_even_on_a_verified_cache_hit(
        self, asgi_client: Client, settings: Callable[..., Settings], minter: TokenMinter
    ) -> None:
        svc = service()
        app = svc.build(settings(SERVICE_TOKEN_REVOCATION_ENABLED="true"))
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        token = minter.mint(jti="cached-1")
        async with client:
            await self._exercise(app, client, token)
        await app.aclose()

    async def _exercise(self, app: BastionApp, client: httpx.AsyncClient, token: str) -> None:
        if True:
            for _ in range(3):
                assert (await client.get("/api/v1/me", headers=bearer(token))).status_code == 200
            assert app.token_auth is not None and app.token_auth.verifier.verifications == 1
            import time

            await app.revoke("cached-1", "rotated", time.time() + 60)
            assert (await client.get("/api/v1/me", headers=bearer(token))).json()["code"] == "TOKEN_REVOKED"

    async def test_token_without_jti_is_refused(
        self, asgi_client: Client, settings: Callable[..., Settings], minter: TokenMinter
    ) -> None:
        client = asgi_client(service(), settings(SERVICE_TOKEN_REVOCATION_ENABLED="true"))
        response = await client.get("/api/v1/me", headers=bearer(minter.mint(jti=None)))
        assert (response.status_code, response.json()["code"]) == (401, "INVALID_TOKEN")

    async def test_cache_store_outage_is_500_in_the_shape(
        self, asgi_client: Client, settings: Callable[..., Settings], minter: TokenMinter, dead_redis_url: str
    ) -> None:
        client = asgi_client(
            service(),
            settings(
                SERVICE_TOKEN_REVOCATION_ENABLED="true",
                SERVICE_CACHE_STORE_URL=dead_redis_url,
                SERVICE_CACHE_STORE_TIMEOUT_SECS="0.5",
            ),
        )
        response = await client.get("/api/v1/me", headers=bearer(minter.mint()))
        assert response.status_code == 500
        assert response.json() == {"error": "Cache store unavailable", "code": "CACHE_STORE_ERROR", "status": 500}

    async def test_revocation_against_real_valkey(
        self, asgi_client: Client, settings: Callable[..., Settings], minter: TokenMinter, valkey_url: str
    ) -> None:
        client = asgi_client(
            service(), settings(SERVICE_TOKEN_REVOCATION_ENABLED="true", SERVICE_CACHE_STORE_URL=valkey_url)
        )
        victim = minter.mint(jti="valkey-victim")
        assert (await client.get("/api/v1/me", headers=bearer(victim))).status_code == 200
        admin = minter.mint(roles=["admin"])
        await client.post("/admin/revoke-token", json={"jti": "valkey-victim", "reason": "r"}, headers=bearer(admin))
        assert (await client.get("/api/v1/me", headers=bearer(victim))).json()["code"] == "TOKEN_REVOKED"
        ready = (await client.get("/ready")).json()
        assert ready["dependencies"]["cache_store"] == {"healthy": True}

    async def test_revoke_route_validates_its_body(
        self, asgi_client: Client, settings: Callable[..., Settings], minter: TokenMinter
    ) -> None:
        client = asgi_client(service(), settings(SERVICE_TOKEN_REVOCATION_ENABLED="true"))
        admin = bearer(minter.mint(roles=["admin"]))
        assert (await client.post("/admin/revoke-token", content=b"{", headers=admin)).status_code == 400
        assert (await client.post("/admin/revoke-token", json={"jti": ""}, headers=admin)).status_code == 422
        assert (await client.get("/admin/revoke-token", headers=admin)).status_code == 405
