"""STARTTLS server context: configured PEM pair or a generated self-signed one."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography import x509

from mailrelay import ConfigError
from mailrelay._tls import generate_self_signed, server_context


def test_generated_certificate_is_self_signed_for_localhost() -> None:
    cert_pem, key_pem = generate_self_signed("relay.test", hosts=("mx.example.org", "10.0.0.1"))
    cert = x509.load_pem_x509_certificate(cert_pem)
    assert cert.issuer == cert.subject
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert "mx.example.org" in names.get_values_for_type(x509.DNSName)
    assert b"PRIVATE KEY" in key_pem


def test_context_without_files_generates_one() -> None:
    context, reloading = server_context(None, None)
    assert reloading is None
    assert context.minimum_version is ssl.TLSVersion.TLSv1_2


def test_context_from_files(tmp_path: Path) -> None:
    cert_pem, key_pem = generate_self_signed()
    (tmp_path / "c.pem").write_bytes(cert_pem)
    (tmp_path / "k.pem").write_bytes(key_pem)
    context, reloading = server_context(tmp_path / "c.pem", tmp_path / "k.pem")
    assert reloading is not None and reloading.front is context


def test_mismatched_files_name_the_variable(tmp_path: Path) -> None:
    cert_pem, _ = generate_self_signed()
    _, other_key = generate_self_signed()
    (tmp_path / "c.pem").write_bytes(cert_pem)
    (tmp_path / "k.pem").write_bytes(other_key)
    with pytest.raises(ConfigError) as caught:
        server_context(tmp_path / "c.pem", tmp_path / "k.pem")
    message = str(caught.value)
    assert message.startswith("MAIL_RELAY_TLS_CERT: expected a PEM certificate matching MAIL_RELAY_TLS_KEY (")
    assert message.endswith(f"), got {str(tmp_path / 'c.pem')!r}")  # the middle is OpenSSL's own wording
