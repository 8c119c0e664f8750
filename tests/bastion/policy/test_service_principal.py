"""Client certificates as principals: ``Service::"<identity>"`` with the certificate's attributes, the identity
passed to Cedar as data (never as policy text), and ``Service`` in the schema only with mutual TLS on."""

from __future__ import annotations

import pytest

from bastion._tls import ClientCertificate, client_certificate
from bastion.policy._capability import service_principal
from bastion.policy._engine import evaluate, parse_policies
from bastion.policy._schema import PolicySchema, cedar_schema

BILLING = "spiffe://example.test/billing"
POLICY = parse_policies(
    f'permit(principal == Service::"{BILLING}", action == Action::"POST /api/v1/invoices", resource);\n'
    'permit(principal is Service, action == Action::"GET /api/v1/invoices", resource)\n'
    '  when { principal.sans.contains("billing.example.test") && principal.issuer == "commonName=CA" };\n'
)
PEER = {
    "subject": ((("commonName", "billing"),),),
    "issuer": ((("commonName", "CA"),),),
    "serialNumber": "0A1B",
    "notAfter": "Jan  1 00:00:00 2030 GMT",
    "subjectAltName": (("DNS", "billing.example.test"), ("URI", BILLING), ("URI", "https://not-spiffe")),
}


def decide(certificate: ClientCertificate, action: str) -> bool:
    resource = ("Resource", "/api/v1/invoices", {})
    context = {"method": action.split()[0], "path": "/api/v1/invoices", "version": 1}
    return evaluate(POLICY, principal=service_principal(certificate), action=action, resource=resource,
                    context=context).allowed  # fmt: skip


class TestIdentity:
    def test_spiffe_uri_san_comes_first(self) -> None:
        certificate = client_certificate(PEER, ["spiffe", "dns", "cn"])
        assert certificate is not None
        assert certificate.attributes() == {
            "identity": BILLING,
            "sans": [BILLING, "billing.example.test"],
            "issuer": "commonName=CA",
            "serial": "0A1B",
            "not_after": 1893456000,
            "common_name": "billing",
        }

    @pytest.mark.parametrize(("order", "identity"), [(["dns", "cn"], "billing.example.test"), (["cn"], "billing")])
    def test_the_configured_order_decides(self, order: list[str], identity: str) -> None:
        certificate = client_certificate(PEER, order)
        assert certificate is not None and certificate.identity == identity

    def test_no_certificate_or_no_identity_is_none(self) -> None:
        assert client_certificate({}, ["spiffe"]) is None
        assert client_certificate({"subject": ((("commonName", "x"),),)}, ["spiffe", "dns"]) is None


class TestDecisions:
    def test_the_named_service_may_create(self) -> None:
        certificate = client_certificate(PEER, ["spiffe"])
        assert certificate is not None and decide(certificate, "POST /api/v1/invoices")

    def test_attributes_are_readable_by_policies(self) -> None:
        certificate = client_certificate(PEER, ["cn"])
        assert certificate is not None and decide(certificate, "GET /api/v1/invoices")

    @pytest.mark.parametrize(
        "identity",
        [
            f'{BILLING}" || true || "',
            f'{BILLING}", action, resource); permit(principal',
            f'Service::"{BILLING}"',
            BILLING.upper(),
            f"{BILLING}\u0000",
        ],
    )
    def test_an_identity_that_looks_like_policy_text_is_only_an_id(self, identity: str) -> None:
        assert not decide(ClientCertificate(identity=identity), "POST /api/v1/invoices")


def test_service_is_in_the_schema_only_with_mutual_tls() -> None:
    without = cedar_schema(resource={}, applicable=["GET /x"], declared=["GET /x"])
    with_mtls = cedar_schema(resource={}, applicable=["GET /x"], declared=["GET /x"], services=True)
    assert "Service" not in without[""]["entityTypes"]
    assert with_mtls[""]["actions"]["GET /x"]["appliesTo"]["principalTypes"] == ["User", "Anonymous", "Service"]
    assert PolicySchema(actions=(), service_principals=True).document()[""]["entityTypes"]["Service"]
