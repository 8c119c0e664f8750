"""The compiled handlers behave exactly as FastAPI's: a differential test over the example and awkward routes.

Every request goes to two builds of the same service, one with ``service.compiled_handlers`` on (the default)
and one with it off (FastAPI's handler for every route), in the same order so that their stores stay equal;
status, every header and the body must be the same bytes. The tests also check that the compiled path is the
one that served (the routes it is meant to take are compiled; the others are not), so the comparison cannot
pass by both builds running FastAPI.
"""

from __future__ import annotations

import contextlib
import enum
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import httpx
import pytest
import structlog
from fastapi import APIRouter, Body, Depends, Header, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from bastion import NotFound, Service, load_settings
from bastion._app import INLINE_DEPENDENCIES, BastionApp
from bastion._claims import Claims, current_claims, optional_claims
from bastion._compat import fastapi as fastapi_compat
from bastion._compat import starlette as starlette_compat
from bastion.broker import Broker, optional_broker
from bastion.routing import _compiled as compiled_module
from bastion.routing._compiled import CompiledHandler
from bastion.routing._resolve import RouteTable
from bastion.testing import TokenMinter
from bastion.types import Message, ReadAhead
from examples.documents_api.api import register
from examples.documents_api.store import seeded_store

RID = "differential-0001"
JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class Case:
    method: str
    path: str
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] | list[tuple[str, str]] | None = None


@dataclass
class Pair:
    compiled: httpx.AsyncClient
    fastapi: httpx.AsyncClient
    compiled_app: BastionApp

    async def compare(self, case: Case, *, token: str | None = None) -> httpx.Response:
        answers = []
        for client in (self.compiled, self.fastapi):
            headers = {"x-request-id": RID, **case.headers}
            if token is not None:
                headers["authorization"] = f"Bearer {token}"
            answers.append(
                await client.request(
                    case.method, case.path, json=case.json, content=case.content, headers=headers, params=case.params
                )
            )
        compiled, reference = answers
        assert (compiled.status_code, compiled.headers.raw, compiled.content) == (
            reference.status_code,
            reference.headers.raw,
            reference.content,
        ), case
        return compiled

    def compiled_routes(self) -> set[str]:
        return {
            f"{sorted(entry.methods or ())[0]} {entry.template}"
            for entry in self.compiled_app.routes.entries
            if isinstance(entry.handler, CompiledHandler)
        }


