"""TLS on the main port: ALPN picks HTTP/2 (gRPC) or HTTP/1.1 (HTTPS, with HSTS) on one listener."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bastion.testing import TokenMinter
from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
from examples.documents_api.proto.documents.v1 import documents_pb2_grpc as pb_grpc
from tests.conftest import BastionProcess

EXAMPLE = ("examples.documents_api:service", "--config", "examples/documents_api/config.toml")


def self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.fixture
def tls_example(
    bastion_process: Callable[..., BastionProcess], tmp_path: Path
) -> tuple[BastionProcess, Path, TokenMinter]:
    minter = TokenMinter("RS256")
    (tmp_path / "public.pem").write_bytes(minter.public_pem())
    cert, key = self_signed(tmp_path)
    env = {
        "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(tmp_path / "public.pem"),
        "SERVICE_TLS_CERT_PATH": str(cert),
        "SERVICE_TLS_KEY_PATH": str(key),
    }
    process = bastion_process(*EXAMPLE, env=env, wait=False)
    context = ssl.create_default_context(cafile=str(cert))
    for _ in range(200):
        try:
            if httpx.get(f"https://127.0.0.1:{process.port}/health", verify=context, timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    return process, cert, minter


def test_https_and_grpc_over_tls_on_one_port(tls_example: tuple[BastionProcess, Path, TokenMinter]) -> None:
    process, cert, minter = tls_example
    context = ssl.create_default_context(cafile=str(cert))
    response = httpx.get(f"https://127.0.0.1:{process.port}/health", verify=context)
    assert response.status_code == 200
    assert response.http_version == "HTTP/1.1"
    assert response.headers["strict-transport-security"].startswith("max-age=")
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    with grpc.secure_channel(f"localhost:{process.port}", credentials) as channel:
        token = minter.mint(sub="alice", roles=["user"])
        reply = pb_grpc.DocumentServiceStub(channel).ListDocuments(
            pb.ListDocumentsRequest(limit=1), metadata=[("authorization", f"Bearer {token}")], timeout=10
        )
    assert len(reply.items) == 1


def test_tls_settings_must_come_in_pairs(tmp_path: Path) -> None:
    from bastion import ConfigError, load_settings

    with pytest.raises(ConfigError, match=r"tls_cert_path and service\.tls_key_path must be set together"):
        load_settings(environ={"SERVICE_TLS_CERT_PATH": str(tmp_path / "c.pem")})
