"""Mutual TLS on a real ``bastion run``: client certificates as ``Service`` principals, per-path credentials, and
every bad certificate refused at the handshake (httpx with a client certificate, websockets, grpcio,
``openssl s_client``)."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from cryptography import x509

from bastion.testing import TokenMinter
from bastion_core.testing import DevCA, Issued, free_port
from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
from examples.documents_api.proto.documents.v1 import documents_pb2_grpc as pb_grpc
from tests.conftest import REPO, BastionProcess, metric_samples

try:  # websockets 13 and later
    from websockets.asyncio.client import connect as websocket_connect
except ImportError:  # websockets 12 (compat/oldest.txt): its asyncio client is the legacy one
    from websockets.client import connect as websocket_connect  # type: ignore[attr-defined,no-redef]

BILLING = "spiffe://example.test/billing"
REPORTING = "spiffe://example.test/reporting"
NOW = datetime.datetime.now(datetime.UTC)
POLICY = f"""
permit(principal == Service::"{BILLING}", action == Action::"POST /api/v1/invoices", resource);
permit(
  principal is Service,
  action in [Action::"GET /api/v1/invoices", Action::"GET /api/v1/reports", Action::"GET /api/v1/live"],
  resource
);
permit(principal is User, action, resource);
"""


@dataclass
class Pki:
    directory: Path
    ca: DevCA
    minter: TokenMinter
    grpc_port: int = field(default_factory=free_port)

    @property
    def ca_path(self) -> Path:
        return self.directory / "ca.pem"

    def context(self, name: str | None = None) -> ssl.SSLContext:
        """A client context trusting the CA, presenting ``<name>.pem`` when a name is given."""
        context = ssl.create_default_context(cafile=str(self.ca_path))
        if name is not None:
            context.load_cert_chain(self.directory / f"{name}.pem", self.directory / f"{name}-key.pem")
        return context

    def server(self, common_name: str) -> Issued:
        return self.ca.issue(common_name, dns=("localhost",), ips=("127.0.0.1",), server=True, client=False)

    def rotate(self, name: str, version: str, issued: Issued) -> None:
        """Point ``<name>-tls`` at a new directory holding ``issued`` (one atomic rename, as Kubernetes swaps a
        mounted secret)."""
        issued.write(self.directory / f"{name}-{version}", "server")
        link = self.directory / f"{name}-tls.new"
        link.symlink_to(f"{name}-{version}")
        os.replace(link, self.directory / f"{name}-tls")

    def config(self, name: str, tls: str, *, extra: str = "") -> Path:
        self.rotate(name, "v1", self.server(f"{name}-v1"))
        path = self.directory / f"{name}.toml"
        path.write_text(
            f"""
[service]
name = "{name}"
tls_cert_path = "{name}-tls/server.pem"
tls_key_path = "{name}-tls/server-key.pem"

[token]
public_key_path = "public.pem"

[tls]
client_ca_path = "ca.pem"
crl_path = "crl.pem"
{tls}
{extra}
"""
        )
        return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = DevCA()
    ca.write(directory)
    ca.issue("billing", spiffe=BILLING).write(directory, "billing")
    ca.issue("reporting", spiffe=REPORTING, dns=("reporting.example.test",)).write(directory, "reporting")
    ca.issue("expired", spiffe=BILLING, valid_from=NOW - datetime.timedelta(days=3), valid_days=1).write(
        directory, "expired"
    )
    ca.issue("future", spiffe=BILLING, valid_from=NOW + datetime.timedelta(days=1)).write(directory, "future")
    ca.issue("server-only", spiffe=BILLING, server=True, client=False).write(directory, "wrong-usage")
    revoked = ca.issue("revoked", spiffe=BILLING)
    revoked.write(directory, "revoked")
    ca.revoke(revoked.serial)
    (directory / "crl.pem").write_bytes(ca.crl_pem())
    DevCA("another CA").issue("billing", spiffe=BILLING).write(directory, "foreign")
    (directory / "policies.cedar").write_text(POLICY)
    minter = TokenMinter("RS256")
    (directory / "public.pem").write_bytes(minter.public_pem())
    return Pki(directory, ca, minter)


def start(factory: Callable[..., BastionProcess], app: str, config: Path, context: ssl.SSLContext) -> BastionProcess:
    process = factory(app, "--config", str(config), wait=False)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert process.proc.poll() is None, process.output()
        try:
            if httpx.get(f"https://127.0.0.1:{process.port}/health", verify=context, timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.05)
    raise AssertionError(process.output())


@pytest.fixture(scope="module")
def optional(module_bastion_process: Callable[..., BastionProcess], pki: Pki) -> BastionProcess:
    """``client_auth = "optional"``: one port for callers with and without a certificate."""
    config = pki.config(
        "optional",
        'client_auth = "optional"\nreload_interval_secs = 0.1',
        extra="""
