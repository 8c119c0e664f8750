"""The claims model: what a verified token says, checked for type, in the scope and in handlers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from starlette.requests import HTTPConnection

from bastion.errors import InvalidToken, TokenError, TokenExpired
from bastion.types import SCOPE_CLAIMS

_KNOWN = frozenset({"sub", "exp", "iat", "nbf", "jti", "roles", "perms", "username", "email", "client_id"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Claims:
    """A verified token's claims. ``extra`` keeps every other claim (``aud``, ``iss``, custom ones)."""

    sub: str | None = None
    exp: int
    iat: int | None = None
    nbf: int | None = None
    jti: str | None = None
    roles: tuple[str, ...] = ()
    perms: tuple[str, ...] = ()
    username: str | None = None
    email: str | None = None
    client_id: str | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def has_role(self, role: str) -> bool:
        return role in self.roles


MAX_NUMERIC_DATE = 253_402_300_799
"""9999-12-31T23:59:59Z, the last second an ISO-8601 date (PASETO's form, Python's datetime) can write."""


def _numeric_date(payload: Mapping[str, Any], name: str) -> int | None:
    """A time claim: a whole number of Unix seconds (the spec's "integer (Unix seconds)"; ``1.7e9`` is one) between
    1970 and 9999. Anything else (a bool, a string, a fraction, ``1e400``, ``2**64``, a 400-digit integer, a
    negative number) is an invalid token, never a 500 from arithmetic on it later."""
    value = payload.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidToken(f"claim {name!r} must be a NumericDate (Unix seconds)")
    if isinstance(value, float) and not value.is_integer():  # also inf and nan
        raise InvalidToken(f"claim {name!r} must be a whole number of Unix seconds")
    if not 0 <= value <= MAX_NUMERIC_DATE:
        raise InvalidToken(f"claim {name!r} must be a date from 1970 to 9999 (Unix seconds)")
    return int(value)


def _string(payload: Mapping[str, Any], name: str) -> str | None:
    value = payload.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidToken(f"claim {name!r} must be a string")
    return value


def _strings(payload: Mapping[str, Any], name: str) -> tuple[str, ...]:
    value = payload.get(name)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InvalidToken(f"claim {name!r} must be an array of strings")
    return tuple(value)


def claims_from_payload(payload: object) -> Claims:
    """Type-check a decoded token payload into :class:`Claims`; raise InvalidToken on any wrong type.

    ``exp`` is required: a token that never expires is refused (fail closed).
    """
    if not isinstance(payload, Mapping):
        raise InvalidToken("token payload must be a JSON object")
    exp = _numeric_date(payload, "exp")
    if exp is None:
        raise InvalidToken("token has no 'exp' claim")
    return Claims(
        sub=_string(payload, "sub"),
        exp=exp,
        iat=_numeric_date(payload, "iat"),
        nbf=_numeric_date(payload, "nbf"),
        jti=_string(payload, "jti"),
        roles=_strings(payload, "roles"),
        perms=_strings(payload, "perms"),
        username=_string(payload, "username"),
        email=_string(payload, "email"),
        client_id=_string(payload, "client_id"),
        extra=MappingProxyType({k: v for k, v in payload.items() if k not in _KNOWN}),
    )


def check_claims(
    claims: Claims, *, now: float, leeway: int, audience: str | None = None, issuer: str | None = None
) -> None:
    """Check the time claims (with ``leeway`` seconds of skew) and, when required, ``aud`` and ``iss``.

    Raises TokenExpired when ``exp + leeway`` has passed, InvalidToken for a future ``nbf`` or a wrong
    audience or issuer.
    """
    if claims.exp + leeway < now:
        raise TokenExpired()
    if claims.nbf is not None and claims.nbf - leeway > now:
        raise InvalidToken("token is not valid yet (nbf)")
    if audience is not None:
        aud = claims.extra.get("aud")
        audiences = aud if isinstance(aud, list) else [aud]
        if audience not in audiences:
            raise InvalidToken("token audience does not match")
    if issuer is not None and claims.extra.get("iss") != issuer:
        raise InvalidToken("token issuer does not match")


def optional_claims(connection: HTTPConnection) -> Claims | None:
    """FastAPI dependency: the caller's claims, or ``None`` on a public path."""
    claims = connection.scope.get(SCOPE_CLAIMS)
    return claims if isinstance(claims, Claims) else None


def current_claims(connection: HTTPConnection) -> Claims:
    """FastAPI dependency (``Depends(current_claims)``): the caller's verified claims.

    Raises TokenError (401) when the route was reached without authentication (a public path).
    """
    claims = optional_claims(connection)
    if claims is None:
        raise TokenError()
    return claims
