"""The mTLS example (docs/auth.md, "Service-to-service: mutual TLS"): the invoices service as a real ``bastion run``
on loopback with certificates from ``bastion dev-ca``, called by the billing service through ResilientTransport
with its client certificate."""

from __future__ import annotations

import argparse
import shutil
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from bastion import load_settings
from bastion._dev_ca import run as dev_ca
from bastion_core import CertificateFiles, Guard, ReloadingClientContext, ResilientTransport
from tests.conftest import REPO, BastionProcess, running

EXAMPLE = REPO / "examples/mtls"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``bastion dev-ca --dir <tmp>/.dev/ca --client billing --client reporting``, beside a copy of the example."""
    root = tmp_path_factory.mktemp("mtls")
    directory = root / ".dev/ca"
    dev_ca(argparse.Namespace(dir=str(directory), server="invoices", client=["billing", "reporting"],
                              trust_domain="example.test"))  # fmt: skip
    shutil.copytree(EXAMPLE, root / "examples/mtls")
    return directory


@pytest.fixture(scope="module")
def invoices(module_bastion_process: Callable[..., BastionProcess], ca: Path) -> BastionProcess:
    config = ca.parent.parent / "examples/mtls/invoices.toml"
    process = module_bastion_process("examples.mtls.invoices:service", "--config", str(config), wait=False)
    context = ssl.create_default_context(cafile=str(ca / "ca.pem"))
    context.load_cert_chain(ca / "billing.pem", ca / "billing-key.pem")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert process.proc.poll() is None, process.output()
        try:
            httpx.get(f"https://127.0.0.1:{process.port}/health", verify=context, timeout=1)
            return process
        except httpx.TransportError:
            time.sleep(0.05)
    raise AssertionError(process.output())


async def test_billing_creates_an_invoice_with_its_certificate(
    invoices: BastionProcess, ca: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from examples.mtls import billing

    monkeypatch.setenv("BILLING_CERT", str(ca / "billing.pem"))
    monkeypatch.setenv("BILLING_KEY", str(ca / "billing-key.pem"))
    monkeypatch.setenv("BILLING_CA", str(ca / "ca.pem"))
    monkeypatch.setenv("INVOICES_URL", f"https://localhost:{invoices.port}")
    app = billing.service.build(load_settings(EXAMPLE / "billing.toml"))
    async with running(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        response = await client.post("/api/v1/charges", json={"customer": "acme", "cents": 1200})
    assert response.status_code == 201
    assert response.json()["invoice"] == {
        "id": 1,
        "customer": "acme",
        "cents": 1200,
        "created_by": "spiffe://example.test/billing",
    }


async def test_another_service_certificate_may_list_but_not_create(invoices: BastionProcess, ca: Path) -> None:
    files = CertificateFiles(
        cert_path=str(ca / "reporting.pem"), key_path=str(ca / "reporting-key.pem"), ca_path=str(ca / "ca.pem")
    )
    transport = ResilientTransport(Guard(), client_tls=ReloadingClientContext(files))
    async with httpx.AsyncClient(transport=transport, base_url=f"https://localhost:{invoices.port}") as client:
        denied = await client.post("/api/v1/invoices", json={"customer": "acme", "cents": 1})
        listed = await client.get("/api/v1/invoices")
    assert (denied.status_code, denied.json()["code"]) == (403, "FORBIDDEN")
    assert listed.status_code == 200