[tls.path_credentials]
"/api/v1/invoices" = "mtls"
"/api/v1/live" = "mtls"
"/api/v1/reports" = "mtls_or_bearer"
"/api/v1/ledger" = "mtls_and_bearer"

[policy]
policy_path = "policies.cedar"
""",
    )
    return start(module_bastion_process, "tests.e2e.apps.mtls_service:service", config, pki.context())


@pytest.fixture(scope="module")
def required(module_bastion_process: Callable[..., BastionProcess], pki: Pki) -> BastionProcess:
    """``client_auth = "required"`` with gRPC on ``grpc.port`` (TLS there too): the documents example, gRPC calls
    needing both a certificate and a token whose ``client_id`` is the certificate's identity."""
    config = pki.config(
        "required",
        'client_auth = "required"\nreload_interval_secs = 3600',
        extra=f"""
[tls.path_credentials]
"/documents.v1.DocumentService/*" = "mtls_and_bearer"

[policy]
policy_path = "{REPO / "examples/documents_api/policies.cedar"}"

[grpc]
enabled = true
use_separate_port = true
port = {pki.grpc_port}
""",
    )
    return start(module_bastion_process, "examples.documents_api:service", config, pki.context("billing"))


def call(
    process: BastionProcess, context: ssl.SSLContext, path: str, *, method: str = "GET", token: str = ""
) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(verify=context, timeout=5) as client:
        return client.request(method, f"https://127.0.0.1:{process.port}{path}", headers=headers)


async def first_message(url: str, context: ssl.SSLContext) -> Any:
    """The first message of a WebSocket over TLS, opened with websockets' asyncio client.

    Not its sync client: that one reads the socket in a background thread from the moment the TCP and TLS
    handshakes are done, while the calling thread writes the HTTP upgrade request, so two threads are inside one
    OpenSSL session at once (OpenSSL forbids it; ``ssl.SSLSocket`` does not serialize them). Under load the request
    was lost now and then: the server logged the TLS handshake, then no byte, then ``connection_sniff_timeout``
    after 10 s, while the client timed out waiting for the 101. One thread, one session: no race."""
    async with websocket_connect(url, ssl=context, open_timeout=10, close_timeout=5) as websocket:
        return json.loads(await asyncio.wait_for(websocket.recv(), 10))


def websocket_upgrade(process: BastionProcess, context: ssl.SSLContext, path: str) -> httpx.Response:
    """An RFC 6455 opening handshake sent by httpx, for a handshake the server refuses: the answer is a plain
    HTTP response, whose body websockets' clients do not all return (its legacy client, websockets 12, drops it)."""
    headers = {
        "connection": "Upgrade",
        "upgrade": "websocket",
        "sec-websocket-key": base64.b64encode(os.urandom(16)).decode(),
        "sec-websocket-version": "13",
    }
    with httpx.Client(verify=context, timeout=10) as client:
        return client.get(f"https://127.0.0.1:{process.port}{path}", headers=headers)


