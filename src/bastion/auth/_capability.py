"""Token authentication assembled from ``[token]``: verifier, verified-token cache, path rules, revocation.

:class:`TokenAuthGuard` is the capability's guard (``bastion._guard``): one check for HTTP requests, WebSocket
handshakes and gRPC calls. Missing or malformed ``Authorization`` -> 401 ``UNAUTHORIZED``; bad token ->
``INVALID_TOKEN``; expired -> ``TOKEN_EXPIRED``; revoked -> ``TOKEN_REVOKED``; each with ``WWW-Authenticate:
Bearer`` (RFC 6750 3). It sits inside route resolution and outside rate limiting and policy, which read the claims.
"""

from __future__ import annotations

from collections.abc import Coroutine
from functools import partial

import structlog

from bastion._cache_store import DeferredRevocation
from bastion._claims import Claims
from bastion._guard import Cleanup, Exemptions, Later, Outcome
from bastion._metrics import NO_METRICS, Metrics
from bastion.auth._bearer import bearer_token, challenge
from bastion.auth._cache import VerifiedTokens
from bastion.auth._formats import token_format
from bastion.auth._paths import PathRules
from bastion.auth._revocation import Revocations
from bastion.config import TokenSettings
from bastion.errors import TokenError, TokenRevoked
from bastion.types import SCOPE_CLAIMS, SCOPE_DEFERRED_REVOCATION, Scope

AUTHORIZATION = b"authorization"


class TokenAuthGuard:
    """The token-auth guard of one built app: verifier, cache, path rules, revocation.

    ``authenticate`` turns the ``Authorization`` values of a request or call into verified claims or raises
    TokenError (``UNAUTHORIZED``, ``INVALID_TOKEN``, ``TOKEN_EXPIRED``, ``TOKEN_REVOKED``) carrying its RFC 6750
    challenge.
    """

    def __init__(
        self,
        settings: TokenSettings,
        *,
        revocations: Revocations,
        realm: str,
        metrics: Metrics = NO_METRICS,
        defer_revocation: bool = False,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.verifier = token_format(settings.format).verifier(settings)
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
        self.defer_revocation = defer_revocation and self.revocations is not None
        """Chosen where token auth and the limiter are built (``bastion._security``): the next step is the
        distributed limiter on Redis/Valkey, so the revocation check is left in the scope
        (SCOPE_DEFERRED_REVOCATION) and made in the limiter's round trip."""
        self.exemptions = Exemptions(
            scope_types=frozenset({"http", "websocket", "grpc"}),
            public_paths=self.rules.public_prefixes,
            preflight=True,
            public_routes=True,
        )
        """``/health``, ``/ready``, gRPC health and reflection, ``token.public_paths``, CORS preflights and the
        public API docs pass; ``include_paths``/``exclude_paths`` are asked in :meth:`check` (HTTP only)."""

    async def authenticate(self, values: list[bytes], scope: Scope | None = None) -> Claims:
        """Verified claims from exactly one ``Bearer`` value; TokenError with its challenge otherwise.

        With ``defer_revocation`` and a ``scope``, the revocation check is put in the scope for the limiter."""
        token = self._bearer(values)
        try:
            claims = await self.tokens.claims(token)
            await self._revocation(claims, scope)
        except TokenError as exc:
            raise self._rejected(exc) from None
        return claims

    def _bearer(self, values: list[bytes]) -> str:
        try:
            return bearer_token(values, max_token_bytes=self.settings.max_token_bytes, realm=self.realm)
        except TokenError as exc:
            self.metrics.token_rejected(exc.code)
            raise

    async def _revocation(self, claims: Claims, scope: Scope | None) -> None:
        """Check the token's revocation now, or (``defer_revocation``, a ``scope``) leave it to the limiter."""
        revocations = self.revocations
        if revocations is None:
            return
        if self.defer_revocation and scope is not None:
            self._defer(claims, scope)
        else:
            await revocations.check(claims)

    def _defer(self, claims: Claims, scope: Scope) -> None:
        assert self.revocations is not None
        key = self.revocations.key_for(claims)
        scope[SCOPE_DEFERRED_REVOCATION] = DeferredRevocation(
            key, partial(self._check_revocation, claims), self._revoked
        )

    def _rejected(self, exc: TokenError) -> TokenError:
        self.metrics.token_rejected(exc.code)
        description = exc.detail.replace('"', "'")
        exc.headers.append(challenge(self.realm, "invalid_token", description))
        return exc

    async def _check_revocation(self, claims: Claims) -> None:
        """The deferred revocation check on its own (a path the limiter does not charge)."""
        assert self.revocations is not None
        try:
            await self.revocations.check(claims)
        except TokenError as exc:
            raise self._rejected(exc) from None

    def _revoked(self) -> TokenError:
        return self._rejected(TokenRevoked())

    async def check(self, scope: Scope) -> Outcome | None:
        """Require one valid bearer token (HTTP ``Authorization`` header, gRPC ``authorization`` metadata) and put
        its claims in scope[SCOPE_CLAIMS]; the caller's ``sub`` is bound to the log lines of the request (for
        HTTP and WebSocket until it ends: the returned outcome unbinds it)."""
        result = self.check_now(scope)
        return await result if isinstance(result, Coroutine) else result

    def check_now(self, scope: Scope) -> Outcome | Later | None:
        """:meth:`check` without a coroutine when the token's verification is cached and its revocation is not
        checked here (off, or left to the limiter); else the coroutine that finishes it (``bastion._guard``)."""
        if scope["type"] != "grpc" and not self.rules.requires_token(scope["path"]):
            return None
        token = self._bearer([value for name, value in scope["headers"] if name == AUTHORIZATION])
        try:
            claims = self.tokens.cached(token)
            if claims is None or (self.revocations is not None and not self.defer_revocation):
                return self._finish(token, claims, scope)
            if self.revocations is not None:
                self._defer(claims, scope)
        except TokenError as exc:
            raise self._rejected(exc) from None
        return self._admit(claims, scope)

    async def _finish(self, token: str, claims: Claims | None, scope: Scope) -> Outcome | None:
        """The rest of the check: verify the token (not cached), check its revocation."""
        try:
            if claims is None:
                claims = await self.tokens.claims(token)
            await self._revocation(claims, scope)
        except TokenError as exc:
            raise self._rejected(exc) from None
        return self._admit(claims, scope)

    def _admit(self, claims: Claims, scope: Scope) -> Outcome | None:
        scope[SCOPE_CLAIMS] = claims
        if claims.sub is None:
            return None
        bound = structlog.contextvars.bind_contextvars(sub=claims.sub)
        if scope["type"] == "grpc":
            return None  # the call's own context: nothing to unbind
        return Cleanup(partial(structlog.contextvars.reset_contextvars, **bound))
