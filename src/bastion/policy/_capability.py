"""Policy authorization: :class:`PolicyGuard` decides each request and call from its principal, action, resource
and context, built from the scope."""

from __future__ import annotations

import asyncio
import inspect
import re
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Any

import structlog

from bastion._audit import Auditor
from bastion._cache_store import CacheStore
from bastion._claims import Claims
from bastion._client_ip import client_ip
from bastion._guard import Exemptions, Later
from bastion._metrics import NO_METRICS, Metrics
from bastion._tls import ClientCertificate
from bastion.config import PolicySettings
from bastion.errors import ConfigError, NotFound, PolicyDenied, PolicyError
from bastion.policy._cache import DecisionCache, SharedDecisionCache, decision_key
from bastion.policy._engine import Decision, LoadedPolicies, PolicyEngine, PolicyLoadError, evaluate
from bastion.policy._normalize import Normalizer, default_normalizer
from bastion.routing._resolve import ResolvedRoute
from bastion.types import (
    SCOPE_CLAIMS,
    SCOPE_CLIENT_CERTIFICATE,
    SCOPE_GRPC_RESOURCE,
    SCOPE_REQUEST_ID,
    SCOPE_ROUTE,
    Scope,
)

PRINCIPAL_TYPE = "User"
SERVICE_TYPE = "Service"
"""A caller admitted by its client certificate (mutual TLS) without a token."""
RESOURCE_TYPE = "Resource"
ANONYMOUS = "anonymous"
ANONYMOUS_TYPE = "Anonymous"
ANONYMOUS_PRINCIPAL: tuple[str, str, dict[str, Any]] = (ANONYMOUS_TYPE, ANONYMOUS, {"roles": [], "perms": []})
"""A request without claims (a public path, or token auth off): ``Anonymous::"anonymous"``, no roles or perms.

Its own entity type, so no token (whatever its ``sub``) can be it; ``principal is User`` excludes it.
"""
_I64 = 2**63
_VERSION_SEGMENT = re.compile(r"v[0-9]{1,9}")
GRPC_METHOD = "POST"
"""``context.method`` of a gRPC call (gRPC is an HTTP/2 POST); its ``context.path`` is ``/pkg.Service/Method``."""

ResourceExtractor = Callable[[Scope, dict[str, Any]], Mapping[str, Any] | Awaitable[Mapping[str, Any] | None] | None]
"""``(scope, path_params) -> extra resource attributes`` (may be async, e.g. a storage lookup); ``None`` (or raising
NotFound) when the resource does not exist: a 404 before the policy is asked."""

log = structlog.get_logger("bastion.policy")


def service_principal(certificate: ClientCertificate) -> tuple[str, str, dict[str, Any]]:
    """``Service::"<identity>"`` with the certificate's attributes (``identity``, ``sans``, ``issuer``, ``serial``,
    ``not_after``, ``common_name``) and empty ``roles``/``perms``. The identity is the entity id as is (a JSON
    string to Cedar, never parsed as policy text)."""
    return SERVICE_TYPE, certificate.identity, {"roles": [], "perms": [], **certificate.attributes()}


def principal_of(claims: Claims) -> tuple[str, str, dict[str, Any]]:
    """``User::<sub>`` with ``sub``, ``roles``, ``perms``, ``username``, ``email`` (and ``client_id``) attributes.

    Absent optional claims are absent attributes (a policy reading one fails, and failing denies);
    ``roles`` and ``perms`` are always sets, empty when the token has none.
    """
    attributes: dict[str, Any] = {"roles": list(claims.roles), "perms": list(claims.perms)}
    for name in ("sub", "username", "email", "client_id"):
        value = getattr(claims, name)
        if value is not None:
            attributes[name] = value
    return PRINCIPAL_TYPE, claims.sub or claims.client_id or ANONYMOUS, attributes


def action_context(action: str) -> dict[str, Any]:
    """``method``, ``path`` and ``version`` for ``action`` as a route's request would carry them, for offline
    evaluation (``bastion policy eval``): a gRPC method (``/pkg.Service/Method``) is a ``POST`` of version 0;
    an HTTP action's version is its path's first ``v<N>`` segment (0 without one)."""
    method, space, path = action.partition(" ")
    if not space:
        return {"method": GRPC_METHOD, "path": action, "version": 0}
    version = next((int(part[1:]) for part in path.split("/") if _VERSION_SEGMENT.fullmatch(part)), 0)
    return {"method": method, "path": path, "version": version}


def _cedar_value(value: object) -> object:
    if isinstance(value, bool) or (isinstance(value, int) and -_I64 <= value < _I64):
        return value
    return str(value)


