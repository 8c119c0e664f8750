"""End to end: inbound circuit breakers and bulkheads on a real ``bastion run``, over HTTP and gRPC."""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Callable

import grpc
import httpx
import pytest

from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
from examples.documents_api.proto.documents.v1 import documents_pb2_grpc as pb_grpc
from tests.conftest import TOKEN_OFF, BastionProcess
from tests.e2e.apps.resilience_service import FAIL_ON_DEMAND

APP = "tests.e2e.apps.resilience_service:service"
WAIT_SECS = 1
ENV = {
    **TOKEN_OFF,
    "SERVICE_RATE_LIMIT_ENABLED": "false",
    "SERVICE_GRPC_ENABLED": "true",
    "SERVICE_MIDDLEWARE_RESILIENCE_CIRCUIT_BREAKER_THRESHOLD": "0.5",
    "SERVICE_MIDDLEWARE_RESILIENCE_CIRCUIT_BREAKER_MIN_REQUESTS": "4",
    "SERVICE_MIDDLEWARE_RESILIENCE_CIRCUIT_BREAKER_WAIT_SECS": str(WAIT_SECS),
    "SERVICE_MIDDLEWARE_RESILIENCE_BULKHEAD_MAX_CONCURRENT": "2",
    "SERVICE_MIDDLEWARE_RESILIENCE_BULKHEAD_MAX_WAIT": "0.3",
}
CIRCUIT_OPEN = {"error": "Service unavailable: circuit open", "code": "SERVICE_UNAVAILABLE", "status": 503}
BULKHEAD_FULL = {
    "error": "Service unavailable: too many concurrent requests",
    "code": "SERVICE_UNAVAILABLE",
    "status": 503,
}


@pytest.fixture
def service(bastion_process: Callable[..., BastionProcess]) -> BastionProcess:
    """A fresh process per test: breakers and pools start closed and empty."""
    return bastion_process(APP, env=ENV)


def get(process: BastionProcess, path: str) -> httpx.Response:
    return httpx.get(process.url + path, headers={"origin": "http://x"}, timeout=10)


def test_failing_route_trips_the_breaker_then_half_opens_and_closes(service: BastionProcess) -> None:
    assert [get(service, "/api/v1/flaky?status=500").status_code for _ in range(4)] == [500, 500, 500, 500]
    rejected = get(service, "/api/v1/flaky")
    assert rejected.status_code == 503
    assert rejected.json() == CIRCUIT_OPEN
    assert int(rejected.headers["retry-after"]) == WAIT_SECS
    assert len(rejected.headers["x-request-id"]) == 32
    assert rejected.headers["x-content-type-options"] == "nosniff"
    assert get(service, "/api/v2/flaky").status_code == 200  # v2's breaker is its own
    time.sleep(WAIT_SECS + 0.2)
    assert get(service, "/api/v1/flaky").status_code == 200  # the Half-Open test request succeeds: Closed
    assert [get(service, "/api/v1/flaky").status_code for _ in range(3)] == [200, 200, 200]
    service.wait_for_output("circuit_breaker_state_changed")
    lines = [json.loads(line) for line in service.output().splitlines() if line.startswith("{")]
    changes = [line for line in lines if line["event"] == "circuit_breaker_state_changed"]
    assert [(change["old_state"], change["new_state"]) for change in changes] == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]


def test_4xx_never_trips_the_breaker(service: BastionProcess) -> None:
    assert {get(service, "/api/v1/flaky?status=404").status_code for _ in range(10)} == {404}
    assert {get(service, "/api/v1/flaky?status=422").status_code for _ in range(5)} == {422}
    assert get(service, "/api/v1/flaky").status_code == 200


def test_bulkhead_of_two_rejects_the_third_caller_after_max_wait_and_versions_have_own_pools(
    service: BastionProcess,
) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=5) as pool:
        slow_v1 = [pool.submit(get, service, "/api/v1/slow?secs=1.5") for _ in range(2)]
        time.sleep(0.3)  # both v1 slots taken
        third = pool.submit(get, service, "/api/v1/slow?secs=0")
        other_version = [pool.submit(get, service, "/api/v2/slow?secs=0") for _ in range(2)]
        rejected = third.result(timeout=10)
        assert rejected.status_code == 503
        assert rejected.json() == BULKHEAD_FULL
        assert rejected.headers["retry-after"] == "1"
        assert [f.result(timeout=10).status_code for f in other_version] == [200, 200]
        assert [f.result(timeout=10).status_code for f in slow_v1] == [200, 200]
    assert get(service, "/api/v1/slow?secs=0").status_code == 200  # the slots came back


def test_grpc_server_failures_trip_the_breaker_caller_errors_do_not(service: BastionProcess) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        stub = pb_grpc.DocumentServiceStub(channel)

        def call(limit: int) -> grpc.StatusCode:
            try:
                stub.ListDocuments(pb.ListDocumentsRequest(limit=limit), timeout=10)
            except grpc.RpcError as exc:
                return exc.code()  # type: ignore[no-any-return]
            return grpc.StatusCode.OK

        assert {call(101) for _ in range(10)} == {grpc.StatusCode.INVALID_ARGUMENT}  # the caller's errors
        assert call(1) == grpc.StatusCode.OK
        # The window holds the last 4 outcomes: [ok, INTERNAL, INTERNAL, INTERNAL] = 0.75 > 0.5 opens it.
        assert [call(FAIL_ON_DEMAND) for _ in range(3)] == [grpc.StatusCode.INTERNAL] * 3
        with pytest.raises(grpc.RpcError) as info:
            stub.ListDocuments(pb.ListDocumentsRequest(limit=1), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert info.value.details() == "Service unavailable: circuit open"
        assert {m.key: m.value for m in info.value.trailing_metadata()}["retry-after"] == str(WAIT_SECS)
