"""Token minters for JWT and PASETO with generated keys, and the development key pair.

Development and testing only: a service never issues tokens; its identity provider does.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyseto
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from joserfc import jwt
from joserfc.jwk import ECKey, OctKey, RSAKey

from bastion.config import TokenSettings

DEFAULT_TTL_SECS = 300
_CURVES = {"ES256": "P-256", "ES384": "P-384"}
_SECRET_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}


def _standard_claims(
    *, sub: str | None, roles: Iterable[str], ttl: int, jti: str | None, claims: Mapping[str, Any]
) -> dict[str, Any]:
    now = int(time.time())
    payload: dict[str, Any] = {"iat": now, "exp": now + ttl, "jti": uuid.uuid4().hex if jti == "" else jti}
    if sub is not None:
        payload["sub"] = sub
    # A str is kept as given (not split into characters), so tests can mint wrongly typed roles.
    listed: object = roles if isinstance(roles, str) else list(roles)
    if listed:
        payload["roles"] = listed
    payload.update(claims)
    return {k: v for k, v in payload.items() if v is not None}


class TokenMinter:
    """Sign JWTs with a generated (or given) key for ``algorithm``.

    ``public_pem()`` / ``secret`` / ``jwks()`` give what the service is configured with;
    ``mint(sub=..., roles=[...], ttl=..., **claims)`` returns a signed token with ``iat``, ``exp`` and ``jti``.
    A claim passed as ``None`` is left out (``mint(exp=None)`` makes a token without ``exp``,
    ``mint(jti=None)`` one without ``jti``); by default ``jti`` is a fresh random id.
    """

    format = "jwt"

    def __init__(self, algorithm: str = "RS256", *, key: RSAKey | ECKey | OctKey | None = None, kid: str | None = None):
        self.algorithm = algorithm
        self.kid = kid
        if key is None:
            if algorithm.startswith("RS"):
                key = RSAKey.generate_key(2048, private=True)
            elif algorithm.startswith("ES"):
                key = ECKey.generate_key(_CURVES[algorithm], private=True)
            else:
                key = OctKey.import_key(secrets.token_urlsafe(_SECRET_BYTES[algorithm]))
        self.key = key

    def fits(self, token: TokenSettings) -> bool:
        """Whether the service with ``token`` accepts what this minter mints (given the matching key)."""
        return token.format == self.format and token.algorithm == self.algorithm

    @classmethod
    def from_private_pem(cls, pem: bytes, algorithm: str | None = None) -> TokenMinter:
        """A minter for an existing private key file (RSA -> RS256, EC -> ES256/ES384 by curve)."""
        try:
            key: RSAKey | ECKey = RSAKey.import_key(pem)
        except (ValueError, TypeError):
            key = ECKey.import_key(pem)
        if algorithm is None:
            algorithm = "RS256" if isinstance(key, RSAKey) else {"P-256": "ES256", "P-384": "ES384"}[key.curve_name]
        return cls(algorithm, key=key)

    @property
    def secret(self) -> str:
        assert isinstance(self.key, OctKey)
        return self.key.raw_value.decode()

    def public_pem(self) -> bytes:
        assert not isinstance(self.key, OctKey), "HMAC keys have no PEM form; use .secret"
        return self.key.as_pem(private=False)

    def private_pem(self) -> bytes:
        assert not isinstance(self.key, OctKey), "HMAC keys have no PEM form; use .secret"
        return self.key.as_pem(private=True)

    def jwks(self) -> dict[str, Any]:
        """A JWKS document with this minter's public key (``kid`` and ``alg`` set)."""
        data = dict(self.key.as_dict(private=False))
        data.update({"kid": self.kid or "test-key", "alg": self.algorithm, "use": "sig"})
        return {"keys": [data]}

    def mint(
        self,
        *,
        sub: str | None = "alice",
        roles: Iterable[str] = (),
        ttl: int = DEFAULT_TTL_SECS,
        jti: str | None = "",
        header: Mapping[str, Any] | None = None,
        **claims: Any,
    ) -> str:
        payload = _standard_claims(sub=sub, roles=roles, ttl=ttl, jti=jti, claims=claims)
        if "exp" in claims and claims["exp"] is None:
            payload.pop("exp", None)
        protected = {"alg": self.algorithm, **({"kid": self.kid} if self.kid else {}), **(header or {})}
        return jwt.encode(protected, payload, self.key, algorithms=[self.algorithm])


class PasetoMinter:
    """Mint v4.local or v4.public PASETOs; ``exp``/``iat`` are ISO-8601 as PASETO specifies."""

    format = "paseto"

    def fits(self, token: TokenSettings) -> bool:
        """Whether the service with ``token`` accepts what this minter mints (given the matching key)."""
        return token.format == self.format and token.purpose == self.purpose

    def __init__(self, purpose: str = "public") -> None:
        self.purpose = purpose
        if purpose == "local":
            self.raw_key = os.urandom(32)
            self._key = pyseto.Key.new(version=4, purpose="local", key=self.raw_key)
            self.verification_key = self.raw_key.hex().encode()
        else:
            private = Ed25519PrivateKey.generate()
            pem = private.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            self._key = pyseto.Key.new(version=4, purpose="public", key=pem)
            self.verification_key = private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )

    def mint(
        self,
        *,
        sub: str | None = "alice",
        roles: Iterable[str] = (),
        ttl: int = DEFAULT_TTL_SECS,
        jti: str | None = "",
        **claims: Any,
    ) -> str:
        payload = _standard_claims(sub=sub, roles=roles, ttl=ttl, jti=jti, claims=claims)
        for name in ("exp", "iat", "nbf"):
            if isinstance(payload.get(name), int):
                payload[name] = datetime.fromtimestamp(payload[name], UTC).isoformat()
        token: bytes = pyseto.encode(self._key, json.dumps(payload).encode())
        return token.decode()


def jwt_minter(token: TokenSettings) -> TokenMinter:
    """The ``jwt`` format's test minter (``bastion.auth._formats``): a new key for ``token.algorithm``."""
    return TokenMinter(token.algorithm)


def paseto_minter(token: TokenSettings) -> PasetoMinter:
    """The ``paseto`` format's test minter: a new key for ``token.purpose``."""
    return PasetoMinter(token.purpose)


def write_dev_keys(directory: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Create ``jwt-private.pem`` / ``jwt-public.pem`` (RS256) in ``directory`` unless they exist."""
    folder = Path(directory)
    private, public = folder / "jwt-private.pem", folder / "jwt-public.pem"
    if private.exists() and public.exists():
        return private, public
    folder.mkdir(parents=True, exist_ok=True)
    minter = TokenMinter("RS256")
    private.write_bytes(minter.private_pem())
    private.chmod(0o600)
    public.write_bytes(minter.public_pem())
    return private, public
