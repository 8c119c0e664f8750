"""``[tls]``: client certificates on the main port and ``grpc.port``, per-path credentials, credential rotation.

The server certificate and key stay ``service.tls_cert_path`` / ``service.tls_key_path``; this table adds who may
present a client certificate, how its identity is read, which paths accept which credentials, and how often the
files are looked at (docs/auth.md, "Service-to-service: mutual TLS").
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from bastion.config._values import PositiveDuration, Section

Credentials = Literal["bearer", "mtls", "mtls_or_bearer", "mtls_and_bearer"]
IdentitySource = Literal["spiffe", "dns", "cn"]
DEFAULT_IDENTITY_FROM: tuple[IdentitySource, ...] = ("spiffe", "dns", "cn")
CREDENTIALS: tuple[str, ...] = ("bearer", "mtls", "mtls_or_bearer", "mtls_and_bearer")


class TlsSettings(Section):
    """``[tls]``: mutual TLS, and reloading of ``service.tls_*_path``, ``client_ca_path`` and ``crl_path``."""

    client_auth: Literal["none", "optional", "required"] = "none"
    client_ca_path: str | None = None
    crl_path: str | None = None
    identity_from: list[IdentitySource] = Field(default_factory=lambda: list(DEFAULT_IDENTITY_FROM))
    """Where a client certificate's identity is read, first found wins: the SPIFFE URI SAN, the first DNS SAN,
    the subject CN."""
    default_credentials: Credentials = "bearer"
    """What a path not listed in ``path_credentials`` accepts."""
    path_credentials: dict[str, Credentials] = Field(default_factory=dict)
    """``path pattern -> credentials``: an exact path or one ending in ``/*`` (the syntax of
    ``token.include_paths``); the longest matching pattern wins, an exact path over a prefix."""
    reload_interval_secs: PositiveDuration = 10.0
    """How often the certificate, key, client CA and CRL files are checked for a change (SIGHUP: at once)."""

    @field_validator("identity_from")
    @classmethod
    def _sources(cls, value: list[str]) -> list[str]:
        if not value or len(set(value)) != len(value):
            raise ValueError("expected a non-empty list of distinct sources among 'spiffe', 'dns', 'cn'")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TlsSettings:
        if self.client_auth != "none" and self.client_ca_path is None:
            raise ValueError(f'tls.client_auth = "{self.client_auth}" needs tls.client_ca_path')
        if self.crl_path is not None and self.client_ca_path is None:
            raise ValueError("tls.crl_path needs tls.client_ca_path (the CRL's issuer)")
        uses_mtls = self.default_credentials != "bearer" or any(v != "bearer" for v in self.path_credentials.values())
        if uses_mtls and self.client_auth == "none":
            raise ValueError("tls.path_credentials or tls.default_credentials accept mtls: set tls.client_auth")
        for pattern in self.path_credentials:
            body = pattern[:-1] if pattern.endswith("/*") else pattern
            if not pattern.startswith("/") or "*" in body:
                raise ValueError(f"tls.path_credentials: {pattern!r} must be an absolute path, maybe ending in '/*'")
        return self

    @property
    def mtls(self) -> bool:
        """Whether client certificates are asked for."""
        return self.client_auth != "none"