def settings(tmp_path: Path, *, compiled: bool, minter: TokenMinter | None = None) -> Any:
    environ = {
        "SERVICE_RATE_LIMIT_ENABLED": "false",
        "SERVICE_COMPILED_HANDLERS": "true" if compiled else "false",
        "SERVICE_TOKEN_ENABLED": "false",
    }
    if minter is not None:
        key = tmp_path / "public.pem"
        key.write_bytes(minter.public_pem())
        environ |= {"SERVICE_TOKEN_ENABLED": "true", "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(key)}
        environ["SERVICE_TOKEN_EXCLUDE_PATHS"] = '["/health", "/ready", "/api/v1/public/*"]'
    return load_settings(None, environ=environ)


@pytest.fixture
async def pair_of(tmp_path: Path) -> AsyncIterator[Callable[..., Pair]]:
    made: list[tuple[httpx.AsyncClient, BastionApp]] = []

    def make(build: Callable[[], Service], minter: TokenMinter | None = None) -> Pair:
        apps = [build().build(settings(tmp_path, compiled=flag, minter=minter)) for flag in (True, False)]
        clients = [
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") for app in apps
        ]
        made.extend(zip(clients, apps, strict=True))
        return Pair(compiled=clients[0], fastapi=clients[1], compiled_app=apps[0])

    yield make
    for client, app in made:
        await client.aclose()
        await app.aclose()


def example_service() -> Service:
    service = Service("documents-api", version="1.0.0")
    register(service, seeded_store())
    return service


EXAMPLE_CASES = [
    Case("GET", "/api/v2/documents"),
    Case("GET", "/api/v2/documents", params={"limit": "2"}),
    Case("GET", "/api/v2/documents", params={"limit": "2", "cursor": "doc-2"}),
    Case("GET", "/api/v2/documents", params={"limit": "0"}),
    Case("GET", "/api/v2/documents", params={"limit": "101"}),
    Case("GET", "/api/v2/documents", params={"limit": "two"}),
    Case("GET", "/api/v2/documents", params={"limit": ""}),
    Case("GET", "/api/v2/documents", params={"limit": " 3 "}),
    Case("GET", "/api/v2/documents", params=[("limit", "1"), ("limit", "3")]),
    Case("GET", "/api/v2/documents", params={"cursor": "c" * 129}),
    Case("GET", "/api/v2/documents", params={"limit": "1e2"}),
    Case("GET", "/api/v2/documents", params={"unknown": "1"}),
    Case("GET", "/api/v1/documents"),
    Case("GET", "/api/v1/admin/users"),
    Case("GET", "/api/v2/documents/alice/doc-1"),
    Case("GET", "/api/v2/documents/alice/missing"),
    Case("GET", "/api/v2/documents/bob/doc-1"),
    Case("POST", "/api/v2/documents", json={"title": "t", "content": "c"}),
    Case("POST", "/api/v2/documents", json={"id": "mine", "title": "t", "content": "c", "extra": 1}),
    Case("POST", "/api/v2/documents", json={"id": "bad id!", "title": "t", "content": "c"}),
    Case("POST", "/api/v2/documents", json={"title": "", "content": "c"}),
    Case("POST", "/api/v2/documents", json={"title": 5, "content": "c"}),
    Case("POST", "/api/v2/documents", json={"content": "c"}),
    Case("POST", "/api/v2/documents", json=[1, 2]),
    Case("POST", "/api/v2/documents", json=None),
    Case("POST", "/api/v2/documents", json="text"),
    Case("POST", "/api/v2/documents", content=b'{"title": "t", "content": ', headers=JSON),
    Case("POST", "/api/v2/documents", content=b"\xff\xfe\x00garbage", headers=JSON),
    Case("POST", "/api/v2/documents", content=b'{"title":"t","content":"c"}'),
    Case("POST", "/api/v2/documents", content=b'{"title":"t","content":"c"}', headers={"content-type": "text/plain"}),
    Case("POST", "/api/v2/documents", content=b'{"title":"t","content":"c"}', headers={"content-type": ""}),
    Case(
        "POST",
        "/api/v2/documents",
        content=b'{"title":"t","content":"c"}',
        headers={"content-type": "application/vnd.api+json; charset=utf-8"},
    ),
    Case("POST", "/api/v2/documents", content=b"", headers={"content-type": "application/json"}),
    Case("POST", "/api/v2/documents", content=b'{"title":"t","content":"c","title":"dup"}', headers=JSON),
    Case("POST", "/api/v2/documents", content=b'{"title":"t","content":NaN}', headers=JSON),
    Case("POST", "/api/v2/documents", json={"title": "t", "content": "x" * 100_001}),
    Case("POST", "/api/v2/documents", json={"title": "t", "content": "x" * 1_100_000}),  # over max_body_bytes
    Case("PUT", "/api/v2/documents/alice/doc-1", json={"title": "new", "content": "body"}),
    Case("PUT", "/api/v2/documents/alice/nope", json={"title": "new", "content": "body"}),
    Case("PUT", "/api/v2/documents/alice/doc-1", json={"title": "new"}),
    Case("DELETE", "/api/v2/documents/alice/doc-1"),
    Case("DELETE", "/api/v2/documents/alice/doc-1"),
    Case("GET", "/api/v2/documents"),
    Case("PATCH", "/api/v2/documents/alice/doc-2"),
    Case("HEAD", "/api/v2/documents"),
]


COMPILES = fastapi_compat.supported() and starlette_compat.supported()
"""Whether the installed FastAPI and Starlette have what the compiled handlers read (FastAPI 0.164.0 and later, see
tests/bastion/compat/test_fastapi.py). On an older release in the supported range no route compiles, and the
differential tests compare the direct route handler's answers with the FastAPI router's."""


async def test_every_route_of_the_example_answers_the_same_bytes_compiled_and_not(
    pair_of: Callable[..., Pair],
) -> None:
    pair = pair_of(example_service)
    compiled = {
        "GET /api/v1/documents",
        "GET /api/v2/documents",
        "POST /api/v1/documents",
        "POST /api/v2/documents",
        "GET /api/v1/documents/{user_id}/{doc_id}",
        "GET /api/v2/documents/{user_id}/{doc_id}",
        "PUT /api/v1/documents/{user_id}/{doc_id}",
        "PUT /api/v2/documents/{user_id}/{doc_id}",
        "DELETE /api/v1/documents/{user_id}/{doc_id}",
        "DELETE /api/v2/documents/{user_id}/{doc_id}",
        "GET /api/v1/admin/users",
        "GET /api/v2/admin/users",
    }
    assert pair.compiled_routes() == (compiled if COMPILES else set())
    statuses = [(await pair.compare(case)).status_code for case in EXAMPLE_CASES]
    # The cases reach every outcome, not just the happy path.
    assert {200, 400, 404, 405, 413, 422} <= set(statuses)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=2)]
    size: int = 1
    tags: list[str] = []


