"""A service whose paths accept different credentials (tests/e2e/test_mtls.py): each route answers with the
client certificate identity and the token subject it was called with."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.websockets import WebSocket

from bastion import Service
from bastion.auth import Claims
from bastion.types import SCOPE_CLAIMS, SCOPE_CLIENT_CERTIFICATE

service = Service("mtls-service", version="1.0.0")
v1 = service.version(1)


def caller(request: Request) -> dict[str, Any]:
    certificate = request.scope.get(SCOPE_CLIENT_CERTIFICATE)
    claims = request.scope.get(SCOPE_CLAIMS)
    return {
        "identity": certificate.identity if certificate is not None else None,
        "sub": claims.sub if isinstance(claims, Claims) else None,
    }


@v1.post("/invoices", status_code=201)
async def create_invoice(request: Request) -> dict[str, Any]:
    return caller(request)


@v1.get("/invoices")
async def list_invoices(request: Request) -> dict[str, Any]:
    return caller(request)


@v1.get("/reports")
async def reports(request: Request) -> dict[str, Any]:
    return caller(request)


@v1.get("/ledger")
async def ledger(request: Request) -> dict[str, Any]:
    return caller(request)


@v1.get("/profile")
async def profile(request: Request) -> dict[str, Any]:
    return caller(request)


@v1.websocket("/live")
async def live(websocket: WebSocket) -> None:
    """Says who called (the handshake's certificate), then closes."""
    await websocket.accept()
    certificate = websocket.scope.get(SCOPE_CLIENT_CERTIFICATE)
    await websocket.send_json({"identity": certificate.identity if certificate is not None else None})
    await websocket.close()
