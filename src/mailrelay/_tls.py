"""TLS for STARTTLS: load the configured PEM pair (re-read when it changes), or generate a self-signed one."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bastion_core import ConfigError
from bastion_core._tls import CertificateFiles, CertificateSetError, ReloadingServerContext

SELF_SIGNED_VALIDITY_DAYS = 365


def generate_self_signed(common_name: str = "MailRelay", *, hosts: tuple[str, ...] = ()) -> tuple[bytes, bytes]:
    """A fresh EC P-256 key and a self-signed certificate for `common_name` (+ `hosts` as SANs), PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SELF_SIGNED_VALIDITY_DAYS))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def server_context(cert: Path | None, key: Path | None) -> tuple[ssl.SSLContext, ReloadingServerContext | None]:
    """The STARTTLS server context and, for a configured pair, what re-reads it (``None``: generated here).

    A configured pair is checked (key matches, valid now, chain complete) and re-read when its files change
    (``reload()``, ``watch()``): each new STARTTLS handshake gets the last good pair. Raises ConfigError naming
    MAIL_RELAY_TLS_CERT when the pair cannot be used.
    """
    if cert is not None and key is not None:
        try:
            reloading = ReloadingServerContext(
                CertificateFiles(cert_path=str(cert), key_path=str(key)), name="starttls"
            )
        except CertificateSetError as exc:
            raise ConfigError.invalid(
                "MAIL_RELAY_TLS_CERT", str(cert), f"a PEM certificate matching MAIL_RELAY_TLS_KEY ({exc})"
            ) from None
        return reloading.front, reloading
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    cert_pem, key_pem = generate_self_signed()
    # load_cert_chain reads files only; the pair lives on disk for a moment, readable by us alone
    with tempfile.TemporaryDirectory(prefix="mailrelay-tls-") as tmp:
        cert_path, key_path = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
        cert_path.write_bytes(cert_pem)
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(key_pem)
        context.load_cert_chain(cert_path, key_path)
    return context, None
