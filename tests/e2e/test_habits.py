"""End to end: FastAPI habits over a real ``bastion run`` process: sync hooks and checks, 404 before the policy,
an extractor's "not found", a domain exception's handler over HTTP and gRPC."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from bastion.testing import TokenMinter
from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
from examples.documents_api.proto.documents.v1 import documents_pb2_grpc as pb_grpc
from tests.conftest import BastionProcess
from tests.e2e.apps.habits_service import POLICY

APP = "tests.e2e.apps.habits_service:service"
LOCKED = {"error": "Document locked is locked (/api/v1/docs/locked)", "code": "DOCUMENT_LOCKED", "status": 423}


@pytest.fixture(scope="module")
def habits(
    module_bastion_process: Callable[..., BastionProcess],
    key_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> BastionProcess:
    policies: Path = tmp_path_factory.mktemp("policy") / "owners.cedar"
    policies.write_text(POLICY)
    env = {**key_env, "SERVICE_POLICY_POLICY_PATH": str(policies), "SERVICE_GRPC_ENABLED": "true"}
    return module_bastion_process(APP, env=env)


@pytest.fixture
def stub(habits: BastionProcess) -> Iterator[pb_grpc.DocumentServiceStub]:
    with grpc.insecure_channel(f"127.0.0.1:{habits.port}") as channel:
        yield pb_grpc.DocumentServiceStub(channel)


def alice(minter: TokenMinter) -> dict[str, str]:
    return {"authorization": "Bearer " + minter.mint(sub="alice", roles=["user"])}


def test_sync_startup_hook_and_sync_readiness_check_make_the_service_ready(habits: BastionProcess) -> None:
    ready = httpx.get(habits.url + "/ready")
    assert (ready.status_code, ready.json()["dependencies"]) == (200, {"started": {"healthy": True}})


def test_lifespan_state_reaches_requests(habits: BastionProcess, minter: TokenMinter) -> None:
    response = httpx.get(habits.url + "/api/v1/greeting", headers=alice(minter))
    assert (response.status_code, response.json()) == (200, {"greeting": "hello from lifespan"})


@pytest.mark.parametrize(
    "path",
    ["/api/v1/nonexistent", "/api/v3/docs/doc-1", "/nonexistent", "/api/v1/docs/doc-1/extra"],
)
def test_mistyped_url_with_a_valid_token_is_an_empty_404(
    habits: BastionProcess, minter: TokenMinter, path: str
) -> None:
    response = httpx.get(habits.url + path, headers=alice(minter))
    assert (response.status_code, response.content) == (404, b"")


@pytest.mark.parametrize("path", ["/api/v1/nonexistent", "/nonexistent", "/api/v1/docs/doc-1"])
def test_without_a_token_every_path_is_401_first(habits: BastionProcess, path: str) -> None:
    """Route existence is not revealed to anonymous callers."""
    assert httpx.get(habits.url + path).status_code == 401


def test_extractor_not_found_is_404_before_the_policy(habits: BastionProcess, minter: TokenMinter) -> None:
    response = httpx.get(habits.url + "/api/v1/docs/missing", headers=alice(minter))
    assert (response.status_code, response.json()) == (404, {"error": "Not found", "code": "NOT_FOUND", "status": 404})


def test_found_resource_is_still_decided_by_the_policy(habits: BastionProcess, minter: TokenMinter) -> None:
    bob = {"authorization": "Bearer " + minter.mint(sub="bob", roles=["user"])}
    assert httpx.get(habits.url + "/api/v1/docs/locked", headers=bob).status_code == 403


def test_domain_exception_gets_its_handlers_status_with_request_id_and_security_headers(
    habits: BastionProcess, minter: TokenMinter
) -> None:
    response = httpx.get(habits.url + "/api/v1/docs/locked", headers={**alice(minter), "x-request-id": "req-423"})
    assert (response.status_code, response.json()) == (423, LOCKED)
    assert (response.headers["x-request-id"], response.headers["x-content-type-options"]) == ("req-423", "nosniff")


def test_domain_exception_over_grpc_gets_the_handlers_grpc_status(
    stub: pb_grpc.DocumentServiceStub, minter: TokenMinter
) -> None:
    metadata = [("authorization", alice(minter)["authorization"])]
    with pytest.raises(grpc.RpcError) as raised:
        stub.GetDocument(pb.GetDocumentRequest(user_id="alice", doc_id="locked"), metadata=metadata, timeout=10)
    assert (raised.value.code(), raised.value.details()) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "Document locked is locked (/documents.v1.DocumentService/GetDocument)",
    )


def test_grpc_extractor_not_found_is_not_found(stub: pb_grpc.DocumentServiceStub, minter: TokenMinter) -> None:
    metadata = [("authorization", alice(minter)["authorization"])]
    with pytest.raises(grpc.RpcError) as raised:
        stub.GetDocument(pb.GetDocumentRequest(user_id="alice", doc_id="missing"), metadata=metadata, timeout=10)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_unknown_grpc_method_is_unimplemented(habits: BastionProcess, minter: TokenMinter) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{habits.port}") as channel:
        call = channel.unary_unary(
            "/documents.v1.DocumentService/Nope", request_serializer=bytes, response_deserializer=bytes
        )
        with pytest.raises(grpc.RpcError) as raised:
            call(b"", metadata=[("authorization", alice(minter)["authorization"])], timeout=10)
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
