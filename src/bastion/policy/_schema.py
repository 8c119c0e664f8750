"""The Cedar schema of a service, generated from what it serves.

Principals come from the claims model (``User``, ``Anonymous``), actions from the route table (one per
``"<METHOD> <template>"``), the built-in, operator and frontend routes and the gRPC methods, resource
attributes from path parameters and declared extractor attributes, the context from what the authorizer
computes. ``bastion.policy._validation`` checks policies against it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.convertors import IntegerConvertor
from starlette.routing import Route, WebSocketRoute

from bastion._health import ALWAYS_PUBLIC
from bastion.errors import ConfigError
from bastion.policy._capability import ANONYMOUS_TYPE, PRINCIPAL_TYPE, RESOURCE_TYPE, SERVICE_TYPE
from bastion.policy._normalize import Normalizer
from bastion.routing._fallback import Dispatcher, empty_not_found
from bastion.routing._resolve import DOCS_ASSET_ROUTE, RouteEntry, RouteTable

ANY_METHOD = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""The actions of a route that takes every method."""
CEDAR_TYPES: Mapping[type, str] = {str: "String", int: "Long", bool: "Boolean"}
"""The Python types an extractor may declare for its attributes, and their Cedar types."""

_STRINGS: dict[str, Any] = {"type": "Set", "element": {"type": "String"}}
USER_ATTRIBUTES: Mapping[str, tuple[dict[str, Any], bool]] = {
    "sub": ({"type": "String"}, False),
    "roles": (_STRINGS, True),
    "perms": (_STRINGS, True),
    "username": ({"type": "String"}, False),
    "email": ({"type": "String"}, False),
    "client_id": ({"type": "String"}, False),
}
"""``(type, required)`` as ``principal_of`` builds them: ``roles``/``perms`` always, the other claims only when
the token has them."""
ANONYMOUS_ATTRIBUTES: Mapping[str, tuple[dict[str, Any], bool]] = {"roles": (_STRINGS, True), "perms": (_STRINGS, True)}
SERVICE_ATTRIBUTES: Mapping[str, tuple[dict[str, Any], bool]] = {
    "identity": ({"type": "String"}, True),
    "sans": (_STRINGS, True),
    "issuer": ({"type": "String"}, True),
    "serial": ({"type": "String"}, True),
    "not_after": ({"type": "Long"}, True),
    "common_name": ({"type": "String"}, False),
    "roles": (_STRINGS, True),
    "perms": (_STRINGS, True),
}
"""``service_principal``'s attributes: a caller admitted by its client certificate (``tls.client_auth`` on)."""
CONTEXT_ATTRIBUTES: Mapping[str, dict[str, Any]] = {
    "ip_address": {"type": "String"},
    "timestamp": {"type": "Long"},
    "user_agent": {"type": "String"},
    "request_id": {"type": "String"},
    "roles": _STRINGS,
    "method": {"type": "String"},
    "path": {"type": "String"},
    "version": {"type": "Long"},
}
"""``PolicyGuard.context_of``: every attribute is in every request (``version`` 0 off a versioned route),
so a policy never needs ``context has``."""