class Out(BaseModel):
    name: str
    note: str | None = None
    hidden: str = "secret"


def custom_dependency() -> str:
    return "custom"


def awkward_service() -> Service:
    service = Service("awkward")
    v1 = service.version(1)

    @v1.get("/scalars/{number}/{flag}/{ident}/{color}")
    async def scalars(
        number: int,
        flag: bool,
        ident: uuid.UUID,
        color: Color,
        ratio: float = 0.5,
        mode: Literal["fast", "slow"] = "fast",
        page_size: Annotated[int, Query(alias="page-size", ge=1, le=50)] = 10,
        label: Annotated[str | None, Query(min_length=2, pattern=r"^[a-z]+$")] = None,
        when: Annotated[str, Query(default_factory=lambda: "now")] = ...,  # type: ignore[assignment]
    ) -> dict[str, Any]:
        return {
            "number": number,
            "flag": flag,
            "ident": ident,
            "color": color,
            "ratio": ratio,
            "mode": mode,
            "page_size": page_size,
            "label": label,
            "when": when,
        }

    @v1.get("/required")
    async def required(q: int, r: Annotated[str, Query(max_length=3)]) -> dict[str, Any]:
        return {"q": q, "r": r}

    @v1.get("/validated-default")
    async def validated_default(n: Annotated[int, Query(validate_default=True)] = "7") -> dict[str, int]:  # type: ignore[assignment]
        return {"n": n}

    @v1.get("/sequence")
    async def sequence(item: Annotated[list[int], Query()] = []) -> dict[str, list[int]]:  # noqa: B006
        return {"item": item}

    @v1.get("/header")
    async def header(x_thing: Annotated[str | None, Header()] = None) -> dict[str, str | None]:
        return {"x_thing": x_thing}

    @v1.post("/strict", response_model=Out, response_model_exclude={"hidden"}, status_code=201)
    async def strict(body: Strict) -> dict[str, Any]:
        return {"name": body.name, "note": None if body.size == 1 else str(body.size), "hidden": "h"}

    @v1.post("/exclude-none", response_model=Out, response_model_exclude_none=True)
    def exclude_none(body: Strict) -> Out:
        return Out(name=body.name)

    @v1.post("/optional-body")
    async def optional_body(body: Strict | None = None) -> dict[str, Any]:
        return {"got": body is not None}

    @v1.post("/embedded")
    async def embedded(item: Annotated[Strict, Body(embed=True)]) -> dict[str, str]:
        return {"name": item.name}

    @v1.post("/raw-request")
    async def raw_request(request: Request, body: Strict) -> dict[str, Any]:
        return {"json": await request.json(), "bytes": len(await request.body()), "name": body.name}

    @v1.get("/no-model")
    async def no_model() -> Any:
        return {"b": 2, "a": [1.5, None, "ü"], "id": uuid.UUID(int=5)}

    @v1.get("/inferred")
    async def inferred() -> Out:
        return Out(name="x", note="y")

    @v1.get("/plain", response_class=PlainTextResponse)
    async def plain() -> str:
        return "plain text"

    @v1.get("/plain-bad", response_class=PlainTextResponse)
    async def plain_bad() -> str:
        return 5  # type: ignore[return-value]

    @v1.get("/response-object")
    async def response_object() -> Response:
        return JSONResponse({"custom": True}, status_code=202, headers={"x-custom": "1"})

    # response_model=None: FastAPI 0.115 reads ``-> None`` as a response model and refuses it on a 204 route.
    @v1.delete("/no-content", status_code=204, response_model=None)
    async def no_content() -> None:
        return None

    @v1.get("/http-error")
    async def http_error() -> None:
        raise HTTPException(status_code=418, detail="teapot", headers={"x-tea": "earl grey"})

    @v1.get("/not-found")
    async def not_found() -> None:
        raise NotFound("nothing here")

    @v1.get("/bad-response", response_model=Out)
    async def bad_response() -> dict[str, int]:
        return {"wrong": 1}

    @v1.get("/sync/{n}")
    def sync_endpoint(n: int) -> dict[str, int]:
        return {"n": n * 2}

    @v1.get("/claims")
    async def claims(who: Annotated[Claims, Depends(current_claims)]) -> dict[str, Any]:
        return {"sub": who.sub, "roles": list(who.roles)}

    @v1.get("/public/maybe-claims")
    async def maybe_claims(
        who: Annotated[Claims | None, Depends(optional_claims)],
        broker: Annotated[Broker | None, Depends(optional_broker)],
    ) -> dict[str, Any]:
        return {"sub": who.sub if who else None, "broker": broker is not None}

    @v1.get("/custom-dependency")
    async def custom(value: Annotated[str, Depends(custom_dependency)]) -> dict[str, str]:
        return {"value": value}

    return service


