"""Policy in the pipeline: the example's matrix, fail_open, caching, reload, hot reload, audit, bypass paths."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from structlog.testing import capture_logs

from bastion import BastionApp, Claims, Service, Settings, load_settings
from bastion.testing import TokenMinter
from examples.documents_api import create_service
from examples.documents_api.store import seeded_store

EXAMPLE_POLICIES = Path(__file__).resolve().parents[3] / "examples" / "documents_api" / "policies.cedar"


@pytest.fixture(scope="module")
def minter() -> TokenMinter:
    return TokenMinter("ES256")


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policies.cedar"
    shutil.copy(EXAMPLE_POLICIES, path)
    return path


@pytest.fixture
def make_settings(minter: TokenMinter, tmp_path: Path, policy_file: Path) -> Callable[..., Settings]:
    key = tmp_path / "public.pem"
    key.write_bytes(minter.public_pem())

    def make(**env: str) -> Settings:
        return load_settings(
            environ={
                "SERVICE_TOKEN_ALGORITHM": "ES256",
                "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(key),
                "SERVICE_POLICY_POLICY_PATH": str(policy_file),
                **env,
            }
        )

    return make


def example_service() -> Service:
    return create_service(seeded_store())


@pytest.fixture
async def app(make_settings: Callable[..., Settings]) -> AsyncIterator[BastionApp]:
    built = example_service().build(make_settings())
    yield built
    await built.aclose()


def client_for(app: BastionApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")


def bearer(
    minter: TokenMinter, sub: str | None = "alice", roles: tuple[str, ...] = ("user",), **claims: object
) -> dict[str, str]:
    return {"authorization": "Bearer " + minter.mint(sub=sub, roles=roles, **claims)}


FORBID_LIST = (
    'forbid(principal, action == Action::"GET /api/v2/documents", resource);\npermit(principal, action, resource);'
)
FORBIDDEN = {"error": "Access denied by policy", "code": "FORBIDDEN", "status": 403}


class TestExampleMatrix:
    @pytest.mark.parametrize("version", [1, 2])
    async def test_matrix(self, app: BastionApp, minter: TokenMinter, version: int) -> None:
        user, admin = bearer(minter, "alice"), bearer(minter, "root", ("admin",))
        base = f"/api/v{version}"
        async with client_for(app) as client:
            assert (await client.get(f"{base}/documents", headers=user)).status_code == 200
            assert (await client.get(f"{base}/documents/alice/doc-1", headers=user)).status_code == 200
            other = await client.get(f"{base}/documents/bob/doc-3", headers=user)
            assert (other.status_code, other.json()) == (403, FORBIDDEN)
            assert (await client.get(f"{base}/documents/bob/doc-3", headers=admin)).status_code == 200
            users = await client.get(f"{base}/admin/users", headers=user)
            assert (users.status_code, users.json()) == (403, FORBIDDEN)
            assert (await client.get(f"{base}/admin/users", headers=admin)).status_code == 200
            assert (await client.get(f"{base}/documents")).status_code == 401

    async def test_owner_may_replace_and_delete_but_not_others(self, app: BastionApp, minter: TokenMinter) -> None:
        async with client_for(app) as client:
            body = {"title": "t", "content": "c"}
            assert (
                await client.put("/api/v2/documents/bob/doc-3", json=body, headers=bearer(minter))
            ).status_code == 403
            assert (await client.delete("/api/v2/documents/bob/doc-3", headers=bearer(minter))).status_code == 403
            bob = bearer(minter, "bob")
            assert (await client.put("/api/v2/documents/bob/doc-3", json=body, headers=bob)).status_code == 200
            assert (await client.delete("/api/v2/documents/bob/doc-3", headers=bob)).status_code == 200

    async def test_any_user_may_create(self, app: BastionApp, minter: TokenMinter) -> None:
        async with client_for(app) as client:
            created = await client.post(
                "/api/v2/documents", json={"title": "t", "content": "c"}, headers=bearer(minter, "zed")
            )
        assert created.status_code == 200 and created.json()["owner_id"] == "zed"

    async def test_missing_roles_claim_neither_crashes_nor_opens(self, app: BastionApp, minter: TokenMinter) -> None:
        headers = {"authorization": "Bearer " + minter.mint(sub="alice")}
        async with client_for(app) as client:
            assert (await client.get("/api/v2/admin/users", headers=headers)).status_code == 403
            assert (await client.get("/api/v2/documents/alice/doc-1", headers=headers)).status_code == 200

    async def test_token_without_sub_is_denied_not_crashed(self, app: BastionApp, minter: TokenMinter) -> None:
        headers = bearer(minter, None, ("user",), client_id="batch-job")
        async with client_for(app) as client:
            assert (await client.get("/api/v2/documents/alice/doc-1", headers=headers)).status_code == 403
            assert (await client.get("/api/v2/documents", headers=headers)).status_code == 200

    async def test_unmatched_path_is_an_empty_404_whatever_the_policy_allows(
        self, app: BastionApp, minter: TokenMinter
    ) -> None:
        """Nothing is served there: an authenticated caller gets the spec's 404 without a policy decision."""
        async with client_for(app) as client:
            user = await client.get("/api/v2/things/42", headers=bearer(minter))
            admin = await client.get("/api/v2/things/42", headers=bearer(minter, "root", ("admin",)))
        assert [(user.status_code, user.content), (admin.status_code, admin.content)] == [(404, b"")] * 2