class TestPrincipals:
    def test_billing_certificate_creates_an_invoice_as_its_spiffe_identity(
        self, optional: BastionProcess, pki: Pki
    ) -> None:
        response = call(optional, pki.context("billing"), "/api/v1/invoices", method="POST")
        assert (response.status_code, response.json()) == (201, {"identity": BILLING, "sub": None})

    def test_another_service_certificate_is_denied_by_the_policy(self, optional: BastionProcess, pki: Pki) -> None:
        response = call(optional, pki.context("reporting"), "/api/v1/invoices", method="POST")
        assert (response.status_code, response.json()["code"]) == (403, "FORBIDDEN")
        assert call(optional, pki.context("reporting"), "/api/v1/invoices").json()["identity"] == REPORTING

    def test_mtls_path_without_a_certificate_gets_401(self, optional: BastionProcess, pki: Pki) -> None:
        token = pki.minter.mint(sub="alice")
        response = call(optional, pki.context(), "/api/v1/invoices", method="POST", token=token)
        assert (response.status_code, response.json()["code"]) == (401, "CLIENT_CERTIFICATE_REQUIRED")

    def test_mtls_or_bearer_takes_either(self, optional: BastionProcess, pki: Pki) -> None:
        by_certificate = call(optional, pki.context("reporting"), "/api/v1/reports")
        by_token = call(optional, pki.context(), "/api/v1/reports", token=pki.minter.mint(sub="alice"))
        assert by_certificate.json() == {"identity": REPORTING, "sub": None}
        assert by_token.json() == {"identity": None, "sub": "alice"}
        assert call(optional, pki.context(), "/api/v1/reports").status_code == 401

    def test_mtls_and_bearer_needs_a_token_for_the_same_client(self, optional: BastionProcess, pki: Pki) -> None:
        same = pki.minter.mint(sub="job", client_id=BILLING)
        other = pki.minter.mint(sub="job", client_id=REPORTING)
        assert call(optional, pki.context("billing"), "/api/v1/ledger", token=same).json() == {
            "identity": BILLING,
            "sub": "job",
        }
        mismatch = call(optional, pki.context("billing"), "/api/v1/ledger", token=other)
        assert (mismatch.status_code, mismatch.json()["code"]) == (401, "CLIENT_CERTIFICATE_MISMATCH")
        assert call(optional, pki.context("billing"), "/api/v1/ledger").status_code == 401
        assert (
            call(optional, pki.context(), "/api/v1/ledger", token=same).json()["code"] == "CLIENT_CERTIFICATE_REQUIRED"
        )

    async def test_a_websocket_handshake_carries_the_certificate_identity(
        self, optional: BastionProcess, pki: Pki
    ) -> None:
        url = f"wss://127.0.0.1:{optional.port}/api/v1/live"
        assert await first_message(url, pki.context("billing")) == {"identity": BILLING}

    def test_a_websocket_handshake_on_an_mtls_path_without_a_certificate_is_401(
        self, optional: BastionProcess, pki: Pki
    ) -> None:
        refused = websocket_upgrade(optional, pki.context(), "/api/v1/live")
        assert (refused.status_code, refused.json()["code"]) == (401, "CLIENT_CERTIFICATE_REQUIRED")

    def test_bearer_path_ignores_a_certificate_without_a_token(self, optional: BastionProcess, pki: Pki) -> None:
        assert call(optional, pki.context("billing"), "/api/v1/profile").status_code == 401
        with_token = call(optional, pki.context("billing"), "/api/v1/profile", token=pki.minter.mint(sub="bob"))
        assert with_token.json() == {"identity": BILLING, "sub": "bob"}


@pytest.mark.parametrize("name", ["foreign", "expired", "future", "wrong-usage", "revoked"])
def test_bad_client_certificate_fails_the_handshake(optional: BastionProcess, pki: Pki, name: str) -> None:
    with pytest.raises(httpx.TransportError):
        call(optional, pki.context(name), "/api/v1/reports")
    assert call(optional, pki.context("billing"), "/api/v1/reports").status_code == 200  # still serving


def test_required_client_auth_refuses_a_handshake_without_certificate(required: BastionProcess, pki: Pki) -> None:
    with pytest.raises(httpx.TransportError):
        call(required, pki.context(), "/health")
    assert call(required, pki.context("billing"), "/health").status_code == 200


def s_client(process: BastionProcess, pki: Pki, name: str | None) -> str:
    args = ["openssl", "s_client", "-connect", f"127.0.0.1:{process.port}", "-CAfile", str(pki.ca_path), "-quiet"]
    if name is not None:
        args += ["-cert", str(pki.directory / f"{name}.pem"), "-key", str(pki.directory / f"{name}-key.pem")]
    request = b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    done = subprocess.run(args, input=request, capture_output=True, timeout=10, check=False)
    return (done.stdout + done.stderr).decode(errors="replace")


@pytest.mark.parametrize("name", [None, "foreign", "revoked"])
def test_openssl_s_client_with_a_refused_certificate_gets_no_http_answer(
    required: BastionProcess, pki: Pki, name: str | None
) -> None:
    """The handshake fails and the connection is closed: nothing of HTTP is ever sent."""
    output = s_client(required, pki, name)
    assert "verify return:1" in output  # the client did verify the server: the refusal is the server's
    assert "HTTP/1.1" not in output


def test_openssl_s_client_with_a_good_certificate_is_answered(required: BastionProcess, pki: Pki) -> None:
    assert "HTTP/1.1 200 OK" in s_client(required, pki, "billing")


@pytest.fixture
def grpc_channel(required: BastionProcess, pki: Pki) -> Iterator[Callable[[str | None], grpc.Channel]]:
    channels: list[grpc.Channel] = []

    def open_channel(name: str | None) -> grpc.Channel:
        pair = {}
        if name is not None:
            pair = {
                "private_key": (pki.directory / f"{name}-key.pem").read_bytes(),
                "certificate_chain": (pki.directory / f"{name}.pem").read_bytes(),
            }
        credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca_path.read_bytes(), **pair)
        channel = grpc.secure_channel(f"localhost:{pki.grpc_port}", credentials)
        channels.append(channel)
        return channel

    yield open_channel
    for channel in channels:
        channel.close()


def list_documents(channel: grpc.Channel, token: str) -> int:
    reply = pb_grpc.DocumentServiceStub(channel).ListDocuments(
        pb.ListDocumentsRequest(limit=1), metadata=[("authorization", f"Bearer {token}")], timeout=10
    )
    return len(reply.items)