AWKWARD_CASES = [
    Case("GET", f"/api/v1/scalars/7/true/{uuid.UUID(int=1)}/red"),
    Case(
        "GET",
        f"/api/v1/scalars/-3/0/{uuid.UUID(int=2).hex}/blue",
        params={"ratio": "1e3", "mode": "slow", "page-size": "50", "label": "abc", "when": "later"},
    ),
    Case("GET", f"/api/v1/scalars/7/yes/{uuid.UUID(int=1)}/red", params={"page_size": "3"}),
    Case("GET", f"/api/v1/scalars/7/maybe/{uuid.UUID(int=1)}/red"),
    Case("GET", "/api/v1/scalars/7/true/not-a-uuid/red"),
    Case("GET", f"/api/v1/scalars/7.5/true/{uuid.UUID(int=1)}/green"),
    Case("GET", f"/api/v1/scalars/7/true/{uuid.UUID(int=1)}/red", params={"page-size": "51", "label": "A"}),
    Case("GET", f"/api/v1/scalars/7/true/{uuid.UUID(int=1)}/red", params={"mode": "medium", "ratio": "nan"}),
    Case("GET", f"/api/v1/scalars/99999999999999999999999/true/{uuid.UUID(int=1)}/red"),
    Case("GET", "/api/v1/required"),
    Case("GET", "/api/v1/required", params={"q": "1"}),
    Case("GET", "/api/v1/required", params={"q": "1", "r": "abcd"}),
    Case("GET", "/api/v1/required", params={"q": "1", "r": ""}),
    Case("GET", "/api/v1/required", params={"q": "١", "r": "x"}),
    Case("GET", "/api/v1/validated-default"),
    Case("GET", "/api/v1/validated-default", params={"n": "x"}),
    Case("GET", "/api/v1/sequence", params=[("item", "1"), ("item", "2")]),
    Case("GET", "/api/v1/sequence", params=[("item", "one")]),
    Case("GET", "/api/v1/header", headers={"x-thing": "h"}),
    Case("POST", "/api/v1/strict", json={"name": "ab", "size": 3}),
    Case("POST", "/api/v1/strict", json={"name": "ab"}),
    Case("POST", "/api/v1/strict", json={"name": "ab", "extra": True}),
    Case("POST", "/api/v1/strict", json={"name": "a", "size": "big", "tags": "x"}),
    Case("POST", "/api/v1/strict", json={"name": "ab", "size": "3"}),
    Case("POST", "/api/v1/strict", json={"name": "ab", "size": 2**70}),
    Case("POST", "/api/v1/strict", content=b"[]", headers=JSON),
    Case("POST", "/api/v1/strict", content=b"{", headers=JSON),
    Case("POST", "/api/v1/strict", content=b"nul", headers=JSON),
    Case("POST", "/api/v1/strict", content=b'"\\ud800"', headers=JSON),
    Case("POST", "/api/v1/strict", content=b"{}" * 10, headers={"content-type": "application/json"}),
    Case("POST", "/api/v1/strict", content=b'{"name":"ab"}', headers={"content-type": "application/xml"}),
    Case("POST", "/api/v1/strict", content=b'{"name":"ab"}', headers={"content-type": "APPLICATION/JSON"}),
    Case("POST", "/api/v1/strict", content=b'{"name":"ab"}', headers={"content-type": "application/problem+json"}),
    Case("POST", "/api/v1/strict", content=b'{"name":"ab"}', headers={"content-type": ";;;=="}),
    Case("POST", "/api/v1/exclude-none", json={"name": "ab"}),
    Case("POST", "/api/v1/exclude-none", json={"name": 1}),
    Case("POST", "/api/v1/optional-body"),
    Case("POST", "/api/v1/optional-body", json={"name": "ab"}),
    Case("POST", "/api/v1/optional-body", json={"name": "a"}),
    Case("POST", "/api/v1/embedded", json={"item": {"name": "ab"}}),
    Case("POST", "/api/v1/embedded", json={"name": "ab"}),
    Case("POST", "/api/v1/raw-request", json={"name": "ab", "tags": ["x"]}),
    Case("POST", "/api/v1/raw-request", json={"name": "a"}),
    Case("GET", "/api/v1/no-model"),
    Case("GET", "/api/v1/inferred"),
    Case("GET", "/api/v1/plain"),
    Case("GET", "/api/v1/response-object"),
    Case("DELETE", "/api/v1/no-content"),
    Case("GET", "/api/v1/http-error"),
    Case("GET", "/api/v1/not-found"),
    Case("GET", "/api/v1/sync/21"),
    Case("GET", "/api/v1/sync/x"),
    Case("GET", "/api/v1/public/maybe-claims"),
    Case("GET", "/api/v1/custom-dependency"),
]


