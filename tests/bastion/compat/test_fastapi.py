"""What ``bastion._compat.fastapi`` assumes of FastAPI's internals, checked on the installed version (verified on
FastAPI 0.165.0): an upgrade that changes one fails here, by name.

Assumptions: ``RouteContext._route_context`` (the effective context of a plain APIRoute), a context's
``_embed_body_fields``, a ``ModelField``'s ``_type_adapter``; ``fastapi._compat.ModelField``,
``fastapi._compat.shared.field_annotation_is_sequence``; ``fastapi.dependencies.utils``' ``_get_param_model``,
``_is_json_field``, ``_get_param_aliases``, ``_get_form_models``, ``_should_embed_body_fields``;
``fastapi.dependencies.models``' ``_is_coroutine_callable``, ``_is_gen_callable``, ``_is_async_gen_callable``;
``fastapi._body_limit.get_body_limit_error``; ``fastapi.routing._extract_endpoint_context``.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

import fastapi
import pytest
from fastapi import APIRouter, Body, Query
from pydantic import BaseModel, TypeAdapter

from bastion._compat import fastapi as fastapi_compat


class Item(BaseModel):
    name: str


class Filters(BaseModel):
    q: str


def contexts() -> dict[str, Any]:
    router = APIRouter()

    @router.get("/scalar/{item_id}")
    async def scalar(item_id: int, q: str = "x", tags: Annotated[list[str] | None, Query()] = None) -> None: ...

    @router.post("/body")
    def body(item: Item) -> None: ...

    @router.post("/embedded")
    def embedded(item: Annotated[Item, Body(embed=True)]) -> None: ...

    @router.get("/model")
    def model(filters: Annotated[Filters, Query()]) -> None: ...

    @router.get("/alias")
    def alias(value: Annotated[str, Query(alias="v")]) -> None: ...

    outer = APIRouter()
    outer.include_router(router, prefix="/v1")  # how Bastion reads its versions' routes
    found = {}
    for view in fastapi_compat.route_views(outer.routes):
        assert view.context is not None, view.path
        found[view.path.removeprefix("/v1")] = view.context
    return found


# FastAPI release -> (route contexts, exit-stack middleware, compiled handlers): what is on with it.
FEATURES = {
    "0.165.0": (True, True, True),  # the newest: `make test` (constraints.txt)
    "0.125.0": (False, True, False),  # `make compat`'s middle set
    "0.115.0": (False, False, False),  # `make compat`'s oldest set
}
COMPILED = FEATURES.get(fastapi.__version__, (False, False, False))[2]
compiled_only = pytest.mark.skipif(
    not COMPILED, reason=f"FastAPI {fastapi.__version__}: the compiled handlers are off (test_features_on_this_version)"
)


def test_the_version_is_one_verified() -> None:
    assert fastapi.__version__ in FEATURES, "re-check bastion/_compat/fastapi.py against this FastAPI, then update"


def test_features_on_this_version() -> None:
    assert (
        fastapi_compat.has_route_contexts(),
        fastapi_compat.has_exit_stack_middleware(),
        fastapi_compat.supported(),
    ) == FEATURES[fastapi.__version__]


def test_included_routes_are_flattened_with_their_full_paths() -> None:
    router = APIRouter()

    @router.get("/items/{item_id}")
    async def item(item_id: int) -> None: ...

    @router.websocket("/feed")
    async def feed() -> None: ...

    outer = APIRouter()
    outer.include_router(router, prefix="/api/v1")
    views = list(fastapi_compat.route_views(outer.routes))
    assert [(view.path, view.methods, view.name) for view in views] == [
        ("/api/v1/items/{item_id}", {"GET"}, "item"),
        ("/api/v1/feed", None, "feed"),
    ]
    assert views[0].handler is not None and views[1].handler is None  # a WebSocket route: FastAPI dispatches it
    assert (views[0].context is not None) is fastapi_compat.has_route_contexts()


@compiled_only
def test_every_private_helper_is_there() -> None:
    assert fastapi_compat.missing() == []
    assert fastapi_compat.supported()


@compiled_only
def test_a_missing_helper_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading the helpers never fails at import: a missing one is listed, and the feature switches off."""
    real = importlib.import_module

    def without_body_limit(name: str, *args: Any) -> Any:
        if name == "fastapi._body_limit":
            raise ImportError(name)
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", without_body_limit)
    found, missing = fastapi_compat._load()
    assert missing == ["fastapi._body_limit.get_body_limit_error"]
    assert "_get_param_model" in found


@compiled_only
def test_the_effective_context_of_a_route() -> None:
    context = contexts()["/body"]
    assert context.original_route.path == "/body"  # the route as declared; the context carries the prefix
    assert context.app is not None and context.endpoint is not None
    assert context.body_field is not None


@compiled_only
def test_parameters_read_as_fastapi_reads_them() -> None:
    found = contexts()
    scalar = found["/scalar/{item_id}"].dependant
    item_id, q, tags = scalar.path_params + scalar.query_params
    assert isinstance(fastapi_compat.type_adapter(item_id), TypeAdapter)
    assert fastapi_compat.type_adapter(item_id).validate_python("3") == 3
    assert fastapi_compat.param_aliases(q) == [("q", "q")]
    assert fastapi_compat.param_model(q) is None and not fastapi_compat.is_json_field(q)
    assert fastapi_compat.is_sequence_annotation(tags.field_info.annotation)
    assert not fastapi_compat.is_sequence_annotation(q.field_info.annotation)
    (value,) = found["/alias"].dependant.query_params
    assert [key for _, key in fastapi_compat.param_aliases(value)] == ["v"]
    (filters,) = found["/model"].dependant.query_params
    assert fastapi_compat.param_model(filters) is not None


@compiled_only
def test_body_shapes() -> None:
    found = contexts()
    plain, embedded = found["/body"], found["/embedded"]
    assert not fastapi_compat.embeds_body_fields(plain)
    assert not fastapi_compat.should_embed_body_fields(plain.dependant.body_params)
    assert fastapi_compat.embeds_body_fields(embedded)
    assert fastapi_compat.should_embed_body_fields(embedded.dependant.body_params)
    assert not fastapi_compat.form_models(plain.dependant.body_params[0])  # (forms need python-multipart)


async def coroutine() -> None: ...


def plain() -> None: ...


def generator() -> Iterator[int]:
    yield 1


async def async_generator() -> AsyncIterator[int]:
    yield 1


@compiled_only
def test_how_an_endpoint_runs() -> None:
    assert fastapi_compat.is_coroutine_callable(coroutine)
    assert not fastapi_compat.is_coroutine_callable(plain)
    assert fastapi_compat.is_generator_callable(generator)
    assert fastapi_compat.is_generator_callable(async_generator)
    assert not fastapi_compat.is_generator_callable(plain)


@compiled_only
def test_the_body_limit_error_and_the_endpoint_context() -> None:
    assert fastapi_compat.body_limit_error(ValueError("not a limit")) is None
    context = fastapi_compat.endpoint_context(plain)
    assert context["function"] == "plain"
