"""ServiceClient and AsyncServiceClient: lifespan, tokens for users, settings, config files, requests."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Annotated, Any

import httpx
import pytest
from fastapi import Depends, Request

from bastion import Claims, ConfigError, Service, current_claims, load_settings
from bastion.testing import AsyncServiceClient, ServiceClient

NOT_STARTED = (
    "the service is not running: use the client as a context manager (`with ServiceClient(service) as client:` "
    "or `async with AsyncServiceClient(service) as client:`); entering it runs the service's start-up"
)


def claims_service(events: list[str] | None = None) -> Service:
    """A service whose v1 ``GET /me`` answers with the caller's claims; its hooks append to ``events``."""
    service = Service("claims-api", version="2.0.0")
    v1 = service.version(1)

    @v1.get("/me")
    async def me(claims: Annotated[Claims, Depends(current_claims)]) -> dict[str, Any]:
        return {
            "sub": claims.sub,
            "roles": list(claims.roles),
            "perms": list(claims.perms),
            "email": claims.email,
            "extra": dict(claims.extra),
        }

    @v1.post("/echo")
    async def echo(request: Request) -> dict[str, str]:
        return {"body": (await request.body()).decode()}

    if events is not None:

        @service.on_startup
        async def started() -> None:
            events.append("startup")

        @service.on_shutdown
        async def stopped() -> None:
            events.append("shutdown")

        @v1.get("/events")
        async def seen() -> list[str]:
            return list(events)

    return service


def failing_service(error: Exception) -> Service:
    """A service whose start-up hook raises ``error``."""
    service = Service("broken-api")
    service.version(1)

    @service.on_startup
    async def fail() -> None:
        raise error

    return service


def write_config(folder: Path, text: str) -> Path:
    path = folder / "service.toml"
    path.write_text(text)
    return path


class TestLifespan:
    def test_sync_client_runs_startup_before_requests_and_shutdown_after(self) -> None:
        events: list[str] = []
        with ServiceClient(claims_service(events)) as client:
            assert client.as_user("alice").get("/api/v1/events").json() == ["startup"]
        assert events == ["startup", "shutdown"]

    async def test_async_client_runs_startup_before_requests_and_shutdown_after(self) -> None:
        events: list[str] = []
        async with AsyncServiceClient(claims_service(events)) as client:
            assert (await client.as_user("alice").get("/api/v1/events")).json() == ["startup"]
        assert events == ["startup", "shutdown"]

    def test_a_failing_startup_hook_fails_with_its_message(self) -> None:
        service = failing_service(ConfigError("database.url is not set"))
        with pytest.raises(RuntimeError) as raised, ServiceClient(service):
            pass
        assert str(raised.value) == "service 'broken-api' failed to start: ConfigError: database.url is not set"

    async def test_a_failing_startup_hook_fails_the_async_client_too(self) -> None:
        with pytest.raises(RuntimeError) as raised:
            async with AsyncServiceClient(failing_service(OSError("no route to the database"))):
                pass
        assert (
            str(raised.value)
            == "service 'broken-api' failed to start: start-up hook fail failed: OSError: no route to the database"
        )

    def test_a_request_outside_with_is_refused(self) -> None:
        client = ServiceClient(claims_service())
        with pytest.raises(RuntimeError) as raised:
            client.get("/health")
        assert str(raised.value) == NOT_STARTED

    async def test_an_async_request_outside_async_with_is_refused(self) -> None:
        client = AsyncServiceClient(claims_service())
        with pytest.raises(RuntimeError) as raised:
            await client.get("/health")
        assert str(raised.value) == NOT_STARTED

    def test_requests_after_with_are_refused(self) -> None:
        with ServiceClient(claims_service()) as client:
            alice = client.as_user("alice")
        with pytest.raises(RuntimeError) as raised:
            alice.get("/api/v1/me")
        assert str(raised.value) == NOT_STARTED