class TestUnmatchedPaths:
    async def test_without_a_token_an_unmatched_path_is_401(self, app: BastionApp) -> None:
        async with client_for(app) as client:
            response = await client.get("/api/v2/nonexistent")
        assert response.status_code == 401

    async def test_with_a_fallback_every_path_is_still_decided(
        self, make_settings: Callable[..., Settings], minter: TokenMinter
    ) -> None:
        """The fallback serves unmatched paths, so they are a policy question: a user is denied, an admin served."""
        service = example_service()

        async def fallback(request: Request) -> PlainTextResponse:
            return PlainTextResponse("fallback")

        service.set_fallback(fallback)
        app = service.build(make_settings())
        async with client_for(app) as client:
            user = await client.get("/nonexistent", headers=bearer(minter))
            admin = await client.get("/nonexistent", headers=bearer(minter, "root", ("admin",)))
        await app.aclose()
        assert [user.status_code, (admin.status_code, admin.text)] == [403, (200, "fallback")]


class TestBypassPaths:
    @pytest.mark.parametrize(
        "path",
        [
            "/api/v1/./admin/users",
            "/api/v1/documents/../admin/users",
            "/api/v1/documents/%2e%2e/admin/users",
            "/api/v1/documents%2F..%2Fadmin/users",
            "/api/v1/documents/..%2fadmin/users",
            "/api/v1/admin/users?",
            "/api/v1/admin/users#x",
            "/api/v1/admin//users",
            "/api/v1/admin/./users/.",
        ],
    )
    async def test_never_served_unauthorized(self, app: BastionApp, minter: TokenMinter, path: str) -> None:
        """Spellings that normalize to the admin route are decided as that route."""
        async with client_for(app) as client:
            response = await client.get(path, headers=bearer(minter))
        assert response.status_code == 403, (path, response.status_code)
        assert response.json() == {"error": "Access denied by policy", "code": "FORBIDDEN", "status": 403}

    @pytest.mark.parametrize(
        "path",
        ["//api/v1/admin/users", "/api/v1/admin/users/", "/api/v1/Admin/Users", "/API/V1/admin/users",
         "/api/v1/admin/users%23"],
    )  # fmt: skip
    async def test_spelling_that_reaches_no_route_is_an_empty_404(
        self, app: BastionApp, minter: TokenMinter, path: str
    ) -> None:
        """Spellings no route matches are not served at all: the empty 404, never the admin handler."""
        async with client_for(app) as client:
            response = await client.get(path, headers=bearer(minter))
        assert (response.status_code, response.content) == (404, b""), path

    async def test_nul_in_the_path_is_a_bad_request(self, app: BastionApp, minter: TokenMinter) -> None:
        async with client_for(app) as client:
            response = await client.get("/api/v1/admin/users%00", headers=bearer(minter))
        assert (response.status_code, response.json()["code"]) == (400, "BAD_REQUEST")