async def test_awkward_signatures_answer_the_same_bytes_compiled_and_not(pair_of: Callable[..., Pair]) -> None:
    minter = TokenMinter("RS256")
    pair = pair_of(awkward_service, minter)
    token = minter.mint(sub="alice", roles=["reader", "writer"], ttl=600)
    compiled = {
        "GET /api/v1/scalars/{number}/{flag}/{ident}/{color}",
        "GET /api/v1/required",
        "GET /api/v1/validated-default",
        "POST /api/v1/strict",
        "POST /api/v1/exclude-none",
        "POST /api/v1/optional-body",
        "POST /api/v1/raw-request",
        "GET /api/v1/no-model",
        "GET /api/v1/inferred",
        "GET /api/v1/plain",
        "GET /api/v1/plain-bad",
        "GET /api/v1/response-object",
        "DELETE /api/v1/no-content",
        "GET /api/v1/http-error",
        "GET /api/v1/not-found",
        "GET /api/v1/bad-response",
        "GET /api/v1/sync/{n}",
        "GET /api/v1/claims",
        "GET /api/v1/public/maybe-claims",
    }  # not: /sequence (a list), /header (a header), /embedded (embedded body), /custom-dependency
    assert pair.compiled_routes() == (compiled if COMPILES else set())
    statuses = [(await pair.compare(case, token=token)).status_code for case in AWKWARD_CASES]
    assert {200, 201, 202, 204, 400, 404, 418, 422} <= set(statuses)
    claims = await pair.compare(Case("GET", "/api/v1/claims"), token=token)
    assert claims.json() == {"sub": "alice", "roles": ["reader", "writer"]}
    anonymous = await pair.compare(Case("GET", "/api/v1/public/maybe-claims"))
    assert anonymous.json() == {"sub": None, "broker": False}