class TestUsers:
    def test_as_user_claims_reach_the_handler(self) -> None:
        with ServiceClient(claims_service()) as client:
            response = client.as_user(
                "alice", roles=["reader", "editor"], perms=["documents:read"], email="alice@example.test", team="blue"
            ).get("/api/v1/me")
        assert response.status_code == 200
        body = response.json()
        assert {key: body[key] for key in ("sub", "roles", "perms", "email")} == {
            "sub": "alice",
            "roles": ["reader", "editor"],
            "perms": ["documents:read"],
            "email": "alice@example.test",
        }
        assert body["extra"] == {"team": "blue"}

    async def test_as_user_claims_reach_the_handler_async(self) -> None:
        async with AsyncServiceClient(claims_service()) as client:
            response = await client.as_user("bob", roles=["admin"]).get("/api/v1/me")
        assert response.json()["sub"] == "bob"
        assert response.json()["roles"] == ["admin"]

    def test_requests_without_as_user_carry_no_token(self) -> None:
        with ServiceClient(claims_service()) as client:
            response = client.get("/api/v1/me")
        assert response.status_code == 401
        assert response.json() == {"error": "Missing bearer token", "code": "UNAUTHORIZED", "status": 401}

    def test_views_share_the_app_and_closing_one_keeps_the_client(self) -> None:
        with ServiceClient(claims_service()) as client:
            with client.as_user("alice") as alice:
                assert alice.get("/api/v1/me").json()["sub"] == "alice"
            assert client.as_user("bob").get("/api/v1/me").json()["sub"] == "bob"
            assert client.get("/health").status_code == 200

    def test_token_is_a_bearer_token_the_service_accepts(self) -> None:
        with ServiceClient(claims_service()) as client:
            token = client.token("carol", roles=["auditor"])
            response = client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"})
        assert response.json()["roles"] == ["auditor"]

    def test_a_token_of_another_key_gets_401(self) -> None:
        with ServiceClient(claims_service()) as first, ServiceClient(claims_service()) as second:
            response = second.get("/api/v1/me", headers={"Authorization": f"Bearer {first.token('alice')}"})
        assert response.status_code == 401
        assert response.json()["code"] == "INVALID_TOKEN"

    async def test_a_revoked_token_gets_401(self, tmp_path: Path) -> None:
        config = write_config(tmp_path, "[token]\nrevocation_enabled = true\n")
        async with AsyncServiceClient(claims_service(), config=config) as client:
            revoked = client.as_user("alice", jti="t-1")
            assert (await revoked.get("/api/v1/me")).status_code == 200
            await client.app.revoke("t-1", "lost laptop", time.time() + 300)
            response = await revoked.get("/api/v1/me")
        assert response.status_code == 401
        assert response.json() == {"error": "Token has been revoked", "code": "TOKEN_REVOKED", "status": 401}

    def test_as_user_with_token_auth_off_is_refused(self) -> None:
        client = ServiceClient(claims_service(), environ={"SERVICE_TOKEN_ENABLED": "false"})
        with pytest.raises(RuntimeError) as raised:
            client.as_user("alice")
        assert str(raised.value).startswith("token authentication is off in these settings (token.enabled = false)")


