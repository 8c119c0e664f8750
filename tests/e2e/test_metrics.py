"""End to end: the Prometheus metrics of real ``bastion run`` processes of the documents example, scraped over
HTTP and parsed with prometheus-client's parser.

The example's configuration is copied next to its policies, as a user would have it; ``key_env`` points the
token key at this module's minter. Each test starts its own process, so every count is exact.

A request is recorded just after its response has gone out, so each test scrapes until the requests it made
are all counted, then asserts the exact values. A public metrics endpoint is never counted itself, so polling
it changes nothing; the ``public = false`` test counts its own scrapes. ``/health`` is left out of the exact
counts: the fixture polls it until the process answers.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import pytest
from prometheus_client.multiprocess import MultiProcessCollector

from bastion.testing import TokenMinter
from bastion_core.testing import free_port
from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
from examples.documents_api.proto.documents.v1 import documents_pb2_grpc as pb_grpc
from tests.conftest import BASTION, REPO, BastionProcess, metric_samples, metric_series, start_up_stderr

APP = "examples.documents_api:service"
EXAMPLE_DIR = REPO / "examples" / "documents_api"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SCRAPE_WITHIN_SECS = 15.0

DURATION = "http_server_request_duration_seconds"
DURATION_COUNT = DURATION + "_count"
DURATION_LABELS = ("http_request_method", "http_route", "http_response_status_code")
VERSION_LABELS = ("version", "deprecated", "replacement_version")
RPC_COUNT = "rpc_server_call_duration_seconds_count"
DOCUMENTS_V1, DOCUMENTS_V2 = "/api/v1/documents", "/api/v2/documents"
DOCUMENT_V1, DOCUMENT_V2 = "/api/v1/documents/{user_id}/{doc_id}", "/api/v2/documents/{user_id}/{doc_id}"
GRPC_LIST, GRPC_GET = "/documents.v1.DocumentService/ListDocuments", "/documents.v1.DocumentService/GetDocument"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
Series = dict[tuple[str, ...], float]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """``config.toml`` and ``policies.cedar`` of the example in a directory of their own."""
    directory = tmp_path / "documents"
    directory.mkdir()
    for name in ("config.toml", "policies.cedar"):
        shutil.copy(EXAMPLE_DIR / name, directory / name)
    return directory / "config.toml"


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not in {path} exactly once"
    path.write_text(text.replace(old, new))


def metrics_keys(config: Path, keys: str) -> None:
    """Add ``keys`` (TOML lines) to the copied config's ``[metrics]`` section."""
    edit(config, "[metrics]\nenabled = true\n", f"[metrics]\nenabled = true\n{keys}\n")


def start(factory: Callable[..., BastionProcess], config: Path, env: dict[str, str], *args: str) -> BastionProcess:
    return factory(APP, "--config", str(config), *args, env=env)


