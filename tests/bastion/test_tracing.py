"""Tracing: the server span of each request (W3C traceparent in), the steps' outcomes on it, trace ids in the log
lines, traceparent out through the outbound transport, malformed input ignored, and ``[tracing]``'s keys."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import structlog
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from structlog.testing import capture_logs

from bastion import BastionApp, Service, Settings, load_settings
from bastion.errors import ConfigError, NotFound
from bastion.resilience import ResilientTransport
from bastion.testing import TokenMinter
from bastion_core import Guard
from tests.conftest import TOKEN_OFF, running

UPSTREAM_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
UPSTREAM_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{UPSTREAM_TRACE}-{UPSTREAM_SPAN}-01"
POLICY = """
permit (principal is User, action == Action::"GET /api/v1/items/{item_id}", resource);
"""


def items_service(downstream: list[httpx.Request] | None = None) -> Service:
    service = Service("items")
    v1 = service.version(1)

    @v1.get("/items/{item_id}")
    async def get_item(item_id: str) -> dict[str, str]:
        structlog.get_logger("items").info("item_read", item_id=item_id)
        if item_id == "missing":
            raise NotFound("no such item")
        if item_id == "boom":
            raise RuntimeError("handler bug")
        return {"id": item_id}

    @v1.get("/proxy")
    async def proxy() -> dict[str, str]:
        assert downstream is not None

        def answer(request: httpx.Request) -> httpx.Response:
            downstream.append(request)
            return httpx.Response(200, json={})

        transport = ResilientTransport(Guard(), httpx.MockTransport(answer))
        async with httpx.AsyncClient(transport=transport, base_url="http://downstream") as client:
            await client.get("/stock")
        return {"ok": "yes"}

    return service


def client(app: BastionApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")


@pytest.fixture
async def traced(provider: TracerProvider) -> AsyncIterator[httpx.AsyncClient]:
    app = items_service().build(load_settings(environ=TOKEN_OFF), tracer_provider=provider)
    async with running(app), client(app) as http:
        yield http


def server_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    (span,) = [span for span in exporter.get_finished_spans() if span.kind is SpanKind.SERVER]
    return span


def ids(span: ReadableSpan) -> tuple[str, str]:
    assert span.context is not None
    return format(span.context.trace_id, "032x"), format(span.context.span_id, "016x")


class TestServerSpan:
    async def test_continues_the_callers_trace_named_by_route_template(
        self, traced: httpx.AsyncClient, exporter: InMemorySpanExporter
    ) -> None:
        response = await traced.get("/api/v1/items/42", headers={"traceparent": TRACEPARENT})
        assert response.status_code == 200
        span = server_span(exporter)
        assert ids(span)[0] == UPSTREAM_TRACE
        assert span.parent is not None and format(span.parent.span_id, "016x") == UPSTREAM_SPAN
        assert span.name == "GET /api/v1/items/{item_id}"
        assert span.attributes == {
            "http.request.method": "GET",
            "url.path": "/api/v1/items/42",
            "url.scheme": "http",
            "network.protocol.version": "1.1",
            "bastion.request_id": response.headers["x-request-id"],
            "http.route": "/api/v1/items/{item_id}",
            "http.response.status_code": 200,
            "bastion.rate_limit.outcome": "allowed",
            "bastion.rate_limit.bucket": "ip",
        }
        assert span.status.status_code is StatusCode.UNSET

    async def test_without_traceparent_a_new_trace(
        self, traced: httpx.AsyncClient, exporter: InMemorySpanExporter
    ) -> None:
        assert (await traced.get("/api/v1/items/42")).status_code == 200
        span = server_span(exporter)
        assert span.parent is None and ids(span)[0] != UPSTREAM_TRACE

    async def test_unmatched_path_is_named_by_method_only(
        self, traced: httpx.AsyncClient, exporter: InMemorySpanExporter
    ) -> None:
        assert (await traced.get("/no/such/path")).status_code == 404
        span = server_span(exporter)
        assert span.name == "GET"
        assert span.attributes is not None and "http.route" not in span.attributes

    async def test_a_4xx_is_not_a_server_error_a_5xx_is(
        self, traced: httpx.AsyncClient, exporter: InMemorySpanExporter
    ) -> None:
        assert (await traced.get("/api/v1/items/missing")).status_code == 404
        assert server_span(exporter).status.status_code is StatusCode.UNSET
        exporter.clear()
        assert (await traced.get("/api/v1/items/boom")).status_code == 500
        assert server_span(exporter).status.status_code is StatusCode.ERROR

    async def test_unknown_method_is_http(self, traced: httpx.AsyncClient, exporter: InMemorySpanExporter) -> None:
        await traced.request("BREW", "/api/v1/items/42")
        span = server_span(exporter)
        assert span.name == "HTTP /api/v1/items/{item_id}"
        assert span.attributes is not None and span.attributes["http.request.method"] == "_OTHER"


MALFORMED = [
    "garbage",
    "",
    f"00-{'0' * 32}-{UPSTREAM_SPAN}-01",  # all-zero trace id
    f"00-{UPSTREAM_TRACE}-{'0' * 16}-01",  # all-zero parent id
    f"00-{UPSTREAM_TRACE}-{UPSTREAM_SPAN}",  # no flags
    f"ff-{UPSTREAM_TRACE}-{UPSTREAM_SPAN}-01",  # version ff is invalid
    f"00-{UPSTREAM_TRACE.upper()}-{UPSTREAM_SPAN}-01",  # upper-case hex
    f"00-{UPSTREAM_TRACE}-{UPSTREAM_SPAN}-01-extra",  # version 00 has exactly four fields
    f"00-{UPSTREAM_TRACE}x-{UPSTREAM_SPAN}-01",
    "00-" + "a" * 8000,  # huge
    f"00-{UPSTREAM_TRACE}-{UPSTREAM_SPAN}-01\x00",
]


class TestMalformedTraceparent:
    @pytest.mark.parametrize("value", MALFORMED)
    async def test_ignored_never_an_error(
        self, traced: httpx.AsyncClient, exporter: InMemorySpanExporter, value: str
    ) -> None:
        response = await traced.get(
            "/api/v1/items/42", headers=[(b"traceparent", value.encode("latin-1")), (b"tracestate", b"\xff,,=")]
        )
        assert response.status_code == 200
        span = server_span(exporter)
        assert span.parent is None and ids(span)[0] != UPSTREAM_TRACE

    async def test_non_ascii_bytes(self, traced: httpx.AsyncClient, exporter: InMemorySpanExporter) -> None:
        response = await traced.get("/api/v1/items/42", headers=[(b"traceparent", b"00-\xff\xfe-\x80-01")])
        assert response.status_code == 200
        assert server_span(exporter).parent is None

    async def test_tracestate_travels_with_a_valid_traceparent(
        self, provider: TracerProvider, exporter: InMemorySpanExporter
    ) -> None:
        seen: list[httpx.Request] = []
        app = items_service(seen).build(load_settings(environ=TOKEN_OFF), tracer_provider=provider)
        async with running(app), client(app) as http:
            response = await http.get("/api/v1/proxy", headers={"traceparent": TRACEPARENT, "tracestate": "vendor=x1"})
        assert response.status_code == 200
        assert seen[0].headers["tracestate"] == "vendor=x1"


class TestOutcomes:
    @pytest.fixture
    def minter(self) -> TokenMinter:
        return TokenMinter("RS256")

    @pytest.fixture
    async def secured(
        self, provider: TracerProvider, minter: TokenMinter, tmp_path: pytest.TempPathFactory
    ) -> AsyncIterator[httpx.AsyncClient]:
        key = tmp_path / "public.pem"  # type: ignore[operator]
        key.write_bytes(minter.public_pem())
        policy = tmp_path / "policy.cedar"  # type: ignore[operator]
        policy.write_text(POLICY)
        settings = load_settings(
            environ={"SERVICE_TOKEN_PUBLIC_KEY_PATH": str(key), "SERVICE_POLICY_POLICY_PATH": str(policy)}
        )
        app = items_service().build(settings, tracer_provider=provider)
        async with running(app), client(app) as http:
            yield http

    def bearer(self, minter: TokenMinter) -> dict[str, str]:
        return {"authorization": "Bearer " + minter.mint(sub="alice", roles=["user"])}

    async def test_allowed_request(
        self, secured: httpx.AsyncClient, exporter: InMemorySpanExporter, minter: TokenMinter
    ) -> None:
        assert (await secured.get("/api/v1/items/42", headers=self.bearer(minter))).status_code == 200
        attributes = server_span(exporter).attributes
        assert attributes is not None
        assert attributes["bastion.token.outcome"] == "valid"
        assert attributes["user.id"] == "alice"
        assert attributes["bastion.rate_limit.outcome"] == "allowed"
        assert attributes["bastion.rate_limit.bucket"] == "user"
        assert attributes["bastion.policy.decision"] == "allow"

    async def test_denied_by_policy(
        self, secured: httpx.AsyncClient, exporter: InMemorySpanExporter, minter: TokenMinter
    ) -> None:
        assert (await secured.get("/api/v1/proxy", headers=self.bearer(minter))).status_code == 403
        attributes = server_span(exporter).attributes
        assert attributes is not None
        assert attributes["bastion.policy.decision"] == "deny"
        assert attributes["http.response.status_code"] == 403

    async def test_missing_token(self, secured: httpx.AsyncClient, exporter: InMemorySpanExporter) -> None:
        assert (await secured.get("/api/v1/items/42")).status_code == 401
        attributes = server_span(exporter).attributes
        assert attributes is not None
        assert attributes["bastion.token.outcome"] == "UNAUTHORIZED"
        assert "bastion.policy.decision" not in attributes and "user.id" not in attributes

    async def test_rate_limited(self, provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
        settings = load_settings(environ={**TOKEN_OFF, "SERVICE_RATE_LIMIT_PER_IP_RPM": "1"})
        app = items_service().build(settings, tracer_provider=provider)
        async with running(app), client(app) as http:
            assert (await http.get("/api/v1/items/1")).status_code == 200
            exporter.clear()
            assert (await http.get("/api/v1/items/1")).status_code == 429
        attributes = server_span(exporter).attributes
        assert attributes is not None
        assert attributes["bastion.rate_limit.outcome"] == "rejected"
        assert attributes["bastion.rate_limit.bucket"] == "ip"


class TestLogLines:
    async def test_every_line_of_a_request_has_request_and_trace_id(
        self, traced: httpx.AsyncClient, exporter: InMemorySpanExporter
    ) -> None:
        with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
            response = await traced.get("/api/v1/items/42", headers={"traceparent": TRACEPARENT})
        trace_id, span_id = ids(server_span(exporter))
        lines = [line for line in logs if line["event"] in ("item_read", "http_request")]
        assert [line["event"] for line in lines] == ["item_read", "http_request"]
        for line in lines:
            assert line["request_id"] == response.headers["x-request-id"]
            assert (line["trace_id"], line["span_id"]) == (trace_id, span_id)

    async def test_ids_do_not_leak_into_the_next_request(self, traced: httpx.AsyncClient) -> None:
        await traced.get("/api/v1/items/42")
        with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
            structlog.get_logger("outside").info("between_requests")
        assert "trace_id" not in logs[0] and "request_id" not in logs[0]


class TestOutbound:
    async def test_calls_through_the_resilient_transport_carry_the_trace(
        self, provider: TracerProvider, exporter: InMemorySpanExporter
    ) -> None:
        seen: list[httpx.Request] = []
        app = items_service(seen).build(load_settings(environ=TOKEN_OFF), tracer_provider=provider)
        async with running(app), client(app) as http:
            assert (await http.get("/api/v1/proxy", headers={"traceparent": TRACEPARENT})).status_code == 200
        trace_id, span_id = ids(server_span(exporter))
        assert trace_id == UPSTREAM_TRACE
        assert seen[0].headers["traceparent"] == f"00-{trace_id}-{span_id}-01"

    async def test_without_tracing_nothing_is_added(self) -> None:
        seen: list[httpx.Request] = []
        app = items_service(seen).build(load_settings(environ=TOKEN_OFF))
        assert app.tracer is None
        async with running(app), client(app) as http:
            assert (await http.get("/api/v1/proxy", headers={"traceparent": TRACEPARENT})).status_code == 200
        assert "traceparent" not in seen[0].headers


def settings_with(**environ: str) -> Settings:
    return load_settings(environ={**TOKEN_OFF, **environ})


class TestSettings:
    def test_off_by_default(self) -> None:
        assert settings_with().tracing.active is False
        assert items_service().build(settings_with()).tracer is None

    def test_an_endpoint_turns_it_on(self) -> None:
        tracing = settings_with(SERVICE_TRACING_ENDPOINT="http://collector:4318/v1/traces").tracing
        assert tracing.active is True

    def test_enabled_false_wins(self) -> None:
        settings = settings_with(
            SERVICE_TRACING_ENDPOINT="http://collector:4318/v1/traces", SERVICE_TRACING_ENABLED="false"
        )
        assert settings.tracing.active is False

    def test_enabled_alone_uses_the_local_collector(self) -> None:
        tracing = settings_with(SERVICE_TRACING_ENABLED="true").tracing
        assert (tracing.active, tracing.endpoint) == (True, "http://127.0.0.1:4318/v1/traces")

    @pytest.mark.parametrize(
        ("key", "value"),
        [
            ("SERVICE_TRACING_ENDPOINT", "collector:4318"),
            ("SERVICE_TRACING_ENDPOINT", "ftp://collector/v1/traces"),
            ("SERVICE_TRACING_SAMPLING_RATIO", "1.5"),
            ("SERVICE_TRACING_SAMPLING_RATIO", "-0.1"),
            ("SERVICE_TRACING_ENABLED", "maybe"),
        ],
    )
    def test_bad_values_are_refused(self, key: str, value: str) -> None:
        with pytest.raises(ConfigError, match=key.removeprefix("SERVICE_").lower().replace("_", ".", 1)):
            settings_with(**{key: value})

    async def test_the_app_builds_an_otlp_provider_with_the_ratio(self) -> None:
        settings = settings_with(SERVICE_TRACING_ENABLED="true", SERVICE_TRACING_SAMPLING_RATIO="0.25")
        app = items_service().build(settings)
        assert app.tracing is not None and app.tracing.owned
        assert app.tracing.provider.sampler.get_description().startswith(
            "ParentBased{root:TraceIdRatioBased{0.25},remoteParentSampled:AlwaysOnSampler,"
        )
        assert app.tracing.provider.resource.attributes["service.name"] == "items"

    async def test_not_sampled_still_has_ids_in_the_log(self) -> None:
        app = items_service().build(settings_with(SERVICE_TRACING_ENABLED="true", SERVICE_TRACING_SAMPLING_RATIO="0"))
        with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
            async with running(app), client(app) as http:
                assert (await http.get("/api/v1/items/1")).status_code == 200
        line = next(line for line in logs if line["event"] == "http_request")
        assert len(line["trace_id"]) == 32 and line["trace_id"] != "0" * 32
