"""The stack a user would otherwise hand-assemble: FastAPI + a PyJWT ``Depends`` (RS256) + slowapi + cedarpy.

It serves the example's ``GET /api/v2/documents`` (same store, same response model) so its row compares with
``bastion-secured`` handler for handler. Written the idiomatic way, with the cheap wins a careful user takes:
the public key and the Cedar policy set are loaded once at import, not per request, and the dependencies
are ``async def`` as in FastAPI's security tutorial (a plain ``def`` would add two thread-pool hops per
request). The public key file comes from ``BENCH_JWT_PUBLIC_KEY_PATH``.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Annotated, Any

import cedarpy
import jwt
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from slowapi import Limiter, _rate_limit_exceeded_handler
from slowapi.errors import RateLimitExceeded
from slowapi.util import get_remote_address

from examples.documents_api.api import PAGE_SIZE_DEFAULT, PAGE_SIZE_MAX, DocumentPage
from examples.documents_api.store import seeded_store

POLICIES = Path(__file__).resolve().parents[2] / "examples" / "documents_api" / "policies.cedar"
# High enough never to trip during a run: the row measures the limiter's cost, not its rejections.
NEVER_TRIPS = "1000000000/minute"

PUBLIC_KEY = load_pem_public_key(Path(os.environ["BENCH_JWT_PUBLIC_KEY_PATH"]).read_bytes())
POLICY_SET = cedarpy.PolicySet.from_str(POLICIES.read_text())
store = seeded_store()
bearer = HTTPBearer()
limiter = Limiter(key_func=get_remote_address)

app = FastAPI()
app.state.limiter = limiter
app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]


async def current_claims(credentials: Annotated[HTTPAuthorizationCredentials, Depends(bearer)]) -> dict[str, Any]:
    try:
        return jwt.decode(credentials.credentials, PUBLIC_KEY, algorithms=["RS256"], leeway=30)
    except jwt.PyJWTError as exc:
        raise HTTPException(401, "invalid token", headers={"WWW-Authenticate": "Bearer"}) from exc


@functools.lru_cache(maxsize=256)
def _version(template: str) -> int:
    """The API version of a route template (``/api/v2/...`` -> 2), worked out once per template."""
    parts = template.split("/")
    return int(parts[2][1:]) if len(parts) > 2 and parts[2][:1] == "v" and parts[2][1:].isdigit() else 0


async def authorized(request: Request, claims: Annotated[dict[str, Any], Depends(current_claims)]) -> dict[str, Any]:
    sub = str(claims.get("sub", "anonymous"))
    route = request.scope.get("route")
    template = getattr(route, "path_format", request.url.path)
    principal = {"uid": {"type": "User", "id": sub}, "attrs": {"sub": sub, "roles": claims.get("roles", [])}}
    decision = cedarpy.is_authorized(
        {
            "principal": f'User::"{sub}"',
            "action": f'Action::"{request.method} {template}"',
            "resource": f'Resource::"{request.url.path}"',
            "context": {
                # what Bastion's context carries too (the example's policies read method, path and version)
                "method": request.method,
                "path": template,
                "version": _version(template),
                "ip_address": request.client.host if request.client else "",
                "timestamp": int(time.time()),
                "user_agent": request.headers.get("user-agent", ""),
            },
        },
        POLICY_SET,
        [{**principal, "parents": []}],
    )
    if decision.decision != cedarpy.Decision.Allow:
        raise HTTPException(403, "Access denied by policy")
    return claims


@app.get("/api/v2/documents", response_model=DocumentPage)
@limiter.limit(NEVER_TRIPS)
async def list_documents(
    request: Request,
    claims: Annotated[dict[str, Any], Depends(authorized)],
    limit: Annotated[int, Query(ge=1, le=PAGE_SIZE_MAX)] = PAGE_SIZE_DEFAULT,
    cursor: Annotated[str | None, Query(max_length=128)] = None,
) -> dict[str, object]:
    items, next_cursor = store.page(after=cursor, limit=limit)
    return {"items": [doc.as_dict() for doc in items], "next_cursor": next_cursor}