def run_refused(config: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``bastion run`` of the example where it should refuse to start (bounded, should it start after all)."""
    return subprocess.run(
        [BASTION, "run", APP, "--config", str(config), "--host", "127.0.0.1", *args],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def as_user(minter: TokenMinter, sub: str, *roles: str) -> dict[str, str]:
    return {"authorization": "Bearer " + minter.mint(sub=sub, roles=list(roles))}


def scrape(url: str, headers: dict[str, str] | None = None) -> Samples:
    response = httpx.get(url, headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == CONTENT_TYPE
    return metric_samples(response.text)


def durations(samples: Samples) -> Series:
    """``{(method, route, status): requests}`` from the duration histogram."""
    return metric_series(samples, DURATION_COUNT, *DURATION_LABELS)


def scrape_when(url: str, done: Callable[[Samples], bool], headers: dict[str, str] | None = None) -> Samples:
    """Scrape until ``done(samples)``: a bound against a hang, never a timing assertion."""
    deadline = time.monotonic() + SCRAPE_WITHIN_SECS
    while True:
        samples = scrape(url, headers)
        if done(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {SCRAPE_WITHIN_SECS:g}s; last scrape: {durations(samples)}")
        time.sleep(0.02)


def rpc_calls(samples: Samples) -> Series:
    """``{(rpc system, method, status code): calls}`` from the gRPC duration histogram."""
    return metric_series(samples, RPC_COUNT, "rpc_system", "rpc_method", "rpc_grpc_status_code")


def api_requests(samples: Samples) -> float:
    """Requests counted on anything but ``/health`` (which the fixture polls until the process is up)."""
    return sum(value for (_, route, _), value in durations(samples).items() if route != "/health")


def without_health(series: Series) -> Series:
    return {labels: value for labels, value in series.items() if labels[1] != "/health"}


# -- the Done-when scenario ---------------------------------------------------------------------------------------


def test_versions_routes_and_refusals_are_counted_exactly(
    bastion_process: Callable[..., BastionProcess], config: Path, key_env: dict[str, str], minter: TokenMinter
) -> None:
    process = start(bastion_process, config, key_env)
    alice = as_user(minter, "alice", "user")
    document = {"title": "Quarterly report", "content": "..."}
    sent: list[tuple[str, str, dict[str, str], int]] = [
        ("GET", DOCUMENTS_V1, alice, 200),
        ("GET", DOCUMENTS_V1, alice, 200),
        ("GET", "/api/v1/documents/alice/doc-1", alice, 200),
        ("GET", DOCUMENTS_V1, {}, 401),  # no token: refused before rate limiting and policy
        ("GET", DOCUMENTS_V2, alice, 200),
        ("GET", DOCUMENTS_V2, alice, 200),
        ("GET", DOCUMENTS_V2, alice, 200),
        ("GET", "/api/v2/documents/alice/doc-1", alice, 200),
        ("GET", "/api/v2/documents/bob/doc-3", alice, 403),  # the policy: only the owner
        *[("POST", DOCUMENTS_V2, alice, 200)] * 10,
        ("POST", DOCUMENTS_V2, alice, 429),  # the 11th POST within the minute
    ]
    with httpx.Client(base_url=process.url, timeout=10) as client:
        statuses = [
            client.request(method, path, headers=headers, json=document if method == "POST" else None).status_code
            for method, path, headers, _ in sent
        ]
    assert statuses == [status for *_, status in sent]

    samples = scrape_when(process.url + "/metrics", lambda s: api_requests(s) >= len(sent))
    assert metric_series(samples, "api_version_requests_total", *VERSION_LABELS) == {
        ("v1", "true", "v2"): 4,
        ("v2", "false", ""): 16,
    }
    assert without_health(durations(samples)) == {
        ("GET", DOCUMENTS_V1, "200"): 2,
        ("GET", DOCUMENTS_V1, "401"): 1,
        ("GET", DOCUMENT_V1, "200"): 1,
        ("GET", DOCUMENTS_V2, "200"): 3,
        ("GET", DOCUMENT_V2, "200"): 1,
        ("GET", DOCUMENT_V2, "403"): 1,
        ("POST", DOCUMENTS_V2, "200"): 10,
        ("POST", DOCUMENTS_V2, "429"): 1,
    }
    routes = {dict(labels)["http_route"] for name, labels in samples if name.startswith(DURATION)}
    assert routes == {DOCUMENTS_V1, DOCUMENT_V1, DOCUMENTS_V2, DOCUMENT_V2, "/health"}  # templates, never raw paths
    assert metric_series(samples, "bastion_rate_limit_rejections_total", "bucket") == {("route",): 1}
    # Decided: every request that passed token auth and rate limiting (17 allowed, the 403 denied).
    assert metric_series(samples, "bastion_policy_decisions_total", "decision") == {("allow",): 17, ("deny",): 1}
    assert metric_series(samples, "bastion_token_rejections_total", "code") == {("UNAUTHORIZED",): 1}
    assert metric_series(samples, "http_server_active_requests", "http_request_method") == {("GET",): 0, ("POST",): 0}
    assert metric_series(samples, "bastion_resilience_rejections_total", "layer", "reason") == {}
    assert metric_series(samples, "bastion_circuit_breaker_state", "breaker") == {}
    assert rpc_calls(samples) == {}


def test_grpc_calls_are_counted_by_method_and_status_code(
    bastion_process: Callable[..., BastionProcess], config: Path, key_env: dict[str, str], minter: TokenMinter
) -> None:
    process = start(bastion_process, config, key_env)
    alice = [("authorization", as_user(minter, "alice", "user")["authorization"])]
    with grpc.insecure_channel(f"127.0.0.1:{process.port}") as channel:
        stub = pb_grpc.DocumentServiceStub(channel)
        assert len(stub.ListDocuments(pb.ListDocumentsRequest(limit=2), metadata=alice, timeout=10).items) == 2
        own = stub.GetDocument(pb.GetDocumentRequest(user_id="alice", doc_id="doc-1"), metadata=alice, timeout=10)
        assert own.owner_id == "alice"
        refused: list[grpc.StatusCode] = []
        for call in (
            lambda: stub.ListDocuments(pb.ListDocumentsRequest(), timeout=10),
            lambda: stub.GetDocument(pb.GetDocumentRequest(user_id="bob", doc_id="doc-3"), metadata=alice, timeout=10),
        ):
            with pytest.raises(grpc.RpcError) as info:
                call()
            refused.append(info.value.code())
    assert refused == [grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED]

    ok, unauthenticated, denied = (str(code.value[0]) for code in (grpc.StatusCode.OK, *refused))  # "0", "16", "7"
    samples = scrape_when(process.url + "/metrics", lambda s: sum(rpc_calls(s).values()) >= 4)
    assert rpc_calls(samples) == {
        ("grpc", GRPC_LIST, ok): 1,
        ("grpc", GRPC_LIST, unauthenticated): 1,
        ("grpc", GRPC_GET, ok): 1,
        ("grpc", GRPC_GET, denied): 1,
    }
    assert metric_series(samples, "bastion_token_rejections_total", "code") == {("UNAUTHORIZED",): 1}
    assert metric_series(samples, "bastion_policy_decisions_total", "decision") == {("allow",): 2, ("deny",): 1}
    assert without_health(durations(samples)) == {}  # gRPC calls are not HTTP requests
    assert metric_series(samples, "api_version_requests_total", *VERSION_LABELS) == {}


# -- metrics.port ---------------------------------------------------------------------------------------------------


def test_metrics_port_serves_them_and_the_main_port_does_not(
    bastion_process: Callable[..., BastionProcess], config: Path, key_env: dict[str, str], minter: TokenMinter
) -> None:
    port = free_port()
    process = start(bastion_process, config, {**key_env, "SERVICE_METRICS_PORT": str(port)})
    listener = f"http://127.0.0.1:{port}"
    assert httpx.get(process.url + DOCUMENTS_V2, headers=as_user(minter, "alice", "user")).status_code == 200
    # On the main port /metrics is an unmatched path like any other: behind token auth and policy, then 404.
    assert httpx.get(process.url + "/metrics").status_code == 401
    not_here = httpx.get(process.url + "/metrics", headers=as_user(minter, "root", "admin"))
    assert (not_here.status_code, not_here.content) == (404, b"")

    samples = scrape_when(listener + "/metrics", lambda s: api_requests(s) >= 3)
    assert without_health(durations(samples)) == {
        ("GET", DOCUMENTS_V2, "200"): 1,
        ("GET", "", "401"): 1,
        ("GET", "", "404"): 1,
    }
    assert metric_series(samples, "api_version_requests_total", *VERSION_LABELS) == {("v2", "false", ""): 1}

    head = httpx.head(listener + "/metrics")
    assert (head.status_code, head.content, head.headers["content-type"]) == (200, b"", CONTENT_TYPE)
    post = httpx.post(listener + "/metrics")
    assert (post.status_code, post.headers["allow"]) == (405, "GET, HEAD")
    assert httpx.get(listener + "/").status_code == 404
    assert httpx.get(listener + "/health").status_code == 404
    assert without_health(durations(scrape(listener + "/metrics"))) == without_health(durations(samples))


@pytest.mark.parametrize("scraped", ["metrics-port", "main-port"])
def test_workers_record_into_one_scrape(
    bastion_process: Callable[..., BastionProcess],
    config: Path,
    key_env: dict[str, str],
    minter: TokenMinter,
    tmp_path: Path,
    scraped: str,
) -> None:
    """``--workers 2``: requests spread over both workers, all counted in one scrape (the supervisor's on
    metrics.port; else any worker's on the main port)."""
    port = free_port()
    if scraped == "metrics-port":
        metrics_keys(config, f"port = {port}")
    temp = tmp_path / "tmp"  # where the supervisor makes its PROMETHEUS_MULTIPROC_DIR
    temp.mkdir()
    process = start(bastion_process, config, {**key_env, "TMPDIR": str(temp)}, "--workers", "2")
    deadline = time.monotonic() + 20  # the second worker may still be starting when the first answers
    while process.output().count("service_started") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.output().count("service_started") == 2
    (shared,) = temp.glob("bastion-metrics-*")

    def per_worker() -> dict[str, float]:
        """The list requests each worker recorded, read from its own file."""
        counts: dict[str, float] = {}
        for path in shared.glob("histogram_*.db"):
            for metric in MultiProcessCollector.merge([str(path)]):
                for sample in metric.samples:
                    if sample.name == DURATION_COUNT and sample.labels["http_route"] == DOCUMENTS_V2:
                        counts[path.stem] = counts.get(path.stem, 0) + sample.value
        return counts

    headers = {"connection": "close", **as_user(minter, "alice", "user")}

    def list_documents(_: int) -> int:
        return httpx.get(process.url + DOCUMENTS_V2, headers=headers, timeout=10).status_code

    sent = 0
    with ThreadPoolExecutor(max_workers=4) as pool:
        while len(per_worker()) < 2:  # until both workers have served some (bounded below)
            assert sent < 400, f"{sent} requests, all recorded by one worker: {per_worker()}"
            assert list(pool.map(list_documents, range(4))) == [200] * 4
            sent += 4

    url = f"http://127.0.0.1:{port}/metrics" if scraped == "metrics-port" else process.url + "/metrics"
    samples = scrape_when(url, lambda s: api_requests(s) >= sent)
    assert without_health(durations(samples)) == {("GET", DOCUMENTS_V2, "200"): sent}
    assert sum(per_worker().values()) == sent
    assert metric_series(samples, "api_version_requests_total", *VERSION_LABELS) == {("v2", "false", ""): sent}
    assert metric_series(samples, "bastion_policy_decisions_total", "decision") == {("allow",): sent}
    if scraped == "metrics-port":
        assert httpx.get(process.url + "/metrics").status_code == 401  # not served on the main port
    assert process.stop(signal.SIGTERM) == 0
    assert list(temp.iterdir()) == []  # the supervisor removed its directory


@pytest.mark.parametrize("where", ["cli-port", "config-file"])
def test_metrics_port_equal_to_the_service_port_is_refused_at_start(
    config: Path, key_env: dict[str, str], where: str
) -> None:
    port = free_port()
    args: list[str] = []
    env = dict(key_env)
    if where == "cli-port":
        args += ["--port", str(port)]
        env["SERVICE_METRICS_PORT"] = str(port)
        message = f"error: metrics.port {port} is the port the service listens on: choose another metrics.port"
    else:
        edit(config, "port = 8080\n", f"port = {port}\n")
        metrics_keys(config, f"port = {port}")
        message = (
            f"error: invalid configuration ({config}): metrics.port {port} is service.port too: "
            "choose another port or remove metrics.port"
        )
    result = run_refused(config, env, *args)
    assert (result.returncode, result.stderr, result.stdout) == (2, message + "\n", "")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_metrics_port_in_use_is_refused_at_start(
    config: Path, key_env: dict[str, str], tmp_path: Path, workers: str
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**key_env, "SERVICE_METRICS_PORT": str(port), "TMPDIR": str(temp)}
        result = run_refused(config, env, "--port", str(free_port()), "--workers", workers)
    message = f"error: metrics.port {port} on 127.0.0.1 cannot be opened (Address already in use)\n"
    assert (result.returncode, start_up_stderr(result.stderr), result.stdout) == (2, message, "")
    assert list(temp.iterdir()) == []


# -- metrics.public = false ---------------------------------------------------------------------------------------

SCRAPER_POLICY = """
// Scrapers (role "scraper") may read the metrics.
@id("metrics-scrapers")
permit(principal is User, action == Action::"GET /metrics", resource)
when { principal.roles.contains("scraper") };
"""


def test_not_public_metrics_need_a_token_and_a_policy_permit(
    bastion_process: Callable[..., BastionProcess], config: Path, key_env: dict[str, str], minter: TokenMinter
) -> None:
    metrics_keys(config, "public = false")
    policies = config.parent / "policies.cedar"
    policies.write_text(policies.read_text() + SCRAPER_POLICY)
    process = start(bastion_process, config, key_env)
    url = process.url + "/metrics"

    anonymous = httpx.get(url)
    assert (anonymous.status_code, anonymous.json()["code"]) == (401, "UNAUTHORIZED")
    assert anonymous.headers["www-authenticate"].startswith("Bearer")
    user = httpx.get(url, headers=as_user(minter, "alice", "user"))
    assert (user.status_code, user.json()["code"]) == (403, "FORBIDDEN")

    scraper = as_user(minter, "prometheus", "scraper")
    scrapes = 0

    def refusals_counted(samples: Samples) -> bool:
        nonlocal scrapes
        scrapes += 1
        refused = {labels: n for labels, n in durations(samples).items() if labels[2] != "200"}
        return sum(refused.values()) >= 2

    samples = scrape_when(url, refusals_counted, scraper)
    assert {
        labels: n for labels, n in durations(samples).items() if labels[1] == "/metrics" and labels[2] != "200"
    } == {
        ("GET", "/metrics", "401"): 1,
        ("GET", "/metrics", "403"): 1,
    }
    assert metric_series(samples, "bastion_token_rejections_total", "code") == {("UNAUTHORIZED",): 1}
    # Every scrape is decided (before it is answered, so the last one counts itself); the user's was denied.
    assert metric_series(samples, "bastion_policy_decisions_total", "decision") == {("allow",): scrapes, ("deny",): 1}
