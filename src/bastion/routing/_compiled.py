"""Compiled handlers: FastAPI routes of the common shapes served without FastAPI's per-request machinery.

At build, each versioned FastAPI route is analysed once (``compile_route``). When its shape is one this module
knows, the route gets a :class:`CompiledHandler` that does, for a request, only what the route needs:

- path and query parameters of scalar types, each validated by the very ``TypeAdapter`` FastAPI built for it;
- at most one JSON body parameter (not embedded, not a form), read and parsed as FastAPI does, then validated
  by FastAPI's own field;
- ``Request`` / ``HTTPConnection`` parameters, and dependencies on Bastion's own pure providers
  (``current_claims``, ``optional_claims``, ``current_broker``, ``optional_broker``, ``app_settings``),
  called inline;
- an ``async def`` or plain ``def`` endpoint (the latter in the thread pool, as FastAPI runs it);
- the response: a ``Response`` the endpoint returns is sent as is; any other value is validated and serialized
  by the route's response field straight to JSON bytes (pydantic's compiled serializer), or by
  ``jsonable_encoder`` + the route's response class when there is no response model.

Everything else (header, cookie or model-shaped parameters, sequence query parameters, forms and files, other
dependencies, ``Response`` / ``BackgroundTasks`` / ``SecurityScopes`` parameters, streaming endpoints, a route
``max_body_size``) keeps FastAPI's handler. So does every
request the compiled path cannot answer as FastAPI would: the first validation error, a body that is not valid
JSON, dependency overrides in force. Those requests go to FastAPI's handler whole (the body already read is
replayed), so a 422 or 400 is FastAPI's own, byte for byte; the endpoint has not run. The differential test
(tests/bastion/routing/test_compiled.py) runs both paths over the example's routes and a set of awkward
signatures and compares status, headers and body. ``service.compiled_handlers = false`` turns this off.

The FastAPI and Starlette internals this module reads are named in ``bastion._compat.fastapi`` and
``bastion._compat.starlette``; on a version without them, compiling is off (one ``compiled_handlers_unavailable``
line at start-up) and FastAPI's handler serves every route.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Collection, Mapping
from copy import deepcopy
from dataclasses import dataclass
from typing import Any

import structlog
from fastapi import params
from fastapi.datastructures import DefaultPlaceholder
from fastapi.dependencies.models import Dependant
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import ResponseValidationError
from fastapi.routing import APIRoute
from fastapi.utils import is_body_allowed_for_status_code
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from bastion._compat import fastapi as fastapi_compat
from bastion._compat import starlette as starlette_compat
from bastion.routing._content_type import content_type_of, is_json_content_type
from bastion.types import ASGIApp, Message, ReadAhead, Receive, Scope, Send

ModelField = Any  # FastAPI's field class; its module is private, so it is named only in bastion._compat.fastapi
log = structlog.get_logger("bastion.routing")

_IMMUTABLE_DEFAULTS = (type(None), bool, int, float, str, bytes)
_FASTAPI_SCOPE, _EFFECTIVE_ROUTE_CONTEXT = "fastapi", "effective_route_context"
_MISSING = object()
_COMPUTED = object()
_JSON_CONTENT_TYPE = (b"content-type", b"application/json")
_NO_QUERY: Mapping[str, str] = {}


class _NoOverrides:
    """The overrides of a route whose router has no ``dependency_overrides_provider``: none, ever."""

    def __init__(self) -> None:
        self.dependency_overrides: Mapping[Any, Any] = {}


_NO_OVERRIDES = _NoOverrides()


class _Fallback(Exception):
    """The compiled path cannot answer this request as FastAPI would: FastAPI's handler answers it."""


@dataclass(frozen=True, slots=True)
class _Param:
    """A path or query parameter: the keyword it is passed as, the key it is read from, how it validates."""

    name: str
    key: str
    validate: Callable[..., Any]
    default: Any
    """The value when absent: a constant, ``_MISSING`` (required: FastAPI answers 422), or ``_COMPUTED``
    (built per request as FastAPI does: a deep copy of the default, validated when the field says so)."""
    field: ModelField


@dataclass(frozen=True, slots=True)
class _Inline:
    """A dependency on one of Bastion's pure providers, called with the request."""

    name: str | None
    call: Callable[[Request], Any]


