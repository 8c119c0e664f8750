"""The versioned builder: the only way to register business routes, one OpenAPI document per version."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from fastapi import APIRouter, Depends, Request

from bastion import ConfigError, Deprecation, Service, VersionedApi
from tests.conftest import open_settings


def two_versions() -> Service:
    service = Service("svc", version="3.1.0")
    v1 = service.version(1, deprecated=Deprecation(replacement=3, message="Use v3."))
    v3 = service.version(3)

    @v1.get("/items")
    async def items_v1() -> list[int]:
        return [1]

    @v3.get("/items/{item_id}")
    async def item_v3(item_id: int) -> dict[str, int]:
        return {"id": item_id}

    return service


class TestRegistration:
    def test_service_has_no_unversioned_route_methods(self) -> None:
        service = Service()
        for name in (
            "get",
            "post",
            "put",
            "delete",
            "route",
            "add_route",
            "add_api_route",
            "include_router",
            "mount",
        ):
            assert not hasattr(service, name), name

    @pytest.mark.parametrize("number", [0, -1, "v1", 1.5, True, None])
    def test_version_must_be_a_positive_integer(self, number: object) -> None:
        with pytest.raises(ConfigError, match="must be a positive integer"):
            VersionedApi().version(number)  # type: ignore[arg-type]

    def test_version_registered_twice_is_rejected(self) -> None:
        api = VersionedApi()
        api.version(1)
        with pytest.raises(ConfigError, match="v1 is registered twice"):
            api.version(1)

    def test_version_takes_no_prefix(self) -> None:
        with pytest.raises(ConfigError, match="takes no prefix"):
            VersionedApi().version(1, prefix="/other")

    def test_build_without_versions_is_rejected(self) -> None:
        with pytest.raises(ConfigError, match="no API version registered"):
            Service().build(open_settings())

    def test_replacement_must_be_registered(self) -> None:
        service = Service()
        service.version(1, deprecated=Deprecation(replacement=2))
        with pytest.raises(ConfigError, match="v2, which is not registered"):
            service.build(open_settings())

    def test_deprecating_an_unknown_version_is_rejected(self) -> None:
        with pytest.raises(ConfigError, match="v4: it is not registered"):
            Service().deprecate(4, replacement=5)

    def test_version_cannot_replace_itself(self) -> None:
        service = Service()
        service.version(1)
        with pytest.raises(ConfigError, match="its own replacement"):
            service.deprecate(1, replacement=1)


class TestServing:
    async def test_versions_may_skip_numbers(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        client = asgi_client(two_versions())
        assert (await client.get("/api/v1/items")).json() == [1]
        assert (await client.get("/api/v3/items/7")).json() == {"id": 7}
        assert (await client.get("/api/v2/items")).status_code == 404

    async def test_base_path_comes_from_settings(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        client = asgi_client(two_versions(), open_settings(environ={"SERVICE_BASE_PATH": "/svc"}))
        assert (await client.get("/svc/v1/items")).status_code == 200
        assert (await client.get("/api/v1/items")).status_code == 404

    async def test_base_path_given_in_code_wins(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        service = Service(api=VersionedApi(base_path="/public"))
        service.version(1).get("/ping")(lambda: {"pong": True})
        assert (await asgi_client(service).get("/public/v1/ping")).json() == {"pong": True}

    async def test_empty_base_path_puts_versions_at_the_root(
        self, asgi_client: Callable[..., httpx.AsyncClient]
    ) -> None:
        service = Service()
        service.version(2).get("/ping")(lambda: {"pong": True})
        client = asgi_client(service, open_settings(environ={"SERVICE_BASE_PATH": "/"}))
        assert (await client.get("/v2/ping")).status_code == 200


class TestOpenApi:
    async def test_each_version_has_its_own_document(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        client = asgi_client(two_versions())
        v1 = (await client.get("/api/v1/openapi.json")).json()
        v3 = (await client.get("/api/v3/openapi.json")).json()
        assert set(v1["paths"]) == {"/api/v1/items"}
        assert set(v3["paths"]) == {"/api/v3/items/{item_id}"}
        assert v3["info"] == {"title": "svc v3", "version": "3.1.0"}

    async def test_deprecated_version_document_is_marked(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        document = (await asgi_client(two_versions()).get("/api/v1/openapi.json")).json()
        assert document["paths"]["/api/v1/items"]["get"]["deprecated"] is True
        assert document["info"]["x-deprecated"] is True
        assert document["info"]["x-replacement-version"] == "v3"
        assert "Use v3." in document["info"]["description"]

    async def test_current_version_document_is_not_marked(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        document = (await asgi_client(two_versions()).get("/api/v3/openapi.json")).json()
        assert "deprecated" not in document["paths"]["/api/v3/items/{item_id}"]["get"]

    async def test_deprecating_later_updates_the_document(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        service = two_versions()
        client = asgi_client(service)
        assert "x-deprecated" not in (await client.get("/api/v3/openapi.json")).json()["info"]
        service.deprecate(3, replacement=1)
        assert (await client.get("/api/v3/openapi.json")).json()["info"]["x-deprecated"] is True


class TestRouterLevelFeatures:
    async def test_router_and_include_dependencies_run(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        calls: list[str] = []

        async def version_dep(request: Request) -> None:
            calls.append("version")

        async def include_dep(request: Request) -> None:
            calls.append("include")

        service = Service()
        v1 = service.version(1, dependencies=[Depends(version_dep)])
        inner = APIRouter(prefix="/inner")

        @inner.get("/items/{item_id}")
        async def item(item_id: int) -> dict[str, int]:
            return {"id": item_id}

        v1.include_router(inner, dependencies=[Depends(include_dep)])
        response = await asgi_client(service).get("/api/v1/inner/items/5")
        assert response.json() == {"id": 5}
        assert calls == ["version", "include"]

    async def test_path_parameter_validation_still_applies(self, asgi_client: Callable[..., httpx.AsyncClient]) -> None:
        service = Service()

        @service.version(1).get("/items/{item_id}")
        async def item(item_id: int) -> dict[str, int]:
            return {"id": item_id}

        response = await asgi_client(service).get("/api/v1/items/abc")
        assert response.status_code == 422
