"""Bastion's Prometheus metrics in process: every instrument recorded by the real pipeline where it should be,
the metrics endpoint (public, custom path, off), and bounded cardinality whatever the clients send."""

from __future__ import annotations

import asyncio
import random
import string
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from bastion import BastionApp, Service, Settings, load_settings
from bastion._metrics import DURATION_BUCKETS, KNOWN_METHODS
from bastion.testing import FakeClock, TokenMinter
from bastion.types import Message
from tests.conftest import metric_samples, metric_series, open_settings

Client = Callable[..., httpx.AsyncClient]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DURATION = "http_server_request_duration_seconds"
DURATION_LABELS = ("http_request_method", "http_route", "http_response_status_code")
VERSION_LABELS = ("version", "deprecated", "replacement_version")
ITEM = "/api/v1/items/{item_id}"


class Gate:
    """Where a waiting handler stops: ``entered`` once it runs, and it returns once ``opened`` is set."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()

    async def pass_through(self) -> None:
        self.entered.set()
        await self.opened.wait()

    async def reached(self) -> None:
        await asyncio.wait_for(self.entered.wait(), 10)


def items_service(gate: Gate | None = None) -> Service:
    """v1 and v2 (neither deprecated) with a few routes; ``GET /api/v1/wait`` waits at ``gate``."""
    service = Service("metrics-test")
    v1 = service.version(1)
    v2 = service.version(2)
    stop = gate or Gate()

    @v1.get("/items")
    async def list_items() -> list[str]:
        return ["a"]

    @v1.post("/items")
    async def create_item() -> dict[str, str]:
        return {"id": "new"}

    @v1.get("/items/{item_id}")
    async def get_item(item_id: str) -> dict[str, str]:
        return {"id": item_id}

    @v1.get("/public")
    async def public() -> dict[str, bool]:
        return {"public": True}

    @v1.get("/crash")
    async def crash() -> None:
        raise RuntimeError("bug")

    @v1.get("/wait")
    async def wait() -> dict[str, bool]:
        await stop.pass_through()
        return {"waited": True}

    @v2.get("/items/{item_id}")
    async def get_item_v2(item_id: str) -> dict[str, str]:
        return {"id": item_id}

    return service


def client_of(app: BastionApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")


Build = Callable[[Service, Settings], tuple[BastionApp, httpx.AsyncClient]]


@pytest.fixture
async def built() -> AsyncIterator[Build]:
    """Factory: ``(app, client)`` for ``service.build(settings)``; both closed at the end."""
    made: list[tuple[BastionApp, httpx.AsyncClient]] = []

    def make(service: Service, settings: Settings) -> tuple[BastionApp, httpx.AsyncClient]:
        app = service.build(settings)
        made.append((app, client_of(app)))
        return made[-1]

    yield make
    for app, client in made:
        await client.aclose()
        await app.aclose()


async def scrape(client: httpx.AsyncClient, path: str = "/metrics") -> Samples:
    response = await client.get(path)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == CONTENT_TYPE
    return metric_samples(response.text)


def durations(samples: Samples) -> dict[tuple[str, ...], float]:
    """Requests counted by the duration histogram: ``{(method, route, status): count}``."""
    return metric_series(samples, DURATION + "_count", *DURATION_LABELS)


def settings_file(tmp_path: Path, text: str, **environ: str) -> Settings:
    path = tmp_path / "service.toml"
    path.write_text(text)
    return load_settings(path, environ=environ)


@pytest.fixture(scope="module")
def minter() -> TokenMinter:
    return TokenMinter("RS256")


@pytest.fixture
def key_file(minter: TokenMinter, tmp_path: Path) -> Path:
    path = tmp_path / "public.pem"
    path.write_bytes(minter.public_pem())
    return path


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


# -- http.server.request.duration and http.server.active_requests ----------------------------------------------


class TestRequests:
    async def test_counted_by_method_route_template_and_status(self, asgi_client: Client) -> None:
        client = asgi_client(items_service())
        sent = [
            ("GET", "/api/v1/items/a"),
            ("GET", "/api/v1/items/b"),
            ("GET", "/api/v2/items/a"),
            ("POST", "/api/v1/items"),
            ("DELETE", "/api/v1/items/a"),  # only GET is registered: 405, still the route's template
            ("GET", "/api/v1/nothing"),
            ("GET", "/nothing/at/all"),
            ("GET", "/api/v1/crash"),
            ("GET", "/health"),
            ("GET", "/ready"),
            ("GET", "/ready"),
        ]
        statuses = [(await client.request(method, path)).status_code for method, path in sent]
        assert statuses == [200, 200, 200, 200, 405, 404, 404, 500, 200, 200, 200]
        samples = await scrape(client)
        assert durations(samples) == {
            ("GET", ITEM, "200"): 2,
            ("GET", "/api/v2/items/{item_id}", "200"): 1,
            ("POST", "/api/v1/items", "200"): 1,
            ("DELETE", ITEM, "405"): 1,
            ("GET", "", "404"): 2,
            ("GET", "/api/v1/crash", "500"): 1,
            ("GET", "/health", "200"): 1,
            ("GET", "/ready", "200"): 2,
        }
        buckets = metric_series(samples, DURATION + "_bucket", *DURATION_LABELS, "le")
        assert {le for (_, route, _, le) in buckets if route == ITEM} == {*(str(b) for b in DURATION_BUCKETS), "+Inf"}
        assert buckets[("GET", ITEM, "200", "+Inf")] == 2
        assert metric_series(samples, "http_server_active_requests", "http_request_method") == {
            ("GET",): 0,
            ("POST",): 0,
            ("DELETE",): 0,
        }

    async def test_active_requests_while_in_flight_then_back_to_zero(self, asgi_client: Client) -> None:
        gate = Gate()
        client = asgi_client(items_service(gate))
        waiting = asyncio.create_task(client.get("/api/v1/wait"))
        await gate.reached()
        during = await scrape(client)
        assert metric_series(during, "http_server_active_requests", "http_request_method") == {("GET",): 1}
        assert durations(during) == {}  # counted when it ends
        gate.opened.set()
        assert (await waiting).status_code == 200
        assert (await client.get("/api/v1/crash")).status_code == 500
        after = await scrape(client)
        assert metric_series(after, "http_server_active_requests", "http_request_method") == {("GET",): 0}
        assert durations(after) == {("GET", "/api/v1/wait", "200"): 1, ("GET", "/api/v1/crash", "500"): 1}

    async def test_a_request_stopped_by_the_timeout_is_a_504_and_no_longer_active(self, asgi_client: Client) -> None:
        client = asgi_client(items_service(), open_settings(environ={"SERVICE_MIDDLEWARE_TIMEOUT_SECS": "0.05"}))
        assert (await client.get("/api/v1/wait")).status_code == 504  # the gate is never opened
        samples = await scrape(client)
        assert durations(samples) == {("GET", "/api/v1/wait", "504"): 1}
        assert metric_series(samples, "http_server_active_requests", "http_request_method") == {("GET",): 0}

    async def test_two_apps_in_one_process_have_their_own_metrics(self, asgi_client: Client) -> None:
        service = items_service()
        first, second = asgi_client(service), asgi_client(service)
        assert (await first.get("/api/v1/items/a")).status_code == 200
        assert durations(await scrape(first)) == {("GET", ITEM, "200"): 1}
        assert durations(await scrape(second)) == {}


# -- api.version.requests -----------------------------------------------------------------------------------------


class TestVersionRequests:
    async def test_current_versions_have_an_empty_replacement_and_a_later_deprecation_shows(
        self, asgi_client: Client
    ) -> None:
        service = items_service()
        client = asgi_client(service)
        for path in (
            "/api/v1/items",
            "/api/v1/nothing",
            "/api/v2/items/a",
            "/api/v3/items",  # no such version
            "/api/v01/items",
            "/api/v\u0661/items",  # ARABIC-INDIC DIGIT ONE: a digit to str.isdigit, not a version
            "/api/v\uff11/items",  # FULLWIDTH DIGIT ONE
            "/x",
        ):
            await client.get(path)
        samples = await scrape(client)
        assert metric_series(samples, "api_version_requests_total", *VERSION_LABELS) == {
            ("v1", "false", ""): 2,  # an unmatched path under /api/v1/ is still a v1 request
            ("v2", "false", ""): 1,
        }
        service.deprecate(1, replacement=2)
        await client.get("/api/v1/items")
        samples = await scrape(client)
        assert metric_series(samples, "api_version_requests_total", *VERSION_LABELS) == {
            ("v1", "false", ""): 2,
            ("v2", "false", ""): 1,
            ("v1", "true", "v2"): 1,
        }


# -- the metrics endpoint -----------------------------------------------------------------------------------------


class TestEndpoint:
    async def test_head_and_other_methods_are_answered_and_never_counted(self, asgi_client: Client) -> None:
        client = asgi_client(items_service())
        assert (await client.get("/api/v1/items")).status_code == 200
        got = await client.get("/metrics")
        head = await client.head("/metrics")
        assert (head.status_code, head.content, head.headers["content-type"]) == (200, b"", CONTENT_TYPE)
        assert int(head.headers["content-length"]) == len(got.content)
        for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
            refused = await client.request(method, "/metrics")
            assert (refused.status_code, refused.headers["allow"], refused.content) == (405, "GET, HEAD", b"")
        samples = await scrape(client)
        assert durations(samples) == {("GET", "/api/v1/items", "200"): 1}
        assert metric_series(samples, "http_server_active_requests", "http_request_method") == {("GET",): 0}

    async def test_public_endpoint_is_answered_before_token_auth_rate_limit_and_policy(
        self, built: Build, key_file: Path
    ) -> None:
        (key_file.parent / "deny.cedar").write_text("forbid(principal, action, resource);")
        settings = settings_file(
            key_file.parent,
            f'[token]\nalgorithm = "RS256"\npublic_key_path = "{key_file.name}"\n'
            '[policy]\npolicy_path = "deny.cedar"\n'
            "[rate_limit]\nper_ip_rpm = 1\nwindow_secs = 3600\n",
        )
        _, client = built(items_service(), settings)
        for _ in range(3):  # no token, a policy that forbids everything, one request an hour: answered each time
            await scrape(client)
        assert (await client.get("/api/v1/items")).status_code == 401
        samples = await scrape(client)
        assert metric_series(samples, "bastion_token_rejections_total", "code") == {("UNAUTHORIZED",): 1}
        assert metric_series(samples, "bastion_rate_limit_rejections_total", "bucket") == {}
        assert metric_series(samples, "bastion_policy_decisions_total", "decision") == {}
        assert durations(samples) == {("GET", "/api/v1/items", "401"): 1}

    async def test_custom_path(self, asgi_client: Client) -> None:
        client = asgi_client(items_service(), open_settings(environ={"SERVICE_METRICS_PATH": "/internal/prometheus"}))
        old = await client.get("/metrics")
        assert (old.status_code, old.content) == (404, b"")
        samples = await scrape(client, "/internal/prometheus")
        assert durations(samples) == {("GET", "", "404"): 1}

    @pytest.mark.parametrize("path", ["/metrics", "/internal/prometheus"])
    async def test_disabled_the_path_is_an_ordinary_404_and_nothing_is_recorded(self, built: Build, path: str) -> None:
        app, client = built(
            items_service(), open_settings(environ={"SERVICE_METRICS_ENABLED": "false", "SERVICE_METRICS_PATH": path})
        )
        ordinary = await client.get("/not-metrics")
        for method in ("GET", "HEAD", "POST"):
            response = await client.request(method, path)
            assert (response.status_code, response.content) == (ordinary.status_code, ordinary.content) == (404, b"")
        for request in ("/api/v1/items", "/api/v1/crash", "/health"):
            await client.get(request)
        assert app.metrics.enabled is False
        assert app.metrics.exposition() == b""

    async def test_not_public_it_is_an_ordinary_route_that_is_counted(self, asgi_client: Client) -> None:
        client = asgi_client(items_service(), open_settings(environ={"SERVICE_METRICS_PUBLIC": "false"}))
        await scrape(client)
        assert (await client.post("/metrics")).status_code == 405
        samples = await scrape(client)
        assert durations(samples) == {("GET", "/metrics", "200"): 1, ("POST", "/metrics", "405"): 1}

    async def test_with_a_metrics_port_the_main_port_does_not_serve_them(self, asgi_client: Client) -> None:
        client = asgi_client(items_service(), open_settings(environ={"SERVICE_METRICS_PORT": "19099"}))
        response = await client.get("/metrics")
        assert (response.status_code, response.content) == (404, b"")


# -- token auth, policy, rate limiting ----------------------------------------------------------------------------


class TestTokenRejections:
    async def test_each_refusal_is_counted_by_its_code(self, built: Build, minter: TokenMinter, key_file: Path) -> None:
        settings = load_settings(
            environ={
                "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(key_file),
                "SERVICE_TOKEN_ALGORITHM": "RS256",
                "SERVICE_TOKEN_LEEWAY_SECONDS": "0",
                "SERVICE_TOKEN_REVOCATION_ENABLED": "true",
                "SERVICE_TOKEN_EXCLUDE_PATHS": "/api/v1/public",
            }
        )
        app, client = built(items_service(), settings)
        revoked = minter.mint(jti="stolen-1")
        await app.revoke("stolen-1", "stolen", time.time() + 600)
        refused = [
            {},
            {"authorization": "Basic YWxpY2U6c2VjcmV0"},
            {"authorization": "Bearer not-a-jwt"},
            bearer(TokenMinter("RS256").mint()),  # another key
            bearer(minter.mint(ttl=-120)),
            bearer(revoked),
        ]
        codes = [(await client.get("/api/v1/items", headers=headers)).json()["code"] for headers in refused]
        assert codes == [
            "UNAUTHORIZED",
            "UNAUTHORIZED",
            "INVALID_TOKEN",
            "INVALID_TOKEN",
            "TOKEN_EXPIRED",
            "TOKEN_REVOKED",
        ]
        twice = httpx.Headers([("authorization", f"Bearer {minter.mint()}"), ("authorization", "Bearer x")])
        assert (await client.get("/api/v1/items", headers=twice)).status_code == 401
        assert (await client.get("/api/v1/items", headers=bearer(minter.mint()))).status_code == 200
        assert (await client.get("/api/v1/public")).status_code == 200
        assert (await client.get("/health")).status_code == 200
        samples = await scrape(client)
        assert metric_series(samples, "bastion_token_rejections_total", "code") == {
            ("UNAUTHORIZED",): 3,
            ("INVALID_TOKEN",): 2,
            ("TOKEN_EXPIRED",): 1,
            ("TOKEN_REVOKED",): 1,
        }
        assert durations(samples) == {
            ("GET", "/api/v1/items", "401"): 7,
            ("GET", "/api/v1/items", "200"): 1,
            ("GET", "/api/v1/public", "200"): 1,
            ("GET", "/health", "200"): 1,
        }


ERRORING_POLICY = """
permit(principal, action in [Action::"GET /api/v1/items", Action::"GET /api/v1/items/{item_id}"], resource);
forbid(principal, action == Action::"GET /api/v1/items/{item_id}", resource) when { resource.item_id == "b" };
permit(principal, action == Action::"POST /api/v1/items", resource);
forbid(principal, action == Action::"POST /api/v1/items", resource) when { context.timestamp * 10000000000 > 0 };
"""
"""Item ``b`` is denied, other items and the list allowed; creating one errs (the product overflows a Long)."""


class TestPolicyDecisions:
    async def test_allow_deny_and_error(self, asgi_client: Client, tmp_path: Path) -> None:
        policy = tmp_path / "policies.cedar"
        policy.write_text(ERRORING_POLICY)
        client = asgi_client(items_service(), open_settings(environ={"SERVICE_POLICY_POLICY_PATH": str(policy)}))
        sent = [
            ("GET", "/api/v1/items"),
            ("GET", "/api/v1/items/a"),
            ("GET", "/api/v1/items/a"),
            ("GET", "/api/v1/items/b"),
            ("POST", "/api/v1/items"),
            ("DELETE", "/api/v1/items/a"),  # 405 from the dispatcher: no policy is asked
            ("GET", "/health"),  # never decided
        ]
        statuses = [(await client.request(method, path)).status_code for method, path in sent]
        assert statuses == [200, 200, 200, 403, 500, 405, 200]
        samples = await scrape(client)
        assert metric_series(samples, "bastion_policy_decisions_total", "decision") == {
            ("allow",): 3,  # the second /items/a too: cached decisions are counted
            ("deny",): 1,
            ("error",): 1,
        }


class TestRateLimitRejections:
    async def test_counted_by_bucket_kind(self, built: Build, minter: TokenMinter, key_file: Path) -> None:
        settings = settings_file(
            key_file.parent,
            f"""