class PolicyGuard:
    """The policy guard: decide each request and gRPC call with Cedar; raise PolicyDenied (403) or PolicyError (500).

    The action is ``"<METHOD> <route template>"`` for a matched route, else the normalized path. Path
    parameters (plus a per-route resource extractor's attributes) are the resource's attributes. Context:
    ``ip_address``, ``timestamp``, ``user_agent``, ``request_id``, ``roles``, and ``method``, ``path`` (the
    action's path: template, normalized path or gRPC method) and ``version`` (the route's API version, 0 for
    anything that is not a versioned route). Evaluation errors deny (500 ``POLICY_ERROR``) unless
    ``fail_open``; a Deny is always a 403, with an ``AuthPermissionDenied`` event.
    """

    def __init__(
        self,
        settings: PolicySettings,
        *,
        auditor: Auditor,
        trust_forwarded: bool = False,
        normalizer: Normalizer | None = None,
        extractors: Mapping[str, ResourceExtractor] | None = None,
        cache_store: CacheStore | None = None,
        clock: Callable[[], float] = time.time,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self.metrics = metrics
        if settings.policy_path is None:
            raise ConfigError("policy authorization needs policy.policy_path")
        self.settings = settings
        self.engine = PolicyEngine(settings.policy_path, key="policy.policy_path")
        self.auditor = auditor
        self.trust_forwarded = trust_forwarded
        self.normalizer = normalizer or default_normalizer
        self.extractors = dict(extractors or {})
        self.cache = DecisionCache(
            size=settings.cache_size if settings.cache_enabled else 0, ttl_secs=settings.cache_ttl_secs
        )
        # policy.cache_backend = "cache_store": decisions shared by every instance, in place of the local LRU.
        self.shared: SharedDecisionCache | None = None
        if settings.cache_enabled and settings.cache_backend == "cache_store":
            if cache_store is None:
                raise ConfigError('policy.cache_backend = "cache_store" needs the app\'s cache store')
            self.shared = SharedDecisionCache(cache_store, ttl_secs=settings.cache_ttl_secs)
        self._clock = clock
        self.evaluations = 0
        self.exemptions = Exemptions(
            scope_types=frozenset({"http", "websocket", "grpc"}), public_routes=True, other_methods=True
        )
        """``/health``, ``/ready``, gRPC health and reflection, the public API docs (``service.api_docs_public``: a
        framework route marked public) and a request whose path exists only with other methods (the dispatcher
        answers 405 before any policy is asked, the same for every caller) pass."""

    @property
    def policies(self) -> LoadedPolicies:
        return self.engine.current

    def reload(self) -> LoadedPolicies:
        """Re-read ``policy_path``; swap it in and clear the decision cache, or keep the old set and raise."""
        loaded = self.engine.reload()
        self.cache.clear()
        log.info("policies_reloaded", path=str(self.engine.path), policies=loaded.statements, digest=loaded.digest)
        return loaded

    def use_schema(self, validate: Callable[[LoadedPolicies], None]) -> None:
        """Validate the loaded policies now (raising PolicyLoadError) and every reloaded set before it is used."""
        validate(self.engine.current)
        self.engine.validator = validate

    def route_of(self, scope: Scope) -> tuple[str, int, dict[str, Any], str | None]:
        """``(path, version, path params, route template)`` of an HTTP request or WebSocket handshake.

        A matched route gives its template and version (precomputed in the route table); any other path its
        normalized form and version 0.
        """
        route: ResolvedRoute | None = scope.get(SCOPE_ROUTE)
        if route is not None and route.method_allowed:
            return route.template, route.version or 0, route.path_params, route.template
        return self.normalizer(scope["path"]), 0, {}, None

    async def resource_of(
        self, scope: Scope, action: str, template: str | None, params: dict[str, Any]
    ) -> dict[str, Any]:
        attributes = {name: _cedar_value(value) for name, value in params.items()}
        extractor = self.extractors.get(action) or (self.extractors.get(template) if template else None)
        if extractor is not None:
            extra = extractor(scope, dict(params))
            if inspect.isawaitable(extra):
                extra = await extra
            if extra is None:
                raise NotFound()  # no such resource: 404 before any policy is asked (docs/policy.md)
            attributes.update({name: _cedar_value(value) for name, value in extra.items()})
        return attributes

    def context_of(
        self, scope: Scope, claims: Claims | None, *, method: str, path: str, version: int
    ) -> dict[str, Any]:
        """The request context; only the attributes the loaded policies read are computed."""
        wanted = self.engine.current.context_attributes
        context: dict[str, Any] = {}
        if wanted is None or "method" in wanted:
            context["method"] = method
        if wanted is None or "path" in wanted:
            context["path"] = path
        if wanted is None or "version" in wanted:
            context["version"] = version
        if wanted is None or "ip_address" in wanted:
            context["ip_address"] = client_ip(scope, trust_forwarded=self.trust_forwarded)
        if wanted is None or "timestamp" in wanted:
            context["timestamp"] = self.now()
        if wanted is None or "user_agent" in wanted:
            context["user_agent"] = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"user-agent"), "")
        if wanted is None or "request_id" in wanted:
            context["request_id"] = scope.get(SCOPE_REQUEST_ID, "")
        if wanted is None or "roles" in wanted:
            context["roles"] = list(claims.roles) if claims is not None else []
        return context

    def action_of(self, scope: Scope) -> tuple[str, str, int, str, str | None, Mapping[str, Any]]:
        """``(method, path, version, action, route template, resource attributes before the extractor's)`` of an
        HTTP request or WebSocket handshake (action from the resolved route or the normalizer) or a gRPC call
        (action ``/<package>.<Service>/<Method>``, attributes from its extractor in scope[SCOPE_GRPC_RESOURCE])."""
        if scope["type"] == "grpc":
            path = scope["path"]
            return GRPC_METHOD, path, 0, path, None, scope.get(SCOPE_GRPC_RESOURCE, {})
        method = scope.get("method", "GET")  # a WebSocket handshake is a GET
        path, version, params, template = self.route_of(scope)
        return method, path, version, f"{method} {path}", template, params

    async def decide(self, scope: Scope, claims: Claims | None) -> tuple[str, Decision]:
        """The decision for an HTTP request, WebSocket handshake or gRPC call (see :meth:`action_of`)."""
        method, path, version, action, template, params = self.action_of(scope)
        if scope["type"] == "grpc":
            attributes = {name: _cedar_value(value) for name, value in params.items()}
        else:
            attributes = await self.resource_of(scope, action, template, dict(params))
        decision = await self.decide_request(
            claims=claims,
            certificate=_certificate(scope, claims),
            action=action,
            resource=(RESOURCE_TYPE, scope["path"], attributes),
            context=self.context_of(scope, claims, method=method, path=path, version=version),
        )
        return action, decision

    async def decide_request(
        self,
        *,
        claims: Claims | None,
        action: str,
        resource: tuple[str, str, dict[str, Any]],
        context: dict[str, Any],
        certificate: ClientCertificate | None = None,
    ) -> Decision:
        """Decide one request, through the decision cache (HTTP and gRPC share this).

        ``claims`` ``None`` is ``Service::"<identity>"`` with a client ``certificate``, else the anonymous principal
        (:data:`ANONYMOUS_PRINCIPAL`).
        """
        policies = self.engine.current
        referenced = policies.context_attributes
        keyed_context = context if referenced is None else {k: v for k, v in context.items() if k in referenced}
        if self.shared is None:
            return self._decide_local(policies, claims, certificate, action, resource, context, keyed_context)
        key = _decision_key(policies, claims, certificate, action, resource[2], keyed_context)
        cached = await self.shared.get(key)
        if cached is not None:
            return cached
        decision = self._evaluate(policies, claims, certificate, action, resource, context)
        await self.shared.put(key, decision)
        return decision

    def _decide_local(
        self,
        policies: LoadedPolicies,
        claims: Claims | None,
        certificate: ClientCertificate | None,
        action: str,
        resource: tuple[str, str, dict[str, Any]],
        context: dict[str, Any],
        keyed_context: dict[str, Any],
    ) -> Decision:
        """Decide through the in-process decision cache (no waiting: Cedar evaluates in this thread)."""
        key = _decision_key(policies, claims, certificate, action, resource[2], keyed_context)
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        decision = self._evaluate(policies, claims, certificate, action, resource, context)
        self.cache.put(key, decision)
        return decision

    def _evaluate(
        self,
        policies: LoadedPolicies,
        claims: Claims | None,
        certificate: ClientCertificate | None,
        action: str,
        resource: tuple[str, str, dict[str, Any]],
        context: dict[str, Any],
    ) -> Decision:
        self.evaluations += 1
        if claims is not None:
            principal = principal_of(claims)
        else:
            principal = ANONYMOUS_PRINCIPAL if certificate is None else service_principal(certificate)
        return evaluate(policies, principal=principal, action=action, resource=resource, context=context)

    def now(self) -> int:
        return int(self._clock())

    def fails_open(self, claims: Claims | None) -> bool:
        """Whether an evaluation failure allows this caller: ``fail_open``, and never for an anonymous one."""
        return self.settings.fail_open and claims is not None

    async def check(self, scope: Scope) -> None:
        """Allow the request, WebSocket handshake (a ``GET``) or gRPC call, or raise PolicyDenied (403,
        PERMISSION_DENIED) / PolicyError (500, INTERNAL).

        Every one is decided, those without claims as the anonymous principal (default deny applies), except
        what :attr:`exemptions` lets pass.
        """
        claims = _claims(scope)
        action, decision = await self.decide(scope, claims)
        denied = self._verdict(scope, claims, action, decision)
        if denied is not None:
            await denied

    def check_now(self, scope: Scope) -> Later | None:
        """:meth:`check` without a coroutine when the decision needs no waiting (the in-process decision cache,
        no resource extractor for the route) and allows; else the coroutine that finishes it (``bastion._guard``).
        """
        if self.shared is not None:
            return self.check(scope)
        method, path, version, action, template, params = self.action_of(scope)
        if self.extractors and scope["type"] != "grpc" and self._has_extractor(action, template):
            return self.check(scope)
        claims = _claims(scope)
        context = self.context_of(scope, claims, method=method, path=path, version=version)
        attributes = {name: _cedar_value(value) for name, value in params.items()} if params else {}
        resource = (RESOURCE_TYPE, scope["path"], attributes)
        certificate = _certificate(scope, claims)
        # The context holds only what the loaded policies read (context_of): it keys the decision as it is.
        decision = self._decide_local(self.engine.current, claims, certificate, action, resource, context, context)
        return self._verdict(scope, claims, action, decision)

    def _has_extractor(self, action: str, template: str | None) -> bool:
        return action in self.extractors or (template is not None and template in self.extractors)

    def _verdict(self, scope: Scope, claims: Claims | None, action: str, decision: Decision) -> Later | None:
        """Count the decision; raise PolicyError for a failed evaluation (unless it fails open); a Deny: the
        coroutine that emits ``AuthPermissionDenied`` and raises PolicyDenied."""
        self.metrics.policy_decision("error" if decision.failed else "allow" if decision.allowed else "deny")
        if decision.failed:
            fail_open = self.fails_open(claims)
            log.error("policy_evaluation_failed", action=action, errors=list(decision.errors), fail_open=fail_open)
            if fail_open:
                return None
            raise PolicyError()
        if not decision.allowed:
            return self._denied(scope, action)
        return None

    async def _denied(self, scope: Scope, action: str) -> None:
        await self.auditor.auth_event("AuthPermissionDenied", scope, action=action)
        raise PolicyDenied()

    async def watch(self) -> None:
        """Hot reload: poll ``policy_path`` every interval; reload once a change has been stable for one poll.

        Compares against the file as it was when the current set was loaded, so an edit made before the
        watcher first runs is not missed. A broken file is logged once per change and the old set stays.
        """
        interval = self.settings.hot_reload_interval_secs
        seen_broken: tuple[int, int] | None = None
        pending: tuple[int, int] | None = None
        while True:
            await asyncio.sleep(interval)
            current = self.engine.file_signature()
            if current is None or current in (self.engine.signature, seen_broken):
                pending = None
                continue
            if current != pending:
                pending = current  # changed since the last poll: wait until the writer is done
                continue
            pending = None
            try:
                self.reload()
            except PolicyLoadError as exc:
                seen_broken = current
                log.error("policy_hot_reload_failed", error=str(exc))


def _claims(scope: Scope) -> Claims | None:
    claims = scope.get(SCOPE_CLAIMS)
    return claims if isinstance(claims, Claims) else None


def _certificate(scope: Scope, claims: Claims | None) -> ClientCertificate | None:
    """The client certificate that is the principal of a caller without a token (mutual TLS)."""
    certificate = scope.get(SCOPE_CLIENT_CERTIFICATE) if claims is None else None
    return certificate if isinstance(certificate, ClientCertificate) else None


def _decision_key(
    policies: LoadedPolicies,
    claims: Claims | None,
    certificate: ClientCertificate | None,
    action: str,
    attributes: dict[str, Any],
    context: dict[str, Any],
) -> Hashable:
    # The principal's attributes all come from these claims (tuples already), so they key it directly.
    principal: object = (
        certificate
        if claims is None
        else (claims.sub, claims.roles, claims.perms, claims.username, claims.email, claims.client_id)
    )
    return decision_key(
        digest=policies.digest, principal=principal, action=action, resource=attributes, context=context
    )
