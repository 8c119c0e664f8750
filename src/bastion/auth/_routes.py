"""The optional admin route ``POST /admin/revoke-token`` an operator can mount."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bastion._claims import MAX_NUMERIC_DATE, current_claims
from bastion.auth._revocation import MAX_JTI_CHARS
from bastion.errors import BadRequest, MalformedBody, PolicyDenied, ValidationFailed

DEFAULT_REVOCATION_TTL_SECS = 24 * 3600


class RevokeRequest(BaseModel):
    jti: str = Field(min_length=1, max_length=MAX_JTI_CHARS)
    reason: str = Field(min_length=1, max_length=500)
    exp: int | None = Field(
        default=None, ge=0, le=MAX_NUMERIC_DATE, description="The token's exp; defaults to now + 24 h"
    )


Revoke = Callable[[str, str, float], Awaitable[None]]


def revoke_token_route(
    revoke_token: Revoke,
    *,
    path: str = "/admin/revoke-token",
    admin_role: str = "admin",
    default_ttl_secs: int = DEFAULT_REVOCATION_TTL_SECS,
) -> Route:
    """``POST {path}`` with ``{"jti", "reason", "exp"?}``: ``revoke_token(jti, reason, exp)``; the caller needs
    ``admin_role`` (the app passes its ``revoke``, which also tells the other instances).

    Without ``exp`` the entry lives ``default_ttl_secs``. Answers 200 ``{"revoked": true, "jti": ...}``;
    403 for a caller without the role; 400/422 for a bad body.
    """

    async def revoke(request: Request) -> Response:
        claims = current_claims(request)
        if not claims.has_role(admin_role):
            raise PolicyDenied()
        body = await request.body()
        try:
            payload = RevokeRequest.model_validate_json(body)
        except ValidationError as exc:
            if any(error["type"] == "json_invalid" for error in exc.errors()):
                raise MalformedBody() from None
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
            raise ValidationFailed(f"Request validation failed: {problems}") from None
        expires_at = payload.exp if payload.exp is not None else time.time() + default_ttl_secs
        try:
            await revoke_token(payload.jti, payload.reason, expires_at)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        return JSONResponse({"revoked": True, "jti": payload.jti})

    return Route(path, revoke, methods=["POST"], name="revoke_token")