def cedar_attributes(owner: str, declared: Mapping[str, type]) -> dict[str, str]:
    """Declared extractor attributes (``{"owner_id": str}``) as Cedar type names; ConfigError for other types."""
    found: dict[str, str] = {}
    for name, kind in declared.items():
        cedar = CEDAR_TYPES.get(kind)
        if cedar is None or not name.isidentifier():
            raise ConfigError(
                f"{owner}: attribute {name!r} of type {kind!r}: declare identifiers of type str, int or bool"
            )
        found[name] = cedar
    return found


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionShape:
    """One action the service decides and the attributes its resource carries (name -> Cedar type name)."""

    name: str
    attributes: Mapping[str, str] = field(default_factory=dict)
    open: bool = False
    """An extractor without declared attributes adds to this resource: it may carry attributes not listed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicySchema:
    """The actions a service decides, with their resources' attributes.

    ``open_actions``: the service also serves paths no route names (a fallback, frontend routes with
    parameters or mounts), so a policy may name an action that is not listed (a warning, not an error).
    """

    actions: tuple[ActionShape, ...]
    open_actions: bool = False
    service_principals: bool = False
    """``tls.client_auth`` is on: ``Service`` principals (client certificates) are in the schema too."""

    def document(self) -> dict[str, Any]:
        """The Cedar JSON schema (``bastion policy schema``): one ``Resource`` type with every attribute any
        action's resource has, required where every action's resource has it."""
        shapes = [set(action.attributes.items()) for action in self.actions]
        every = set.intersection(*shapes) if shapes else set()
        union = {name: kind for action in self.actions for name, kind in action.attributes.items()}
        resource = {name: (kind, (name, kind) in every) for name, kind in sorted(union.items())}
        names = [action.name for action in self.actions]
        return cedar_schema(resource=resource, applicable=names, declared=names, services=self.service_principals)


def cedar_schema(
    *,
    resource: Mapping[str, tuple[str, bool]],
    applicable: Iterable[str],
    declared: Iterable[str],
    services: bool = False,
) -> dict[str, Any]:
    """A Cedar JSON schema: ``User`` and ``Anonymous``, ``Resource`` with ``resource``'s attributes (name ->
    (type, required)), the ``Context`` type, and the ``declared`` actions, of which ``applicable`` apply to
    ``User | Anonymous`` (and ``Service`` with ``services``) on ``Resource`` (the others to nothing)."""
    applies = set(applicable)
    principals = [PRINCIPAL_TYPE, ANONYMOUS_TYPE, *([SERVICE_TYPE] if services else [])]
    target = {"principalTypes": principals, "resourceTypes": [RESOURCE_TYPE]}
    actions = {
        name: {"appliesTo": {**target, "context": {"type": "Context"}}} if name in applies else {} for name in declared
    }
    resource_attributes = {name: ({"type": kind}, required) for name, (kind, required) in resource.items()}
    entities = {
        PRINCIPAL_TYPE: {"shape": _record(USER_ATTRIBUTES)},
        ANONYMOUS_TYPE: {"shape": _record(ANONYMOUS_ATTRIBUTES)},
        **({SERVICE_TYPE: {"shape": _record(SERVICE_ATTRIBUTES)}} if services else {}),
        RESOURCE_TYPE: {"shape": _record(resource_attributes)},
    }
    return {
        "": {
            "commonTypes": {"Context": _record({name: (kind, True) for name, kind in CONTEXT_ATTRIBUTES.items()})},
            "entityTypes": entities,
            "actions": actions,
        }
    }


def _record(attributes: Mapping[str, tuple[dict[str, Any], bool]]) -> dict[str, Any]:
    return {
        "type": "Record",
        "attributes": {name: {**kind, "required": required} for name, (kind, required) in attributes.items()},
    }


def _path_parameters(entry: RouteEntry) -> dict[str, str]:
    """A route's path parameters as resource attributes: ``Long`` for an ``int`` convertor, else ``String``."""
    return {
        name: "Long" if isinstance(convertor, IntegerConvertor) else "String"
        for name, convertor in entry.convertors.items()
    }


def service_schema(
    *,
    routes: RouteTable,
    dispatcher: Dispatcher,
    normalizer: Normalizer,
    extractors: Iterable[str],
    declared: Mapping[str, Mapping[str, str]],
    grpc_services: Iterable[Any] = (),
) -> PolicySchema:
    """The schema of the actions a built app decides, in the dispatcher's order.

    - every route of the table: ``"<METHOD> <template>"`` (a WebSocket route: ``GET``), its resource the path
      parameters (``Long`` for an ``int`` convertor, else ``String``) plus its extractor's attributes;
    - the built-in and operator endpoints and the frontend routes without parameters: ``"<METHOD>
      <normalized path>"`` (``/health`` and ``/ready`` are never decided); a frontend route with parameters, a
      mount or a fallback make the action set open;
    - every method of the gRPC services: ``/<package>.<Service>/<Method>``;
    - an action named by an extractor registration (a path the fallback serves).

    ``extractors`` are the keys (template, action or gRPC method) extractors are registered for, ``declared``
    the attributes they declared: an extractor without a declaration makes its actions' resources open.
    """
    keys = set(extractors)
    shapes: dict[str, ActionShape] = {}

    def add(name: str, attributes: Mapping[str, str], *lookup: str) -> None:
        if name in shapes:
            return  # the first route the resolver reaches decides
        key = next((key for key in (name, *lookup) if key in keys), None)
        extra = declared.get(key) if key is not None else {}
        shapes[name] = ActionShape(name=name, attributes={**attributes, **(extra or {})}, open=extra is None)

    for entry in routes.entries:
        # The API docs are actions too, public or not: a policy may name them (it must, for
        # service.api_docs_public = false), and one written for that stays valid when they are public. Their
        # scripts and styles (hashed file names) are not: a policy reaches them through context.path.
        if entry.name == DOCS_ASSET_ROUTE:
            continue
        params = _path_parameters(entry)
        for method in ("GET",) if entry.websocket else sorted(entry.methods or ANY_METHOD):
            add(f"{method} {entry.template}", params, entry.template)
    for path in dispatcher.builtins:
        if path not in ALWAYS_PUBLIC:
            for method in ("GET", "HEAD"):
                add(f"{method} {normalizer(path)}", {})
    open_actions = dispatcher.fallback is not empty_not_found
    for route in dispatcher.frontend:
        if isinstance(route, Route | WebSocketRoute) and not route.param_convertors:
            for method in ("GET",) if isinstance(route, WebSocketRoute) else sorted(route.methods or ANY_METHOD):
                add(f"{method} {normalizer(route.path)}", {})
        else:
            open_actions = True
    for servable in grpc_services:
        for method in servable.__mapping__():
            add(method, {})
    for key in keys:
        if " " in key:  # an action: its extractor is for a path no route has (one the fallback serves)
            add(key, {})
    return PolicySchema(actions=tuple(shapes.values()), open_actions=open_actions)
