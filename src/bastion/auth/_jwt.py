"""JWT verification with joserfc: exactly the configured algorithm, keys loaded and checked at start-up."""

from __future__ import annotations

import base64
import binascii
import json
import warnings
from typing import Any

import structlog
from joserfc import jwt
from joserfc.errors import JoseError, SecurityWarning
from joserfc.jwk import ECKey, KeySet, OctKey, RSAKey

from bastion._claims import Claims, claims_from_payload
from bastion.auth._jwks import JwksUrlSource
from bastion.config import TokenSettings, read_file
from bastion.errors import ConfigError, InvalidToken, Unavailable

log = structlog.get_logger("bastion.auth.jwt")

MIN_RSA_BITS = 2048
# RFC 7518 3.2: an HMAC key must be at least as long as the hash output.
MIN_HMAC_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
EC_CURVES = {"ES256": "P-256", "ES384": "P-384"}

Key = RSAKey | ECKey | OctKey


def check_key(key: Key, algorithm: str, origin: str) -> Key:
    """Refuse a key that does not fit ``algorithm`` (type, RSA size, EC curve) or that is private."""
    family = algorithm[:2]
    if family == "RS":
        if not isinstance(key, RSAKey):
            raise ConfigError(f"{origin}: {algorithm} needs an RSA public key, got {key.key_type}")
        bits = key.raw_value.key_size
        if bits < MIN_RSA_BITS:
            raise ConfigError(f"{origin}: RSA key has {bits} bits; at least {MIN_RSA_BITS} are required")
    elif family == "ES":
        if not isinstance(key, ECKey):
            raise ConfigError(f"{origin}: {algorithm} needs an EC public key, got {key.key_type}")
        if key.curve_name != EC_CURVES[algorithm]:
            raise ConfigError(f"{origin}: {algorithm} needs curve {EC_CURVES[algorithm]}, got {key.curve_name}")
    elif not isinstance(key, OctKey):
        raise ConfigError(f"{origin}: {algorithm} needs a shared secret, got {key.key_type}")
    if family != "HS" and key.is_private:
        raise ConfigError(f"{origin}: a private key was given; the service needs only the public key")
    return key


def _import_pem(pem: bytes, algorithm: str, origin: str) -> Key:
    try:
        with warnings.catch_warnings():
            # joserfc warns about small RSA keys; check_key refuses them outright with a clearer message.
            warnings.simplefilter("ignore", SecurityWarning)
            key: Key = (RSAKey if algorithm.startswith("RS") else ECKey).import_key(pem)
    except (ValueError, TypeError, JoseError) as exc:
        raise ConfigError(f"{origin}: not a PEM public key for {algorithm} ({exc})") from None
    return check_key(key, algorithm, origin)


def usable_keys(key_set: KeySet, algorithm: str, origin: str) -> dict[str | None, Key]:
    """The keys of a JWKS that can verify ``algorithm``, by ``kid`` (signing keys only)."""
    keys: dict[str | None, Key] = {}
    for key in key_set.keys:
        if key.get("use") not in (None, "sig") or key.get("alg") not in (None, algorithm):
            continue
        try:
            keys[key.kid] = check_key(key, algorithm, f"{origin} kid={key.kid!r}")  # type: ignore[arg-type]
        except ConfigError:
            continue
    return keys


def load_jwks(raw: bytes | str, algorithm: str, origin: str) -> dict[str | None, Key]:
    try:
        key_set = KeySet.import_key_set(json.loads(raw))
    except (ValueError, TypeError, KeyError, JoseError) as exc:
        raise ConfigError(f"{origin}: not a JWKS document ({exc})") from None
    keys = usable_keys(key_set, algorithm, origin)
    if not keys:
        raise ConfigError(f"{origin}: no key in the JWKS can verify {algorithm}")
    return keys


