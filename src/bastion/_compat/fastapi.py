"""FastAPI internals Bastion relies on (verified on FastAPI 0.165.0; `make compat` runs on 0.115.0 and 0.125.0).

Version-dependent public names, used when present (``route_views``, ``exit_stack``):

- ``fastapi.routing.iter_route_contexts`` / ``RouteContext`` (FastAPI 0.138 and later): an included router keeps
  its routes and yields their effective contexts. Before them ``include_router`` copies every route, prefixed,
  into the including router, so its ``routes`` are already flat: the route table walks those.
- ``fastapi.middleware.asyncexitstack.AsyncExitStackMiddleware`` (FastAPI 0.118 and later): the exit stack a
  route's handler expects in its scope. Before it, each route's handler opens its own.

The compiled handlers (``bastion.routing._compiled``) analyse a route once with FastAPI's own helpers and serve
it without FastAPI's per-request machinery; the route table (``bastion.routing._resolve``) calls a route's
handler directly. They assume:

- ``fastapi.routing.RouteContext._route_context``: the effective route context of a flattened route (its
  dependant, body field, response field and options, ``app``, ``endpoint``, ``original_route``), ``None``
  for a route that is not a plain ``APIRoute``.
- ``<route context>._embed_body_fields``: whether the route's body parameters are embedded in one object.
- ``<ModelField>._type_adapter``: the pydantic ``TypeAdapter`` FastAPI validates a parameter or body with.
- ``fastapi._compat.ModelField``: the class of those fields (a type only).
- ``fastapi._compat.shared.field_annotation_is_sequence(annotation)``: whether a query parameter is a list.
- ``fastapi.dependencies.utils``: ``_get_param_model(field)``, ``_is_json_field(field)``,
  ``_get_param_aliases(field)`` (``[(name, key)]``), ``_get_form_models(field)``,
  ``_should_embed_body_fields(fields)``: how FastAPI reads a parameter.
- ``fastapi.dependencies.models``: ``_is_coroutine_callable``, ``_is_gen_callable``, ``_is_async_gen_callable``:
  how FastAPI runs an endpoint (awaited, in the thread pool, or not at all: a generator streams).
- ``fastapi._body_limit.get_body_limit_error(exc)``: the 413 FastAPI answers when a body passes the route's
  ``max_body_size`` (``None`` for any other failure while reading it).
- ``fastapi.routing._extract_endpoint_context(call)``: the endpoint description a ``ResponseValidationError``
  carries.

``supported()`` says whether every one is present on the installed FastAPI; without them the compiled handlers
switch themselves off (``compiled_handlers_unavailable``) and FastAPI's handler serves every route.
``tests/bastion/compat/test_fastapi.py`` checks each assumption.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from bastion.types import ASGIApp, Receive, Scope, Send

try:  # FastAPI 0.138 and later
    from fastapi.routing import iter_route_contexts
except ImportError:  # pragma: no cover - older FastAPI: include_router copies routes (see the docstring)
    iter_route_contexts = None  # type: ignore[assignment]
try:  # FastAPI 0.118 and later
    from fastapi.middleware.asyncexitstack import AsyncExitStackMiddleware
except ImportError:  # pragma: no cover - older FastAPI: each route's handler opens its own exit stack
    AsyncExitStackMiddleware = None  # type: ignore[assignment,misc]

VERIFIED = "FastAPI 0.165.0"
"""The FastAPI version these assumptions were last checked on."""

_FUNCTIONS = {
    "fastapi._body_limit": ("get_body_limit_error",),
    "fastapi._compat": ("ModelField",),
    "fastapi._compat.shared": ("field_annotation_is_sequence",),
    "fastapi.dependencies.models": ("_is_async_gen_callable", "_is_coroutine_callable", "_is_gen_callable"),
    "fastapi.dependencies.utils": (
        "_get_form_models",
        "_get_param_aliases",
        "_get_param_model",
        "_is_json_field",
        "_should_embed_body_fields",
    ),
    "fastapi.routing": ("_extract_endpoint_context",),
}
ATTRIBUTES = ("_route_context", "_embed_body_fields", "_type_adapter")
"""Private attributes of FastAPI's objects (route contexts, model fields) read here."""
PRIVATE_NAMES = frozenset(
    {*ATTRIBUTES, "_body_limit", "_compat", *(name for names in _FUNCTIONS.values() for name in names)}
    - {"ModelField", "get_body_limit_error", "field_annotation_is_sequence"}
)
"""Every private name of FastAPI this module touches (the wall test looks for them outside ``bastion._compat``)."""


