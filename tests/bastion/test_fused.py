"""The compiled pipeline (bastion._fused) answers as the nested layers do: status, headers, body, guard outcomes.

Two apps are built from the same service and settings; one is served as built (adjacent steps fused), the other
with the same steps nested one layer each (``assemble(fuse=False)``). Every request below goes to both, in the same
order, and must get the same answer byte for byte; the recording guards must be told the same outcomes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from fastapi import Request

from bastion import BastionError, Exemptions, NotFound, Service, Slot, load_settings
from bastion._app import BastionApp
from bastion._guard import Cleanup
from bastion._pipeline import Step, assemble
from bastion.testing import TokenMinter
from bastion.types import ASGIApp, Message, Scope

Headers = list[tuple[bytes, bytes]]


class Denied(BastionError):
    status, code, message = 403, "DENIED_BY_TEST", "Denied by the test guard"


class Recorder:
    """A guard that returns an outcome (or, with ``cleanup``, only notes the end) and records what it is told."""

    exemptions = Exemptions()

    def __init__(self, *, cleanup: bool = False) -> None:
        self.told: list[str | None] = []
        self.cleanup = cleanup

    async def check(self, scope: Scope) -> object:
        if any(name == b"x-deny" for name, _ in scope["headers"]):
            raise Denied()
        if self.cleanup:
            return Cleanup(lambda: self.told.append("cleanup"))

        async def outcome(status: str | None) -> None:
            self.told.append(status)

        return outcome


def service(inside: list[Callable[[], Awaitable[object]]]) -> Service:
    """``inside``: what the idempotent route's handler awaits when the body asks for ``again`` (the same request
    sent again while this one runs: 409)."""
    built = Service("fused")
    created: list[str] = []
    for number in (1, 2):
        version = built.version(number)
        version.get("/x")(lambda: {"ok": True})
        version.get("/items/{item_id}")(lambda item_id: {"item_id": item_id, "text": "y" * 600})

        @version.get("/boom")
        def boom() -> dict[str, str]:
            raise RuntimeError("handler bug")

        @version.post("/orders", status_code=201, idempotency=True)
        async def order(request: Request) -> dict[str, object]:
            body = await request.json()
            if body.get("again"):
                await inside[0]()
            created.append(body["item"])
            return {"id": len(created), "item": body["item"]}

        @version.get("/missing")
        def missing() -> dict[str, str]:
            raise NotFound("No such thing")

    built.deprecate(1, replacement=2, message="Use v2.")
    built.use_resilience(version=2)
    return built


def build(
    environ: dict[str, str], inside: list[Callable[[], Awaitable[object]]] | None = None
) -> tuple[BastionApp, list[Recorder]]:
    app = service([] if inside is None else inside).build(load_settings(environ=environ))
    recorders = [Recorder(), Recorder(cleanup=True)]
    # Two more built-in-like guards after policy (fused with it): one reporting outcomes, one cleaning up.
    at = next(index for index, step in enumerate(app.steps) if step.name == "policy") + 1
    extra = [Step.guarding(f"policy:test:{n}", guard, Slot.POLICY) for n, guard in enumerate(recorders)]
    app.steps[at:at] = extra
    return app, recorders


@pytest.fixture
def environ(tmp_path: Path) -> dict[str, str]:
    key = tmp_path / "public.pem"
    minter = TokenMinter("RS256")
    key.write_bytes(minter.public_pem())
    policies = tmp_path / "p.cedar"
    policies.write_text("permit(principal, action, resource);")
    return {
        "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(key),
        "SERVICE_POLICY_POLICY_PATH": str(policies),
        "SERVICE_MIDDLEWARE_CORS_ALLOW_ORIGINS": "https://app.example",
        "SERVICE_MIDDLEWARE_MAX_BODY_BYTES": "100",
        "SERVICE_MIDDLEWARE_COMPRESSION_MINIMUM_SIZE": "100",
        "BEARER": minter.mint(sub="alice", roles=["user"], ttl=600),
    }


async def call(app: ASGIApp, method: str, path: str, headers: Headers, body: bytes = b"") -> tuple[int, Headers, bytes]:
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"test"), (b"x-request-id", b"fixed-id"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
    }
    messages: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        messages.append(message)

    await app(scope, receive, send)
    start = messages[0]
    body = b"".join(message.get("body", b"") for message in messages[1:])
    # The quota's reset and remaining follow the clock (tokens refill between the two calls): present, value aside.
    headers = [(name, b"~" if name == b"x-ratelimit-remaining" else value) for name, value in start["headers"]]
    return start["status"], [(name, value) for name, value in headers if b"reset" not in name], body


async def test_fused_and_nested_pipelines_answer_alike(environ: dict[str, str]) -> None:
    bearer = [(b"authorization", f"Bearer {environ.pop('BEARER')}".encode())]
    fused_app, fused_told = build(environ)
    nested_app, nested_told = build(environ)
    fused = assemble(fused_app.steps, fused_app.dispatcher)
    nested = assemble(nested_app.steps, nested_app.dispatcher, fuse=False)
    origin = [(b"origin", b"https://app.example")]
    requests: list[tuple[str, str, Headers]] = [
        ("GET", "/api/v2/x", bearer),
        ("GET", "/api/v1/x", bearer),  # deprecated: its headers on the response
        ("GET", "/api/v2/x", [*bearer, *origin]),  # CORS's own path
        ("OPTIONS", "/api/v2/x", [*origin, (b"access-control-request-method", b"GET")]),  # preflight
        ("GET", "/api/v2/items/7", [*bearer, (b"accept-encoding", b"gzip")]),  # compressed: nested from there
        ("GET", "/api/v2/items/7", bearer),
        ("GET", "//api/v2/./x", bearer),  # normalized
        ("GET", "/api/v2/x\x01", bearer),  # 400 from path normalization
        ("GET", "/api/v2/x", []),  # 401
        ("GET", "/api/v2/x", [*bearer, (b"x-deny", b"1")]),  # a later guard refuses
        ("GET", "/api/v2/boom", bearer),  # 500: INTERNAL
        ("GET", "/api/v2/missing", bearer),  # 404 raised: OK
        ("GET", "/api/v2/nowhere", bearer),  # empty 404
        ("POST", "/api/v2/x", bearer),  # 405
        ("GET", "/api/v2/x", [*bearer, (b"content-length", b"1000")]),  # 413
        ("GET", "/health", []),
    ]
    for method, path, headers in requests:
        got = await call(fused, method, path, headers)
        assert got == await call(nested, method, path, headers), (method, path)
    # The metrics endpoint (answered in the observe step): same status and headers (the values differ by the timings).
    (status, headers, _), (nested_status, nested_headers, _) = [
        await call(app, "GET", "/metrics", []) for app in (fused, nested)
    ]
    assert (status, [name for name, _ in headers]) == (nested_status, [name for name, _ in nested_headers])
    assert (status, headers[-1]) == (200, (b"x-request-id", b"fixed-id"))
    assert [recorder.told for recorder in fused_told] == [recorder.told for recorder in nested_told]
    assert fused_told[0].told.count("INTERNAL") == 1
    assert fused_told[1].told.count("cleanup") == len(fused_told[0].told)


async def test_other_connections_take_the_nested_layers(environ: dict[str, str]) -> None:
    environ.pop("BEARER")
    app, _ = build(environ)
    seen: list[str] = []

    async def lifespan_app(scope: Scope, receive: object, send: object) -> None:
        seen.append(scope["type"])

    await assemble(app.steps, lifespan_app)({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    assert seen == ["lifespan"]


async def test_an_idempotent_post_answers_alike_fused_and_nested(environ: dict[str, str]) -> None:
    bearer = [(b"authorization", f"Bearer {environ.pop('BEARER')}".encode()), (b"content-type", b"application/json")]
    inside: list[Callable[[], Awaitable[object]]] = []
    fused_app, _ = build(environ, inside)
    nested_app, _ = build(environ, inside)
    fused = assemble(fused_app.steps, fused_app.dispatcher)
    nested = assemble(nested_app.steps, nested_app.dispatcher, fuse=False)
    key = [*bearer, (b"idempotency-key", b"k-1")]
    again = [*bearer, (b"idempotency-key", b"k-2")]
    requests: list[tuple[Headers, bytes]] = [
        (key, b'{"item": "a"}'),  # first: 201, stored
        (key, b'{"item": "a"}'),  # replayed
        (key, b'{"item": "b"}'),  # 422: another body
        (again, b'{"item": "c", "again": true}'),  # 201; the same request inside it: 409
        (bearer, b'{"item": "d"}'),  # 400: no key
        ([*bearer, (b"idempotency-key", b'"bad\\"')], b'{"item": "e"}'),  # 400: invalid key
    ]
    answers = []
    for app in (fused, nested):
        got = []
        for headers, body in requests:
            inner: list[tuple[int, Headers, bytes]] = []

            async def again_inside(app: ASGIApp = app, headers: Headers = headers, body: bytes = body) -> None:
                inner.append(await call(app, "POST", "/api/v2/orders", headers, body))  # noqa: B023

            inside[:] = [again_inside]
            got.append((await call(app, "POST", "/api/v2/orders", headers, body), inner))
        answers.append(got)
    assert answers[0] == answers[1]
    statuses = [(status, [answer[0] for answer in inner]) for (status, _, _), inner in answers[0]]
    assert statuses == [(201, []), (201, []), (422, []), (201, [409]), (400, []), (400, [])]
    replayed = answers[0][1][0][1]
    assert (b"idempotent-replayed", b"true") in replayed