class TestFailOpen:
    ERRORING = (
        "permit(principal, action, resource);\n"
        # Valid against the schema, an error at run time: the product overflows a Cedar Long.
        "forbid(principal, action, resource) when { context.timestamp * 10000000000 > 0 };\n"
    )

    @pytest.mark.parametrize(("fail_open", "status"), [("false", 500), ("true", 200)])
    async def test_erroring_policy(
        self,
        make_settings: Callable[..., Settings],
        policy_file: Path,
        minter: TokenMinter,
        fail_open: str,
        status: int,
    ) -> None:
        policy_file.write_text(self.ERRORING)
        app = example_service().build(make_settings(SERVICE_POLICY_FAIL_OPEN=fail_open))
        try:
            with capture_logs() as logs:
                async with client_for(app) as client:
                    response = await client.get("/api/v2/documents", headers=bearer(minter))
        finally:
            await app.aclose()
        assert response.status_code == status
        if status == 500:
            assert response.json() == {"error": "Policy evaluation failed", "code": "POLICY_ERROR", "status": 500}
        assert any(entry["event"] == "policy_evaluation_failed" for entry in logs)

    async def test_fail_open_never_turns_a_deny_into_an_allow(
        self, make_settings: Callable[..., Settings], minter: TokenMinter
    ) -> None:
        app = example_service().build(make_settings(SERVICE_POLICY_FAIL_OPEN="true"))
        try:
            async with client_for(app) as client:
                response = await client.get("/api/v2/admin/users", headers=bearer(minter))
        finally:
            await app.aclose()
        assert response.status_code == 403


class TestCache:
    async def test_repeated_request_hits_the_cache(self, app: BastionApp, minter: TokenMinter) -> None:
        headers = bearer(minter)
        async with client_for(app) as client:
            for _ in range(5):
                assert (await client.get("/api/v2/documents", headers=headers)).status_code == 200
        assert app.policy is not None
        assert app.policy.evaluations == 1
        assert app.policy.cache.hits == 4

    async def test_different_resource_misses(self, app: BastionApp, minter: TokenMinter) -> None:
        headers = bearer(minter, "root", ("admin",))
        async with client_for(app) as client:
            await client.get("/api/v2/documents/alice/doc-1", headers=headers)
            await client.get("/api/v2/documents/bob/doc-3", headers=headers)
        assert app.policy is not None and app.policy.evaluations == 2

    async def test_cache_disabled(self, make_settings: Callable[..., Settings], minter: TokenMinter) -> None:
        app = example_service().build(make_settings(SERVICE_POLICY_CACHE_ENABLED="false"))
        try:
            async with client_for(app) as client:
                for _ in range(3):
                    await client.get("/api/v2/documents", headers=bearer(minter))
        finally:
            await app.aclose()
        assert app.policy is not None and app.policy.evaluations == 3

    async def test_timestamp_policy_is_never_served_a_stale_decision(
        self, make_settings: Callable[..., Settings], policy_file: Path, minter: TokenMinter
    ) -> None:
        now = time.time()
        policy_file.write_text(f"permit(principal, action, resource) when {{ context.timestamp < {int(now) + 3600} }};")
        app = example_service().build(make_settings())
        assert app.policy is not None
        clock = {"now": now}
        app.policy._clock = lambda: clock["now"]
        try:
            async with client_for(app) as client:
                assert (await client.get("/api/v2/documents", headers=bearer(minter))).status_code == 200
                clock["now"] = now + 7200
                assert (await client.get("/api/v2/documents", headers=bearer(minter))).status_code == 403
        finally:
            await app.aclose()

    async def test_reload_invalidates(self, app: BastionApp, minter: TokenMinter, policy_file: Path) -> None:
        async with client_for(app) as client:
            assert (await client.get("/api/v2/documents", headers=bearer(minter))).status_code == 200
            policy_file.write_text(FORBID_LIST)
            app.reload_policies()
            assert (await client.get("/api/v2/documents", headers=bearer(minter))).status_code == 403


