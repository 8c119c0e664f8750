"""The Cedar schema generated from a service: actions from the route table and gRPC, resource attributes,
principal and context types."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from bastion import Service
from bastion.errors import ConfigError
from bastion.policy._schema import PolicySchema
from tests.conftest import open_settings


class Orders:
    """Stands in for a generated grpclib servable: the schema reads only its method names."""

    def __mapping__(self) -> dict[str, object]:
        return {"/shop.v1.Orders/GetOrder": None, "/shop.v1.Orders/ListOrders": None}


async def page(request: Request) -> Response:
    return PlainTextResponse("page")


def shop_service() -> Service:
    """v1 and v2 routes (one with an ``int`` parameter), extractors with and without declared attributes,
    a frontend page and a gRPC service."""
    service = Service("shop")
    v1, v2 = service.version(1), service.version(2)

    @v1.get("/orders")
    async def list_orders() -> list[str]:
        return []

    @v2.get("/orders/{order_id:int}")
    async def get_order(order_id: int) -> dict[str, int]:
        return {"id": order_id}

    @v2.put("/notes/{note_id}")
    async def put_note(note_id: str) -> dict[str, str]:
        return {"id": note_id}

    def owner(scope: Any, params: dict[str, Any]) -> dict[str, Any]:
        return {"owner_id": "alice", "archived": False}

    service.resource_extractor("/api/v2/orders/{order_id}", attributes={"owner_id": str, "archived": bool})(owner)
    service.resource_extractor("/api/v2/notes/{note_id}")(owner)  # nothing declared
    service.frontend([Route("/about", page)])
    service.add_grpc_service(Orders())
    service.grpc_resource_extractor("/shop.v1.Orders/GetOrder", attributes={"owner_id": str})(lambda m: {})
    service.mount_policy_reload_route()
    return service


DOCS_PAGES = ("/docs", "/redoc")  # Swagger UI and ReDoc


def schema_of(service: Service, **environ: str) -> PolicySchema:
    return service.build(open_settings(environ=environ)).policy_schema()


class TestActions:
    def test_every_route_operator_route_frontend_page_and_grpc_method(self) -> None:
        schema = schema_of(shop_service())
        assert [action.name for action in schema.actions if not action.name.endswith(DOCS_PAGES)] == [
            "GET /api/v1/openapi.json",
            "HEAD /api/v1/openapi.json",
            "GET /api/v1/orders",
            "GET /api/v2/openapi.json",
            "HEAD /api/v2/openapi.json",
            "GET /api/v2/orders/{order_id}",
            "PUT /api/v2/notes/{note_id}",
            "POST /admin/reload-policy",
            "GET /about",
            "HEAD /about",
            "/shop.v1.Orders/GetOrder",
            "/shop.v1.Orders/ListOrders",
        ]
        assert not schema.open_actions

    def test_the_api_docs_are_actions_public_or_not(self) -> None:
        """A policy naming them (needed with service.api_docs_public = false) stays valid when they are public."""
        docs = ["GET /api/v2/openapi.json", "GET /api/v2/docs", "HEAD /api/v2/docs", "GET /api/v2/redoc"]
        for environ in ({}, {"SERVICE_API_DOCS_PUBLIC": "false"}):
            names = [action.name for action in schema_of(shop_service(), **environ).actions]
            assert [name in names for name in docs] == [True] * 4

    def test_metrics_behind_the_policy_is_an_action(self) -> None:
        schema = schema_of(shop_service(), SERVICE_METRICS_ENABLED="true", SERVICE_METRICS_PUBLIC="false")
        names = [action.name for action in schema.actions]
        assert ("GET /metrics" in names, "HEAD /metrics" in names, "GET /health" in names) == (True, True, False)

    def test_a_fallback_opens_the_action_set(self) -> None:
        service = shop_service()
        service.set_fallback(page)
        assert schema_of(service).open_actions

    def test_a_frontend_route_with_parameters_opens_the_action_set(self) -> None:
        service = Service("pages")
        service.version(1)
        service.frontend([Route("/pages/{slug}", page)])
        assert schema_of(service).open_actions


class TestResources:
    def test_path_parameters_and_declared_attributes(self) -> None:
        shapes = {action.name: (dict(action.attributes), action.open) for action in schema_of(shop_service()).actions}
        assert shapes["GET /api/v2/orders/{order_id}"] == (
            {"order_id": "Long", "owner_id": "String", "archived": "Boolean"},
            False,
        )
        assert shapes["PUT /api/v2/notes/{note_id}"] == ({"note_id": "String"}, True)
        assert shapes["/shop.v1.Orders/GetOrder"] == ({"owner_id": "String"}, False)
        assert shapes["/shop.v1.Orders/ListOrders"] == ({}, False)

    @pytest.mark.parametrize("declared", [{"owner_id": list}, {"owner-id": str}])
    def test_an_undeclarable_attribute_is_refused_at_registration(self, declared: dict[str, type]) -> None:
        service = Service("x")
        with pytest.raises(ConfigError) as info:
            service.resource_extractor("/api/v1/x", attributes=declared)
        name, kind = next(iter(declared.items()))
        assert str(info.value) == (
            f"resource_extractor('/api/v1/x'): attribute {name!r} of type {kind!r}: declare identifiers of type "
            "str, int or bool"
        )


class TestDocument:
    def test_cedar_json_schema(self) -> None:
        document = schema_of(shop_service()).document()[""]
        user = document["entityTypes"]["User"]["shape"]["attributes"]
        assert user == {
            "sub": {"type": "String", "required": False},
            "roles": {"type": "Set", "element": {"type": "String"}, "required": True},
            "perms": {"type": "Set", "element": {"type": "String"}, "required": True},
            "username": {"type": "String", "required": False},
            "email": {"type": "String", "required": False},
            "client_id": {"type": "String", "required": False},
        }
        assert document["entityTypes"]["Anonymous"]["shape"]["attributes"] == {
            "roles": {"type": "Set", "element": {"type": "String"}, "required": True},
            "perms": {"type": "Set", "element": {"type": "String"}, "required": True},
        }
        # One Resource type for every action: an attribute not every resource has is optional here.
        assert document["entityTypes"]["Resource"]["shape"]["attributes"] == {
            "archived": {"type": "Boolean", "required": False},
            "note_id": {"type": "String", "required": False},
            "order_id": {"type": "Long", "required": False},
            "owner_id": {"type": "String", "required": False},
        }
        assert document["commonTypes"]["Context"]["attributes"] == {
            "ip_address": {"type": "String", "required": True},
            "timestamp": {"type": "Long", "required": True},
            "user_agent": {"type": "String", "required": True},
            "request_id": {"type": "String", "required": True},
            "roles": {"type": "Set", "element": {"type": "String"}, "required": True},
            "method": {"type": "String", "required": True},
            "path": {"type": "String", "required": True},
            "version": {"type": "Long", "required": True},
        }
        assert document["actions"]["GET /api/v1/orders"] == {
            "appliesTo": {
                "principalTypes": ["User", "Anonymous"],
                "resourceTypes": ["Resource"],
                "context": {"type": "Context"},
            }
        }
        assert len([name for name in document["actions"] if not name.endswith(DOCS_PAGES)]) == 12