def _load() -> tuple[dict[str, Any], list[str]]:
    found: dict[str, Any] = {}
    missing: list[str] = []
    for module_name, names in _FUNCTIONS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing.extend(f"{module_name}.{name}" for name in names)
            continue
        for name in names:
            value = getattr(module, name, None)
            if value is None:
                missing.append(f"{module_name}.{name}")
            else:
                found[name] = value
    return found, missing


_FOUND, _MISSING = _load()


def version() -> str:
    """The installed FastAPI's version."""
    return importlib.metadata.version("fastapi")


def _attributes_missing() -> list[str]:
    """The private attributes (declared or assigned in FastAPI's source) the installed FastAPI lacks."""
    try:
        source = inspect.getsource(importlib.import_module("fastapi.routing"))
        source += inspect.getsource(importlib.import_module("fastapi._compat.v2"))
    except (ImportError, OSError, TypeError):
        return [f"fastapi.{name}" for name in ATTRIBUTES]
    return [f"fastapi.{name}" for name in ATTRIBUTES if f"{name}: " not in source and f"self.{name} =" not in source]


def missing() -> list[str]:
    """The private helpers and attributes the compiled handlers need that the installed FastAPI lacks (``[]``:
    none)."""
    return [*_MISSING, *_attributes_missing()]


def supported() -> bool:
    """Whether the compiled handlers can run on the installed FastAPI."""
    return not missing()


# FastAPI's scope keys for the matched route's context (fastapi/routing.py, route contexts' releases).
_FASTAPI_SCOPE, _EFFECTIVE_ROUTE_CONTEXT = "fastapi", "effective_route_context"


def has_route_contexts() -> bool:
    """Whether the installed FastAPI keeps included routers and yields route contexts (0.138 and later)."""
    return iter_route_contexts is not None


def has_exit_stack_middleware() -> bool:
    """Whether the installed FastAPI has ``AsyncExitStackMiddleware`` (0.118 and later)."""
    return AsyncExitStackMiddleware is not None


@dataclass(frozen=True, slots=True)
class RouteView:
    """One route of a router, flattened through included routers, the same on every supported FastAPI."""

    path: str | None
    methods: Any
    name: str | None
    original_route: BaseRoute
    context: Any
    """FastAPI's effective route context of a plain ``APIRoute`` (what the compiled handlers analyse), or
    ``None``: another kind of route, or a FastAPI without route contexts."""
    handler: ASGIApp | None
    """The route's own handler, called directly after matching (``None``: FastAPI's router dispatches it)."""


def route_views(routes: Sequence[BaseRoute]) -> Iterator[RouteView]:
    """Every route of ``routes``, included routers flattened, in registration order."""
    if iter_route_contexts is None:
        for route in routes:
            handler = _route_handler(route, route.app, route.endpoint, None) if isinstance(route, APIRoute) else None
            yield RouteView(
                path=getattr(route, "path", None),
                methods=getattr(route, "methods", None),
                name=getattr(route, "name", None),
                original_route=route,
                context=None,
                handler=handler,
            )
        return
    for context in iter_route_contexts(routes):
        effective = route_context(context)
        if effective is None or not isinstance(effective.original_route, APIRoute) or effective.app is None:
            effective, handler = None, None
        else:
            handler = _route_handler(effective.original_route, effective.app, effective.endpoint, effective)
        yield RouteView(
            path=context.path,
            methods=context.methods,
            name=context.name,
            original_route=context.original_route,
            context=effective,
            handler=handler,
        )