class TestReload:
    async def test_reload_route_success_and_failure(
        self, app: BastionApp, minter: TokenMinter, policy_file: Path
    ) -> None:
        admin = bearer(minter, "root", ("admin",))
        async with client_for(app) as client:
            ok = await client.post("/admin/reload-policy", headers=admin)
            assert ok.status_code == 200 and ok.json()["reloaded"] is True and ok.json()["policies"] == 6
            policy_file.write_text("permit(principal, action, resource")
            bad = await client.post("/admin/reload-policy", headers=admin)
            assert bad.status_code == 500
            assert bad.json()["code"] == "POLICY_ERROR"
            assert "previous policies stay in force" in bad.json()["error"]
            assert (await client.get("/api/v2/documents", headers=bearer(minter))).status_code == 200
            assert (await client.post("/admin/reload-policy", headers=bearer(minter))).status_code == 403

    async def test_hot_reload_picks_up_a_change(
        self, make_settings: Callable[..., Settings], policy_file: Path, minter: TokenMinter
    ) -> None:
        app = example_service().build(
            make_settings(SERVICE_POLICY_HOT_RELOAD="true", SERVICE_POLICY_HOT_RELOAD_INTERVAL_SECS="0.02")
        )
        assert app.policy is not None
        watcher = asyncio.create_task(app.policy.watch())
        try:
            async with client_for(app) as client:
                assert (await client.get("/api/v2/documents", headers=bearer(minter))).status_code == 200
                before = app.policy.policies.digest
                policy_file.write_text(FORBID_LIST)
                for _ in range(500):
                    if app.policy.policies.digest != before:
                        break
                    await asyncio.sleep(0.01)
                assert (await client.get("/api/v2/documents", headers=bearer(minter))).status_code == 403
        finally:
            watcher.cancel()
            await app.aclose()

    async def test_hot_reload_of_a_broken_file_keeps_serving(
        self, make_settings: Callable[..., Settings], policy_file: Path, minter: TokenMinter
    ) -> None:
        app = example_service().build(make_settings(SERVICE_POLICY_HOT_RELOAD_INTERVAL_SECS="0.02"))
        assert app.policy is not None
        watcher = asyncio.create_task(app.policy.watch())
        try:
            with capture_logs() as logs:
                policy_file.write_text("permit(principal, action, resource")
                for _ in range(500):
                    if any(entry["event"] == "policy_hot_reload_failed" for entry in logs):
                        break
                    await asyncio.sleep(0.01)
            assert any(entry["event"] == "policy_hot_reload_failed" for entry in logs)
            async with client_for(app) as client:
                assert (await client.get("/api/v2/documents", headers=bearer(minter))).status_code == 200
        finally:
            watcher.cancel()
            await app.aclose()


class TestAudit:
    async def test_deny_emits_auth_permission_denied(self, app: BastionApp, minter: TokenMinter) -> None:
        with capture_logs() as logs:
            async with client_for(app) as client:
                await client.get(
                    "/api/v2/admin/users",
                    headers={
                        **bearer(minter),
                        "user-agent": "probe/1.0",
                        "x-request-id": "aud-1",
                        "x-forwarded-for": "203.0.113.9",
                    },
                )
        events = [entry for entry in logs if entry["event"] == "AuthPermissionDenied"]
        assert len(events) == 1
        event = events[0]
        assert event["log_level"] == "warning" and event["severity"] == "warning"
        assert (event["subject"], event["user_agent"], event["request_id"], event["client_ip"]) == (
            "alice",
            "probe/1.0",
            "aud-1",
            "203.0.113.9",
        )
        assert event["details"] == {"action": "GET /api/v2/admin/users"}

    async def test_suppressed_by_audit_auth_events_false(
        self, make_settings: Callable[..., Settings], minter: TokenMinter
    ) -> None:
        app = example_service().build(make_settings(SERVICE_AUDIT_AUDIT_AUTH_EVENTS="false"))
        try:
            with capture_logs() as logs:
                async with client_for(app) as client:
                    assert (await client.get("/api/v2/admin/users", headers=bearer(minter))).status_code == 403
        finally:
            await app.aclose()
        assert not any(entry["event"] == "AuthPermissionDenied" for entry in logs)

    async def test_no_event_on_allow(self, app: BastionApp, minter: TokenMinter) -> None:
        with capture_logs() as logs:
            async with client_for(app) as client:
                await client.get("/api/v2/documents", headers=bearer(minter))
        assert not any(entry["event"] == "AuthPermissionDenied" for entry in logs)