def _param(field: ModelField) -> _Param | None:
    if fastapi_compat.param_model(field) is not None or fastapi_compat.is_json_field(field):
        return None
    if fastapi_compat.is_sequence_annotation(field.field_info.annotation):
        return None
    aliases = fastapi_compat.param_aliases(field)
    if len(aliases) != 1:
        return None
    key = aliases[0][1]
    adapter = fastapi_compat.type_adapter(field)
    validate = functools.partial(adapter.validate_python, from_attributes=True)
    info = field.field_info
    if info.is_required():
        default: Any = _MISSING
    elif info.default_factory is None and not info.validate_default and type(info.default) in _IMMUTABLE_DEFAULTS:
        default = info.default
    else:
        default = _COMPUTED
    return _Param(name=field.name, key=key, validate=validate, default=default, field=field)


def _computed_default(param: _Param) -> Any:
    field = param.field
    value = deepcopy(field.default)
    if field.field_info.validate_default:
        return param.validate(value)
    return value


def _inline(dependency: Dependant, inline: Collection[Callable[..., Any]]) -> _Inline | None:
    """The dependency as a direct call, when it is one of ``inline`` taking only the connection."""
    call = dependency.call
    if call not in inline or dependency.dependencies:
        return None
    if dependency.path_params or dependency.query_params or dependency.header_params:
        return None
    if dependency.cookie_params or dependency.body_params:
        return None
    names = [
        name
        for name in (
            dependency.request_param_name,
            dependency.websocket_param_name,
            dependency.response_param_name,
            dependency.background_tasks_param_name,
            dependency.security_scopes_param_name,
        )
        if name is not None
    ]
    if names or dependency.http_connection_param_name is None:
        return None
    connection = dependency.http_connection_param_name
    assert call is not None
    return _Inline(name=dependency.name, call=lambda request: call(**{connection: request}))


