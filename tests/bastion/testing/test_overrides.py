"""``dependency_overrides`` as FastAPI has it: on the service, the built app and the clients, read per request."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from fastapi import Depends, WebSocket

from bastion import Claims, Service, optional_claims
from bastion._compat import fastapi as fastapi_compat
from bastion._compat import starlette as starlette_compat
from bastion.routing._compiled import CompiledHandler
from bastion.testing import AsyncServiceClient, ServiceClient

COMPILES = fastapi_compat.supported() and starlette_compat.supported()


def get_store() -> str:
    return "real store"


def fake_store() -> str:
    return "fake store"


def override_claims() -> Claims:
    return Claims(sub="override", exp=0)


def store_service() -> Service:
    """``/store`` and the ``/ws`` WebSocket depend on ``get_store``; ``/who`` only on ``optional_claims`` (the
    compiled path's shape)."""
    service = Service("store-api")
    v1 = service.version(1)

    @v1.get("/store")
    async def store(name: Annotated[str, Depends(get_store)]) -> dict[str, str]:
        return {"store": name}

    @v1.get("/who")
    async def who(claims: Annotated[Claims | None, Depends(optional_claims)]) -> dict[str, Any]:
        return {"sub": claims.sub if claims else None}

    @v1.websocket("/ws")
    async def ws(websocket: WebSocket, name: Annotated[str, Depends(get_store)]) -> None:
        await websocket.accept()
        await websocket.send_json({"store": name})
        await websocket.close()

    return service


def compiled(value: bool) -> dict[str, str]:
    return {"SERVICE_COMPILED_HANDLERS": "true" if value else "false"}


def test_an_override_set_before_the_client_is_built_applies() -> None:
    service = store_service()
    service.dependency_overrides[get_store] = fake_store
    with ServiceClient(service) as client:
        assert client.as_user("alice").get("/api/v1/store").json() == {"store": "fake store"}


def test_an_override_set_after_the_build_applies_from_the_next_request() -> None:
    with ServiceClient(store_service()) as client:
        alice = client.as_user("alice")
        assert alice.get("/api/v1/store").json() == {"store": "real store"}
        client.app.dependency_overrides[get_store] = fake_store
        assert alice.get("/api/v1/store").json() == {"store": "fake store"}
        client.app.dependency_overrides.clear()
        assert alice.get("/api/v1/store").json() == {"store": "real store"}


def test_the_app_mapping_is_the_service_mapping_and_may_be_replaced() -> None:
    service = store_service()
    with ServiceClient(service) as client:
        assert client.app.dependency_overrides is service.dependency_overrides
        client.app.dependency_overrides = {get_store: fake_store}
        assert service.dependency_overrides == {get_store: fake_store}
        assert client.as_user("alice").get("/api/v1/store").json() == {"store": "fake store"}


@pytest.mark.parametrize("compiled_handlers", [True, False], ids=["compiled", "fastapi"])
def test_an_override_reaches_a_route_on_either_path(compiled_handlers: bool) -> None:
    with ServiceClient(store_service(), environ=compiled(compiled_handlers)) as client:
        (entry,) = [entry for entry in client.app.routes.entries if entry.path == "/api/v1/who"]
        assert isinstance(entry.handler, CompiledHandler) is (compiled_handlers and COMPILES)
        alice = client.as_user("alice")
        assert alice.get("/api/v1/who").json() == {"sub": "alice"}
        client.app.dependency_overrides[optional_claims] = override_claims
        assert alice.get("/api/v1/who").json() == {"sub": "override"}


def test_an_override_reaches_a_websocket_route() -> None:
    with ServiceClient(store_service()) as client:
        client.app.dependency_overrides[get_store] = fake_store
        with client.as_user("alice").websocket_connect("/api/v1/ws") as websocket:
            assert websocket.receive_json() == {"store": "fake store"}


async def test_the_async_client_reads_overrides_set_after_start() -> None:
    async with AsyncServiceClient(store_service()) as client:
        alice = client.as_user("alice")
        client.app.dependency_overrides[get_store] = fake_store
        assert (await alice.get("/api/v1/store")).json() == {"store": "fake store"}