def test_grpc_call_with_certificate_and_matching_token(
    grpc_channel: Callable[[str | None], grpc.Channel], pki: Pki
) -> None:
    token = pki.minter.mint(sub="alice", roles=["user"], client_id=BILLING)
    assert list_documents(grpc_channel("billing"), token) == 1


def test_grpc_call_with_the_token_of_another_client_is_unauthenticated(
    grpc_channel: Callable[[str | None], grpc.Channel], pki: Pki
) -> None:
    token = pki.minter.mint(sub="alice", roles=["user"], client_id=REPORTING)
    with pytest.raises(grpc.RpcError) as caught:
        list_documents(grpc_channel("billing"), token)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "CLIENT_CERTIFICATE_MISMATCH" in (caught.value.details() or "")


def test_grpc_channel_without_certificate_fails_the_handshake(
    grpc_channel: Callable[[str | None], grpc.Channel], pki: Pki
) -> None:
    token = pki.minter.mint(sub="alice", roles=["user"], client_id=BILLING)
    with pytest.raises(grpc.RpcError) as caught:
        list_documents(grpc_channel(None), token)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def served_name(process: BastionProcess, pki: Pki) -> str:
    """The CN of the certificate a new handshake gets."""
    with (
        socket.create_connection(("127.0.0.1", process.port), timeout=5) as raw,
        pki.context("billing").wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        peer = tls.getpeercert()
    return next(value for rdn in peer["subject"] for key, value in rdn if key == "commonName")


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


class TestRotation:
    def test_new_files_serve_new_handshakes_while_open_connections_finish(
        self, optional: BastionProcess, pki: Pki
    ) -> None:
        url = f"https://127.0.0.1:{optional.port}/api/v1/reports"
        with httpx.Client(verify=pki.context("billing"), timeout=5) as kept:
            assert kept.get(url).status_code == 200
            pki.rotate("optional", "v2", pki.server("optional-v2"))
            wait_for(lambda: served_name(optional, pki) == "optional-v2")
            assert kept.get(url).status_code == 200  # the connection opened before the swap still serves
        assert "tls_reloaded" in optional.output()

    def test_a_broken_rotation_keeps_the_previous_set(self, optional: BastionProcess, pki: Pki) -> None:
        good = served_name(optional, pki)
        cert = pki.server("optional-bad")
        pki.rotate("optional", "bad", Issued(cert.cert_pem, pki.ca.issue("x", server=True).key_pem, cert.serial))
        wait_for(lambda: "does not match its certificate" in optional.output())
        assert served_name(optional, pki) == good
        assert call(optional, pki.context("billing"), "/api/v1/reports").status_code == 200
        failed = [line for line in optional.output().splitlines() if "tls_reload_failed" in line]
        assert len(failed) == 1 and "kept" in failed[0]
        pki.rotate("optional", "v3", pki.server("optional-v3"))
        wait_for(lambda: served_name(optional, pki) == "optional-v3")

    def test_a_new_crl_refuses_a_certificate_from_the_next_handshake(self, optional: BastionProcess, pki: Pki) -> None:
        pki.ca.issue("later", spiffe="spiffe://example.test/later").write(pki.directory, "later")
        assert (
            call(optional, pki.context("later"), "/api/v1/reports").json()["identity"] == "spiffe://example.test/later"
        )
        pki.ca.revoke(x509.load_pem_x509_certificate((pki.directory / "later.pem").read_bytes()).serial_number)
        crl = pki.directory / "crl.next"
        crl.write_bytes(pki.ca.crl_pem())
        os.replace(crl, pki.directory / "crl.pem")

        def refused() -> bool:
            try:
                call(optional, pki.context("later"), "/api/v1/reports")
            except httpx.TransportError:
                return True
            return False

        wait_for(refused)
        assert call(optional, pki.context("billing"), "/api/v1/reports").status_code == 200

    def test_expiry_and_reloads_are_metrics(self, optional: BastionProcess, pki: Pki) -> None:
        text = call(optional, pki.context(), "/metrics").text
        samples = metric_samples(text)
        assert 29 * 86400 < samples[("bastion_tls_certificate_expiry_seconds", (("port", "main"),))] <= 30 * 86400
        assert samples[("bastion_tls_reloads_total", (("outcome", "failure"), ("port", "main")))] >= 1

    def test_sighup_reloads_at_once(self, required: BastionProcess, pki: Pki) -> None:
        """``reload_interval_secs = 3600`` here: only the signal can explain the new certificate."""
        pki.rotate("required", "v2", pki.server("required-v2"))
        assert served_name(required, pki) == "required-v1"
        required.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: served_name(required, pki) == "required-v2")
        assert call(required, pki.context("billing"), "/health").status_code == 200
