"""RateLimitMiddleware in the assembled app: headers, the 429 contract, audit, pipeline order, wiring."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from bastion import BastionApp, ConfigError, PolicyDenied, RateLimitExceeded, Slot
from bastion._cache_store import MemoryCacheStore
from bastion._guard import GuardLayer
from bastion.config import Settings
from bastion.errors import InvalidToken
from bastion.ratelimit import RateLimiting
from bastion.ratelimit._capability import RateLimitGuard
from bastion.ratelimit._local import LocalLimiter
from bastion.types import ASGIApp, Message, Receive, Scope, Send
from tests.bastion.ratelimit.conftest import service
from tests.conftest import open_settings

Client = Callable[..., httpx.AsyncClient]


def settings(**env: str) -> Settings:
    return open_settings(environ={f"SERVICE_{k.upper()}": v for k, v in env.items()})


def settings_with_routes(routes: dict[str, dict[str, Any]], **rate_limit: Any) -> Settings:
    return Settings.model_validate({"token": {"enabled": False}, "rate_limit": {**rate_limit, "routes": routes}})


class TestHeaders:
    async def test_allowed_response_carries_the_quota(self, asgi_client: Client) -> None:
        client = asgi_client(service(), settings(rate_limit_per_user_rpm="5"))
        responses = [await client.get("/api/v1/items") for _ in range(3)]
        assert [r.status_code for r in responses] == [200, 200, 200]
        assert [r.headers["x-ratelimit-remaining"] for r in responses] == ["4", "3", "2"]
        assert {r.headers["x-ratelimit-limit"] for r in responses} == {"5"}
        reset = int(responses[-1].headers["x-ratelimit-reset"])
        assert time.time() < reset <= time.time() + 61

    async def test_errors_raised_further_in_carry_the_quota_too(self, asgi_client: Client) -> None:
        response = await asgi_client(service(), settings(rate_limit_per_user_rpm="5")).get("/api/v1/missing")
        assert response.status_code == 404
        assert response.headers["x-ratelimit-remaining"] == "4"
        assert response.headers.get_list("x-ratelimit-limit") == ["5"]

    async def test_health_and_ready_are_not_limited(self, asgi_client: Client) -> None:
        client = asgi_client(service(sub=None), settings(rate_limit_per_ip_rpm="1"))
        for _ in range(5):
            for path in ("/health", "/ready"):
                response = await client.get(path)
                assert response.status_code == 200
                assert "x-ratelimit-limit" not in response.headers


class Test429:
    async def test_body_and_headers(self, asgi_client: Client) -> None:
        client = asgi_client(service(), settings(rate_limit_per_user_rpm="2", service_name="x"))
        await client.get("/api/v1/items")
        await client.get("/api/v1/items")
        response = await client.get("/api/v1/items", headers={"x-request-id": "rl-1"})
        assert response.status_code == 429
        assert response.json() == {
            "error": "Rate limit exceeded",
            "code": "RATE_LIMIT_EXCEEDED",
            "status": 429,
            "retry_after": 30,
        }
        assert response.headers["retry-after"] == "30"
        assert response.headers["x-ratelimit-limit"] == "2"
        assert response.headers["x-ratelimit-remaining"] == "0"
        assert time.time() + 59 <= int(response.headers["x-ratelimit-reset"]) <= time.time() + 61
        assert response.headers["content-type"] == "application/json"
        assert response.headers["x-request-id"] == "rl-1"
        assert response.headers["x-content-type-options"] == "nosniff"

    async def test_the_handler_is_not_called(self, asgi_client: Client) -> None:
        calls: list[str] = []
        client = asgi_client(service(calls=calls), settings(rate_limit_per_user_rpm="1"))
        assert (await client.get("/api/v1/items")).status_code == 200
        assert (await client.get("/api/v1/items")).status_code == 429
        assert calls == ["items"]

    async def test_users_have_separate_buckets(self, asgi_client: Client) -> None:
        client = asgi_client(service(), settings(rate_limit_per_user_rpm="1"))
        assert (await client.get("/api/v1/items", headers={"x-test-sub": "alice"})).status_code == 200
        assert (await client.get("/api/v1/items", headers={"x-test-sub": "alice"})).status_code == 429
        assert (await client.get("/api/v1/items", headers={"x-test-sub": "bob"})).status_code == 200

    async def test_denial_emits_the_audit_event(self, asgi_client: Client) -> None:
        client = asgi_client(service(), settings(rate_limit_per_user_rpm="1"))
        await client.get("/api/v1/items")
        with capture_logs() as logs:
            await client.get(
                "/api/v1/items",
                headers={"x-request-id": "rl-2", "user-agent": "probe/1.0", "x-forwarded-for": "198.51.100.4"},
            )
        [event] = [entry for entry in logs if entry["event"] == "HttpRequestDenied"]
        assert event["log_level"] == "warning" and event["severity"] == "warning" and event["audit"] is True
        assert event["subject"] == "alice"
        assert event["user_agent"] == "probe/1.0"
        assert event["request_id"] == "rl-2"
        assert event["client_ip"] == "198.51.100.4"  # the spec records the forwarded address when present
        assert event["details"]["event_type"] == "http.request.denied"
        assert event["details"]["bucket"] == "rate_limit:user:alice:60"
        assert event["details"]["retry_after"] == 60

    async def test_no_audit_event_for_allowed_requests(self, asgi_client: Client) -> None:
        with capture_logs() as logs:
            await asgi_client(service(), settings()).get("/api/v1/items")
        assert not [entry for entry in logs if entry["event"] == "HttpRequestDenied"]

    async def test_audit_auth_events_false_suppresses_the_event(self, asgi_client: Client) -> None:
        client = asgi_client(service(), settings(rate_limit_per_user_rpm="1", audit_audit_auth_events="false"))
        await client.get("/api/v1/items")
        with capture_logs() as logs:
            response = await client.get("/api/v1/items")
        assert response.status_code == 429
        assert not [entry for entry in logs if entry["event"] == "HttpRequestDenied"]


class TestPipelineOrder:
    async def test_rejected_by_auth_is_not_charged(self, asgi_client: Client) -> None:
        svc = service()

        def reject_bob(app: ASGIApp) -> ASGIApp:
            async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
                if dict(scope["headers"]).get(b"x-test-sub") == b"bob":
                    raise InvalidToken()
                await app(scope, receive, send)

            return middleware

        svc.use(Slot.TOKEN_AUTH, reject_bob)
        client = asgi_client(svc, settings(rate_limit_per_ip_rpm="1", rate_limit_per_user_rpm="1"))
        for _ in range(3):
            response = await client.get("/api/v1/items", headers={"x-test-sub": "bob"})
            assert response.status_code == 401
            assert "x-ratelimit-limit" not in response.headers
        assert (await client.get("/api/v1/items", headers={"x-test-sub": "-"})).status_code == 200

    async def test_charged_before_policy(self, asgi_client: Client) -> None:
        svc = service()

        def deny_all(app: ASGIApp) -> ASGIApp:
            async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
                raise PolicyDenied()

            return middleware

        svc.use(Slot.POLICY, deny_all)
        client = asgi_client(svc, settings(rate_limit_per_user_rpm="1"))
        first = await client.get("/api/v1/items")
        assert (first.status_code, first.headers["x-ratelimit-remaining"]) == (403, "0")
        assert (await client.get("/api/v1/items")).status_code == 429


async def call(app: BastionApp, method: str, path: str) -> int:
    """Send one request with a raw ``path`` (httpx would resolve ``..`` itself) and return the status."""
    status = 0

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"testserver")],
        "client": ("10.0.0.1", 1234),
        "server": ("testserver", 80),
    }
    await app(scope, receive, send)
    return status


class TestPathTricks:
    """Paths are canonical before the limiter, so no spelling escapes the rule of the route it reaches."""

    @pytest.mark.parametrize(
        "path",
        [
            pytest.param("//api/v1/uploads", id="double-slash"),
            pytest.param("/api/v1/x/../uploads", id="dot-dot"),
            pytest.param("/api/v1/./uploads", id="dot"),
            pytest.param("/api/v1/uploads/", id="trailing-slash"),
        ],
    )
    async def test_spelling_stays_in_the_strict_rule(self, path: str) -> None:
        calls: list[str] = []
        app = service(calls=calls).build(settings_with_routes({"POST /api/v1/uploads": {"requests_per_hour": 1}}))
        try:
            assert await call(app, "POST", "/api/v1/uploads") == 200
            assert await call(app, "POST", path) == 429
            assert calls == ["upload"]
        finally:
            await app.aclose()

    async def test_case_variant_reaches_no_route(self) -> None:
        """``/API/V1/UPLOADS`` is outside the rule, but it is not the uploads route either: nothing is gained."""
        calls: list[str] = []
        app = service(calls=calls).build(settings_with_routes({"POST /api/v1/uploads": {"requests_per_hour": 1}}))
        try:
            assert await call(app, "POST", "/api/v1/uploads") == 200
            assert await call(app, "POST", "/API/V1/UPLOADS") == 404
            assert calls == ["upload"]
        finally:
            await app.aclose()

    async def test_rule_uses_the_full_path_including_the_base_path(self, asgi_client: Client) -> None:
        client = asgi_client(service(), settings_with_routes({"GET /api/v1/items": {"requests_per_minute": 1}}))
        assert (await client.get("/api/v1/items")).headers["x-ratelimit-limit"] == "1"


class TestForwardedHeaders:
    async def test_untrusted_forwarded_for_cannot_open_new_buckets(self, asgi_client: Client) -> None:
        client = asgi_client(service(sub=None), settings(rate_limit_per_ip_rpm="2"))
        codes = [
            (await client.get("/api/v1/items", headers={"x-forwarded-for": f"192.0.2.{n}"})).status_code
            for n in range(4)
        ]
        assert codes == [200, 200, 429, 429]

    async def test_trusted_forwarded_for_separates_clients(self, asgi_client: Client) -> None:
        client = asgi_client(
            service(sub=None), settings(rate_limit_per_ip_rpm="1", rate_limit_trust_forwarded_headers="true")
        )
        codes = [
            (await client.get("/api/v1/items", headers={"x-forwarded-for": f"192.0.2.{n}"})).status_code
            for n in (1, 2, 1)
        ]
        assert codes == [200, 200, 429]


class TestWiring:
    def test_local_limiter_by_default(self) -> None:
        app = service().build(settings())
        assert app.rate_limiting is not None and isinstance(app.rate_limiting.store, LocalLimiter)

    @pytest.mark.parametrize(
        "env",
        [
            pytest.param({"rate_limit_enabled": "false"}, id="disabled"),
            pytest.param({"rate_limit_auto_apply": "false"}, id="auto-apply-off"),
            pytest.param({"rate_limit_enabled": "false", "rate_limit_distributed": "true"}, id="disabled-wins"),
        ],
    )
    async def test_nothing_is_wired(self, asgi_client: Client, env: dict[str, str]) -> None:
        client = asgi_client(service(), settings(rate_limit_per_user_rpm="1", **env))
        for _ in range(3):
            response = await client.get("/api/v1/items")
            assert response.status_code == 200
            assert "x-ratelimit-limit" not in response.headers

    async def test_distributed_switch_without_a_url_runs_on_the_memory_store(self, asgi_client: Client) -> None:
        svc = service()
        client = asgi_client(svc, settings(rate_limit_per_user_rpm="1", rate_limit_distributed="true"))
        assert (await client.get("/api/v1/items")).status_code == 200
        assert (await client.get("/api/v1/items")).status_code == 429

    async def test_operator_wires_the_distributed_limiter_by_hand(self, asgi_client: Client) -> None:
        configured = settings(rate_limit_auto_apply="false", rate_limit_per_user_rpm="1")
        store = MemoryCacheStore()
        svc = service()
        svc.use(Slot.RATE_LIMIT, RateLimiting.distributed(configured.rate_limit, store).layer)
        client = asgi_client(svc, configured)
        assert (await client.get("/api/v1/items")).status_code == 200
        assert (await client.get("/api/v1/items")).status_code == 429
        assert await store.exists("rate_limit:user:alice:60")

    def test_bad_route_pattern_fails_at_start_up(self) -> None:
        settings = settings_with_routes({"POST /api/v*/documents": {"requests_per_minute": 5}})
        with pytest.raises(ConfigError) as info:
            service().build(settings)
        assert str(info.value) == (
            "route pattern 'POST /api/v*/documents': 'v*' mixes '*' with text; a wildcard is a whole segment "
            "('*' = one segment, '**' = any number)"
        )


async def test_lifespan_passes_through_and_websocket_handshakes_are_charged() -> None:
    seen: list[str] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    guard = RateLimitGuard(settings(rate_limit_per_ip_rpm="1").rate_limit, store=LocalLimiter())
    middleware = GuardLayer(inner, guard=guard)

    async def receive() -> Message:
        return {}

    async def send(message: Message) -> None:
        return None

    websocket = {"type": "websocket", "path": "/x", "headers": [], "client": ("10.0.0.1", 1)}
    await middleware({"type": "lifespan"}, receive, send)
    await middleware(dict(websocket), receive, send)
    with pytest.raises(RateLimitExceeded):
        await middleware(dict(websocket), receive, send)
    await middleware({"type": "lifespan"}, receive, send)
    assert seen == ["lifespan", "websocket", "lifespan"]


def test_ratelimit_all_is_sorted_and_resolvable() -> None:
    import bastion.ratelimit as package

    assert package.__all__ == sorted(package.__all__)
    assert all(hasattr(package, name) for name in package.__all__)
