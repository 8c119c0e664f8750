"""Which credentials a path accepts (``[tls]`` ``path_credentials``): a bearer token, a client certificate, either,
or both (the token's ``client_id`` must then be the certificate's identity).

:class:`CredentialsGuard` takes the token-auth step's place when ``tls.client_auth`` is on: it asks the path's
rule, reads the verified client certificate the protocol put in the scope (scope[SCOPE_CLIENT_CERTIFICATE]) and
hands bearer checks to the token guard. A certificate that OpenSSL did not verify never reaches it: the
handshake failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bastion._claims import Claims
from bastion._guard import Exemptions, Outcome
from bastion.auth._capability import AUTHORIZATION, TokenAuthGuard
from bastion.config import TlsSettings
from bastion.errors import ClientCertificateMismatch, ClientCertificateRequired, ConfigError, TokenError
from bastion.types import SCOPE_CLAIMS, SCOPE_CLIENT_CERTIFICATE, Scope


@dataclass(frozen=True, slots=True)
class CredentialRules:
    """``path -> credentials``: exact paths first, then the longest ``/*`` prefix, else the default."""

    exact: Mapping[str, str]
    prefixes: tuple[tuple[str, str], ...]
    default: str

    @classmethod
    def from_settings(cls, settings: TlsSettings) -> CredentialRules:
        exact: dict[str, str] = {}
        prefixes: list[tuple[str, str]] = []
        for pattern, kind in settings.path_credentials.items():
            if pattern.endswith("/*"):
                prefixes.append((pattern[:-1], kind))
            else:
                exact[pattern] = kind
        prefixes.sort(key=lambda item: len(item[0]), reverse=True)
        return cls(exact, tuple(prefixes), settings.default_credentials)

    def for_path(self, path: str) -> str:
        kind = self.exact.get(path)
        if kind is not None:
            return kind
        for prefix, kind in self.prefixes:
            if path.startswith(prefix):
                return kind
        return self.default

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset({self.default, *self.exact.values(), *(kind for _, kind in self.prefixes)})


class CredentialsGuard:
    """The token-auth step with client certificates: per path ``bearer``, ``mtls``, ``mtls_or_bearer`` or
    ``mtls_and_bearer``.

    Raises ClientCertificateRequired (401 ``CLIENT_CERTIFICATE_REQUIRED``) when the path needs a certificate and
    the connection has none, ClientCertificateMismatch (401) when ``mtls_and_bearer``'s token ``client_id`` is not
    the certificate's identity, and the token guard's errors for bearer checks. A caller admitted by its
    certificate alone has no claims: the policy's principal is ``Service::"<identity>"``.
    """

    def __init__(self, settings: TlsSettings, *, token: TokenAuthGuard | None) -> None:
        self.rules = CredentialRules.from_settings(settings)
        if token is None and "mtls_and_bearer" in self.rules.kinds:
            raise ConfigError("tls.path_credentials: mtls_and_bearer needs token authentication ([token])")
        self.token = token
        self.exemptions = (
            token.exemptions
            if token is not None
            else Exemptions(scope_types=frozenset({"http", "websocket", "grpc"}), preflight=True, public_routes=True)
        )

    async def check(self, scope: Scope) -> Outcome | None:
        kind = self.rules.for_path(scope["path"])
        certificate = scope.get(SCOPE_CLIENT_CERTIFICATE)
        token = self.token
        if kind == "bearer" or (kind == "mtls_or_bearer" and certificate is None and token is not None):
            return None if token is None else await token.check(scope)
        if certificate is None:
            raise ClientCertificateRequired()
        if kind != "mtls_and_bearer" or token is None:
            return None
        claims = await token.authenticate([value for name, value in scope["headers"] if name == AUTHORIZATION], scope)
        if not isinstance(claims, Claims) or claims.client_id != certificate.identity:
            error: TokenError = ClientCertificateMismatch()
            token.metrics.token_rejected(error.code)
            raise error
        scope[SCOPE_CLAIMS] = claims
        return None