class TestSettings:
    def test_environ_overrides_the_embedded_defaults(self) -> None:
        with ServiceClient(claims_service(), environ={"SERVICE_NAME": "renamed-api"}) as client:
            assert client.get("/health").json() == {"status": "healthy", "service": "renamed-api", "version": "2.0.0"}

    def test_the_process_environment_is_not_read(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("SERVICE_NAME", "from-the-environment")
        with ServiceClient(claims_service()) as client:
            assert client.get("/health").json()["service"] == "claims-api"

    def test_given_settings_are_used_with_the_generated_key(self) -> None:
        settings = load_settings(environ={"SERVICE_VERSION": "9.9.9"})
        with ServiceClient(claims_service(), settings) as client:
            assert client.get("/health").json()["version"] == "9.9.9"
            assert client.as_user("alice").get("/api/v1/me").status_code == 200

    def test_settings_and_config_together_are_refused(self, tmp_path: Path) -> None:
        with pytest.raises(TypeError) as raised:
            ServiceClient(claims_service(), load_settings(environ={}), config=write_config(tmp_path, ""))
        assert str(raised.value) == "pass settings=, or config= and/or environ=, not both: settings are already loaded"

    def test_a_config_file_keeps_every_token_setting_but_the_key(self, tmp_path: Path) -> None:
        config = write_config(
            tmp_path,
            '[service]\nname = "configured-api"\n\n'
            '[token]\nalgorithm = "ES256"\npublic_key_path = "keys/missing.pem"\nleeway_seconds = 5\n'
            'required_issuer = "https://id.example.test"\nrequired_audience = "configured-api"\n'
            'exclude_paths = ["/api/v1/echo"]\n',
        )
        with ServiceClient(claims_service(), config=config) as client:
            token = client.settings.token
            assert (token.algorithm, token.leeway_seconds, token.exclude_paths) == ("ES256", 5, ["/api/v1/echo"])
            assert (token.required_issuer, token.required_audience) == ("https://id.example.test", "configured-api")
            assert token.public_key_path != str(tmp_path / "keys" / "missing.pem")
            me = client.as_user("alice").get("/api/v1/me")
            assert me.status_code == 200
            assert me.json()["extra"] == {"iss": "https://id.example.test", "aud": "configured-api"}
            wrong = client.as_user("alice", aud="another-api").get("/api/v1/me")
            assert (wrong.status_code, wrong.json()["code"]) == (401, "INVALID_TOKEN")
            assert client.post("/api/v1/echo", content=b"public").json() == {"body": "public"}
            assert client.get("/health").json()["service"] == "configured-api"

    @pytest.mark.parametrize(
        "token_section",
        [
            pytest.param('algorithm = "HS256"\nsecret = "not-the-one-in-tests-0123456789abcdef"', id="hs256-secret"),
            pytest.param('algorithm = "RS256"\njwks_url = "https://id.example.test/jwks.json"', id="rs256-jwks-url"),
            pytest.param('format = "paseto"\npurpose = "public"\nkey_path = "missing.key"', id="paseto-public"),
            pytest.param('format = "paseto"\npurpose = "local"\nkey_path = "missing.key"', id="paseto-local"),
        ],
    )
    def test_every_key_source_is_replaced(self, tmp_path: Path, token_section: str) -> None:
        config = write_config(tmp_path, f"[token]\n{token_section}\n")
        with ServiceClient(claims_service(), config=config) as client:
            assert client.as_user("alice").get("/api/v1/me").json()["sub"] == "alice"

    def test_replace_token_key_false_keeps_the_configured_key(self, tmp_path: Path) -> None:
        config = write_config(tmp_path, '[token]\npublic_key_path = "keys/missing.pem"\n')
        with pytest.raises(ConfigError) as raised:
            ServiceClient(claims_service(), config=config, replace_token_key=False)
        assert str(raised.value) == (
            f"token.public_key_path = {str(tmp_path / 'keys' / 'missing.pem')!r}: cannot read the file (no such file)"
        )

    def test_replace_token_key_false_with_the_matching_minter(self, tmp_path: Path) -> None:
        from bastion.testing import TokenMinter, write_dev_keys

        private, public = write_dev_keys(tmp_path / "keys")
        config = write_config(tmp_path, f"[token]\npublic_key_path = {str(public)!r}\n")
        minter = TokenMinter.from_private_pem(private.read_bytes())
        with ServiceClient(claims_service(), config=config, minter=minter, replace_token_key=False) as client:
            assert client.settings.token.public_key_path == str(public)
            assert client.as_user("alice").get("/api/v1/me").json()["sub"] == "alice"

    def test_a_minter_of_another_algorithm_is_refused(self) -> None:
        from bastion.testing import TokenMinter

        with pytest.raises(ConfigError) as raised:
            ServiceClient(claims_service(), minter=TokenMinter("ES256"))
        assert str(raised.value) == "token.algorithm = 'RS256' needs a TokenMinter for RS256"

    def test_a_service_the_settings_refuse_fails_at_construction(self, tmp_path: Path) -> None:
        config = write_config(tmp_path, '[policy]\npolicy_path = "missing.cedar"\n')
        with pytest.raises(ConfigError) as raised:
            ServiceClient(claims_service(), config=config)
        assert str(raised.value) == (
            f"policy.policy_path = {str(tmp_path / 'missing.cedar')!r}: cannot read the file (no such file)"
        )


class TestRequests:
    def test_sync_request_bodies_of_every_kind_arrive(self) -> None:
        with ServiceClient(claims_service()) as client:
            alice = client.as_user("alice")
            assert alice.post("/api/v1/echo", content=b"bytes").json() == {"body": "bytes"}
            assert alice.post("/api/v1/echo", content=iter([b"it", b"erator"])).json() == {"body": "iterator"}
            assert alice.post("/api/v1/echo", json={"a": 1}).json() == {"body": '{"a":1}'}

    def test_compressed_responses_are_decoded(self) -> None:
        with ServiceClient(claims_service()) as client:
            body = "x" * 4096
            response = client.as_user("alice").post("/api/v1/echo", content=body.encode())
        assert response.headers["content-encoding"] == "gzip"
        assert response.json() == {"body": body}

    def test_a_client_session_emits_no_warning(self) -> None:
        """No deprecation warning of any kind (StarletteDeprecationWarning is a UserWarning, not a
        DeprecationWarning): the clients never import starlette.testclient."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with ServiceClient(claims_service()) as client:
                client.as_user("alice").get("/api/v1/me")
        assert [str(warning.message) for warning in caught] == []

    async def test_an_async_client_session_emits_no_warning(self) -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            async with AsyncServiceClient(claims_service()) as client:
                await client.as_user("alice").get("/api/v1/me")
        assert [str(warning.message) for warning in caught] == []

    def test_the_sync_client_is_an_httpx_client(self) -> None:
        with ServiceClient(claims_service(), headers={"x-test": "1"}) as client:
            assert isinstance(client, httpx.Client)
            assert client.as_user("alice").headers["x-test"] == "1"