async def test_start_up_fails_on_a_broken_policy_file(
    make_settings: Callable[..., Settings], policy_file: Path
) -> None:
    from bastion.policy import PolicyLoadError

    policy_file.write_text("permit(principal, action, resource);\nforbid(principal, actoin, resource);\n")
    with pytest.raises(PolicyLoadError, match=r"statement 2 \(line 2\)"):
        example_service().build(make_settings())


READERS_V2 = (
    '@id("readers-v2")\npermit(principal, action, resource)\n'
    'when { principal.roles.contains("reader") && context.method == "GET" && context.version == 2 };'
)


class TestContext:
    """``context.method``, ``context.path`` (route template) and ``context.version`` in decisions."""

    def build(self, make_settings: Callable[..., Settings], policy_file: Path, text: str) -> BastionApp:
        policy_file.write_text(text)
        return example_service().build(make_settings())

    async def test_one_rule_for_every_get_of_a_version(
        self, make_settings: Callable[..., Settings], policy_file: Path, minter: TokenMinter
    ) -> None:
        app = self.build(make_settings, policy_file, READERS_V2)
        reader = bearer(minter, "rita", ("reader",))
        try:
            async with client_for(app) as client:
                statuses = [
                    (await client.get("/api/v2/documents", headers=reader)).status_code,
                    (await client.get("/api/v2/documents/bob/doc-3", headers=reader)).status_code,
                    (await client.get("/api/v1/documents", headers=reader)).status_code,
                    (
                        await client.post("/api/v2/documents", json={"title": "t", "content": "c"}, headers=reader)
                    ).status_code,
                    (await client.get("/api/v2/documents", headers=bearer(minter, "ursula", ("user",)))).status_code,
                ]
        finally:
            await app.aclose()
        assert statuses == [200, 200, 403, 403, 403]

    async def test_path_is_the_route_template(
        self, make_settings: Callable[..., Settings], policy_file: Path, minter: TokenMinter
    ) -> None:
        text = 'permit(principal, action, resource) when { context.path == "/api/v1/documents/{user_id}/{doc_id}" };'
        app = self.build(make_settings, policy_file, text)
        try:
            async with client_for(app) as client:
                allowed = await client.get("/api/v1/documents/bob/doc-3", headers=bearer(minter))
                other = await client.get("/api/v2/documents/bob/doc-3", headers=bearer(minter))
        finally:
            await app.aclose()
        assert (allowed.status_code, other.status_code) == (200, 403)

    async def test_an_unmatched_path_is_normalized_and_of_version_0(
        self, make_settings: Callable[..., Settings], policy_file: Path, minter: TokenMinter
    ) -> None:
        text = (
            "permit(principal, action, resource) when "
            '{ context.version == 0 && context.path == "/api/v2/things/{id}" };'
        )
        app = self.build(make_settings, policy_file, text)
        try:
            async with client_for(app) as client:
                permitted = await client.get("/api/v2/things/42", headers=bearer(minter))
                route = await client.get("/api/v2/documents", headers=bearer(minter))
        finally:
            await app.aclose()
        assert (permitted.status_code, permitted.content, route.status_code) == (404, b"", 403)

    async def test_a_grpc_call_is_a_post_of_its_method_and_version_0(
        self, make_settings: Callable[..., Settings], policy_file: Path
    ) -> None:
        method = "/documents.v1.DocumentService/ListDocuments"
        text = (
            "permit(principal, action, resource) when "
            f'{{ context.method == "POST" && context.path == "{method}" && context.version == 0 }};'
        )
        app = self.build(make_settings, policy_file, text)
        assert app.policy is not None
        try:
            action, decision = await app.policy.decide({"type": "grpc", "path": method, "headers": []}, None)
        finally:
            await app.aclose()
        assert (action, decision.allowed, decision.errors) == (method, True, ())

    async def test_only_the_attributes_the_policies_read_are_computed(
        self, make_settings: Callable[..., Settings], policy_file: Path
    ) -> None:
        app = self.build(make_settings, policy_file, READERS_V2)
        assert app.policy is not None
        scope = {"type": "http", "path": "/api/v2/documents", "headers": []}
        try:
            context = app.policy.context_of(scope, None, method="GET", path="/api/v2/documents", version=2)
        finally:
            await app.aclose()
        assert context == {"method": "GET", "version": 2}

    async def test_the_decision_cache_keys_on_them(
        self, make_settings: Callable[..., Settings], policy_file: Path, minter: TokenMinter
    ) -> None:
        app = self.build(make_settings, policy_file, READERS_V2)
        assert app.policy is not None
        claims = Claims(sub="rita", exp=2**40, roles=("reader",))
        decisions = []
        try:
            for version in (2, 1, 2):
                decision = await app.policy.decide_request(
                    claims=claims,
                    action="GET /api/v2/documents",
                    resource=("Resource", "/api/v2/documents", {}),
                    context={"method": "GET", "path": "/api/v2/documents", "version": version},
                )
                decisions.append(decision.allowed)
        finally:
            await app.aclose()
        assert (decisions, app.policy.evaluations, app.policy.cache.hits) == ([True, False, True], 2, 1)


