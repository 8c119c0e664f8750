"""A small certificate authority for development and tests: ``bastion dev-ca`` and the mTLS tests.

Never for production: its key is written next to its certificate, unencrypted. ECDSA P-256 keys, SHA-256
signatures; leaf certificates carry the key usages a TLS server or client needs, or the wrong ones on request.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DAY = datetime.timedelta(days=1)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True, slots=True)
class Issued:
    """One issued certificate: PEM of the certificate and its private key, and its serial number."""

    cert_pem: bytes
    key_pem: bytes
    serial: int

    def write(self, directory: Path | str, name: str) -> tuple[Path, Path]:
        """Write ``<name>.pem`` and ``<name>-key.pem`` (0600) into ``directory``; return both paths."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        cert, key = folder / f"{name}.pem", folder / f"{name}-key.pem"
        cert.write_bytes(self.cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(self.key_pem)
        return cert, key


class DevCA:
    """A self-signed root that issues server and client certificates and signs a CRL.

    ``issue(...)`` -> :class:`Issued`; ``revoke(serial)`` then ``crl_pem()`` for a CRL listing what was revoked.
    """

    def __init__(self, name: str = "Bastion development CA") -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - DAY)
            .not_valid_after(now + 3650 * DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.revoked: list[int] = []

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _key_pem(self.key)

    def issue(
        self,
        common_name: str,
        *,
        spiffe: str | None = None,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        server: bool = False,
        client: bool = True,
        valid_from: datetime.datetime | None = None,
        valid_days: float = 30,
    ) -> Issued:
        """A leaf certificate. ``server``/``client`` choose the extended key usages (neither: code signing only,
        a wrong usage for TLS); ``valid_from``/``valid_days`` place its validity (past or future for tests)."""
        key = ec.generate_private_key(ec.SECP256R1())
        start = valid_from or _now() - datetime.timedelta(minutes=5)
        names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        if spiffe is not None:
            names.append(x509.UniformResourceIdentifier(spiffe))
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        serial = x509.random_serial_number()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(start)
            .not_valid_after(start + datetime.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages or [ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key), serial)

    def revoke(self, serial: int) -> None:
        self.revoked.append(serial)

    def crl_pem(self) -> bytes:
        """A CRL signed by this CA listing every revoked serial, valid for a week."""
        now = _now()
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(self.cert.subject)
            .last_update(now - datetime.timedelta(minutes=5))
            .next_update(now + 7 * DAY)
        )
        for serial in self.revoked:
            builder = builder.add_revoked_certificate(
                x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(now).build()
            )
        return builder.sign(self.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    def write(self, directory: Path | str) -> tuple[Path, Path]:
        """Write ``ca.pem`` and ``ca-key.pem`` (0600) into ``directory``."""
        return Issued(self.cert_pem, self.key_pem, self.cert.serial_number).write(directory, "ca")