def _route_handler(route: APIRoute, app: ASGIApp, endpoint: Callable[..., Any], effective: Any) -> ASGIApp:
    """Call a FastAPI route's handler directly, skipping FastAPI's second walk through the routers: what FastAPI's
    router does once it has matched (record the route, its endpoint and, with route contexts, the effective
    context in the scope; run the route's app inside FastAPI's exit stack where the route expects one)."""

    async def handle(scope: Scope, receive: Receive, send: Send) -> None:
        scope["endpoint"] = endpoint
        scope["route"] = route
        if effective is not None:
            scope.setdefault(_FASTAPI_SCOPE, {})[_EFFECTIVE_ROUTE_CONTEXT] = effective
        await app(scope, receive, send)

    return exit_stack(handle)


def exit_stack(app: ASGIApp) -> ASGIApp:
    """``app`` inside FastAPI's exit stack middleware where the installed FastAPI has one (routes expect it then)."""
    if AsyncExitStackMiddleware is None:
        return app
    wrapped: ASGIApp = AsyncExitStackMiddleware(app)
    return wrapped


def route_context(context: Any) -> Any:
    """The effective route context of one of ``fastapi.routing.iter_route_contexts``'s contexts, or ``None``."""
    return getattr(context, "_route_context", None)


def embeds_body_fields(context: Any) -> bool:
    """Whether the route's body parameters are read as one embedded object."""
    return bool(context._embed_body_fields)


def type_adapter(field: Any) -> Any:
    """The pydantic ``TypeAdapter`` a FastAPI ``ModelField`` validates with."""
    return field._type_adapter


def is_sequence_annotation(annotation: Any) -> bool:
    """Whether FastAPI reads a parameter of this annotation as a list."""
    return bool(_FOUND["field_annotation_is_sequence"](annotation))


def param_model(field: Any) -> Any:
    """The pydantic model that groups a route's parameters of one kind, or ``None``."""
    return _FOUND["_get_param_model"](field)


def is_json_field(field: Any) -> bool:
    """Whether FastAPI reads the parameter as JSON (``Json[...]``)."""
    return bool(_FOUND["_is_json_field"](field))


def param_aliases(field: Any) -> list[tuple[str, str]]:
    """The ``(name, key)`` pairs FastAPI reads a parameter under."""
    return list(_FOUND["_get_param_aliases"](field))


def form_models(field: Any) -> Any:
    """The form models of a body parameter (falsy: none)."""
    return _FOUND["_get_form_models"](field)


def should_embed_body_fields(fields: Sequence[Any]) -> bool:
    """Whether FastAPI embeds these body parameters in one object."""
    return bool(_FOUND["_should_embed_body_fields"](fields))


def is_coroutine_callable(call: Callable[..., Any]) -> bool:
    """Whether FastAPI awaits ``call`` (else it runs it in the thread pool)."""
    return bool(_FOUND["_is_coroutine_callable"](call))


def is_generator_callable(call: Callable[..., Any]) -> bool:
    """Whether ``call`` is a generator or async generator function (FastAPI streams or yields it)."""
    return bool(_FOUND["_is_gen_callable"](call) or _FOUND["_is_async_gen_callable"](call))


def body_limit_error(exc: Exception) -> Exception | None:
    """The error FastAPI answers when reading a body failed because of ``exc`` (``None``: not a size limit)."""
    error: Exception | None = _FOUND["get_body_limit_error"](exc)
    return error


def endpoint_context(call: Callable[..., Any]) -> dict[str, Any]:
    """The endpoint description FastAPI puts in a ``ResponseValidationError``."""
    context: dict[str, Any] = _FOUND["_extract_endpoint_context"](call)
    return context
