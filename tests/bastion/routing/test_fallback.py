"""Path precedence: health > versioned > frontend > fallback; the last fallback setter wins; empty 404."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from bastion import Service
from bastion.types import Receive, Scope, Send


def service_with_everything() -> Service:
    service = Service("svc")
    service.version(1).get("/things")(lambda: {"from": "versioned"})

    async def page(request: Request) -> Response:
        return PlainTextResponse("frontend page")

    async def health_impostor(request: Request) -> Response:
        return PlainTextResponse("impostor")

    async def api_impostor(request: Request) -> Response:
        return PlainTextResponse("impostor")

    service.frontend(
        [Route("/", page), Route("/health", health_impostor), Route("/api/v1/things", api_impostor)],
        fallback=text_handler("frontend fallback"),
    )
    return service


def text_handler(text: str) -> Callable[[Request], Awaitable[Response]]:
    async def handler(request: Request) -> Response:
        return PlainTextResponse(text)

    return handler


class TestPrecedence:
    async def test_health_beats_frontend(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        response = await asgi_client(service_with_everything()).get("/health")
        assert response.json()["status"] == "healthy"

    async def test_versioned_beats_frontend(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        assert (await asgi_client(service_with_everything()).get("/api/v1/things")).json() == {"from": "versioned"}

    async def test_frontend_route_serves_its_path(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        assert (await asgi_client(service_with_everything()).get("/")).text == "frontend page"

    async def test_frontend_fallback_takes_unmatched_paths(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        assert (await asgi_client(service_with_everything()).get("/elsewhere")).text == "frontend fallback"

    async def test_set_fallback_wins_over_frontend_fallback(
        self, asgi_client: Callable[..., httpx.AsyncClient]
    ) -> None:
        service = service_with_everything()
        service.set_fallback(text_handler("service fallback"))
        client = asgi_client(service)
        assert (await client.get("/elsewhere")).text == "service fallback"
        assert (await client.get("/")).text == "frontend page"
        assert (await client.get("/api/v1/things")).json() == {"from": "versioned"}

    async def test_last_setter_wins(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        service = service_with_everything()
        service.set_fallback(text_handler("first"))

        async def forward(scope: Scope, receive: Receive, send: Send) -> None:
            await PlainTextResponse("forwarded " + scope["path"])(scope, receive, send)

        service.set_fallback_app(forward)
        service.set_fallback(text_handler("third"))
        assert (await asgi_client(service).get("/x")).text == "third"

    async def test_forwarding_app_as_last_setter(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        service = service_with_everything()
        service.set_fallback(text_handler("first"))

        async def forward(scope: Scope, receive: Receive, send: Send) -> None:
            await PlainTextResponse("forwarded " + scope["path"])(scope, receive, send)

        service.set_fallback_app(forward)
        assert (await asgi_client(service).get("/upstream/x")).text == "forwarded /upstream/x"

    async def test_forwarded_requests_pass_the_whole_stack(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        service = service_with_everything()

        async def forward(scope: Scope, receive: Receive, send: Send) -> None:
            await PlainTextResponse("forwarded")(scope, receive, send)

        service.set_fallback_app(forward)
        response = await asgi_client(service).get("/upstream", headers={"x-request-id": "abc-123"})
        assert response.headers["x-request-id"] == "abc-123"
        assert response.headers["x-content-type-options"] == "nosniff"


class TestUnmatched:
    async def test_unmatched_path_without_fallback_is_empty_404(
        self, asgi_client: Callable[..., httpx.AsyncClient]
    ) -> None:
        service = Service()
        service.version(1).get("/x")(lambda: {})
        response = await asgi_client(service).get("/nowhere")
        assert response.status_code == 404
        assert response.content == b""
        assert response.headers["x-request-id"]

    async def test_trailing_slash_is_not_the_same_route(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        service = Service()
        service.version(1).get("/x")(lambda: {})
        response = await asgi_client(service).get("/api/v1/x/")
        assert (response.status_code, response.content) == (404, b"")

    async def test_wrong_method_is_405_in_the_error_shape(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        service = Service()
        service.version(1).get("/x")(lambda: {})
        response = await asgi_client(service).delete("/api/v1/x")
        assert response.status_code == 405
        assert response.json() == {"error": "Method not allowed", "code": "METHOD_NOT_ALLOWED", "status": 405}
        assert response.headers["allow"] == "GET"

    async def test_health_rejects_post_with_405(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        service = Service()
        service.version(1).get("/x")(lambda: {})
        assert (await asgi_client(service).post("/health")).status_code == 405