@pytest.mark.parametrize("path", ["/api/v1/bad-response", "/api/v1/plain-bad"])
async def test_a_response_that_fails_its_model_is_the_same_500(pair_of: Callable[..., Pair], path: str) -> None:
    pair = pair_of(awkward_service)
    response = await pair.compare(Case("GET", path))
    assert response.status_code == 500


async def test_dependency_overrides_in_force_send_the_request_to_fastapi() -> None:
    """An override may replace a dependency the compiled handler would call inline: FastAPI's handler runs."""

    class Provider:
        dependency_overrides: dict[Any, Any] = {}

    inner = APIRouter()

    @inner.get("/who")
    async def who(claims: Annotated[Claims | None, Depends(optional_claims)]) -> dict[str, Any]:
        return {"sub": claims.sub if claims else None}

    outer = APIRouter(dependency_overrides_provider=Provider)
    outer.include_router(inner, prefix="/x")
    (entry,) = RouteTable.from_router(outer, version=1, compile_with=INLINE_DEPENDENCIES)
    assert isinstance(entry.handler, CompiledHandler) is COMPILES

    async def app(scope: Any, receive: Any, send: Any) -> None:
        scope["path_params"] = {}
        await entry.handler(scope, receive, send)  # type: ignore[misc]

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as client:
        assert (await client.get("/x/who")).json() == {"sub": None}
        Provider.dependency_overrides = {optional_claims: lambda: Claims(sub="override", exp=0)}
        assert (await client.get("/x/who")).json() == {"sub": "override"}


async def test_the_setting_turns_the_compiled_path_off(tmp_path: Path) -> None:
    app = example_service().build(settings(tmp_path, compiled=False))
    assert not any(isinstance(entry.handler, CompiledHandler) for entry in app.routes.entries)
    await app.aclose()


@pytest.mark.parametrize("compat", [fastapi_compat, starlette_compat], ids=["fastapi", "starlette"])
async def test_without_the_internals_compiling_switches_off_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compat: Any
) -> None:
    """A FastAPI or Starlette without a hook the compiled handlers read: FastAPI's handler serves every route (the
    same answers), and one ``compiled_handlers_unavailable`` line names the versions."""
    monkeypatch.setattr(compat, "supported", lambda: False)
    compiled_module.available.cache_clear()
    try:
        with structlog.testing.capture_logs() as logs:
            app = example_service().build(settings(tmp_path, compiled=True))
        unavailable = [log for log in logs if log["event"] == "compiled_handlers_unavailable"]
        assert len(unavailable) == 1
        assert unavailable[0]["fastapi"] == fastapi_compat.version()
        assert unavailable[0]["log_level"] == "warning"
        assert not any(isinstance(entry.handler, CompiledHandler) for entry in app.routes.entries)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as client:
            assert (await client.get("/api/v1/documents")).status_code == 200
        await app.aclose()
    finally:
        compiled_module.available.cache_clear()