INVALID = '@id("readers")\npermit(principal, action, resource) when { principal.role.contains("reader") };\n'
INVALID_PROBLEM = (
    'does not validate against the service\'s schema: statement 1 (line 1), @id("readers"): attribute `role` on '
    "entity type `User` not found; did you mean `roles`?"
)


class TestSchemaValidation:
    def test_start_up_refuses_a_policy_the_schema_rejects(
        self, make_settings: Callable[..., Settings], policy_file: Path
    ) -> None:
        from bastion.policy import PolicyLoadError

        policy_file.write_text(INVALID)
        with pytest.raises(PolicyLoadError) as info:
            example_service().build(make_settings())
        assert str(info.value) == f"policy.policy_path = {str(policy_file)!r} {INVALID_PROBLEM}"

    async def test_reload_route_keeps_the_old_set(
        self, app: BastionApp, minter: TokenMinter, policy_file: Path
    ) -> None:
        policy_file.write_text(INVALID)
        async with client_for(app) as client:
            reloaded = await client.post("/admin/reload-policy", headers=bearer(minter, "root", ("admin",)))
            listed = await client.get("/api/v2/documents", headers=bearer(minter))
        assert (reloaded.status_code, reloaded.json()) == (
            500,
            {
                "error": "Policy reload failed, previous policies stay in force: "
                f"policy.policy_path = {str(policy_file)!r} {INVALID_PROBLEM}",
                "code": "POLICY_ERROR",
                "status": 500,
            },
        )
        assert listed.status_code == 200

    async def test_hot_reload_keeps_the_old_set_and_logs_once(
        self, make_settings: Callable[..., Settings], policy_file: Path, minter: TokenMinter
    ) -> None:
        app = example_service().build(make_settings(SERVICE_POLICY_HOT_RELOAD_INTERVAL_SECS="0.01"))
        assert app.policy is not None
        before = app.policy.policies
        watcher = asyncio.create_task(app.policy.watch())
        try:
            with capture_logs() as logs:
                policy_file.write_text(INVALID)
                for _ in range(500):
                    if any(entry["event"] == "policy_hot_reload_failed" for entry in logs):
                        break
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.2)  # many more polls of the same broken file
            failures = [entry["error"] for entry in logs if entry["event"] == "policy_hot_reload_failed"]
            async with client_for(app) as client:
                assert (await client.get("/api/v2/documents", headers=bearer(minter))).status_code == 200
        finally:
            watcher.cancel()
            await app.aclose()
        assert failures == [f"policy.policy_path = {str(policy_file)!r} {INVALID_PROBLEM}"]
        assert app.policy.policies is before