def _header(token: str) -> dict[str, Any]:
    segment = token.split(".", 1)[0]
    try:
        header = json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    except (ValueError, binascii.Error):
        raise InvalidToken("token header is not base64url JSON") from None
    if not isinstance(header, dict):
        raise InvalidToken("token header is not a JSON object")
    return header


class JwtVerifier:
    """Verify a JWT's signature with the configured key(s) and type-check its claims.

    Keys come from exactly one of ``public_key_path`` (RS*/ES*), ``secret`` (HS*), ``jwks_path`` or
    ``jwks_url``, and are checked at start-up (ConfigError). Only ``algorithm`` is accepted: ``alg: none``
    and algorithm switching fail. With several keys the token's ``kid`` must name one. ``verifications``
    counts signature checks; ``generation`` changes when the keys change (the verified-token cache reads it).
    """

    def __init__(self, settings: TokenSettings, *, jwks_source: JwksUrlSource | None = None) -> None:
        self.algorithm = settings.algorithm
        self.verifications = 0
        self.generation = 0
        self._keys: dict[str | None, Key] = {}
        self._single: Key | None = None
        self._source = jwks_source
        self._document: bytes | None = None
        # TokenSettings has checked that exactly one source fits the algorithm (ConfigError naming the keys).
        if settings.secret is not None:
            secret = settings.secret.get_secret_value().encode()
            if len(secret) < MIN_HMAC_BYTES[self.algorithm]:
                raise ConfigError(
                    f"token.secret is {len(secret)} bytes; {self.algorithm} needs at least "
                    f"{MIN_HMAC_BYTES[self.algorithm]}"
                )
            self._single = OctKey.import_key(secret)
        elif settings.public_key_path is not None:
            key = "token.public_key_path"
            origin = f"{key} = {settings.public_key_path!r}"
            self._single = _import_pem(read_file(key, settings.public_key_path), self.algorithm, origin)
        elif settings.jwks_path is not None:
            origin = f"token.jwks_path = {settings.jwks_path!r}"
            self._keys = load_jwks(read_file("token.jwks_path", settings.jwks_path), self.algorithm, origin)
        elif self._source is None:
            if settings.jwks_url is None:
                raise ConfigError(
                    "token authentication has no key: set token.public_key_path, token.secret, token.jwks_path "
                    "or token.jwks_url"
                )
            self._source = JwksUrlSource(settings.jwks_url, refresh_secs=settings.jwks_refresh_secs)

    async def _key_for(self, header: dict[str, Any]) -> Key:
        if self._single is not None:
            return self._single
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise InvalidToken("token kid must be a string")
        if self._source is not None:
            raw = await self._source.document(unknown_kid=kid not in self._keys, have_keys=bool(self._keys))
            if raw is not None and raw != self._document:
                try:
                    self._keys = load_jwks(raw, self.algorithm, f"token.jwks_url {self._source.url!r}")
                except ConfigError as exc:
                    log.error("jwks_rejected", error=str(exc))
                    if not self._keys:
                        raise Unavailable("Token signing keys are unavailable", retry_after=5) from None
                else:
                    self._document = raw
                    self.generation += 1
        if kid is None:
            if len(self._keys) == 1:
                return next(iter(self._keys.values()))
            raise InvalidToken("token has no kid and several keys are configured")
        key = self._keys.get(kid)
        if key is None:
            raise InvalidToken("token kid is not a known key")
        return key

    async def decode(self, token: str) -> Claims:
        """Verify the signature and type-check the claims (time claims are checked by the caller)."""
        header = _header(token)
        if header.get("alg") != self.algorithm:
            raise InvalidToken(f"token alg {header.get('alg')!r} is not the configured {self.algorithm}")
        key = await self._key_for(header)
        self.verifications += 1
        try:
            decoded = jwt.decode(token, key, algorithms=[self.algorithm])
        except (JoseError, ValueError, TypeError) as exc:
            raise InvalidToken() from exc
        return claims_from_payload(decoded.claims)