async def test_the_installed_fastapi_compiles_or_says_so_in_one_line(tmp_path: Path) -> None:
    """FastAPI 0.164.0 and later compile without a line; an older one in the range logs one line and compiles none."""
    compiled_module.available.cache_clear()
    try:
        with structlog.testing.capture_logs() as logs:
            app = example_service().build(settings(tmp_path, compiled=True))
            second = example_service().build(settings(tmp_path, compiled=True))  # one line per process, not per app
        unavailable = [log for log in logs if log["event"] == "compiled_handlers_unavailable"]
        assert len(unavailable) == (0 if COMPILES else 1)
        assert any(isinstance(entry.handler, CompiledHandler) for entry in app.routes.entries) is COMPILES
        await app.aclose()
        await second.aclose()
    finally:
        compiled_module.available.cache_clear()


async def test_a_streamed_body_over_the_limit_is_the_same_413(pair_of: Callable[..., Pair]) -> None:
    """No content-length: the body limit trips while the compiled handler reads the body, as in FastAPI's."""
    pair = pair_of(example_service)
    answers = []
    for client in (pair.compiled, pair.fastapi):

        async def chunks() -> AsyncIterator[bytes]:
            yield b'{"title": "t", "content": "'
            for _ in range(20):
                yield b"x" * 65_536
            yield b'"}'

        response = await client.post(
            "/api/v2/documents", content=chunks(), headers={"content-type": "application/json", "x-request-id": RID}
        )
        answers.append((response.status_code, response.headers.raw, response.content))
    assert answers[0] == answers[1]
    assert answers[0][0] == 413


class Titled(BaseModel):
    title: str


async def test_a_body_read_ahead_is_taken_from_its_reader_not_received_again() -> None:
    """A step before the handler that read the whole body (the idempotency step) hands it over through its
    ``receive``'s owner, a ReadAhead: the compiled handler takes it from there and never calls ``receive``;
    FastAPI's handler (a FastAPI without the hooks: nothing compiles) receives it as one message. Same answer."""

    class Ahead(ReadAhead):
        __slots__ = ("body", "received")

        def __init__(self, body: bytes) -> None:
            self.body: bytes | None = body
            self.received = 0

        def take_body(self) -> bytes | None:
            body, self.body = self.body, None
            return body

        async def receive(self) -> Message:
            self.received += 1
            body = self.take_body()
            if body is None:
                return {"type": "http.disconnect"}
            return {"type": "http.request", "body": body, "more_body": False}

    inner = APIRouter()

    @inner.post("/items", status_code=201)
    async def create(item: Titled) -> dict[str, str]:
        return {"title": item.title}

    router = APIRouter()
    router.include_router(inner, prefix="/x")
    (entry,) = RouteTable.from_router(router, version=1, compile_with=INLINE_DEPENDENCIES)
    assert isinstance(entry.handler, CompiledHandler) is COMPILES
    ahead = Ahead(b'{"title": "t"}')
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async with contextlib.AsyncExitStack() as stack:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/x/items",
            "raw_path": b"/x/items",
            "root_path": "",
            "query_string": b"",
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"14")],
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
            "path_params": {},
            "fastapi_astack": stack,
            "fastapi_inner_astack": stack,
            "fastapi_function_astack": stack,
        }
        await entry.handler(scope, ahead.receive, send)  # type: ignore[misc]
    assert ahead.received == (0 if COMPILES else 1)
    assert sent[0]["status"] == 201
    assert json.loads(sent[1]["body"]) == {"title": "t"}
