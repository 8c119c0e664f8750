"""Token authentication for HTTP: bearer extraction, verification, revocation, claims into the scope."""

from __future__ import annotations

import re

import structlog

from bastion.auth.cache import VerifiedTokens
from bastion.auth.paths import PathRules
from bastion.auth.revocation import Revocations
from bastion.errors import InvalidToken, TokenError
from bastion.types import SCOPE_CLAIMS, ASGIApp, Receive, Scope, Send

# RFC 6750 2.1: credentials = "Bearer" 1*SP b64token
_BEARER = re.compile(rb"(?i:bearer) +([A-Za-z0-9\-._~+/]+=*) *")
_AUTHORIZATION = b"authorization"
_GUARDED = frozenset({"http", "websocket"})


def _challenge(realm: str, error: str | None = None, description: str | None = None) -> tuple[str, str]:
    value = f'Bearer realm="{realm}"'
    if error:
        value += f', error="{error}"'
    if description:
        value += f', error_description="{description}"'
    return ("www-authenticate", value)


def bearer_token(values: list[bytes], *, max_token_bytes: int, realm: str = "api") -> str:
    """The token of exactly one ``Authorization: Bearer <token>`` value (HTTP header or gRPC metadata).

    Raises TokenError (``UNAUTHORIZED``) when it is missing, repeated or malformed, InvalidToken when it
    is longer than ``max_token_bytes``; each carries its RFC 6750 challenge.
    """
    if len(values) == 1 and len(values[0]) <= max_token_bytes + 16:
        match = _BEARER.fullmatch(values[0])
        if match is not None:
            return match.group(1).decode("ascii")
    invalid_request = _challenge(realm, "invalid_request", "malformed Authorization header")
    if not values:
        raise TokenError("Missing bearer token", headers=[_challenge(realm)])
    if len(values) > 1:
        raise TokenError("Exactly one Authorization header is allowed", headers=[invalid_request])
    if len(values[0]) > max_token_bytes + 16:
        raise InvalidToken("Token too large", headers=[_challenge(realm, "invalid_token", "token too large")])
    match = _BEARER.fullmatch(values[0])
    if match is None:
        raise TokenError("Authorization header must be 'Bearer <token>'", headers=[invalid_request])
    return match.group(1).decode("ascii")


class TokenAuthMiddleware:
    """Require a valid bearer token on protected paths; put its Claims in scope[SCOPE_CLAIMS].

    HTTP requests and WebSocket handshakes (the same ``Authorization`` header) are checked alike. Public paths
    (``/health``, ``/ready``, exclude/include/public rules) and CORS preflights pass untouched.
    Missing or malformed ``Authorization`` -> 401 ``UNAUTHORIZED``; bad token -> ``INVALID_TOKEN``; expired ->
    ``TOKEN_EXPIRED``; revoked -> ``TOKEN_REVOKED``; each with ``WWW-Authenticate: Bearer`` (RFC 6750 3).
    Sits inside the route-resolution layer and outside rate limiting and policy, which read the claims.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: VerifiedTokens,
        rules: PathRules,
        revocations: Revocations | None = None,
        max_token_bytes: int = 8192,
        realm: str = "api",
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.rules = rules
        self.revocations = revocations
        self.max_token_bytes = max_token_bytes
        self.realm = realm.replace('"', "")

    def _bearer(self, headers: list[tuple[bytes, bytes]]) -> str:
        values = [value for name, value in headers if name == _AUTHORIZATION]
        return bearer_token(values, max_token_bytes=self.max_token_bytes, realm=self.realm)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in _GUARDED or not self.rules.requires_token(scope["path"]) or _is_preflight(scope):
            await self.app(scope, receive, send)
            return
        token = self._bearer(scope["headers"])
        try:
            claims = await self.tokens.claims(token)
            if self.revocations is not None:
                await self.revocations.check(claims)
        except TokenError as exc:
            description = exc.detail.replace('"', "'")
            exc.headers.append(_challenge(self.realm, "invalid_token", description))
            raise
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
