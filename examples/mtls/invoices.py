"""The invoices service: callers are identified by their client certificate (``[tls]`` in invoices.toml)."""

from __future__ import annotations

from pydantic import BaseModel
from starlette.requests import Request

from bastion import Service
from bastion.types import SCOPE_CLIENT_CERTIFICATE


class InvoiceIn(BaseModel):
    customer: str
    cents: int


service = Service("invoices", version="1.0.0")
v1 = service.version(1)
invoices: list[dict[str, object]] = []


@v1.post("/invoices", status_code=201)
async def create_invoice(body: InvoiceIn, request: Request) -> dict[str, object]:
    certificate = request.scope.get(SCOPE_CLIENT_CERTIFICATE)
    invoice = {
        "id": len(invoices) + 1,
        **body.model_dump(),
        "created_by": certificate.identity if certificate else None,
    }
    invoices.append(invoice)
    return invoice


@v1.get("/invoices")
async def list_invoices() -> list[dict[str, object]]:
    return invoices
