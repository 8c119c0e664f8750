"""The assembled pipeline: slot order, error shapes, panics, lifespan hooks."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from fastapi import HTTPException
from pydantic import BaseModel
from structlog.testing import capture_logs

from bastion import PolicyDenied, RateLimitExceeded, Service, Slot, TokenError, Unavailable
from bastion.errors import InvalidToken
from bastion.types import SCOPE_REQUEST_ID, SCOPE_ROUTE, ASGIApp, Receive, Scope, Send
from tests.conftest import open_settings


class Item(BaseModel):
    name: str
    size: int


def items_service() -> Service:
    service = Service("items")
    v1 = service.version(1)

    @v1.post("/items")
    async def create(item: Item) -> Item:
        return item

    @v1.get("/boom")
    async def boom() -> None:
        raise RuntimeError("database password is hunter2")

    @v1.get("/teapot")
    async def teapot() -> None:
        raise HTTPException(418, "short and stout")

    @v1.get("/denied")
    async def denied() -> None:
        raise PolicyDenied()

    @v1.get("/limited")
    async def limited() -> None:
        raise RateLimitExceeded(retry_after=7)

    @v1.get("/down")
    async def down() -> None:
        raise Unavailable(retry_after=3)

    return service


class TestErrorShapes:
    async def test_unhandled_exception_is_500_without_details(
        self, asgi_client: Callable[..., httpx.AsyncClient]
    ) -> None:
        with capture_logs() as logs:
            response = await asgi_client(items_service()).get("/api/v1/boom", headers={"x-request-id": "req-42"})
        assert response.status_code == 500
        assert response.json() == {"error": "Internal server error", "code": "INTERNAL_ERROR", "status": 500}
        assert "hunter2" not in response.text and "Traceback" not in response.text
        assert response.headers["x-request-id"] == "req-42"
        errors = [entry for entry in logs if entry["event"] == "unhandled_exception"]
        assert len(errors) == 1
        assert errors[0]["exception"].startswith("Traceback (most recent call last):")
        assert errors[0]["exception"].endswith("RuntimeError: database password is hunter2")

    async def test_500_log_line_carries_the_request_id(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        import structlog

        structlog.contextvars.clear_contextvars()
        seen: list[object] = []

        def grab(logger: object, method: str, event: dict[str, object]) -> dict[str, object]:
            if event.get("event") == "unhandled_exception":
                seen.append(structlog.contextvars.get_contextvars().get("request_id"))
            raise structlog.DropEvent

        structlog.configure(processors=[grab])
        try:
            await asgi_client(items_service()).get("/api/v1/boom", headers={"x-request-id": "req-43"})
        finally:
            structlog.reset_defaults()
        assert seen == ["req-43"]

    async def test_validation_error_is_422(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        response = await asgi_client(items_service()).post("/api/v1/items", json={"name": "x", "size": "big"})
        assert response.status_code == 422
        body = response.json()
        assert body["code"] == "VALIDATION_ERROR" and body["status"] == 422
        assert "body.size" in body["error"]

    async def test_malformed_json_is_400(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        response = await asgi_client(items_service()).post(
            "/api/v1/items", content=b'{"name": ', headers={"content-type": "application/json"}
        )
        assert response.status_code == 400
        assert response.json() == {
            "error": "Request body is not valid JSON",
            "code": "MALFORMED_BODY",
            "status": 400,
        }

    @pytest.mark.parametrize(
        ("content", "content_type"),
        [
            (b"name=x", "application/x-www-form-urlencoded"),
            (b"<item/>", "application/xml"),
            (b"\xff\xfe", "text/plain"),
        ],
    )
    async def test_wrong_content_type_is_a_4xx(
        self, asgi_client: Callable[..., httpx.AsyncClient], content: bytes, content_type: str
    ) -> None:
        response = await asgi_client(items_service()).post(
            "/api/v1/items", content=content, headers={"content-type": content_type}
        )
        assert 400 <= response.status_code < 500
        assert set(response.json()) == {"error", "code", "status"}

    async def test_http_exception_keeps_its_status(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        response = await asgi_client(items_service()).get("/api/v1/teapot")
        assert response.status_code == 418
        assert response.json() == {"error": "short and stout", "code": "IM_A_TEAPOT", "status": 418}

    async def test_403_body_is_exact(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        response = await asgi_client(items_service()).get("/api/v1/denied")
        assert response.status_code == 403
        assert response.json() == {"error": "Access denied by policy", "code": "FORBIDDEN", "status": 403}

    async def test_429_has_retry_after_in_body_and_header(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        response = await asgi_client(items_service()).get("/api/v1/limited")
        assert response.status_code == 429
        assert response.json() == {
            "error": "Rate limit exceeded",
            "code": "RATE_LIMIT_EXCEEDED",
            "status": 429,
            "retry_after": 7,
        }
        assert response.headers["retry-after"] == "7"

    async def test_503_has_retry_after(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        response = await asgi_client(items_service()).get("/api/v1/down")
        assert response.status_code == 503
        assert response.json()["code"] == "SERVICE_UNAVAILABLE"
        assert response.headers["retry-after"] == "3"


def recording_layer(name: str, trail: list[str]) -> Callable[[ASGIApp], ASGIApp]:
    def layer(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            trail.append(name)
            await app(scope, receive, send)

        return middleware

    return layer


class TestSlots:
    async def test_slots_run_in_spec_order(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        trail: list[str] = []
        service = items_service()
        for slot in (Slot.RESILIENCE, Slot.POLICY, Slot.RATE_LIMIT, Slot.TOKEN_AUTH):
            service.use(slot, recording_layer(slot.value, trail))
        service.use(Slot.TOKEN_AUTH, recording_layer("token_auth_2", trail))
        await asgi_client(service).get("/api/v1/teapot")
        assert trail == ["token_auth", "token_auth_2", "rate_limit", "policy", "resilience"]

    async def test_slot_sees_request_id_and_resolved_route(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        seen: dict[str, object] = {}

        def layer(app: ASGIApp) -> ASGIApp:
            async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
                seen["request_id"] = scope[SCOPE_REQUEST_ID]
                seen["template"] = scope[SCOPE_ROUTE].template
                await app(scope, receive, send)

            return middleware

        service = items_service()
        service.use(Slot.POLICY, layer)
        await asgi_client(service).post("/api/v1/items", json={"name": "a", "size": 1}, headers={"x-request-id": "r1"})
        assert seen == {"request_id": "r1", "template": "/api/v1/items"}

    async def test_rejection_in_a_slot_gets_the_shape_and_the_outer_headers(
        self, asgi_client: Callable[..., httpx.AsyncClient]
    ) -> None:
        def reject(app: ASGIApp) -> ASGIApp:
            async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
                raise InvalidToken(headers=[("www-authenticate", 'Bearer error="invalid_token"')])

            return middleware

        service = items_service()
        service.use(Slot.TOKEN_AUTH, reject)
        settings = open_settings(environ={"SERVICE_MIDDLEWARE_CORS_ALLOW_ORIGINS": "https://app.example"})
        response = await asgi_client(service, settings).get(
            "/api/v1/teapot", headers={"origin": "https://app.example", "x-request-id": "r2"}
        )
        assert response.status_code == 401
        assert response.json() == {"error": "Invalid token", "code": "INVALID_TOKEN", "status": 401}
        assert response.headers["www-authenticate"] == 'Bearer error="invalid_token"'
        assert response.headers["x-request-id"] == "r2"
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["access-control-allow-origin"] == "https://app.example"

    async def test_health_is_reached_without_passing_slots_bypass_is_up_to_the_layer(
        self, asgi_client: Callable[..., httpx.AsyncClient]
    ) -> None:
        trail: list[str] = []
        service = items_service()
        service.use(Slot.TOKEN_AUTH, recording_layer("auth", trail))
        assert (await asgi_client(service).get("/health")).status_code == 200
        assert trail == ["auth"]

    def test_token_error_base_is_401(self) -> None:
        assert TokenError.status == 401 and TokenError.code == "UNAUTHORIZED"


class TestLifespan:
    async def test_startup_and_shutdown_hooks_run(self) -> None:
        calls: list[str] = []
        service = items_service()

        @service.on_startup
        async def up() -> None:
            calls.append("up")

        @service.on_shutdown
        async def down() -> None:
            calls.append("down")

        app = service.build(open_settings())
        messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
        sent: list[str] = []

        async def receive() -> dict[str, str]:
            return next(messages)

        async def send(message: dict[str, str]) -> None:
            sent.append(message["type"])

        await app({"type": "lifespan"}, receive, send)  # type: ignore[arg-type]
        assert calls == ["up", "down"]
        assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]

    async def test_failing_startup_hook_fails_startup(self) -> None:
        service = items_service()

        @service.on_startup
        async def up() -> None:
            raise RuntimeError("no database")

        sent: list[dict[str, str]] = []

        async def receive() -> dict[str, str]:
            return {"type": "lifespan.startup"}

        async def send(message: dict[str, str]) -> None:
            sent.append(message)

        await service.build(open_settings())({"type": "lifespan"}, receive, send)  # type: ignore[arg-type]
        assert sent == [
            {"type": "lifespan.startup.failed", "message": "start-up hook up failed: RuntimeError: no database"}
        ]