class CompiledHandler:
    """One FastAPI route served directly (see the module's description). ``fallback`` is FastAPI's own
    handler for the route; it answers every request this one cannot answer exactly as it would."""

    def __init__(self, context: Any, fallback: ASGIApp, inline: list[_Inline], params: list[_Param]) -> None:
        dependant: Dependant = context.dependant
        assert dependant.call is not None
        self.context = context
        self.fallback = fallback
        self.call = dependant.call
        self.is_coroutine = fastapi_compat.is_coroutine_callable(dependant.call)
        self.inline = inline
        self.path_params = [param for param in params if param.field.field_info.in_.value == "path"]
        self.query_params = [param for param in params if param.field.field_info.in_.value == "query"]
        self.body_field: ModelField | None = context.body_field
        self.body_name = self.body_field.name if self.body_field is not None else ""
        self.body_validate = (
            functools.partial(fastapi_compat.type_adapter(self.body_field).validate_python, from_attributes=True)
            if self.body_field is not None
            else None
        )
        strict = context.strict_content_type
        self.strict_content_type: bool = strict.value if isinstance(strict, DefaultPlaceholder) else strict
        self.request_names = [
            name for name in (dependant.request_param_name, dependant.http_connection_param_name) if name
        ]
        self.needs_request = bool(self.request_names or inline or self.body_field is not None)
        # Read per request, as FastAPI does: a mapping filled after the build still counts.
        self.overrides = context.dependency_overrides_provider or _NO_OVERRIDES
        self.endpoint = context.endpoint
        self.route = context.original_route
        self.status_code: int | None = context.status_code
        self.response_field: ModelField | None = context.response_field
        response_class = context.response_class
        self.response_class: type[Response] = (
            response_class.value if isinstance(response_class, DefaultPlaceholder) else response_class
        )
        self.dump_json = self.response_field is not None and isinstance(response_class, DefaultPlaceholder)
        # The route's response_model_* options, passed to its response field as FastAPI passes them.
        self.serialize_options: dict[str, Any] = {
            "include": context.response_model_include,
            "exclude": context.response_model_exclude,
            "by_alias": context.response_model_by_alias,
            "exclude_unset": context.response_model_exclude_unset,
            "exclude_defaults": context.response_model_exclude_defaults,
            "exclude_none": context.response_model_exclude_none,
        }
        self.response_args: dict[str, Any] = {"background": None}  # what FastAPI passes to the response class
        if self.status_code:
            self.response_args["status_code"] = self.status_code
        self.status = self.status_code or 200
        self.body_allowed = is_body_allowed_for_status_code(self.status)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["endpoint"] = self.endpoint
        scope["route"] = self.route
        scope.setdefault(_FASTAPI_SCOPE, {})[_EFFECTIVE_ROUTE_CONTEXT] = self.context
        if self.overrides.dependency_overrides:
            await self.fallback(scope, receive, send)
            return
        request = Request(scope, receive, send) if self.needs_request else None
        body: Any = _MISSING
        if self.body_field is not None:
            assert request is not None
            body = await self._read_body(request, receive)
            if body is _Fallback:
                await self.fallback(scope, _replay(starlette_compat.body_read(request) or b"", receive), send)
                return
        try:
            values = self._values(scope, request, body)
        except (_Fallback, ValidationError):
            read = None if request is None else starlette_compat.body_read(request)
            replay = receive if read is None else _replay(read, receive)
            await self.fallback(scope, replay, send)
            return
        if self.is_coroutine:
            raw = await self.call(**values)
        else:
            raw = await run_in_threadpool(self.call, **values)
        if isinstance(raw, Response):
            await raw(scope, receive, send)
        elif self.dump_json:
            # What FastAPI's Response(content=..., media_type="application/json") sends, built directly.
            body = self._json_body(await self._validated(raw, scope))
            if self.body_allowed:
                headers = [(b"content-length", str(len(body)).encode("latin-1")), _JSON_CONTENT_TYPE]
            else:
                headers, body = [_JSON_CONTENT_TYPE], b""
            await send({"type": "http.response.start", "status": self.status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        else:
            value = await self._validated(raw, scope) if self.response_field is not None else raw
            await self._response(value)(scope, receive, send)

    async def _read_body(self, request: Request, receive: Receive) -> Any:
        """The body as FastAPI reads it: bytes, or the parsed JSON when the content type says JSON.
        ``_Fallback`` (the class) when FastAPI would refuse the body (malformed JSON). A body a step before the
        handler read already (``receive`` of a :class:`~bastion.types.ReadAhead`: the idempotency step) is taken from
        it, not received again."""
        ahead = getattr(receive, "__self__", None)
        taken = ahead.take_body() if isinstance(ahead, ReadAhead) else None
        if taken is not None:
            body_bytes = taken
            starlette_compat.remember_body(request, taken)
        else:
            try:
                body_bytes = await request.body()
            except HTTPException:
                raise
            except Exception as exc:  # what FastAPI's handler answers when reading the body fails
                if starlette_compat.body_size_limited(request.scope) and (
                    error := fastapi_compat.body_limit_error(exc)
                ):
                    raise error from exc
                raise HTTPException(status_code=400, detail="There was an error parsing the body") from exc
        if not body_bytes:
            return _MISSING
        content_type = content_type_of(request.scope)
        parse = is_json_content_type(content_type) if content_type else not self.strict_content_type
        if not parse:
            return body_bytes
        try:
            parsed = json.loads(body_bytes)
        except (ValueError, RecursionError):  # not JSON, not UTF-8/16/32, or nested too deep: FastAPI's 400
            return _Fallback
        starlette_compat.remember_json(request, parsed)  # what request.json() would have cached
        return parsed

    def _values(self, scope: Scope, request: Request | None, body: Any) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for dependency in self.inline:
            solved = dependency.call(request)  # type: ignore[arg-type]
            if dependency.name is not None:
                values[dependency.name] = solved
        if self.path_params:
            path_params = scope["path_params"]
            for param in self.path_params:
                values[param.name] = self._value(param, path_params.get(param.key))
        if self.query_params:
            raw_query = scope["query_string"]
            query: Mapping[str, str] = QueryParams(raw_query) if raw_query else _NO_QUERY
            for param in self.query_params:
                values[param.name] = self._value(param, query.get(param.key))
        if self.body_validate is not None:
            if body is _MISSING:
                raise _Fallback  # FastAPI: 422 "Field required" (or the field's default: let it decide)
            values[self.body_name] = self.body_validate(body)
        for name in self.request_names:
            values[name] = request
        return values

    @staticmethod
    def _value(param: _Param, raw: Any) -> Any:
        if raw is None:
            default = param.default
            if default is _MISSING:
                raise _Fallback
            if default is _COMPUTED:
                return _computed_default(param)
            return default
        return param.validate(raw)

    async def _validated(self, raw: Any, scope: Scope) -> Any:
        """The endpoint's value validated by the response field: in the thread pool for a plain ``def``
        endpoint, as FastAPI does (a large answer then does not hold up the event loop)."""
        field = self.response_field
        assert field is not None
        if self.is_coroutine:
            value, errors = field.validate(raw, {}, loc=("response",))
        else:
            value, errors = await run_in_threadpool(field.validate, raw, {}, loc=("response",))
        if errors:
            raise ResponseValidationError(errors=errors, body=raw, endpoint_ctx=self._endpoint_context(scope))
        return value

    def _json_body(self, value: Any) -> bytes:
        field = self.response_field
        assert field is not None
        body: bytes = field.serialize_json(value, **self.serialize_options)
        return body

    def _response(self, value: Any) -> Response:
        """The response FastAPI builds with the route's response class (no response model, or a custom class);
        ``value`` is already validated when there is a response field."""
        field = self.response_field
        content = field.serialize(value, **self.serialize_options) if field is not None else jsonable_encoder(value)
        response = self.response_class(content, **self.response_args)
        if not is_body_allowed_for_status_code(response.status_code):
            response.body = b""
        return response

    def _endpoint_context(self, scope: Scope) -> Any:
        context = fastapi_compat.endpoint_context(self.call)
        path = self.context.dependant.path
        if path:
            mount = scope.get("root_path", "").rstrip("/")
            context["path"] = f"{scope['method']} {mount}{path}"
        return context


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` that first hands over the body already read, then what the client sends next."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


@functools.cache
def available() -> bool:
    """Whether the installed FastAPI and Starlette have the internals the compiled handlers read (checked once per
    process); when they do not, logs ``compiled_handlers_unavailable`` naming the versions."""
    if fastapi_compat.supported() and starlette_compat.supported():
        return True
    log.warning(
        "compiled_handlers_unavailable",
        fastapi=fastapi_compat.version(),
        starlette=starlette_compat.version(),
        missing=fastapi_compat.missing(),
        verified=[fastapi_compat.VERIFIED, starlette_compat.VERIFIED],
    )
    return False


def compile_route(context: Any, fallback: ASGIApp, *, inline: Collection[Callable[..., Any]]) -> ASGIApp | None:
    """A :class:`CompiledHandler` for the FastAPI route ``context`` (its effective route context), or ``None``
    when its shape is not one the compiled path serves exactly as FastAPI, or compiling is unavailable on the
    installed FastAPI (:func:`available`)."""
    if not available() or context is None:
        return None
    route = context.original_route
    dependant: Dependant | None = context.dependant
    if not isinstance(route, APIRoute) or dependant is None or dependant.call is None:
        return None
    if context.is_sse_stream or context.is_json_stream or context.stream_item_field is not None:
        return None
    if context.max_body_size is not None:
        return None
    if fastapi_compat.is_generator_callable(dependant.call):
        return None
    if dependant.header_params or dependant.cookie_params:
        return None
    if (
        dependant.websocket_param_name
        or dependant.response_param_name
        or dependant.background_tasks_param_name
        or dependant.security_scopes_param_name
    ):
        return None
    inlined = [_inline(dependency, inline) for dependency in dependant.dependencies]
    if any(dependency is None for dependency in inlined):
        return None
    params = [_param(field) for field in (*dependant.path_params, *dependant.query_params)]
    if any(param is None for param in params):
        return None
    body_fields = dependant.body_params
    if body_fields:
        body_field = context.body_field
        if (
            len(body_fields) != 1
            or fastapi_compat.embeds_body_fields(context)
            or fastapi_compat.should_embed_body_fields(body_fields)
            or fastapi_compat.form_models(body_fields[0])
            or body_field is None
            or body_field.name != body_fields[0].name
            or not _is_plain_body(body_field)
        ):
            return None
    return CompiledHandler(
        context,
        fallback,
        [dependency for dependency in inlined if dependency is not None],
        [param for param in params if param is not None],
    )


def _is_plain_body(field: ModelField) -> bool:
    return isinstance(field.field_info, params.Body) and not isinstance(field.field_info, params.Form)
