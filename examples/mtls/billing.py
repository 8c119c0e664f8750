"""The billing service: ``POST /api/v1/charges`` creates an invoice on the invoices service, presenting its own
client certificate (``BILLING_CERT``/``BILLING_KEY``, re-read when the files change) to ``INVOICES_URL``."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx
from pydantic import BaseModel
from starlette.requests import Request

from bastion import Service
from bastion_core import CertificateFiles, CircuitBreaker, Guard, ReloadingClientContext, ResilientTransport


class ChargeIn(BaseModel):
    customer: str
    cents: int


@contextlib.asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[dict[str, Any]]:
    files = CertificateFiles(
        cert_path=os.environ["BILLING_CERT"], key_path=os.environ["BILLING_KEY"], ca_path=os.environ["BILLING_CA"]
    )
    identity = ReloadingClientContext(files, name="invoices-client")
    watcher = asyncio.create_task(identity.watch(interval=10.0))
    transport = ResilientTransport(Guard(breaker=CircuitBreaker("invoices")), client_tls=identity)
    async with httpx.AsyncClient(transport=transport, timeout=5.0) as client:
        yield {"invoices": client}
    watcher.cancel()


service = Service("billing", version="1.0.0", lifespan=lifespan)
v1 = service.version(1)


@v1.post("/charges", status_code=201)
async def charge(body: ChargeIn, request: Request) -> dict[str, Any]:
    client: httpx.AsyncClient = request.app.state.invoices
    response = await client.post(f"{os.environ['INVOICES_URL']}/api/v1/invoices", json=body.model_dump())
    return {"invoice_status": response.status_code, "invoice": response.json()}
