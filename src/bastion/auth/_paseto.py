"""PASETO v4 verification with pyseto: ``local`` (symmetric key) or ``public`` (Ed25519 public key)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import re
from datetime import datetime
from typing import Any

import pyseto
from pyseto import Key, Paseto

from bastion._claims import Claims, claims_from_payload
from bastion.config import TokenSettings, read_file
from bastion.errors import ConfigError, InvalidToken

LOCAL_KEY_BYTES = 32
_TIME_CLAIMS = ("exp", "nbf", "iat")
_BASE64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_BASE64URL_TEXT = re.compile(r"[A-Za-z0-9_-]+")
# The low bits of a segment's last character that encode no byte, by the segment's length modulo 4.
_UNUSED_BITS = {0: 0, 2: 0b1111, 3: 0b11}


def canonical_base64url(segment: str) -> bool:
    """Whether ``segment`` is the one base64url text of its bytes: unpadded, only the URL-safe alphabet, no
    impossible length, and the unused low bits of its last character zero (RFC 4648 3.5). Decoders (pyseto's
    among them) ignore those bits, so each token would otherwise have several spellings."""
    if not _BASE64URL_TEXT.fullmatch(segment):
        return False
    rest = len(segment) % 4
    if rest == 1:
        return False
    return not _BASE64URL.index(segment[-1]) & _UNUSED_BITS[rest]


def _local_key_bytes(raw: bytes) -> bytes:
    """32 key bytes from hex (64 characters), base64, or a binary file of exactly 32 bytes."""
    text = raw.strip()
    candidates = []
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        candidates.append(bytes.fromhex(text.decode("ascii")))
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        with contextlib.suppress(ValueError, binascii.Error):
            candidates.append(decode(text))
    if not (raw.isascii() and raw.decode("ascii").isprintable()):
        candidates.append(raw)  # a binary key file; text is never taken as key bytes
    for decoded in candidates:
        if len(decoded) == LOCAL_KEY_BYTES:
            return decoded
    raise ConfigError(
        f"token.key_path: a v4.local key is {LOCAL_KEY_BYTES} bytes (raw, hex, base64, or a k4.local. PASERK)"
    )


def load_paseto_key(settings: TokenSettings) -> Any:
    """The verification key from ``token.key_path``; ConfigError when it is missing or does not fit."""
    if settings.key_path is None:
        raise ConfigError("token.format = 'paseto' needs token.key_path")
    raw = read_file("token.key_path", settings.key_path)
    text = raw.strip()
    try:
        if text.startswith(b"k4."):
            key = Key.from_paserk(text.decode("ascii"))
            if key.purpose != settings.purpose:
                raise ConfigError(f"token.key_path holds a {key.purpose} key; token.purpose is {settings.purpose}")
            if settings.purpose == "public" and key.is_secret:
                raise ConfigError("token.key_path: a secret key was given; the service needs only the public key")
            return key
        if settings.purpose == "local":
            return Key.new(version=4, purpose="local", key=_local_key_bytes(raw))
        if b"PRIVATE KEY" in text:
            raise ConfigError("token.key_path: a private key was given; the service needs only the public key")
        return Key.new(version=4, purpose="public", key=text)
    except ConfigError:
        raise
    except (ValueError, TypeError, pyseto.PysetoError) as exc:
        raise ConfigError(f"token.key_path {settings.key_path!r}: not a v4.{settings.purpose} key ({exc})") from None


def _unix(value: object, name: str) -> int:
    if not isinstance(value, str):
        raise InvalidToken(f"claim {name!r} must be an ISO-8601 date-time")
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidToken(f"claim {name!r} must be an ISO-8601 date-time") from None
    if moment.tzinfo is None:
        raise InvalidToken(f"claim {name!r} must carry a UTC offset")
    return int(moment.timestamp())


class PasetoVerifier:
    """Verify v4.local / v4.public tokens; ``exp``/``nbf``/``iat`` are PASETO's ISO-8601 strings.

    The claims then map exactly as JWT claims do (:func:`claims_from_payload`).
    """

    def __init__(self, settings: TokenSettings) -> None:
        if settings.version != "v4":
            raise ConfigError(f"token.version {settings.version!r}: only v4 is supported")
        self.purpose = settings.purpose
        self.prefix = f"v4.{settings.purpose}."
        self._key = load_paseto_key(settings)
        self._paseto = Paseto.new(leeway=0)
        self.verifications = 0
        self.generation = 0

    async def decode(self, token: str) -> Claims:
        if not token.startswith(self.prefix):
            raise InvalidToken(f"token is not a {self.prefix[:-1]} PASETO")
        # Before any cryptography: the payload and the footer in canonical base64url only.
        segments = token[len(self.prefix) :].split(".")
        if len(segments) > 2 or not all(map(canonical_base64url, segments)):
            raise InvalidToken("token is not canonical base64url (PASETO: unpadded, unused bits zero)")
        self.verifications += 1
        try:
            decoded = self._paseto.decode(self._key, token)
            raw = decoded.payload
            payload = json.loads(raw) if isinstance(raw, bytes | str) else raw
        except (ValueError, TypeError, pyseto.PysetoError) as exc:
            raise InvalidToken() from exc
        if not isinstance(payload, dict):
            raise InvalidToken("token payload must be a JSON object")
        for name in _TIME_CLAIMS:
            if name in payload:
                payload[name] = _unix(payload[name], name)
        return claims_from_payload(payload)