[token]
algorithm = "RS256"
public_key_path = "{key_file.name}"
exclude_paths = ["/api/v1/public"]

[rate_limit]
per_user_rpm = 1
per_client_rpm = 1
per_ip_rpm = 1
window_secs = 3600

[rate_limit.routes."POST /api/v1/items"]
requests_per_minute = 1
burst_size = 1
""",
        )
        _, client = built(items_service(), settings)
        callers: list[tuple[str, str, dict[str, str]]] = [
            ("GET", "/api/v1/items", bearer(minter.mint(sub="alice"))),  # user
            ("GET", "/api/v1/items", bearer(minter.mint(sub=None, client_id="billing"))),  # client
            ("GET", "/api/v1/public", {}),  # ip
            ("POST", "/api/v1/items", bearer(minter.mint(sub="bob"))),  # route
        ]
        for method, path, headers in callers:
            statuses = [(await client.request(method, path, headers=headers)).status_code for _ in range(2)]
            assert statuses == [200, 429], (method, path)
        samples = await scrape(client)
        assert metric_series(samples, "bastion_rate_limit_rejections_total", "bucket") == {
            ("user",): 1,
            ("client",): 1,
            ("ip",): 1,
            ("route",): 1,
        }
        assert durations(samples) == {
            ("GET", "/api/v1/items", "200"): 2,
            ("GET", "/api/v1/items", "429"): 2,
            ("GET", "/api/v1/public", "200"): 1,
            ("GET", "/api/v1/public", "429"): 1,
            ("POST", "/api/v1/items", "200"): 1,
            ("POST", "/api/v1/items", "429"): 1,
        }


# -- resilience ---------------------------------------------------------------------------------------------------


def resilient_service(gate: Gate | None = None) -> Service:
    """``flaky``: a breaker only (2 outcomes, more than half failed -> open for 30 s); ``pool``: a bulkhead only
    (one slot, 10 ms wait); ``GET /api/v1/pool/wait`` waits at ``gate``."""
    service = Service("resilient")
    v1 = service.version(1)
    stop = gate or Gate()

    @v1.get("/flaky/fail")
    async def fail() -> None:
        raise RuntimeError("down")

    @v1.get("/flaky/ok")
    async def ok() -> dict[str, bool]:
        return {"ok": True}

    @v1.get("/pool/wait")
    async def wait() -> dict[str, bool]:
        await stop.pass_through()
        return {"waited": True}

    service.use_resilience(
        paths=["/api/v1/flaky/*"], name="flaky", bulkhead=False, min_requests=2, threshold=0.5, wait_secs=30
    )
    service.use_resilience(paths=["/api/v1/pool/*"], name="pool", breaker=False, max_concurrent=1, max_wait=0.01)
    return service


RESILIENCE = ("layer", "reason")


class TestResilience:
    async def test_breaker_state_gauge_and_circuit_open_rejections(self, built: Build) -> None:
        app, client = built(resilient_service(), open_settings(environ={"SERVICE_RATE_LIMIT_ENABLED": "false"}))
        clock = FakeClock()
        breaker = app.resilience[0].breaker
        breaker._clock = clock  # moved by hand: Open -> Half-Open without waiting 30 s

        async def states() -> dict[tuple[str, ...], float]:
            return metric_series(await scrape(client), "bastion_circuit_breaker_state", "breaker")

        assert await states() == {("flaky",): 0}  # the bulkhead-only layer has no breaker
        assert [(await client.get("/api/v1/flaky/fail")).status_code for _ in range(2)] == [500, 500]
        assert await states() == {("flaky",): 1}
        rejected = await client.get("/api/v1/flaky/ok")
        assert (rejected.status_code, rejected.headers["retry-after"]) == (503, "30")
        clock.advance(30)
        assert await states() == {("flaky",): 2}
        assert (await client.get("/api/v1/flaky/ok")).status_code == 200  # the probe succeeds: closed again
        samples = await scrape(client)
        assert metric_series(samples, "bastion_circuit_breaker_state", "breaker") == {("flaky",): 0}
        assert metric_series(samples, "bastion_resilience_rejections_total", *RESILIENCE) == {
            ("flaky", "circuit_open"): 1
        }
        assert durations(samples) == {
            ("GET", "/api/v1/flaky/fail", "500"): 2,
            ("GET", "/api/v1/flaky/ok", "503"): 1,
            ("GET", "/api/v1/flaky/ok", "200"): 1,
        }

    async def test_bulkhead_full_rejections(self, built: Build) -> None:
        gate = Gate()
        _, client = built(resilient_service(gate), open_settings(environ={"SERVICE_RATE_LIMIT_ENABLED": "false"}))
        holder = asyncio.create_task(client.get("/api/v1/pool/wait"))
        await gate.reached()
        assert (await client.get("/api/v1/pool/wait")).status_code == 503  # the one slot is held until released
        gate.opened.set()
        assert (await holder).status_code == 200
        samples = await scrape(client)
        assert metric_series(samples, "bastion_resilience_rejections_total", *RESILIENCE) == {
            ("pool", "bulkhead_full"): 1
        }
        assert durations(samples) == {("GET", "/api/v1/pool/wait", "503"): 1, ("GET", "/api/v1/pool/wait", "200"): 1}


# -- cardinality ----------------------------------------------------------------------------------------------------


class Direct:
    """Requests straight into the ASGI app (no HTTP client): the 10,000-request test stays at about a second."""

    def __init__(self, app: BastionApp) -> None:
        self.app = app

    async def request(
        self, method: str, path: str, *, query: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None
    ) -> tuple[int, bytes]:
        status, body = 0, b""

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Message) -> None:
            nonlocal status, body
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                body += message.get("body", b"")

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query,
            "root_path": "",
            "headers": [(b"host", b"testserver"), *(headers or [])],
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
        }
        await self.app(scope, receive, send)  # type: ignore[arg-type]
        return status, body

    async def __call__(
        self, method: str, path: str, *, query: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None
    ) -> int:
        return (await self.request(method, path, query=query, headers=headers))[0]

    async def series(self) -> Samples:
        status, body = await self.request("GET", "/metrics")
        assert status == 200
        return metric_samples(body.decode())


SEGMENT_CHARS = string.ascii_letters + string.digits + "-_~" + "éß文字ñ"  # no dots: "." and ".." are resolved


def random_segment(rng: random.Random) -> str:
    return "".join(rng.choice(SEGMENT_CHARS) for _ in range(rng.randint(1, 24)))


def random_path(rng: random.Random) -> tuple[str, bool]:
    """An unmatched path, and whether it lies under /api/v1/ (a v1 request)."""
    kind = rng.randrange(5)
    tail = "/".join(random_segment(rng) for _ in range(rng.randint(1, 6)))
    if kind == 0:
        return f"/api/v1/nothing-{tail}", True
    if kind == 1:
        return f"/api/v{rng.randint(3, 10**9)}/{tail}", False  # no such version
    if kind == 2:
        return f"/api/{tail}", False
    if kind == 3:
        return f"/api/v1/items/a/{tail}", True  # beyond a template: no route
    return f"/{tail}", False


@pytest.fixture
def direct(built: Build) -> Direct:
    """The items service with rate limiting on but out of reach (10,000 requests from one address)."""
    app, _ = built(items_service(), open_settings(environ={"SERVICE_RATE_LIMIT_PER_IP_RPM": "100000000"}))
    return Direct(app)


def v1_requests(samples: Samples) -> float:
    return metric_series(samples, "api_version_requests_total", *VERSION_LABELS).get(("v1", "false", ""), 0)


class TestCardinality:
    async def test_random_unmatched_paths_add_no_series(self, direct: Direct) -> None:
        assert await direct("GET", "/warm-up") == 404
        assert await direct("GET", "/api/v1/warm-up") == 404
        before = await direct.series()
        rng = random.Random(20260416)
        statuses: set[int] = set()
        under_v1 = 0
        for _ in range(10_000):
            path, v1 = random_path(rng)
            under_v1 += v1
            query = random_segment(rng).encode() if rng.random() < 0.5 else b""
            statuses.add(await direct("GET", path, query=query))
        after = await direct.series()
        assert statuses == {404}
        assert set(after) == set(before)
        assert durations(after)[("GET", "", "404")] == durations(before)[("GET", "", "404")] + 10_000
        assert v1_requests(after) == v1_requests(before) + under_v1

    async def test_unknown_methods_are_other(self, direct: Direct) -> None:
        assert await direct("BREW", "/warm-up") == 404
        assert await direct("BREW", "/api/v1/items/a") == 405
        before = await direct.series()
        rng = random.Random(7)
        sent = 0
        for _ in range(1_000):
            method = "".join(rng.choice(string.ascii_letters) for _ in range(rng.randint(1, 12)))
            if method in KNOWN_METHODS:
                continue
            sent += 1
            assert await direct(method, "/nowhere") == 404
            assert await direct(method, "/api/v1/items/a") == 405
        after = await direct.series()
        assert set(after) == set(before)
        assert durations(after) == {
            ("_OTHER", "", "404"): 1 + sent,
            ("_OTHER", ITEM, "405"): 1 + sent,
        }
        assert metric_series(after, "http_server_active_requests", "http_request_method") == {("_OTHER",): 0}

    async def test_huge_header_values_add_nothing(self, direct: Direct) -> None:
        assert await direct("GET", "/warm-up") == 404
        before = await direct.series()
        rng = random.Random(11)
        for number in range(200):
            value = "".join(rng.choice(string.printable[:94]) for _ in range(64)).encode() * 1024  # 64 KiB
            headers = [
                (b"user-agent", value),
                (b"x-request-id", value),
                (b"x-forwarded-for", value),
                (b"cookie", value),
                (b"referer", value),
                (f"x-custom-{number}".encode(), value),
            ]
            assert await direct("GET", "/warm-up", headers=headers) == 404
        after = await direct.series()
        assert set(after) == set(before)
        assert durations(after)[("GET", "", "404")] == durations(before)[("GET", "", "404")] + 200


async def test_cache_store_up_follows_the_stores_last_answer(
    built: Build, valkey_url: str, dead_redis_url: str
) -> None:
    """``/ready`` pings the store: 1 after a ping Valkey answered, 0 after one nobody answered; no gauge without
    ``cache_store.url``."""
    found = {}
    for name, url in (("valkey", valkey_url), ("dead", dead_redis_url)):
        settings = open_settings(environ={"SERVICE_CACHE_STORE_URL": url, "SERVICE_CACHE_STORE_TIMEOUT_SECS": "0.5"})
        _, client = built(items_service(), settings)
        await client.get("/ready")
        found[name] = metric_series(await scrape(client), "bastion_cache_store_up")
    _, client = built(items_service(), open_settings())
    found["memory"] = metric_series(await scrape(client), "bastion_cache_store_up")
    assert found == {"valkey": {(): 1.0}, "dead": {(): 0.0}, "memory": {}}
