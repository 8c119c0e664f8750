"""Token authentication assembled from ``[token]``: verifier, verified-token cache, path rules, revocation.

One :class:`TokenAuth` checks HTTP requests and WebSocket handshakes (:meth:`TokenAuth.layer`) and gRPC
calls (:meth:`TokenAuth.check_call`) the same way.
"""

from __future__ import annotations

import structlog

from bastion._cache_store import DeferredRevocation
from bastion._claims import Claims
from bastion._metrics import NO_METRICS, Metrics
from bastion.auth._bearer import bearer_token, challenge
from bastion.auth._cache import TokenVerifier, VerifiedTokens
from bastion.auth._jwt import JwtVerifier
from bastion.auth._paseto import PasetoVerifier
from bastion.auth._paths import PathRules
from bastion.auth._revocation import Revocations
from bastion.config import TokenSettings
from bastion.errors import TokenError, TokenRevoked
from bastion.routing._resolve import public_route
from bastion.types import SCOPE_CLAIMS, SCOPE_DEFERRED_REVOCATION, ASGIApp, Receive, Scope, Send

AUTHORIZATION = b"authorization"
_GUARDED = frozenset({"http", "websocket"})
# gRPC health and reflection are exempt from every check (spec, endpoints rule 4); the gRPC guard skips them.


def verifier_from_settings(settings: TokenSettings) -> TokenVerifier:
    """A JWT or PASETO verifier; keys are read and checked now (ConfigError at start-up)."""
    if settings.format == "paseto":
        return PasetoVerifier(settings)
    return JwtVerifier(settings)


class TokenAuth:
    """The token-auth capability of one built app: verifier, cache, path rules, revocation.

    ``authenticate`` turns the ``Authorization`` values of a request or call into verified claims or raises
    TokenError (``UNAUTHORIZED``, ``INVALID_TOKEN``, ``TOKEN_EXPIRED``, ``TOKEN_REVOKED``) carrying its RFC 6750
    challenge.
    """

    def __init__(
        self, settings: TokenSettings, *, revocations: Revocations, realm: str, metrics: Metrics = NO_METRICS
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.verifier = verifier_from_settings(settings)
        self.tokens = VerifiedTokens(
            self.verifier,
            size=settings.verified_cache_size,
            leeway=settings.leeway_seconds,
            audience=settings.required_audience,
            issuer=settings.required_issuer,
        )
        self.rules = PathRules.from_settings(
            include_paths=settings.include_paths,
            exclude_paths=settings.exclude_paths,
            public_paths=settings.public_paths,
        )
        self.revocations = revocations if settings.revocation_enabled else None
        self.realm = realm.replace('"', "")
        self.defer_revocation = False
        """Set by the app when the next step is the distributed limiter on Redis/Valkey: the revocation check is
        then left in the scope (SCOPE_DEFERRED_REVOCATION) and made in the limiter's round trip."""

    async def authenticate(self, values: list[bytes], scope: Scope | None = None) -> Claims:
        """Verified claims from exactly one ``Bearer`` value; TokenError with its challenge otherwise.

        With ``defer_revocation`` and a ``scope``, the revocation check is put in the scope for the limiter."""
        try:
            token = bearer_token(values, max_token_bytes=self.settings.max_token_bytes, realm=self.realm)
        except TokenError as exc:
            self.metrics.token_rejected(exc.code)
            raise
        try:
            claims = await self.tokens.claims(token)
            revocations = self.revocations
            if revocations is not None:
                if self.defer_revocation and scope is not None:
                    scope[SCOPE_DEFERRED_REVOCATION] = self._deferred(revocations.key_for(claims), claims)
                else:
                    await revocations.check(claims)
        except TokenError as exc:
            raise self._rejected(exc) from None
        return claims

    def _rejected(self, exc: TokenError) -> TokenError:
        self.metrics.token_rejected(exc.code)
        description = exc.detail.replace('"', "'")
        exc.headers.append(challenge(self.realm, "invalid_token", description))
        return exc

    def _deferred(self, key: str, claims: Claims) -> DeferredRevocation:
        revocations = self.revocations
        assert revocations is not None

        async def check() -> None:
            try:
                await revocations.check(claims)
            except TokenError as exc:
                raise self._rejected(exc) from None

        return DeferredRevocation(key=key, check=check, revoked=lambda: self._rejected(TokenRevoked()))

    def layer(self, app: ASGIApp) -> ASGIApp:
        return TokenAuthMiddleware(app, auth=self)

    async def check_call(self, scope: Scope) -> None:
        """The gRPC form: the ``authorization`` metadata of a call to a method outside ``public_paths``."""
        method = scope["path"]
        if any(method == prefix or method.startswith(prefix + "/") for prefix in self.rules.public_prefixes):
            return
        claims = await self.authenticate([value for name, value in scope["headers"] if name == AUTHORIZATION], scope)
        scope[SCOPE_CLAIMS] = claims
        if claims.sub is not None:
            structlog.contextvars.bind_contextvars(sub=claims.sub)


class TokenAuthMiddleware:
    """Require a valid bearer token on protected paths; put its Claims in scope[SCOPE_CLAIMS].

    HTTP requests and WebSocket handshakes (the same ``Authorization`` header) are checked alike. Public paths
    (``/health``, ``/ready``, exclude/include/public rules), public framework routes (the API docs with
    ``service.api_docs_public``) and CORS preflights pass untouched. Missing or
    malformed ``Authorization`` -> 401 ``UNAUTHORIZED``; bad token -> ``INVALID_TOKEN``; expired ->
    ``TOKEN_EXPIRED``; revoked -> ``TOKEN_REVOKED``; each with ``WWW-Authenticate: Bearer`` (RFC 6750 3).
    Sits inside the route-resolution step and outside rate limiting and policy, which read the claims.
    """

    def __init__(self, app: ASGIApp, *, auth: TokenAuth) -> None:
        self.app = app
        self.auth = auth
        self.rules = auth.rules

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] not in _GUARDED
            or not self.rules.requires_token(scope["path"])
            or _is_preflight(scope)
            or public_route(scope)
        ):
            await self.app(scope, receive, send)
            return
        claims = await self.auth.authenticate(
            [value for name, value in scope["headers"] if name == AUTHORIZATION], scope
        )
        scope[SCOPE_CLAIMS] = claims
        if claims.sub is None:
            await self.app(scope, receive, send)
            return
        bound = structlog.contextvars.bind_contextvars(sub=claims.sub)
        try:
            await self.app(scope, receive, send)
        finally:
            structlog.contextvars.reset_contextvars(**bound)


def _is_preflight(scope: Scope) -> bool:
    if scope.get("method") != "OPTIONS":
        return False
    names = {name for name, _ in scope["headers"]}
    return b"origin" in names and b"access-control-request-method" in names
